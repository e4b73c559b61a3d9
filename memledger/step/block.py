"""One block's program for the step timeline, written once: its forward under a save policy, and its backward.

The GPT block (LayerNorm, fused QKV, eager attention or a flash kernel, GeLU MLP, dropout) and the LLaMA
block (RMSNorm, SwiGLU) of the reference decoder (:mod:`memledger.pytorch.reference`). Python locals set
the lifetimes: q, k, v and the attention output live until the block returns; autograd releases a node's
saved tensors after the node ran; nn.Linear's backward writes the input gradient first (addmm, with a
bias) or the weight gradient first (mm, without).

The save policy, the ledger's ``recompute`` (:data:`POLICIES`), says what becomes of the tensors the
forward saves for backward, per region (:class:`~memledger.step.vocab.Save`): ``none`` keeps them all (the
rows of :func:`memledger.activations.inventory.inventory`). ``selective`` (Korthikanti et al. 2022, Sec. 5)
runs the attention core under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: in forward
its tensors are dropped with their last reference, the checkpoint holding q, k and v (the Q, K and V rows,
views of the fused projection's output); in backward, once autograd unpacks a tensor the core saved (``@
v``'s), the core is recomputed with saving up to its last saved tensor (``_StopRecomputationError``,
``torch/utils/checkpoint.py``), and the checkpoint's frame (q, k, v, block 0's causal mask) goes after
``QK^T``'s backward; a flash kernel is re-run whole. ``full`` runs the whole block under the checkpoint,
which keeps only its input ("layer input"); its backward re-runs the forward with saving up to the last
tensor the backward needs, drops the temporaries alive then, and runs the backward (a recomputed tensor is
freed when unpacked, a few ops before the program frees it: a peak inside a recomputed block can be
overestimated by a tensor or two).

Under a library's code (``implementation`` hf or litgpt) the checkpointed block frees each tensor where that
library's Python drops its last reference (:mod:`memledger.step.hf`, :mod:`memledger.step.litgpt`).

Where PyTorch's order differs between saving and dropping, the program says so where it happens. Read off
MemTracker's allocation log of the reference decoder (PyTorch 2.13, CPU); checked against it by
``tests/step/test_timeline.py`` and ``tests/step/test_selective.py``.
"""
from collections import namedtuple

from ..core.symbols import B, H, S
from . import gpt_style, hf, litgpt, packing
from .families import ALIBI_INPUT
from .norms import norm_backward, norm_forward
from .ops import (BHSS, CAUSAL_MASK, INPUT_GRADIENT, BSd, BSF, Ref, block_output, define_grads, dropout_ops, per_rank,
                  residual_names, qkv_width, widths_of)
from .structure import Shape
from .vocab import Lifetime, OpRole, Save, Scope

__all__ = ["POLICIES", "Core", "attention_backward", "attention_core", "block_backward", "block_forward",
           "flash_attention"]

#: The save policy of each ``recompute``: what the forward does with (the attention core's, the rest's) tensors.
POLICIES = {"none": (Save.KEPT, Save.KEPT), "selective": (Save.DROPPED, Save.KEPT),
            "full": (Save.DROPPED, Save.DROPPED)}
#: How a temporary standing for a saved tensor is marked.
MARKS = {Save.KEPT: "", Save.DROPPED: " (checkpointed)", Save.RECOMPUTED: " (recomputed)"}


#: The attention core's tensors its backward reads and frees: the q, k, v its matmuls read (None where they read
#: the views in place), the probabilities, the dropout's mask and output (None without dropout), and what goes
#: with the checkpoint's frame after ``QK^T``'s backward.
Core = namedtuple("Core", "q k v probs mask dropped frame")


