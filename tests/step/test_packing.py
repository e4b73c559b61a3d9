"""Packed sequences in the step (memledger/step/packing.py) against PyTorch's MemTracker.

The reference decoder with ``packed=n`` (memledger/pytorch/packing.py) builds a (B, S, S) block-causal bool mask
once per forward and passes it to every block's SDPA, which converts it to an additive mask in the activation
dtype and saves it. One small shape here (every landmark, each phase's peak, the peak, each block's peaks and the
totals op by op inside the blocks equal MemTracker's to the byte under the CPU backend); more shapes and LLaMA-2
7B in tests/step/test_packing_slow.py.
"""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step

from packcheck import packed_against_memtracker
from stepcheck import GPT7B, landmarks_are_sums_of_rows


@pytest.mark.slow
def test_packed_step_is_memtrackers():
    """B = 2, two documents per row, two blocks: the step is MemTracker's, op by op; the rows it adds."""
    step, _ = packed_against_memtracker(2, 32, 2)
    rows = {r["name"]: r for r in step.rows}
    assert rows["L x packed attention mask (additive, B x 1 x S x S)"]["bytes"] == 2 * 2 * 32 * 32 * 2
    assert rows["document ids"]["bytes"] == 8 * 2 * 32


@pytest.mark.slow
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
    ({"tp": 2}, "cpu", "not for tensor parallelism"),
    ({"arch": GPT7B, "zero_stage": 3, "dp": 8}, "article", "not for ZeRO-3"),
])
def test_refused_in_one_line(changes, backend, words):
    ledger = Ledger(**{"arch": "llama2-7b", "seq_len": 4096, "packed": 4, **changes})
    with pytest.raises(ValueError, match=words):
        ledger.step(backend)


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_recomputation_keeps_the_bool_mask_not_the_additive_one(recompute):
    """Under a checkpoint SDPA's additive mask is dropped with the call (made again in backward), and every
    block's checkpoint frame holds the (B, S, S) bool mask: after the forward pass the bool mask is a row, no
    additive mask is."""
    B_, S_ = 2, 1024
    step = Step(Ledger("llama2-7b", batch_size=B_, seq_len=S_, packed=4, recompute=recompute, overhead_bytes=0),
                "cpu")
    after = {r["name"]: r["bytes"] for r in step.rows if "after forward" in r["live"]}
    assert after["block-causal mask (B, S, S) bool"] == B_ * S_ * S_
    assert not any("additive" in name for name in after)
    landmarks_are_sums_of_rows(step)


@pytest.mark.slow
def test_offloading_puts_the_additive_masks_on_the_host():
    """Under activation offloading each block's additive mask is saved, hence copied to the host, once per block."""
    B_, S_ = 2, 1024
    step = Step(Ledger("llama2-7b", batch_size=B_, seq_len=S_, packed=4, offload_activations=True,
                       overhead_bytes=0), "cpu")
    rows = {r["name"]: r for r in step.rows}
    row = rows["L x packed attention mask (additive, B x 1 x S x S), host copy"]
    assert row["bytes"] == 32 * B_ * S_ * S_ * 2 and row["device"] == "cpu"
    landmarks_are_sums_of_rows(step)


def test_offloaded_checkpoints_put_the_bool_masks_on_the_host():
    """Under full recomputation with offloading the checkpoint saves its inputs, the block's and the bool mask, as
    host copies (one per block); on the GPU the bool mask goes as the forward returns."""
    B_, S_ = 2, 1024
    step = Step(Ledger("llama2-7b", batch_size=B_, seq_len=S_, packed=4, offload_activations=True, recompute="full",
                       overhead_bytes=0), "cpu")
    rows = {r["name"]: r for r in step.rows}
    assert rows["L x block-causal mask (B, S, S) bool, host copy"]["bytes"] == 32 * B_ * S_ * S_
    assert "after forward" not in rows["block-causal mask (B, S, S) bool"]["live"]
    landmarks_are_sums_of_rows(step)


def test_unpacked_step_unchanged():
    """``packed`` 0 (the default) is the step as before: no mask, no document ids."""
    rows = {r["name"] for r in Step(Ledger("llama2-7b", seq_len=4096), "cpu").rows}
    assert not any("packed" in n or "document" in n for n in rows)
