"""FP16 autocast with a GradScaler in the step (memledger/step/amp.py) against PyTorch's MemTracker.

The reference loop ``fp16-amp-adamw`` (memledger/pytorch/reference.py, ``Trainer(amp=...)``): FP32 weights,
``torch.autocast(dtype=torch.float16)`` around forward and loss, ``torch.amp.GradScaler``. Every landmark, each
phase's peak, the peak, each block's peaks and the totals op by op inside the blocks equal MemTracker's to the
byte under the CPU backend (one small shape here; composite and fused RMSNorm, each AdamW implementation and
LLaMA-2 7B in tests/step/test_amp_slow.py).
"""
import pytest

from memledger.ledger.ledger import Ledger

from ampcheck import amp_against_memtracker
from stepcheck import GPT7B


@pytest.mark.slow
def test_weight_copies_are_the_linears_weights_in_fp16():
    """The step's autocast copies (and the ledger's row) hold 2 bytes per element of every nn.Linear weight of the
    reference decoder, as PyTorch counts them; the step is MemTracker's, op by op (amp_against_memtracker)."""
    torch = pytest.importorskip("torch")
    from memledger.pytorch.reference import RefConfig, make_model
    step, _ = amp_against_memtracker(2, 32)
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
