"""Packed sequences in the step (memledger/step/packing.py) against PyTorch's MemTracker.

The reference decoder with ``packed=n`` (memledger/pytorch/packing.py) builds a (B, S, S) block-causal bool mask
once per forward and passes it to every block's SDPA, which converts it to an additive mask in the activation
dtype and saves it. Every landmark, each phase's peak, the peak, each block's peaks and (small shapes) the totals
op by op inside the blocks equal MemTracker's to the byte under the CPU backend. LLaMA-2 7B: tests/step/
test_packing_7b.py (slow).
"""
import pytest

from memledger.core.symbols import B, L, S
from memledger.ledger.ledger import Ledger
from memledger.step.timeline import LANDMARKS, Step

from stepcheck import GPT7B, block_totals_agree, landmarks_are_sums_of_rows


def packed_against_memtracker(B_, S_, n, L_=2, d=64, H=4, F_=160, V_=1000, loop="bf16-pure-adamw", kv=None,
                              trace=True):
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(d, L_, H, F_, V_, "llama", packed=n, n_kv_heads=kv)
    measured = memtracker_step(c, loop, B_, S_, blocks=True, trace=trace)
    step = Step(Ledger(architecture_of(c), batch_size=B_, seq_len=S_, recipe=loop, overhead_bytes=0, packed=n),
                "cpu")
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


@pytest.mark.parametrize("B_,S_,n,L_,loop", [(2, 32, 2, 2, "bf16-pure-adamw"), (1, 32, 4, 5, "bf16-adamw"),
                                             (2, 48, 3, 3, "fp32-adamw")])
def test_packed_step_is_memtrackers(B_, S_, n, L_, loop):
    """Small shapes, B = 1 and B > 1, lumped blocks (L = 5), BF16 and FP32: the step is MemTracker's, op by op."""
    step, _ = packed_against_memtracker(B_, S_, n, L_, loop=loop)
    rows = {r["name"]: r for r in step.rows}
    assert rows["L x packed attention mask (additive, B x 1 x S x S)"]["bytes"] == \
        L_ * B_ * S_ * S_ * (4 if loop == "fp32-adamw" else 2)
    assert rows["document ids"]["bytes"] == 8 * B_ * S_


def test_what_packing_adds_is_what_pytorch_allocates():
    """PyTorch's own difference between a packed and an unpacked run after the forward pass: one additive
    (B, 1, S, S) BF16 mask per block and the (B, S) int64 document ids; the (B, S, S) bool mask is gone."""
    pytest.importorskip("torch")
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    B_, S_, L_ = 2, 32, 2
    packed = memtracker_step(RefConfig(64, L_, 4, 160, 1000, "llama", packed=2), "bf16-pure-adamw", B_, S_)
    plain = memtracker_step(RefConfig(64, L_, 4, 160, 1000, "llama"), "bf16-pure-adamw", B_, S_)
    assert packed["after forward"] - plain["after forward"] == L_ * B_ * S_ * S_ * 2 + 8 * B_ * S_
    step = Step(Ledger("llama2-7b", seq_len=64, packed=2, overhead_bytes=0), "cpu")
    formula = {r["name"]: r["formula"] for r in step.rows}["L x packed attention mask (additive, B x 1 x S x S)"]
    assert formula == str(2 * B * L * S**2)


def test_varlen_books_no_mask():
    """The cuda backend (flash-attention varlen) books position ids and cu_seqlens, no mask: its peak exceeds the
    unpacked step's by those inputs only."""
    packed = Step(Ledger("llama2-7b", seq_len=4096, packed=4, overhead_bytes=0), "cuda")
    plain = Step(Ledger("llama2-7b", seq_len=4096, overhead_bytes=0), "cuda")
    rows = {r["name"]: r["bytes"] for r in packed.rows}
    assert rows["position ids"] == 8 * 4096 and rows["cu_seqlens"] == 4 * (4 + 1)
    assert not any("mask" in name for name in rows)
    assert packed.peak.bytes - plain.peak.bytes == 8 * 4096 + 4 * 5


@pytest.mark.parametrize("changes,backend,words", [
    ({}, "article", "article backend's eager attention"),
    ({"recompute": "full"}, "cpu", "not for recomputation"),
    ({"arch": GPT7B}, "cpu", "not for GPT blocks"),
    ({"tp": 2}, "cpu", "not for tensor parallelism"),
])
def test_refused_in_one_line(changes, backend, words):
    ledger = Ledger(**{"arch": "llama2-7b", "seq_len": 4096, "packed": 4, **changes})
    with pytest.raises(ValueError, match=words):
        ledger.step(backend)


def test_unpacked_step_unchanged():
    """``packed`` 0 (the default) is the step as before: no mask, no document ids."""
    rows = {r["name"] for r in Step(Ledger("llama2-7b", seq_len=4096), "cpu").rows}
    assert not any("packed" in n or "document" in n for n in rows)