def block_forward(p, c: Shape, policy=None):
    """One block's forward under ``policy`` ((core, rest) :class:`Save`; default: the shape's ``recompute``,
    :data:`POLICIES`). Its input is live; its output is the next block's input."""
    core, rest = policy or POLICIES[c.recompute]
    kept, a = rest is Save.KEPT, c.dtype
    x, xm = residual_names(c)
    n1 = norm_forward(p, c, "1", "Q/K/V projection input", rest)
    pin, leftovers, *layer_locals = _attention(p, c, core, rest, n1)
    layer_locals = layer_locals[0] if layer_locals else []
    po = p.new("output projection output" + MARKS[rest], BSd, a, "the attention branch before the residual add")
    if not kept:
        xm = p.new("attention residual sum (checkpointed)", BSd, a, "x + attention")
    p.op("output projection", alloc=[po], role=OpRole.OUTPUT_PROJECTION)
    lit = c.implementation == "litgpt" and not kept     # LitGPT's Block.forward under its checkpoint
    if (c.hf or lit) and not kept:      # the attention returns: its locals go (q, k, v, SDPA's output, ...)
        p.op("attention returns", free=leftovers)
        leftovers = []
    if lit:     # Block.forward's x_normed lives until norm_2 replaces it, attention_output until it returns
        p.op("residual add", alloc=[xm])
        n2 = norm_forward(p, c, "2", "MLP input", rest)
        p.op("released", free=[n1])
        leftovers = [po]
    else:
        held = _residual(p, c, rest, "attention residual", pin, po, xm)
        p.op("residual done" if kept else "released", free=[held])
        n2 = norm_forward(p, c, "2", "MLP input", rest)
    gate, up, h = _mlp_forward(p, c, rest, lit)
    dn = p.new("down-projection output" + MARKS[rest], BSd, a, "the MLP branch before the residual add")
    p.op("down projection", alloc=[dn], role=OpRole.DOWN_PROJECTION)
    if c.hf and not kept:               # LlamaMLP.forward returns (its product goes), hidden_states = its output
        p.op("MLP returns", free=[h, n2])
        h = n2 = None
    if lit:
        p.op("MLP returns", free=[gate, up, h])
        h = None
    held = _residual(p, c, rest, "MLP residual", h, dn, block_output(c))
    temporaries = [n for n in (xm, n2) + (() if not kept else (x,)) if n and p.tensors[n].lifetime is Lifetime.TEMPORARY]
    if c.hf and x in temporaries:       # LlamaModel.forward holds block 0's input (inputs_embeds) until it returns
        temporaries = [Ref(Scope.NOT_FIRST, n) if n == x else n for n in temporaries]
    p.op("block returns", free=[held] + leftovers + layer_locals + temporaries, role=OpRole.BLOCK_RETURNS)


def _mlp_forward(p, c: Shape, rest, lit):
    """The MLP up to the down projection's input: GPT's up projection and GeLU, LitGPT's LLaMAMLP under its
    checkpoint, or LLaMA's gate, SiLU, up projection and product. Under ``rest`` KEPT each tensor saved for backward
    is its row; DROPPED, a checkpointed temporary going with its last reference. Returns (gate, up, the down
    projection's input): LitGPT's gate and up go when its MLP returns; GPT's MLP has neither (None)."""
    kept, a = rest is Save.KEPT, c.dtype

    def saved(row, dropped, why):
        """A tensor the block saves: its row where kept, a checkpointed temporary where dropped."""
        return row if kept else p.new(dropped, per_rank(c, BSF), a, why)

    def release(*names):
        """Free the temporaries among ``names`` (the rows stay for backward)."""
        names = [n for n in names if n and p.tensors[n].lifetime is Lifetime.TEMPORARY]
        if names:
            p.op("released", free=names)
    if c.gpt:
        u = saved("GeLU input", "up-projection output (checkpointed)", "GeLU's input")
        h = saved("down-projection input", "GeLU output (checkpointed)", "the down projection's input")
        p.op("up projection", alloc=[u], role=OpRole.UP_PROJECTION)
        p.op("GeLU", alloc=[h])
        release(u)
        return None, None, h
    if lit:     # LLaMAMLP.forward (litgpt/model.py l. 827-831): fc_1, fc_2, SiLU, the product; its locals until proj
        gate, up, silu, h = (p.new(f"{n} (checkpointed)", per_rank(c, BSF), a, "a local of LLaMAMLP.forward")
                             for n in ("fc_1 output", "fc_2 output", "SiLU output", "SiLU(fc_1) * fc_2"))
        p.op("fc_1", alloc=[gate], role=OpRole.GATE_PROJECTION)
        p.op("fc_2", alloc=[up], role=OpRole.UP_PROJECTION)
        p.op("SiLU", alloc=[silu])
        p.op("SiLU(fc_1) * fc_2", alloc=[h])
        p.op("released", free=[silu])
        return gate, up, h
    gate = saved("gate output", "gate output (checkpointed)", "SiLU's input")
    silu = saved("SiLU output", "SiLU output (checkpointed)", "a factor")
    up = saved("up-projection output", "up-projection output (checkpointed)", "a factor")
    h = saved("down-projection input", "SiLU(gate) * up (checkpointed)", "the down projection's input")
    p.op("gate projection", alloc=[gate], role=OpRole.GATE_PROJECTION)
    p.op("SiLU", alloc=[silu])
    release(gate)
    p.op("up projection", alloc=[up], role=OpRole.UP_PROJECTION)
    p.op("SiLU(gate) * up", alloc=[h])
    release(silu, up)
    return gate, up, h


