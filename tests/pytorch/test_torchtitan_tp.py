"""torchtitan's own tensor parallelism (its ``Llama3Model`` sharded by its own ``Model.parallelize`` as its trainer
does it, rank 0 of a fake world of 8) against memledger's :func:`memledger.step.torchtitan.tp_layer_bytes`: what one
layer saves on the rank, local shards only, with and without sequence parallelism."""
import pytest

pytest.importorskip("torch")

from memledger.core.symbols import t  # noqa: E402
from memledger.pytorch.compare import _block_rows, ledger_for, run_options  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402
from memledger.pytorch.torchtitan_step import missing, tp_layer_saved  # noqa: E402
from memledger.step.torchtitan import tp_layer_bytes  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=missing() or "")]

LOOP, TP = "bf16-pure-adamw", 8
LLAMA2_7B = dict(d=4096, H=32, F=11008, V=32000)
#: torchtitan's ``_8b`` widths (models/llama3/__init__.py l. 230-272).
LLAMA3_8B = dict(d=4096, H=32, F=14336, V=128256)
MiB = 2 ** 20


def booked(shape, B, S, sp, kv=None, megatron=False):
    """memledger's bytes of one layer on one of 8 ranks: torchtitan's layout, or Megatron's slice (every row's
    rank share)."""
    c = RefConfig(**shape, L=2, style="llama", n_kv_heads=kv)
    rows = _block_rows(c, run_options(c, LOOP))
    expr = sum(r.rank_bytes(True, sp) for r in rows) if megatron else tp_layer_bytes(rows, sp)
    return ledger_for(c, LOOP, B, S).evaluate(expr.subs(t, TP))


@pytest.mark.parametrize("sp", [False, True])
@pytest.mark.parametrize("shape, B, S, kv", [(dict(d=256, H=8, F=512, V=512), 2, 64, None),
                                             (dict(d=512, H=16, F=1376, V=1000), 1, 128, 8)])
def test_small_layer_on_rank_0_of_8(shape, B, S, kv, sp):
    assert tp_layer_saved(**shape, batch=B, seq=S, tp=TP, sequence_parallel=sp, n_kv_heads=kv) == \
        booked(shape, B, S, sp, kv)


@pytest.mark.parametrize("sp", [False, True])
def test_the_dtensor_backend_saves_the_same(sp):
    """``parallelism.spmd_backend = "partial_dtensor"`` (DTensors on the tp axis, counted by their local shards):
    the same bytes as the default ``spmd_types`` backend."""
    shape = dict(d=256, H=8, F=512, V=512)
    assert tp_layer_saved(**shape, batch=2, seq=64, tp=TP, sequence_parallel=sp, backend="partial_dtensor") == \
        booked(shape, 2, 64, sp)


@pytest.mark.parametrize("sp", [False, True])
def test_llama2_7b_width_and_the_56_mib(sp):
    """LLaMA-2 7B widths, B 1, S 4096, t 8: to the byte; with SP, 56 MiB a layer above Megatron's slice (the two
    gathered inputs whole, 2 x 32 MiB, where Megatron keeps 2 x 4 MiB); without SP, no difference."""
    got = tp_layer_saved(**LLAMA2_7B, batch=1, seq=4096, tp=TP, sequence_parallel=sp)
    assert got == booked(LLAMA2_7B, 1, 4096, sp)
    assert got - booked(LLAMA2_7B, 1, 4096, sp, megatron=True) == (56 * MiB if sp else 0)


@pytest.mark.parametrize("sp", [False, True])
def test_llama3_8b_width(sp):
    """torchtitan's Llama3-8B widths (GQA 32/8: one KV head a rank), B 1, S 256."""
    assert tp_layer_saved(**LLAMA3_8B, batch=1, seq=256, tp=TP, sequence_parallel=sp, n_kv_heads=8) == \
        booked(LLAMA3_8B, 1, 256, sp, 8)
