"""``memledger.measure.track`` and ``torchtune_hook`` on a plain loop of memledger's reference decoder
(memledger/pytorch/reference.py) on the CPU: MemTracker, counting the real tensors of the run, must find every
landmark, every phase's peak and the peak of the steady step equal to the step timeline's under the CPU backend
with no overhead, byte for byte (the project's claim for its reference decoder, tests/step/test_timeline.py), and
the same numbers as the project's own harness, which marks the landmarks by hand
(memledger.pytorch.measure.memtracker_step, fake tensors)."""
import json

import pytest

torch = pytest.importorskip("torch")

from memledger.measure import torchtune_hook, track                       # noqa: E402
from memledger.pytorch.compare import architecture_of                      # noqa: E402
from memledger.pytorch.measure import memtracker_step                      # noqa: E402
from memledger.pytorch.reference import RefConfig, make_model              # noqa: E402
from memledger.step.timeline import LANDMARKS                              # noqa: E402

pytestmark = pytest.mark.slow

LLAMA = RefConfig(64, 2, 4, 160, 1000, "llama")
GPT = RefConfig(64, 2, 4, 256, 1000, "gpt", dropout=0.1)
B, S = 2, 32
PNG = b"\x89PNG\r\n\x1a\n"


def _setup(c, loop):
    return dict(arch=architecture_of(c), batch_size=B, seq_len=S, recipe=loop, dropout=c.dropout > 0)


def _loop(model, opt, c, steps, zero_grad_first=False, after_step=None):
    """Steps as memledger.pytorch.reference.Trainer runs them (forward and loss, backward, the loss dropped,
    opt.step(), zero_grad(set_to_none=True)), or with zero_grad at the top of the loop, as many loops do."""
    for _ in range(steps):
        ids, targets = torch.randint(0, c.V, (B, S)), torch.randint(0, c.V, (B, S))
        if zero_grad_first:
            opt.zero_grad(set_to_none=True)
        loss = model.loss(ids, targets)
        loss.backward()
        del loss
        opt.step()
        if not zero_grad_first:
            opt.zero_grad(set_to_none=True)
        if after_step is not None:
            after_step(model, opt)


def _check_exact(report, c, loop):
    measured, predicted = report["measured"], report["predicted"]
    assert measured["what"] == "MemTracker" and measured["device"] == "cpu"
    assert measured["landmarks"] == predicted["landmarks"]
    assert measured["phase_peaks"] == predicted["phase_peaks"]
    assert measured["peak"] == predicted["peak"]
    assert report["difference"]["bytes"] == 0 and report["difference"]["largest_unexplained"] is None
    harness = memtracker_step(c, loop, B, S)                  # PyTorch's count with the landmarks marked by hand
    assert measured["landmarks"] == {k: harness[k] for k in LANDMARKS}
    assert measured["phase_peaks"] == harness["phase peaks"] and measured["peak"] == harness["peak"]


@pytest.mark.parametrize("c, loop, zero_grad_first", [(LLAMA, "fp32-adamw", False), (GPT, "bf16-pure-adamw", True)],
                         ids=["llama-fp32", "gpt-bf16-dropout-zero-grad-first"])
def test_plain_loop_measures_the_reference_decoder_to_the_byte(tmp_path, capsys, c, loop, zero_grad_first):
    torch.manual_seed(0)
    model = make_model(c, loop)
    opt = torch.optim.AdamW(model.parameters())
    path = tmp_path / "run" / "report.json"
    with track(model, opt, setup=_setup(c, loop), steps=2, report=path) as m:
        _loop(model, opt, c, 3, zero_grad_first)
    report = json.loads(path.read_text())
    assert report == json.loads(json.dumps(m.report))
    _check_exact(report, c, loop)
    assert [s["step"] for s in report["measured"]["steps"]] == [1, 2] and report["measured"]["compared_step"] == 2
    first = report["measured"]["steps"][0]                      # the parameters and the batch (int64 ids, targets)
    assert first["landmarks"]["before forward"] == report["observed"]["parameters"] * (4 if loop == "fp32-adamw" else 2) \
        + 2 * B * S * 8
    assert first["landmarks"]["after step"] > first["landmarks"]["before forward"]     # the step made AdamW's state
    assert report["observed"]["batch"] == [B, S]
    assert report["environment"]["torch"] == torch.__version__
    assert report["predicted"]["backend"] == "cpu"
    assert capsys.readouterr().out == report["line"] + "\n"
    png = (tmp_path / "run" / "report.png").read_bytes()
    assert png[:8] == PNG and int.from_bytes(png[16:20], "big") == 900       # the IHDR width: 9 in at 100 dpi