def _attention(p, c, core, rest, n1):
    """The fused QKV projection and the attention core, up to the output projection's input; returns that
    input's name and the locals freed when the block returns (the projection's output, the core's)."""
    a = c.dtype
    BSq = widths_of(c)[0]
    views = None          # q, k and v, views of the projection's output, are the saved rows Q, K and V
    if core is Save.KEPT and c.attention == "flash":
        views = "QKV projection (q, k, v stay views of it)"
    elif core is Save.KEPT and c.single and not c.gqa:
        views = "QKV projection (B = 1: q, k, v stay views of it)"
    elif core is Save.DROPPED and rest is Save.KEPT:
        views = "QKV projection (q, k, v: views the checkpoint keeps)"
    qkv = None
    if c.implementation == "litgpt" and rest is Save.DROPPED:      # LitGPT's Block under its checkpoint
        return litgpt.attention_checkpointed(p, c)
    if c.implementation == "litgpt":    # the fused projection and LitGPT's rotary code (memledger.step.litgpt)
        litgpt.qkv_forward(p, c)
        litgpt.flash(p, c)
        return "output projection input", []
    if c.hf and rest is Save.DROPPED:   # transformers' layer under its checkpoint: LlamaAttention.forward's locals
        locals_ = list(hf.qkv_forward(p, c, dropped=True))
        if c.attention == "flash":
            locals_.append(flash_attention(p, c, core, whole_block=True))
            return n1, locals_
        pin, held = hf.eager_core_checkpointed(p, c)
        return n1, locals_ + [pin], held
    if c.hf:                # transformers: q_proj, k_proj, v_proj and its rotary code (memledger.step.hf)
        hf.qkv_forward(p, c)
    elif views:
        p.op(views, alloc=["Q", "K", "V"], role=OpRole.QKV_PROJECTION)
    else:
        qkv = p.new("QKV projection output" + MARKS[rest], (B, S, qkv_width(c)), a,
                    "the fused projection's output, alive while the block's q, k, v views are")
        p.op("QKV projection", alloc=[qkv], role=OpRole.QKV_PROJECTION)
        if rest is Save.DROPPED:
            p.op("released", free=[n1])
    if c.attention == "flash":
        out = flash_attention(p, c, core, whole_block=rest is Save.DROPPED)
        return (None, [qkv, out]) if rest is Save.DROPPED else (out, [])
    if c.hf:                # transformers' eager_attention_forward
        hf.eager_core(p, c)
        return "output projection input", []
    out = attention_core(p, c, core)
    if rest is Save.DROPPED:
        merged = p.new("output projection input (checkpointed)", BSq, a, "heads merged (a copy)")
        p.op("heads merged", alloc=[merged])
    else:
        merged = "output projection input"
        p.op("heads merged (a copy)", alloc=[merged])
    return merged, [n for n in (qkv, out) if n]


def _residual(p, c, save, where, consumed, branch, result):
    """A branch's output (after its dropout) added to the residual stream into ``result``; returns the tensor the
    add leaves held (the dropout's output, or the branch's). ``consumed``: the branch projection's input, which
    a checkpointed block drops once the projection has run."""
    kept = save is Save.KEPT
    if not c.dropout:
        p.op("residual add", free=[None if kept else consumed], alloc=[result])
        return branch
    if kept:
        out = p.new(f"{where} dropout output", BSd, c.dtype, "the dropout's output, until the add consumes it")
        dropout_ops(p, c, where, f"{where} dropout mask", out)
        p.op("residual add", free=[branch], alloc=[result])
        return out
    short = "" if where == "attention residual" else "MLP "
    mask = p.new(f"{short}residual dropout mask (dropped)", BSd, c.mask_dtype or c.dtype, "not kept")
    out = p.new(f"{short}residual dropout output (checkpointed)", BSd, c.dtype, "before the add")
    p.op("released", free=[consumed])
    p.op("residual dropout", alloc=[mask, out])          # one op under the checkpoint, whatever the mask
    p.op("residual add", free=[mask, branch], alloc=[result])
    return out


