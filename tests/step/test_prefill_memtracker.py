"""The prefill op by op (memledger.step.prefill) equals MemTracker's run of generate's first forward on the
reference decoder (memledger.pytorch.prefill.generate_prefill) to the byte: every op's total (in order), each
block's peak, the peak and the total after it; small shapes and LLaMA-2 7B at B 1, S 4096 (SDPA and eager). Past four
blocks the prefill runs blocks 0, 1, L-2 and L-1 op by op and the others as one op (their KV cache): those four
blocks' ops and peaks are checked, and the peak and the total after it."""
import pytest

from memledger.step.prefill import LUMP, Prefill, explicit_blocks

torch = pytest.importorskip("torch")
from memledger.pytorch.compare import architecture_of  # noqa: E402
from memledger.pytorch.prefill import memtracker_generate_prefill  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402

pytestmark = pytest.mark.slow

SMALL = dict(d=64, L=2, H=8, F=96, V=100)
LLAMA2_7B = dict(d=4096, L=32, H=32, F=11008, V=32000)


def against_memtracker(shape, batch, seq, attention="sdpa", kv=None, dtype="bf16", keep=1, nf4=False):
    c = RefConfig(**shape, style="llama", attention=attention, rmsnorm="fused", softmax_fp32=attention == "eager",
                  n_kv_heads=kv)
    measured = memtracker_generate_prefill(c, batch, seq, dtype=dtype, logits_to_keep=keep, nf4=nf4)
    ours = Prefill(architecture_of(c), batch, seq, dtype, attention, keep, weights="nf4" if nf4 else "dense")
    assert ours.resident_bytes == measured["before"]        # weights, ids and inv_freq, from the parameter count
    theirs = [total for total, _ in measured["trace"]]
    rest, last = iter(theirs), None     # MemTracker samples after every ATen op; each total after an op of ours
    for total, layer, label, allocates in ours.moments:    # that allocates is one of them, in order (a repeated
        if allocates and total != last and layer != LUMP:  # total is one sample; the lump stands for many ops)
            assert any(total == t for t in rest), (layer, label, total)
            last = total
    bounds = [k for _, k in measured["marks"]] + [len(theirs)]
    for i in explicit_blocks(c.L):  # each block's largest total (the blocks run op by op)
        assert max(t for t, layer, _, _ in ours.moments if layer == i) == max(theirs[bounds[i]:bounds[i + 1]]), i
    assert ours.peak.bytes == measured["peak"]
    assert ours.after == measured["after"]
    return ours, measured


@pytest.mark.parametrize("attention,kv,dtype,keep", [
    ("sdpa", None, "bf16", 1), ("sdpa", 2, "bf16", 0), ("sdpa", None, "fp32", 1),
    ("eager", None, "bf16", 1), ("eager", 2, "bf16", 0), ("eager", 2, "fp32", 1)])
def test_small_shapes_op_by_op(attention, kv, dtype, keep):
    against_memtracker(SMALL, 2, 16, attention, kv, dtype, keep)


@pytest.mark.parametrize("shape,batch,seq,attention,kv,dtype,keep,nf4", [
    (SMALL, 1, 16, "eager", None, "bf16", 1, False),                     # B 1: matmul folds q as a view
    (dict(SMALL, head_dim=16), 2, 16, "sdpa", 2, "bf16", 1, False),      # a head size other than d/H
    (dict(SMALL, head_dim=16), 2, 16, "eager", 2, "bf16", 1, False),
    (dict(SMALL, qkv_bias=True), 2, 16, "sdpa", 2, "bf16", 1, True),     # Qwen2's QKV bias, NF4
    (SMALL, 3, 17, "eager", 4, "bf16", 3, False),                        # three kept positions: the head's copy
    (dict(SMALL, L=1), 1, 16, "eager", None, "fp32", 0, True),
    (dict(SMALL, L=7), 2, 16, "sdpa", 2, "bf16", 1, False),             # blocks 2..4 lumped
    (dict(SMALL, L=6), 2, 16, "eager", None, "bf16", 0, True)])
def test_refinements(shape, batch, seq, attention, kv, dtype, keep, nf4):
    against_memtracker(shape, batch, seq, attention, kv, dtype, keep, nf4)


@pytest.mark.parametrize("attention,kv", [("sdpa", None), ("eager", 2)])
def test_nf4_projections(attention, kv):
    against_memtracker(SMALL, 2, 16, attention, kv, nf4=True)


def test_the_peak_moves_to_the_scores_under_eager_attention():
    ours, _ = against_memtracker(SMALL, 2, 64, "eager")
    assert ours.peak.op.endswith("softmax")
    ours, _ = against_memtracker(SMALL, 2, 64, "sdpa")
    assert not ours.peak.op.endswith("softmax")


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_llama2_7b_at_4096(attention):
    ours, measured = against_memtracker(LLAMA2_7B, 1, 4096, attention)
    assert ours.peak.layer == 31


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_llama2_7b_nf4_at_4096(attention):
    against_memtracker(LLAMA2_7B, 1, 4096, attention, nf4=True)