def test_torchtune_hook_measures_the_steps_after_its_first_call(tmp_path):
    """The recipe calls the hook after every optimizer step: the first call starts the measurement, so steps 2
    and 3 of the run are measured, and the last is the steady step."""
    c, loop = LLAMA, "bf16-pure-adamw"
    torch.manual_seed(0)
    model = make_model(c, loop)
    opt = torch.optim.AdamW(model.parameters())
    hook = torchtune_hook(setup=_setup(c, loop), steps=2, report=tmp_path / "r.json", plot=False, echo=False)
    _loop(model, opt, c, 5, after_step=hook)
    assert hook.recorder.done and not (tmp_path / "r.png").exists()
    report = json.loads((tmp_path / "r.json").read_text())
    steps = report["measured"]["steps"]
    assert len(steps) == 2 and steps[0]["landmarks"] == steps[1]["landmarks"]       # both steady
    _check_exact(report, c, loop)


def test_the_loop_goes_on_unmeasured_and_hooks_are_removed(tmp_path):
    """After the measured steps nothing of the recorder is left in the run: no MemTracker, no wrapped
    torch.autograd.backward or zero_grad, no hooks."""
    c, loop = LLAMA, "fp32-adamw"
    model = make_model(c, loop)
    opt = torch.optim.AdamW(model.parameters())
    backward = torch.autograd.backward
    with track(model, opt, setup=_setup(c, loop), steps=1, report=tmp_path / "r.json", plot=False,
               echo=False) as m:
        _loop(model, opt, c, 1)
        assert m.done                                   # the report is written after the last measured step
        assert torch.autograd.backward is backward and "zero_grad" not in vars(opt)
        assert "zero_grad" not in vars(model) and not model._forward_pre_hooks
        from torch.utils._python_dispatch import _get_current_dispatch_mode
        assert _get_current_dispatch_mode() is None
        _loop(model, opt, c, 1)
    assert len(m.report["measured"]["steps"]) == 1


def test_a_failing_loop_leaves_nothing_behind(tmp_path):
    model = make_model(LLAMA, "fp32-adamw")
    opt = torch.optim.AdamW(model.parameters())
    backward = torch.autograd.backward
    with pytest.raises(RuntimeError, match="boom"):
        with track(model, opt, setup=_setup(LLAMA, "fp32-adamw"), report=tmp_path / "r.json", echo=False):
            raise RuntimeError("boom")
    assert torch.autograd.backward is backward and not model._forward_pre_hooks
    assert not (tmp_path / "r.json").exists()


def test_bad_arguments_are_refused_in_one_line():
    model = make_model(LLAMA, "fp32-adamw")
    with pytest.raises(ValueError, match="model must be a torch.nn.Module"):
        track("model", setup=_setup(LLAMA, "fp32-adamw"))
    with pytest.raises(ValueError, match="optimizer must be a torch.optim.Optimizer"):
        track(model, "adamw", setup=_setup(LLAMA, "fp32-adamw"))
    with pytest.raises(ValueError, match="steps must be"):
        track(model, setup=_setup(LLAMA, "fp32-adamw"), steps=0)
    assert not model._forward_pre_hooks


def test_frozen_parameters_are_measured(tmp_path):
    """MemTracker cannot hook a frozen parameter's gradient: the recorder gives it a no-op handle first. With the
    embedding frozen, the steady step starts with every parameter (FP32), AdamW's two FP32 moments and 4-byte step
    of each trainable tensor only, and the batch."""
    c, loop = LLAMA, "fp32-adamw"
    model = make_model(c, loop)
    model.embed.weight.requires_grad_(False)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable)
    with track(model, opt, setup=_setup(c, loop), report=tmp_path / "r.json", plot=False, echo=False) as m:
        _loop(model, opt, c, 2)
    params = sum(p.numel() for p in model.parameters())
    states = sum(2 * 4 * p.numel() + 4 for p in trainable)
    assert m.report["measured"]["landmarks"]["before forward"] == 4 * params + states + 2 * B * S * 8
    assert m.report["observed"]["trainable_parameters"] == params - c.V * c.d