def flash_attention(p, c, save, whole_block=False):
    """The flash kernel: its output (laid out as the merged heads) and an FP32 log-sum-exp of B*H*S. KEPT:
    both saved, returns the output; DROPPED (``whole_block``: the block's checkpoint, else the core's): the
    log-sum-exp goes at once, returns the output; RECOMPUTED (its backward reads both): returns both."""
    out, lse = "output projection input", "softmax log-sum-exp"
    if save is Save.KEPT:
        scalars, _ = packing.additive_mask(p, c)      # packed rows: SDPA's additive mask (memledger.step.packing)
        p.op("flash attention", alloc=[out, lse], free=[scalars])
        return out
    scalars, additive = packing.additive_mask(p, c, MARKS[save])
    if save is Save.RECOMPUTED:
        out = p.new("flash output (recomputed)", widths_of(c)[0], c.dtype,
                    "the re-run kernel's output (its backward reads it)")
        lse = p.new("softmax log-sum-exp (recomputed)", per_rank(c, (B, H, S)), "fp32",
                    "the re-run kernel's statistics")
        p.op("flash attention recomputed", alloc=[out, lse], free=[scalars])
        return [out, lse, additive]
    lse = p.new("log-sum-exp (dropped)", per_rank(c, (B, H, S)), "fp32",
                "not kept: the checkpointed call recomputes it")
    if whole_block:
        out = p.new("attention output (checkpointed)", widths_of(c)[0], c.dtype, "the flash kernel's output")
        p.op("flash attention", alloc=[out, lse], free=[scalars])
        p.op("released", free=[lse, additive])
    else:
        p.op("flash attention (checkpointed; its output laid out as the merged heads)", alloc=[out, lse],
             free=[scalars])
        p.op("log-sum-exp dropped", free=[lse, additive])
    return out


def attention_core(p, c, save):
    """The eager core: the q, k (and v) copies the batched matmuls read, the S x S scores, softmax, dropout,
    ``@ v``. KEPT: the copies, probabilities and dropout tensors are the saved rows; returns the (B, H, S, d_h)
    output, a local until the block returns. DROPPED: each dies with its last reference; returns the output.
    RECOMPUTED: re-run up to ``@ v``'s inputs; returns the :class:`Core` its backward reads. q, k, v (views
    of the fused projection's output) are live."""
    a, drop, gqa = c.dtype, c.attention_dropped, c.gqa
    kept, dropped, again = save is Save.KEPT, save is Save.DROPPED, save is Save.RECOMPUTED
    in_place = c.single and not gqa                  # B = 1, multi-head: the matmuls read the views
    BSq, mark = widths_of(c)[0], MARKS[save]

    def local(name, shape=None, dtype=a, why="a local of the core"):
        return p.new(name + mark, shape or per_rank(c, BHSS), dtype, why)
    q, k, v = _core_copies(p, c, save, local)
    scaled, probs = _core_softmax(p, c, save, local, q, k)
    mask = out = None
    if drop and not (dropped and gqa):              # the grouped core under a checkpoint books no dropout
        mask, out = _core_dropout(p, c, save, local, probs)
    if again:
        if not gqa and not in_place:
            p.op("v copied (recomputation)", alloc=[v])
        p.op("recomputation stops (@ v's inputs packed)", free=[scaled])
        return Core(q, k, v, probs, mask, out, ("Q", "K", "V", CAUSAL_MASK) + ((ALIBI_INPUT,) if c.alibi else ()))
    result = local("attention output (B, H, S, d/H)", BSq, why="probabilities @ v, a local until the block returns")
    p.op("probabilities @ V", alloc=([v] if not gqa and not c.single else []) + [result])
    if kept:
        p.op("attention core done", free=[scaled])
    else:
        p.op("released", free=([q, k, v] if gqa else [v]) + [out or probs, scaled])
    return result


def _core_copies(p, c, save, local):
    """The q, k, v the core's batched matmuls read: the saved Q, K, V rows (KEPT), None where they read the
    views in place (B = 1, multi-head), else contiguous copies; the copies of q and k (all three, grouped) are
    made here, a multi-head v's before ``@ v``. Returns (q, k, v)."""
    gqa, again = c.gqa, save is Save.RECOMPUTED
    BSq, BSkv = widths_of(c)
    if save is Save.KEPT:
        q, k, v = "Q", "K", "V"
    elif c.single and not gqa:
        q = k = v = None
    else:
        q, k, v = (local(f"{n} copy", w, why="a contiguous copy") for n, w in (("q", BSq), ("k", BSkv), ("v", BSkv)))
    if gqa and save is Save.KEPT:
        p.op("q copied: a group's query heads as one batch", alloc=[q])
        p.op("k, v made contiguous at H_kv heads", alloc=[k, v])
    elif gqa:
        p.op("q copied, k, v made contiguous" + (" (recomputation)" if again else ""), alloc=[q, k, v])
    elif not c.single:                              # B = 1, multi-head: the matmuls read the views
        p.op({Save.KEPT: "q, k copied for the batched matmul", Save.DROPPED: "q, k copied",
              Save.RECOMPUTED: "q, k copied (recomputation)"}[save], alloc=[q, k])
    return q, k, v


