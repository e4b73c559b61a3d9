"""A parallel-residual block's program for the step timeline: GPT-NeoX's and Phi's.

GPT-NeoX (``use_parallel_residual``, ``modeling_gpt_neox.py``): x + attn(ln1(x)) + mlp(ln2(x)); Phi
(``modeling_phi.py``): x + attn(ln(x)) + mlp(ln(x)), one norm (``shared_norm``). The reference decoder's
``Block`` with ``parallel`` (:mod:`memledger.pytorch.reference`) runs them; this program follows MemTracker's
allocation log of it (PyTorch 2.13, CPU), checked by ``tests/step/test_parallel.py`` and ``test_parallel_slow.py``.
Selective recomputation re-runs the attention core as the sequential block does (its helpers); full recomputation
runs the block under a checkpoint (:data:`~memledger.step.block.POLICIES`) and re-runs its forward in backward.

Forward: norm 1, the fused QKV projection and the attention core as in the sequential block
(:mod:`memledger.step.block`), the output projection's output kept as a local (no residual add yet); norm 2
on the block input (GPT-NeoX; Phi's MLP reads norm 1's output), the MLP; then ``x + attn`` (a temporary) and
``+ mlp``, the block's output; the locals go when the block returns.

Backward: the sum's backward hands the same gradient ``dX_out`` to the skip, to the attention branch and to the
MLP branch. Autograd runs the MLP branch first (its nodes are the newer). GPT-NeoX: norm 2's input gradient is
added to ``dX_out`` in the block input's buffer (a new tensor; ``dX_out`` stays, the attention branch's), then
the attention branch runs and releases ``dX_out`` with the output projection's backward; norm 1's input gradient
is added last. Phi: the MLP's input gradient waits for the attention branch's, the two are summed (norm 1's
output gradient), norm 1 runs backward, and its input gradient is added to ``dX_out``, which the skip held.
"""
from .block import POLICIES, _attention, _linear_backward, _recompute_forward, attention_backward
from .norms import norm_backward, norm_forward
from .ops import BSF, CAUSAL_MASK, BSd, INPUT_GRADIENT, block_output, define_grads, dropout_ops, per_rank
from .structure import Shape
from .vocab import OpRole, Save

__all__ = ["parallel_backward", "parallel_forward"]


def _stats(c, k):
    return [f"LayerNorm {k} mean", f"LayerNorm {k} rstd"] if c.stats else []


def parallel_forward(p, c: Shape, policy=None):
    """One parallel block's forward (eager core): its input is live; its output is the next block's input.
    ``policy`` (:data:`~memledger.step.block.POLICIES`; default the shape's ``recompute``): under full
    recomputation (DROPPED) what the block would save are temporaries that die with their last reference (the
    norms' outputs are the block's locals ``h1``, ``h``: they live until it returns)."""
    core, rest = policy or POLICIES[c.recompute]
    kept, a = rest is Save.KEPT, c.dtype
    mark = "" if kept else " (checkpointed)"
    n1 = norm_forward(p, c, "1", "Q/K/V projection input", rest)
    # norm 1's output dies after the QKV projection unless saved, or (Phi) the MLP's input too
    merged, leftovers = _attention(p, c, core, rest, None if c.shared_norm else n1)
    attn = p.new("output projection output" + mark, BSd, a, "the attention branch, a local until the block returns")
    p.op("output projection", alloc=[attn], role=OpRole.OUTPUT_PROJECTION)
    if not kept:
        p.op("released", free=[merged])
    attn = _dropout(p, c, "attention", attn, kept)
    h = n1 if c.shared_norm else norm_forward(p, c, "2", "MLP input", rest)    # norm 2 reads the block input
    u = "GeLU input" if kept else p.new("up-projection output (checkpointed)", per_rank(c, BSF), a, "GeLU's input")
    g = "down-projection input" if kept else p.new("GeLU output (checkpointed)", per_rank(c, BSF), a,
                                                   "the down projection's input")
    p.op("up projection", alloc=[u], role=OpRole.UP_PROJECTION)
    p.op("GeLU", alloc=[g])
    if not kept:
        p.op("released", free=[u])
    mlp = p.new("down-projection output" + mark, BSd, a, "the MLP branch, a local until the block returns")
    p.op("down projection", alloc=[mlp], role=OpRole.DOWN_PROJECTION)
    if not kept:
        p.op("released", free=[g])
    mlp = _dropout(p, c, "MLP", mlp, kept)
    partial = p.new("x + attention" + mark, BSd, a, "the sum's first add, a temporary")
    p.op("x + attention", alloc=[partial])
    p.op("+ MLP: the block's output", alloc=[block_output(c)])
    p.op("block returns", free=[partial, attn, mlp] + leftovers + ([] if kept else [h]), role=OpRole.BLOCK_RETURNS)


