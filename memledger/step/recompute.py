"""Full recomputation: a checkpointed block's forward, and its backward that recomputes it first.

With ``torch.utils.checkpoint.checkpoint(block, x, mask, use_reentrant=False)``
the forward keeps only the block's input; every intermediate dies as soon as
its Python reference does (read off MemTracker's log of the reference). In
backward the block's forward is re-run with saving on, and stops early once
the last tensor its backward needs exists (``torch/utils/checkpoint.py``,
``_StopRecomputationError``); then the usual backward runs
(:func:`memledger.step.ops.layer_backward`).

Known difference: a recomputed tensor is freed when backward unpacks it,
which can be a few ops before its node is released; the programs free it at
the release, so a peak inside a recomputed block can be overestimated by a
tensor or two (``tests/step/test_timeline.py`` bounds it).
"""
from .block import layer_backward, layer_forward
from .selective import dropped_core
from .ops import BSd, BSF, block_output, io_names, qkv_width, widths_of
from ..core.symbols import B, H, S
from .norms import norm_forward
from .vocab import Kind, Lifetime, Save


def checkpointed_forward(p, c):
    """A block's forward under a non-reentrant checkpoint: only its input stays (as "layer input")."""
    a = c.dtype
    n1 = norm_forward(p, c, "1", None, Save.DROPPED)
    qkv = p.new("QKV projection output (checkpointed)", (B, S, qkv_width(c.gqa, c.head_dim)), a, "q, k, v are views of it")
    p.op("QKV projection", alloc=[qkv])
    p.op("released", free=[n1])
    if c.attention == "flash":
        out = p.new("attention output (checkpointed)", widths_of(c)[0], a, "the flash kernel's output")
        lse = p.new("log-sum-exp (dropped)", (B, H, S), "fp32", "not kept")
        p.op("flash attention", alloc=[out, lse])
        p.op("released", free=[lse])
        pin, leftovers = None, [qkv, out]
    else:
        out4 = dropped_core(p, c)
        pin = p.new("output projection input (checkpointed)", widths_of(c)[0], a, "heads merged (a copy)")
        p.op("heads merged", alloc=[pin])
        leftovers = [qkv, out4]
    po = p.new("output projection output (checkpointed)", BSd, a, "before the residual add")
    xm = p.new("attention residual sum (checkpointed)", BSd, a, "x + attention")
    p.op("output projection", alloc=[po])
    p.op("released", free=[_residual_add(p, c, "", pin, po, xm)])
    n2 = norm_forward(p, c, "2", None, Save.DROPPED)
    if c.gpt:
        u = p.new("up-projection output (checkpointed)", BSF, a, "GeLU's input")
        g = p.new("GeLU output (checkpointed)", BSF, a, "the down projection's input")
        p.op("up projection", alloc=[u])
        p.op("GeLU", alloc=[g])
        p.op("released", free=[u])
        last = g
    else:
        gt = p.new("gate output (checkpointed)", BSF, a, "SiLU's input")
        sl = p.new("SiLU output (checkpointed)", BSF, a, "a factor")
        up = p.new("up-projection output (checkpointed)", BSF, a, "a factor")
        pr = p.new("SiLU(gate) * up (checkpointed)", BSF, a, "the down projection's input")
        p.op("gate projection", alloc=[gt])
        p.op("SiLU", alloc=[sl])
        p.op("released", free=[gt])
        p.op("up projection", alloc=[up])
        p.op("SiLU(gate) * up", alloc=[pr])
        p.op("released", free=[sl, up])
        last = pr
    dn = p.new("down-projection output (checkpointed)", BSd, a, "before the residual add")
    p.op("down projection", alloc=[dn])
    held = _residual_add(p, c, "MLP ", last, dn, block_output(c))
    p.op("block returns", free=[held, xm] + leftovers + [n2])


def _residual_add(p, c, prefix, projection_input, projection_output, result):
    """A projection's output (after its residual dropout, whose mask is dropped) added to the residual stream
    into ``result``; returns the tensor the add leaves held: the dropout output, or the projection output."""
    if not c.dropout:
        p.op("residual add", free=[projection_input], alloc=[result])
        return projection_output
    mask = p.new(f"{prefix}residual dropout mask (dropped)", BSd, c.mask_dtype or c.dtype, "not kept")
    out = p.new(f"{prefix}residual dropout output (checkpointed)", BSd, c.dtype, "before the add")
    p.op("released", free=[projection_input])
    p.op("residual dropout", alloc=[mask, out])
    p.op("residual add", free=[mask, projection_output], alloc=[result])
    return out


def saved(p, name) -> bool:
    """Whether ``name`` is one of this block's saved tensors."""
    return isinstance(name, str) and p.tensors[name].lifetime is Lifetime.SAVED


def recompute_backward(p, c, share):
    """Recompute the block's forward with saving, stopping after its last saved tensor (the transients
    still alive then are dropped), then run its backward."""
    q = p.fork()
    layer_forward(q, c)
    last = max(i for i, op in enumerate(q.ops) if any(saved(p, n) for n in op.allocs))
    alive = []
    for op in q.ops[:last + 1]:
        alive = [n for n in alive if n not in op.frees] + list(op.allocs)
    p.ops.extend(q.ops[:last + 1])
    x = io_names(c)[0]
    p.op("recomputation stops", free=[n for n in alive if n != x and p.tensors[n].kind is Kind.TRANSIENT])
    layer_backward(p, c, share, recomputed=True)
