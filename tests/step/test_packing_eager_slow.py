"""Packed sequences in the eager core against MemTracker (slow): grouped- and multi-query cores, selective and
full recomputation, PyTorch's own difference between a packed and an unpacked run, and LLaMA-2 7B (B 1, S 4096,
4 documents per row) and the article's 7B GPT at the same shape."""
import pytest

from packcheck import packed_against_memtracker

pytestmark = pytest.mark.slow

LLAMA2_7B = dict(L_=32, d=4096, H=32, F_=11008, V_=32000)
GPT_7B = dict(L_=32, d=4096, H=32, F_=16384, V_=32000, style="gpt")


@pytest.mark.parametrize("B_,S_,n,L_,kw", [
    (2, 32, 2, 2, dict(attention="eager", kv=2)), (1, 32, 4, 3, dict(style="gpt", kv=1)),
    (2, 48, 3, 3, dict(attention="eager", loop="fp32-adamw")), (1, 32, 2, 2, dict(style="gpt", loss_chunks=4)),
    (2, 32, 2, 2, dict(style="gpt", dropout=0.1))])
def test_packed_eager_step_is_memtrackers(B_, S_, n, L_, kw):
    packed_against_memtracker(B_, S_, n, L_, **kw)


@pytest.mark.parametrize("B_,S_,n,L_,kw", [
    (2, 32, 2, 2, dict(attention="eager")), (1, 32, 4, 5, dict(attention="eager", kv=2)),
    (2, 32, 2, 3, dict(style="gpt", dropout=0.1)), (1, 48, 3, 2, dict(style="gpt", kv=1))])
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_packed_eager_recomputed_is_memtrackers(B_, S_, n, L_, kw, recompute):
    packed_against_memtracker(B_, S_, n, L_, recompute=recompute, trace=False, **kw)


def test_what_eager_packing_adds_is_what_pytorch_allocates():
    """PyTorch's own difference after the forward pass between a packed and an unpacked eager run: the shared bool
    mask grows from (S, S) to (B, S, S), and the (B, S) int64 document ids."""
    pytest.importorskip("torch")
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    B_, S_ = 2, 32
    runs = [memtracker_step(RefConfig(64, 2, 4, 160, 1000, "llama", attention="eager", packed=n), "bf16-pure-adamw",
                            B_, S_)["after forward"] for n in (2, 0)]
    assert runs[0] - runs[1] == (B_ - 1) * S_ * S_ + 8 * B_ * S_


@pytest.mark.live(2)  # full-scale repeats of the small grids' proofs: n run PyTorch under --pytorch=live
@pytest.mark.parametrize("kw", [dict(LLAMA2_7B, attention="eager"), dict(LLAMA2_7B, attention="eager",
                                recompute="selective"), dict(LLAMA2_7B, attention="eager", recompute="full"), GPT_7B])
def test_7b_packed_eager_is_memtrackers(kw):
    packed_against_memtracker(1, 4096, 4, trace=False, **kw)