class FakeAllocator:
    """Stands in for torch.cuda's allocator counters (this machine has no GPU): allocated grows by 512 bytes at
    each reading, the peak since the last reset is 1,000 bytes above it, reserved 2 MiB above that."""

    def __init__(self):
        self.allocated, self.resets = 0, 0

    def memory_allocated(self, device=None):
        self.allocated += 512
        return self.allocated

    def max_memory_allocated(self, device=None):
        return self.allocated + 1000

    def max_memory_reserved(self, device=None):
        return self.allocated + 1000 + 2**21

    def reset_peak_memory_stats(self, device=None):
        self.resets += 1


def test_on_cuda_the_allocator_counters_are_read(tmp_path, monkeypatch):
    """The CUDA path's wiring, on fake counters: the allocator's counters are what is read, its peaks reset at each
    landmark, reserved reported beside allocated, and the prediction made under the CUDA backend."""
    from memledger.measure import recorder
    fake = FakeAllocator()
    for name in ("memory_allocated", "max_memory_allocated", "max_memory_reserved", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, getattr(fake, name))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    monkeypatch.setattr(recorder, "_device_of", lambda model: torch.device("cuda", 0))
    c, loop = LLAMA, "bf16-pure-adamw"
    model = make_model(c, loop)
    opt = torch.optim.AdamW(model.parameters())
    with track(model, opt, setup=_setup(c, loop), steps=1, report=tmp_path / "r.json", plot=False,
               echo=False) as m:
        _loop(model, opt, c, 1)
    measured = m.report["measured"]
    assert measured["what"] == "torch.cuda.max_memory_allocated" and measured["device"] == "cuda:0"
    assert list(measured["landmarks"].values()) == [512, 1024, 1536, 2048]     # one reading per landmark, in order
    assert measured["phase_peaks"] == {"forward": 1024 + 1000, "backward": 1536 + 1000, "optimizer": 2048 + 1000}
    assert measured["peak"] == 3048 and measured["peak_reserved"] == 3048 + 2**21
    assert fake.resets == 1 + 4                       # when the step begins, and at each landmark
    assert m.report["predicted"]["backend"] == "cuda"
    assert m.report["environment"]["device_name"] == "Fake GPU"
    assert "(2.10 MB reserved)" in m.report["line"]


def test_a_lora_ledger_is_a_setup(tmp_path):
    """A LoraLedger predicts the reference decoder under LoRA (memledger/pytorch/lora.py). MemTracker's run keeps
    one thing the step does not: the embedding's output made a leaf that requires grad, and its .grad,
    2 * B * S * d * 2 bytes in BF16 (tests/stepcheck.py, lora_against_memtracker), alive into the next step and
    until its backward has made the next pair; every other part agrees to the byte."""
    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.pytorch.lora import LoraRef, make_lora_model
    c, loop = LLAMA, "bf16-pure-adamw"
    torch.manual_seed(0)
    model = make_lora_model(c, LoraRef(4, ("q_proj", "v_proj")), loop)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad])
    setup = LoraLedger(architecture_of(c), LoraConfig(4, ("q_proj", "v_proj"), base="bf16", adapter_recipe=loop), B,
                       S, overhead_bytes=0)
    with track(model, opt, setup=setup, report=tmp_path / "r.json", plot=False, echo=False) as m:
        _loop(model, opt, c, 2)
    assert m.report["setup"]["lora"]["rank"] == 4
    held = 2 * B * S * c.d * 2
    parts = {p["part"]: p["bytes"] for p in m.report["difference"]["parts"]}
    assert parts == {"held before forward": held, "added by forward": 0, "added by backward": held,
                     "added by the optimizer step": 0, "forward transients": 0, "backward transients": 0,
                     "optimizer transients": 0}