def _dropout(p, c, where, branch, kept=True):
    """A branch's residual dropout (where the block has dropout): its mask is saved (under a checkpoint dropped
    at once: one op, whatever the mask), its output is the branch's value until the block returns, and the
    projection's output goes with its last reference."""
    if not c.dropout:
        return branch
    mark = "" if kept else " (checkpointed)"
    out = p.new(f"{where} residual dropout output" + mark, BSd, c.dtype, "the branch after its dropout, a local")
    if kept:
        dropout_ops(p, c, f"{where} residual", f"{where} residual dropout mask", out)
        p.op("released", free=[branch])
    else:
        mask = p.new(f"{where} residual dropout mask (dropped)", BSd, c.mask_dtype or c.dtype, "not kept")
        p.op(f"{where} residual dropout", alloc=[mask, out])
        p.op("released", free=[mask, branch])
    return out


def parallel_backward(p, c: Shape, share):
    """One parallel block's backward: ``dX_out`` (live) -> the previous block's; frees the block's saved tensors."""
    a, drop = c.dtype, c.dropout
    recomputed = c.recompute == "full"
    if recomputed:
        _recompute_forward(p, c, parallel_forward)
    gm = None
    if drop:
        gm = p.new("gradient through the MLP dropout", BSd, a, "dX times the mask")
        p.op("MLP residual dropout backward", alloc=[gm])
        p.op("mask released", free=["MLP residual dropout mask"])
    gdi = p.new("gradient of the down-projection input", per_rank(c, BSF), a, "dL/d(down input)")
    _linear_backward(p, c, "down projection backward", gdi, define_grads(p, ["down.weight", "down.bias"], c, share),
                     "down-projection input", [gm], recomputed, role=OpRole.DOWN_PROJECTION_BACKWARD)
    gu = p.new("gradient of the GeLU input", per_rank(c, BSF), a, "GeLU backward's output")
    p.op("GeLU backward", alloc=[gu])
    p.op("released", free=[gdi, "GeLU input"])
    up = define_grads(p, ["up.weight", "up.bias"], c, share)
    if c.shared_norm:       # norm 1's output is saved for the QKV projection's backward too: it stays
        gh = p.new("gradient of norm 1's output via the MLP", BSd, a, "the up projection's input gradient")
        _linear_backward(p, c, "up projection backward", gh, up, None, [gu], recomputed, role=OpRole.UP_PROJECTION_BACKWARD)
    else:
        gh = p.new("gradient of the MLP input", BSd, a, "the up projection's input gradient")
        _linear_backward(p, c, "up projection backward", gh, up, "MLP input", [gu], recomputed,
                         role=OpRole.UP_PROJECTION_BACKWARD)
        gn2 = p.new("gradient of norm 2's input", BSd, a, "norm 2 backward's output")
        p.op("norm 2 backward", alloc=[gn2] + define_grads(p, ["norm2.weight", "norm2.bias"], c, share))
        p.op("norm 2 released", free=[gh] + _stats(c, "2"))       # its input is norm 1's, kept
        gxm = p.new("gradient of the block input: skip and norm 2", BSd, a, "autograd's input buffer: a new sum")
        p.op("skip and norm 2 gradients summed", alloc=[gxm])
        p.op("released", free=[gn2])
    skip = [] if c.shared_norm else ["dX_out"]     # GPT-NeoX: the attention branch holds dX_out last
    if drop:
        ga = p.new("gradient through the attention residual dropout", BSd, a, "dX times the mask")
        p.op("attention residual dropout backward", alloc=[ga])
        p.op("mask released", free=["attention residual dropout mask"] + skip)
        gn1 = attention_backward(p, c, ga, share, [ga])
    else:
        gn1 = attention_backward(p, c, "dX_out", share, skip)
    if c.shared_norm:
        total = p.new("gradient of norm 1's output (both branches)", BSd, a, "the MLP's and Q/K/V's summed")
        p.op("norm 1 output gradients summed", alloc=[total])
        p.op("released", free=[gn1, gh])
        gn1, held = total, "dX_out"
    else:
        held = gxm
    gx1 = p.new("gradient of norm 1's input", BSd, a, "norm 1 backward's output")
    # a recomputed block's causal mask goes with norm 1's input, the last tensor its recomputation saved
    norm_backward(p, c, "1", gn1, gx1, define_grads(p, ["norm1.weight", "norm1.bias"], c, share),
                  also_free=[CAUSAL_MASK] if recomputed else [])
    p.op("residual gradients summed", alloc=[INPUT_GRADIENT])
    p.op("released", free=[gx1, held])