def _core_softmax(p, c, save, local, q, k):
    """``QK^T``, the scale, ALiBi's bias where the family has it, the causal mask and softmax, each temporary
    going once the next is made. Returns (the scaled scores, still live; the probabilities)."""
    kept, again = save is Save.KEPT, save is Save.RECOMPUTED
    step = " (recomputed)" if again else ""
    raw, scaled, masked = local("scores QK^T"), local("scaled scores"), local("masked scores")
    probs = "softmax output" if kept else local("softmax output" if again else "probabilities")
    p.op("QK^T" + step, alloc=[raw])
    p.op("scale" + step, alloc=[scaled], free=[q, k] if save is Save.DROPPED and not c.gqa else [])
    if c.alibi:                 # scores + the (1, H, 1, S) bias: the scaled scores go once it is made
        biased = local("scores + ALiBi")
        p.op("+ ALiBi bias" + step, free=[raw], alloc=[biased])
        raw, scaled = scaled, biased
    p.op("causal masked_fill" + step, free=[raw], alloc=[masked])
    p.op("softmax" + step, alloc=[probs])
    p.op("softmax done" if kept else "released", free=[masked])
    return scaled, probs


def _core_dropout(p, c, save, local, probs):
    """The attention dropout over the probabilities: its mask and output are the saved rows (KEPT), one op under
    the checkpoint (DROPPED, the probabilities going with it), or re-made (RECOMPUTED). Returns (mask, output)."""
    kept, again = save is Save.KEPT, save is Save.RECOMPUTED
    mask = "attention dropout mask" if kept else p.new(
        "attention dropout mask" + (" (recomputed)" if again else " (dropped)"), per_rank(c, BHSS),
        c.mask_dtype or c.dtype, "the attention dropout's mask")
    out = "attention dropout output" if kept else local("attention dropout output", why="@ v's input")
    if save is Save.DROPPED:                         # one op under the checkpoint, whatever the mask
        p.op("attention dropout", alloc=[mask, out])
        p.op("released", free=[mask, probs])
    else:
        dropout_ops(p, c, "attention" + (" (recomputed)" if again else ""), mask, out)
    return mask, out


def _linear_backward(p, c, label, g_in, grads, saved_input, frees=(), recomputed=False, role: OpRole = None):
    """A linear layer's backward: the input gradient and the weight (and bias) gradients; then its saved
    input and ``frees`` are released. nn.Linear with a bias runs addmm (input gradient first), without one
    mm (weight gradient first): ``grads`` has a bias gradient exactly when the layer has a bias. A
    recomputed input is released when unpacked, before the bias gradient."""
    if len(grads) == 1:
        p.op(label, alloc=grads + [g_in], role=role)
    elif recomputed:
        p.op(label, alloc=[g_in] + grads[:1], role=role)
        p.op("released (unpacked)", free=[saved_input])
        p.op("bias gradient", alloc=grads[1:])
        saved_input = None
    else:
        p.op(label, alloc=[g_in] + grads, role=role)
    p.op("released", free=list(frees) + [saved_input])


def _recompute_forward(p, c, forward=None):
    """Full recomputation: the block's forward (``forward``; default :func:`block_forward`) re-run with saving,
    stopping after its last saved tensor; the temporaries still alive then are dropped (the block's input stays)."""
    q = p.fork()
    (forward or block_forward)(q, c, (Save.KEPT, Save.KEPT))
    last = max(i for i, op in enumerate(q.ops) if any(
        isinstance(n, str) and p.tensors[n].lifetime is Lifetime.SAVED for n in op.allocs))
    alive = []
    for op in q.ops[:last + 1]:
        alive = [n for n in alive if n not in op.frees] + list(op.allocs)
    p.ops.extend(q.ops[:last + 1])
    x = residual_names(c)[0]
    p.op("recomputation stops", free=[n for n in alive if isinstance(n, str) and n != x and
                                      p.tensors[n].lifetime is Lifetime.TEMPORARY], role=OpRole.RECOMPUTATION_STOPS)


