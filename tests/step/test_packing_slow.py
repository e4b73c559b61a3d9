"""Packed sequences against MemTracker (slow): more small shapes (B = 1, lumped blocks, FP32), PyTorch's own
difference between a packed and an unpacked run, and LLaMA-2 7B (B 1, S 4096, 4 documents per row)."""
import pytest

from memledger.core.symbols import B, L, S
from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step

from packcheck import packed_against_memtracker

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("B_,S_,n,L_,loop", [(1, 32, 4, 5, "bf16-adamw"), (2, 48, 3, 3, "fp32-adamw")])
def test_packed_step_is_memtrackers(B_, S_, n, L_, loop):
    step, _ = packed_against_memtracker(B_, S_, n, L_, loop=loop)
    rows = {r["name"]: r for r in step.rows}
    assert rows["L x packed attention mask (additive, B x 1 x S x S)"]["bytes"] == \
        L_ * B_ * S_ * S_ * (4 if loop == "fp32-adamw" else 2)


@pytest.mark.parametrize("B_,chunks,impl", [(2, 4, "torchtune"), (1, 2, "litgpt")])
def test_packed_with_a_chunked_loss(B_, chunks, impl):
    """The bool mask dies as the decoder returns, after the last chunk's LM head."""
    packed_against_memtracker(B_, 32, 2, loss_chunks=chunks, loss_impl=impl)


@pytest.mark.parametrize("B_,S_,n,L_,kw", [(2, 32, 2, 3, {}), (1, 32, 4, 5, dict(kv=2)),
                                          (2, 48, 3, 2, dict(loop="fp32-adamw"))])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_packed_recomputed_is_memtrackers(B_, S_, n, L_, kw, recompute):
    """Under a checkpoint (the attention core's or the block's) SDPA's additive mask is dropped with the call and
    made again in backward; every checkpoint frame holds the bool mask, so it lives until block 0's backward."""
    packed_against_memtracker(B_, S_, n, L_, recompute=recompute, trace=False, **kw)


@pytest.mark.parametrize("B_,S_,n,L_,loop", [(2, 32, 2, 2, "bf16-pure-adamw"), (1, 32, 4, 3, "fp32-adamw")])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_packed_offloaded_is_memtrackers(B_, S_, n, L_, loop, recompute):
    """Under save_on_cpu each block's additive mask is a host copy, copied back for the flash kernel's backward;
    under full recomputation the checkpoint saves the bool mask (a host copy per block), copied back with the
    block's input for the re-run."""
    packed_against_memtracker(B_, S_, n, L_, loop=loop, offload=True, recompute=recompute,
                              trace=recompute == "none")


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


@pytest.mark.parametrize("recompute,offload", [("none", False), ("selective", False), ("full", False), ("none", True),
                                               ("full", True)])
def test_llama2_7b_packed_is_memtrackers(recompute, offload):
    packed_against_memtracker(1, 4096, 4, L_=32, d=4096, H=32, F_=11008, V_=32000, trace=False, recompute=recompute,
                              offload=offload)
