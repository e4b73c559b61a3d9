"""FP16 autocast with a GradScaler in the step (memledger/step/amp.py) against PyTorch's MemTracker.

The reference loop ``fp16-amp-adamw`` (memledger/pytorch/reference.py, ``Trainer(amp=...)``): FP32 weights,
``torch.autocast(dtype=torch.float16)`` around forward and loss, ``torch.amp.GradScaler``. Every landmark, each
phase's peak, the peak, each block's peaks and the totals op by op inside the blocks equal MemTracker's to the
byte under the CPU backend, with composite and fused RMSNorm and each AdamW implementation. LLaMA-2 7B:
tests/step/test_amp_7b.py (slow).
"""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import LANDMARKS, Step

from stepcheck import GPT7B, block_totals_agree, landmarks_are_sums_of_rows


def amp_against_memtracker(B_, S_, L_=2, d=64, H=4, F_=160, V_=1000, rmsnorm="composite", foreach=False,
                           fused=False, trace=True):
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(d, L_, H, F_, V_, "llama", rmsnorm=rmsnorm)
    measured = memtracker_step(c, "fp16-amp-adamw", B_, S_, blocks=True, trace=trace, foreach=foreach, fused=fused)
    conv = {"rmsnorm": "fused"} if rmsnorm == "fused" else {}
    step = Step(Ledger(architecture_of(c), batch_size=B_, seq_len=S_, recipe="fp16-amp-adamw", overhead_bytes=0),
                "cpu", foreach=foreach, fused=fused, **conv)
    for landmark in LANDMARKS:
        assert step.landmarks[landmark]["gpu"] == measured[landmark], landmark
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    ours = step.block_peaks()
    assert ours == {k: measured["block peaks"][k] for k in ours}
    if trace:
        block_totals_agree(step, measured)
    landmarks_are_sums_of_rows(step)
    return step, measured


@pytest.mark.parametrize("B_,L_,kw", [(2, 2, {}), (1, 5, {}), (2, 3, {"rmsnorm": "fused"}), (2, 3, {"foreach": True}),
                                      (1, 3, {"fused": True})])
def test_amp_step_is_memtrackers(B_, L_, kw):
    """B = 1 and B > 1, lumped blocks (L = 5), composite and fused RMSNorm, for-loop, foreach and fused AdamW."""
    amp_against_memtracker(B_, 32, L_, **kw)


def test_weight_copies_are_the_linears_weights_in_fp16():
    """The step's autocast copies (and the ledger's row) hold 2 bytes per element of every nn.Linear weight of the
    reference decoder, as PyTorch counts them (the step's total is MemTracker's: amp_against_memtracker)."""
    import torch
    from memledger.pytorch.reference import RefConfig, make_model
    step, _ = amp_against_memtracker(2, 32, trace=False)
    with torch.device("meta"):
        model = make_model(RefConfig(64, 2, 4, 160, 1000, "llama"), "fp16-amp-adamw")
    linear = 2 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    rows = {r["name"]: r["bytes"] for r in step.rows}
    assert sum(b for n, b in rows.items() if "autocast FP16 copy" in n) == linear
    ledger = Ledger(step.ledger.arch, batch_size=2, seq_len=32, recipe="fp16-amp-adamw", overhead_bytes=0)
    assert {r.name: r.bytes for r in ledger.rows}["autocast FP16 weight copies (saved by autograd)"] == linear


@pytest.mark.parametrize("changes,backend,words", [
    ({}, "article", "not for the eager attention kernel"),
    ({"recompute": "full"}, "cpu", "not for recomputation"),
    ({"arch": GPT7B}, "cpu", "GPT blocks"),
    ({"arch": "llama3-8b"}, "cpu", "grouped-query attention"),
    ({"zero_stage": 1, "dp": 2}, "cpu", "ZeRO"),
])
def test_refused_in_one_line(changes, backend, words):
    ledger = Ledger(**{"arch": "llama2-7b", "seq_len": 4096, "recipe": "fp16-amp-adamw", **changes})
    with pytest.raises(ValueError, match=words):
        ledger.step(backend)


def test_cuda_backend_runs_amp():
    """The weight cache is the same on every device (cached_cast has no device test): the cuda backend's step runs
    AMP with its own conventions (fused RMSNorm, foreach AdamW), above the cpu backend's here."""
    ledger = Ledger("llama2-7b", seq_len=4096, recipe="fp16-amp-adamw", overhead_bytes=0)
    assert ledger.step("cuda").peak.bytes > ledger.step("cpu").peak.bytes > 0