def block_backward(p, c: Shape, share):
    """One block's backward pass: ``dX_out`` (live) -> the previous block's; frees the block's saved tensors.
    Under full recomputation the forward is re-run first; under selective, the core before its backward."""
    a, drop = c.dtype, c.dropout
    recomputed = c.recompute == "full"
    if recomputed:
        _recompute_forward(p, c)
    BSq, BSkv = widths_of(c)
    g = "dX_out"
    if drop:
        g = p.new("gradient through the MLP dropout", BSd, a, "dX times the mask")
        p.op("MLP residual dropout backward", alloc=[g])
        p.op("mask released", free=["MLP residual dropout mask"])
    gh = _mlp_backward(p, c, share, g, recomputed)
    fp32_composite = c.composite and not c.upcast
    gn2 = p.new("gradient of norm 2's input", BSd, a, "norm 2 backward's output")
    norm_backward(p, c, "2", gh, gn2, define_grads(p, ["norm2.weight", "norm2.bias"], c, share),
                  residual="dX_out" if fp32_composite else None)
    if fp32_composite:
        gxm = gn2
    else:
        gxm = p.new("gradient of the attention residual sum", BSd, a, "skip and norm gradients summed")
        p.op("residual gradients summed", alloc=[gxm])
        p.op("released", free=[gn2, "dX_out"])
    g = gxm
    if drop:
        g = p.new("gradient through the attention residual dropout", BSd, a, "times the mask")
        p.op("attention residual dropout backward", alloc=[g])
        p.op("mask released", free=["attention residual dropout mask"])
    gn1 = attention_backward(p, c, g, share, [g if drop else None])
    # A recomputed block's inputs (the checkpoint's x and, eager, the causal mask) are released with the
    # last tensor its recomputation saved: norm 1's input (read off MemTracker's log).
    last = [] if not recomputed else ([residual_names(c)[0]] if c.upcast else []) + (
        [CAUSAL_MASK] if c.attention == "eager" and not c.hf else []) + ([ALIBI_INPUT] if c.alibi else []) + (
        packing.frame(c) + hf.checkpoint_frame(c))
    if fp32_composite:
        norm_backward(p, c, "1", gn1, INPUT_GRADIENT, define_grads(p, ["norm1.weight", "norm1.bias"], c, share),
                      residual=gxm, also_free=last)
    else:
        gx1 = p.new("gradient of norm 1's input", BSd, a, "norm 1 backward's output")
        norm_backward(p, c, "1", gn1, gx1, define_grads(p, ["norm1.weight", "norm1.bias"], c, share),
                      also_free=last)
        p.op("residual gradients summed", alloc=[INPUT_GRADIENT])
        p.op("released", free=[gx1, gxm])


def _mlp_backward(p, c: Shape, share, g, recomputed: bool) -> str:
    """The MLP's backward from ``g`` (the block output's gradient, through the dropout where there is one):
    GeLU's or SwiGLU's; returns the MLP input's gradient."""
    a, drop = c.dtype, c.dropout
    gdi = p.new("gradient of the down-projection input", per_rank(c, BSF), a, "dL/d(down input)")
    if c.gpt:
        _linear_backward(p, c, "down projection backward", gdi, define_grads(p, ["down.weight", "down.bias"], c, share),
                         "down-projection input", [g if drop else None], recomputed, role=OpRole.DOWN_PROJECTION_BACKWARD)
        gu = p.new("gradient of the GeLU input", per_rank(c, BSF), a, "GeLU backward's output")
        p.op("GeLU backward", alloc=[gu])
        p.op("released", free=[gdi, "GeLU input"])
        gh = p.new("gradient of the MLP input", BSd, a, "the up projection's input gradient")
        _linear_backward(p, c, "up projection backward", gh, define_grads(p, ["up.weight", "up.bias"], c, share),
                         "MLP input", [gu], recomputed, role=OpRole.UP_PROJECTION_BACKWARD)
    else:
        p.op("down projection backward", alloc=define_grads(p, ["down.weight"], c, share) + [gdi],
             role=OpRole.DOWN_PROJECTION_BACKWARD)
        p.op("released", free=[g if drop else None, "down-projection input"])
        gs = p.new("gradient of the SiLU output", per_rank(c, BSF), a, "dL/d(SiLU(gate)) = g * up")
        gup = p.new("gradient of the up-projection output", per_rank(c, BSF), a, "dL/d(up) = g * SiLU(gate)")
        p.op("SiLU(gate) * up backward", alloc=[gs, gup], role=OpRole.SWIGLU_PRODUCT_BACKWARD)
        p.op("released", free=[gdi, "up-projection output", "SiLU output"])
        gh_up = p.new("gradient of the MLP input via up", BSd, a, "the up projection's input gradient")
        p.op("up projection backward", alloc=define_grads(p, ["up.weight"], c, share) + [gh_up],
             role=OpRole.UP_PROJECTION_BACKWARD)
        p.op("released", free=[gup])
        gg = p.new("gradient of the gate output", per_rank(c, BSF), a, "SiLU backward's output")
        p.op("SiLU backward", alloc=[gg], role=OpRole.SILU_BACKWARD)
        p.op("released", free=[gs, "gate output"])
        gh_gate = p.new("gradient of the MLP input via gate", BSd, a, "the gate projection's input gradient")
        p.op("gate projection backward", alloc=define_grads(p, ["gate.weight"], c, share) + [gh_gate],
             role=OpRole.GATE_PROJECTION_BACKWARD)
        p.op("released", free=[gg, "MLP input"])
        gh = p.new("gradient of the MLP input", BSd, a, "the two input gradients summed")
        p.op("MLP input gradients summed", alloc=[gh])
        p.op("released", free=[gh_up, gh_gate])
    return gh


