"""What a ``torch.compile``-d reference block saves for backward, measured live on real tensors.

One :class:`~memledger.pytorch.reference.Block` compiled with ``backend="aot_eager_decomp_partition"``
(``torch/_dynamo/backends/debugging.py``: AOTAutograd with Inductor's decomposition table and
``min_cut_rematerialization_partition(..., compiler="inductor")``, the nodes run eagerly: no code
generation, no C++ compiler) or ``backend="inductor"`` (the same partitioner after Inductor's joint-graph
passes, ``torch/_inductor/compile_fx.py`` ``partition_fn``). AOTAutograd's ``CompiledFunction.forward``
hands the partitioned forward graph's saved outputs to ``ctx.save_for_backward``, where
``torch.autograd.graph.saved_tensors_hooks`` catch them: each storage counted once, the block's
parameters skipped, the block's input and the causal mask named.
"""
import torch

from .record import recorded
from .reference import RefConfig, Block

__all__ = ["BACKENDS", "compiled_saved", "eager_saved"]

BACKENDS = ("aot_eager_decomp_partition", "inductor")


def _block(c: RefConfig, dtype, seed):
    torch.manual_seed(seed)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        return Block(c)
    finally:
        torch.set_default_dtype(before)


def _saved(fn, block, c: RefConfig, dtype, batch, seq, seed):
    """[(bytes, dtype, shape, what)] of the storages ``fn(x, mask)`` saves; ``what``: "input", "mask" or ""."""
    torch.manual_seed(seed + 1)
    params = {p.untyped_storage().data_ptr() for p in block.parameters()}
    x = torch.randn(batch, seq, c.d, dtype=dtype, requires_grad=True)
    mask = torch.ones(seq, seq, dtype=torch.bool).triu(1) if c.kernel == "eager" else None
    named = {x.untyped_storage().data_ptr(): "input"}
    if mask is not None:
        named[mask.untyped_storage().data_ptr()] = "mask"
    seen = {}

    def pack(t):
        st = t.untyped_storage()
        if st.data_ptr() not in params and st.data_ptr() not in seen:
            seen[st.data_ptr()] = (st.nbytes(), str(t.dtype).replace("torch.", ""), tuple(t.shape),
                                   named.get(st.data_ptr(), ""))
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = fn(x, mask)
    y.float().sum().backward()          # the saved tensors are used: the compiled backward runs
    return sorted(seen.values(), key=lambda r: (-r[0], r[1], r[2], r[3]))


@recorded
def compiled_saved(c: RefConfig, dtype=torch.bfloat16, batch: int = 2, seq: int = 16, seed: int = 0,
                   backend: str = "aot_eager_decomp_partition") -> list:
    """[(bytes, dtype, shape, what), ...] one compiled block saves (largest first)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    torch._dynamo.reset()
    block = _block(c, dtype, seed)
    return _saved(torch.compile(block, backend=backend, fullgraph=True, dynamic=False), block, c, dtype, batch,
                  seq, seed)


@recorded
def eager_saved(c: RefConfig, dtype=torch.bfloat16, batch: int = 2, seq: int = 16, seed: int = 0) -> list:
    """The same, the block run eagerly."""
    block = _block(c, dtype, seed)
    return _saved(block, block, c, dtype, batch, seq, seed)
