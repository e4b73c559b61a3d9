"""LitGPT's LoRA step op by op (memledger/step/litgpt_lora_step.py) beside LitGPT's own LoRA model and
``finetune/lora.py``'s loop, measured by MemTracker under ``FakeTensorMode`` (:func:`memledger.pytorch.litgpt_lora
.lora_step`): every landmark, each phase's peak and the peak, to the byte (the CPU backend: the dropout keeps a BF16
noise tensor for its mask). Skips, saying why, where LitGPT is not installed."""
import pytest

pytest.importorskip("torch")

from memledger.ledger.lora import LoraConfig, LoraLedger  # noqa: E402
from memledger.pytorch.litgpt_lora import lora_step, missing  # noqa: E402
from memledger.step.litgpt_lora import fields  # noqa: E402

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

SMALL = dict(d=256, H=4, F=688, V=1000)
SEVEN_B = dict(d=4096, H=32, F=11008, V=32000)
QV = ("q_proj", "v_proj")
LANDMARKS = ("before forward", "after forward", "after backward", "after step")


def memledger_step(shape, L, B, S, targets, dropout, rank=8):
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.reference import RefConfig
    arch = architecture_of(RefConfig(**shape, L=L, style="llama"))
    config = LoraConfig(rank=rank, targets=targets, adapter_recipe="bf16-pure-adamw", dropout=dropout > 0)
    return LoraLedger(arch, config, B, S, overhead_bytes=0, implementation="litgpt").step("cpu")


def against_litgpt(shape, L, B, S, targets, dropout, rank=8):
    """memledger's step and LitGPT's, landmark by landmark, phase by phase and at the peak."""
    got = lora_step(**shape, L=L, batch=B, seq=S, lora=tuple(sorted(fields(targets, rank, dropout).items())))
    step = memledger_step(shape, L, B, S, targets, dropout, rank)
    assert {k: step.landmarks[k]["gpu"] for k in LANDMARKS} == {k: got[k] for k in LANDMARKS}
    assert step.phase_peaks() == got["phase peaks"]
    assert step.peak.bytes == got["peak"]
    return step


@pytest.mark.parametrize("targets, dropout, L, B, S", [
    (QV, 0.05, 2, 1, 200), (QV, 0.05, 2, 2, 200), (QV, 0.0, 3, 2, 64), (("q_proj", "k_proj", "v_proj"), 0.05, 2, 1, 300),
    (("k_proj",), 0.05, 2, 2, 48), (QV, 0.05, 6, 1, 520), (("q_proj", "k_proj", "v_proj"), 0.0, 5, 2, 100),
    (("k_proj",), 0.0, 2, 3, 150)])
def test_step_is_litgpts(targets, dropout, L, B, S):
    """finetune/lora.py's step on LitGPT's LoRA model: one, two or more head chunks (a short last one), B = 1 (views)
    and B > 1 (the last chunk's and the targets' copies), with and without zero_pad and dropout, L up to 6 (blocks
    2..L-3 as one lump in the step)."""
    against_litgpt(SMALL, L, B, S, targets, dropout)


def test_many_chunks_with_a_wide_vocabulary():
    """Nine head chunks (chunks 0..N-3 booked as one group) with a vocabulary wide enough that the loss's backward
    holds the peak: each chunk's gradient replaces its log-softmax in turn."""
    step = against_litgpt(dict(SMALL, V=8000), 2, 1, 1100, QV, 0.05)
    assert step.peak.phase == "loss"


@pytest.mark.parametrize("L, B, S, targets, dropout", [(3, 2, 200, QV, 0.05), (6, 2, 100, ("v_proj",), 0.05),
                                                       (4, 1, 300, ("q_proj", "k_proj", "v_proj"), 0.0)])
def test_a_narrow_vocabulary_puts_the_peaks_in_the_layers(L, B, S, targets, dropout):
    """With V 64 and F 2048 the forward's and the backward's peaks are a layer's (the last one's MLP), not the
    loss's: the layers' programs reach LitGPT's heights."""
    step = against_litgpt(dict(d=256, H=4, F=2048, V=64), L, B, S, targets, dropout)
    assert step.peak.phase == "backward" and step.peak.layer == L - 1


def test_many_chunks_at_batch_2():
    """Six head chunks at B 2: each chunk's targets and the last chunk's logits copied."""
    against_litgpt(dict(SMALL, V=8000), 5, 2, 700, QV, 0.05)


def test_the_peak_is_in_the_loss_backward():
    """At finetune/lora.py's defaults the step peaks while the loss's chunks run backward."""
    step = against_litgpt(SMALL, 2, 1, 200, QV, 0.05)
    assert step.peak.phase == "loss"


@pytest.mark.parametrize("changes, message", [
    (dict(targets=("q_proj", "o_proj")), "lora_projection"), (dict(seq_len=257), "seq_len 257"),
    (dict(adapter_recipe="bf16-adamw"), "adapter_recipe bf16-adamw")])
def test_unmodelled_runs_are_refused_in_one_line(changes, message):
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.reference import RefConfig
    arch = architecture_of(RefConfig(**SMALL, L=2, style="llama"))
    config = dict(rank=8, targets=QV, adapter_recipe="bf16-pure-adamw", dropout=True)
    seq = changes.pop("seq_len", 64)
    ledger = LoraLedger(arch, LoraConfig(**(config | changes)), 1, seq, implementation="litgpt")
    with pytest.raises(ValueError, match=message):
        ledger.step("cpu")


@pytest.mark.slow
@pytest.mark.parametrize("B, S, rank", [(1, 1304, 8), (2, 512, 32)])
def test_llama2_7b_width_step(B, S, rank):
    """LLaMA-2 7B's width (two layers, V 32000), the published LitGPT rows' setups (r 8 at B 1, S 1304; r 32 at B 2,
    S 512): every landmark, phase peak and the peak."""
    against_litgpt(SEVEN_B, 2, B, S, QV, 0.05, rank)


@pytest.mark.parametrize("L, targets, dropout", [(3, QV, 0.05), (6, ("q_proj", "k_proj", "v_proj"), 0.0)])
def test_rows_add_up_to_each_landmark(L, targets, dropout):
    """The step's rows live at a landmark add up to it: the first layer's saved tensors booked once, the others'
    L - 1 times."""
    step = memledger_step(SMALL, L, 2, 200, targets, dropout)
    for mark in LANDMARKS:
        assert step.landmarks[mark]["gpu"] == sum(row["bytes"] for row in step.rows
                                                  if mark in row["live"] and row["device"] == "gpu")