def attention_backward(p, c: Shape, g, share, release):
    """The attention branch's backward, from ``g`` (the gradient of the output projection's output, live) to the
    gradient of norm 1's output (returned): output projection, the core (re-run first under selective
    recomputation), q, k and v's gradients into the fused projection's, its backward. ``release``: what goes
    with the output projection's backward (eager) or the kernel's (flash), beside what the branch saved."""
    a, recomputed = c.dtype, c.recompute == "full"
    BSq, BSkv = widths_of(c)
    gpi = p.new("gradient of the output projection input", BSq, a, "the output projection's input gradient")
    proj = define_grads(p, ["proj.weight", "proj.bias"], c, share)
    gq, gk, gv = (p.new(f"gradient of {n}", (B, S, w), a, f"dL/d{n}")
                  for n, w in (("q", BSq[2]), ("k", BSkv[2]), ("v", BSkv[2])))
    if c.implementation == "litgpt" or (c.hf and c.gpt and c.attention == "flash"):     # the output projection's
        # input is a copy; SDPA keeps its own output (transformers' GPT-NeoX: memledger.step.gpt_style). A parallel
        # block's dX_out goes with the output projection's backward, its last user (measured: at pythia-1b's width,
        # B 1, S 1024, the layers' backward peak)
        early = release if c.parallel else ()
        _linear_backward(p, c, "output projection backward", gpi, proj, "output projection input", early, recomputed,
                         role=OpRole.OUTPUT_PROJECTION_BACKWARD)
        p.op("flash attention backward", alloc=[gq, gk, gv], role=OpRole.FLASH_ATTENTION_BACKWARD)
        p.op("released", free=([] if c.parallel else release) + [gpi, "Q", "K", litgpt.QKV, litgpt.ATTENTION_OUTPUT,
                                                                "softmax log-sum-exp"])
        return (gpt_style.hf_qkv_backward if c.hf else litgpt.qkv_backward)(
            p, c, gq, gk, gv, define_grads(p, ["qkv.weight", "qkv.bias"], c, share))
    if c.attention == "flash":
        _flash_core_backward(p, c, gpi, proj, (gq, gk, gv), release)
    else:
        _linear_backward(p, c, "output projection backward", gpi, proj, "output projection input",
                         release, recomputed, role=OpRole.OUTPUT_PROJECTION_BACKWARD)
        if c.hf:
            gq, gk, gv = hf.eager_backward(p, c, gpi)
        else:
            _eager_core_backward(p, c, gpi, (gq, gk, gv))
    if c.hf and c.gpt:      # transformers' GPT-NeoX: the rotary code's and the fused projection's backward
        return gpt_style.hf_qkv_backward(p, c, gq, gk, gv, define_grads(p, ["qkv.weight", "qkv.bias"], c, share))
    if c.hf:                # transformers: the rotary code's and the three projections' backward
        grads = {n: define_grads(p, [f"{n}_proj.weight"], c, share)[0] for n in "qkv"}
        return hf.qkv_backward(p, c, gq, gk, gv, grads)
    gqkv = _qkv_gradients_joined(p, c, gq, gk, gv)
    gn1 = p.new("gradient of norm 1's output", BSd, a, "the QKV projection's input gradient")
    _linear_backward(p, c, "QKV projection backward", gn1, define_grads(p, ["qkv.weight", "qkv.bias"], c, share),
                     "Q/K/V projection input", [gqkv], recomputed, role=OpRole.QKV_PROJECTION_BACKWARD)
    return gn1


def _flash_core_backward(p, c: Shape, gpi, proj, gqkv, release):
    """The output projection's backward and the flash kernel's, writing ``gqkv`` (the q, k, v gradients). Under
    selective recomputation the projection's input is released, then the kernel re-runs."""
    selective = c.recompute == "selective"
    kept = [] if selective else ["softmax log-sum-exp", "output projection input"]
    _linear_backward(p, c, "output projection backward", gpi, proj, "output projection input" if selective
                     else None, (), c.recompute == "full", role=OpRole.OUTPUT_PROJECTION_BACKWARD)
    again = flash_attention(p, c, Save.RECOMPUTED) if selective else []
    p.op("flash attention backward", alloc=list(gqkv), role=OpRole.FLASH_ATTENTION_BACKWARD)
    if again:
        p.op("recomputed output released", free=again)
    p.op("released", free=release + [gpi, "Q", "K", "V"] + kept + packing.saved_names(c) + (
        packing.frame(c) if selective else []))


def _eager_core_backward(p, c: Shape, gpi, gqkv):
    """The eager core's backward from ``gpi`` (the gradient of its merged output, live) to ``gqkv`` (the q, k, v
    gradients): heads split, ``@ v``'s, the attention dropout's, softmax's, the mask's, the scale's and
    ``QK^T``'s backward, each releasing what it read. Under selective recomputation the core re-runs first."""
    a, drop = c.dtype, c.attention_dropped          # the probabilities' dropout (not at p = 0, Phi-2's)
    gq, gk, gv = gqkv
    g4, single = gpi, c.single and not c.gqa        # the grouped core copies q, k and v at any B
    if not single:
        g4 = p.new("gradient of the attention output (B, H, S, d/H)", widths_of(c)[0], a, "heads split: a copy")
        p.op("heads split", alloc=[g4])
        p.op("released", free=[gpi])
    if c.recompute == "selective":
        core = attention_core(p, c, Save.RECOMPUTED)
    else:       # the saved rows; the copies of a batched matmul are the Q, K (and V) rows themselves
        core = Core("Q", "K", None if single else "V", "softmax output", "attention dropout mask",
                    "attention dropout output", ("V" if single else None,))
    gp = p.new("gradient of the probabilities", per_rank(c, BHSS), a, "g @ v^T")
    p.op("probabilities @ V backward", alloc=[gv, gp])
    p.op("released", free=[g4, core.v, core.dropped if drop else None])
    if drop:
        gp2 = p.new("gradient through the attention dropout", per_rank(c, BHSS), a, "times the mask")
        p.op("attention dropout backward", alloc=[gp2])
        p.op("released", free=[gp, core.mask])
        gp = gp2
    gm = p.new("gradient of the masked scores", per_rank(c, BHSS), a, "softmax backward's output")
    p.op("softmax backward", alloc=[gm])
    p.op("released", free=[gp, core.probs])
    gsc = p.new("gradient of the scaled scores", per_rank(c, BHSS), a, "masked_fill backward's output")
    p.op("masked_fill backward", alloc=[gsc])
    p.op("released", free=[gm, None if c.recompute in ("full", "selective") else CAUSAL_MASK])
    gr = p.new("gradient of QK^T", per_rank(c, BHSS), a, "times the scale")
    p.op("scale backward", alloc=[gr])
    p.op("released", free=[gsc])
    p.op("QK^T backward", alloc=[gq, gk])
    p.op("released", free=[gr, core.k, core.q, *core.frame])


def _qkv_gradients_joined(p, c: Shape, gq, gk, gv):
    """The gradient of the fused QKV projection's output from the q, k, v gradients (released): grouped heads
    concatenate (split's backward; the eager core's q and v gradients, laid out (B, heads, S, d/H), are copied
    back first), multi-head ones are stacked and permuted back."""
    a, (BSq, BSkv) = c.dtype, widths_of(c)
    if not c.gqa:
        stack = p.new("stacked q, k, v gradients", (B, S, 3 * BSq[2]), a, "torch.stack of the three gradients")
        gqkv = p.new("gradient of the QKV projection output", (B, S, 3 * BSq[2]), a, "permuted back: a copy")
        p.op("q, k, v gradients stacked", alloc=[stack])
        p.op("released", free=[gq, gk, gv])
        p.op("permuted back", alloc=[gqkv])
        p.op("released", free=[stack])
        return gqkv
    if c.attention != "flash":      # the views of the (B, S, heads, d/H) grads are free; these are not
        gv2 = None if c.mqa else p.new("gradient of v, copied back", BSkv, a,
                                       "(B, H_kv, S, d/H) to (B, S, H_kv*d/H): the view's backward copies")
        gq2 = p.new("gradient of q, copied back", BSq, a, "(B, H, S, d/H) to (B, S, d): the view's backward "
                    "copies")
        if gv2:
            p.op("v gradient copied back", alloc=[gv2])
            p.op("released", free=[gv])
            gv = gv2
        p.op("q gradient copied back", alloc=[gq2])
        p.op("released", free=[gq])
        gq = gq2
    gqkv = p.new("gradient of the QKV projection output", (B, S, qkv_width(c)), a,
                 "split backward: torch.cat of the q, k, v gradients")
    p.op("q, k, v gradients concatenated", alloc=[gqkv])
    p.op("released", free=[gq, gk, gv])
    return gqkv
