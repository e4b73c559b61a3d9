"""One block's programs for the step timeline: its forward and its backward, op by op.

The GPT block (LayerNorm, fused QKV, eager attention or a flash kernel,
GeLU MLP, dropout) and the LLaMA block (RMSNorm, SwiGLU) of ``docs/step.md``.
Python locals set the lifetimes: q, k, v and the attention output live until
the block returns; autograd releases a node's saved tensors after the node
ran, and nn.Linear's backward writes the input gradient first (addmm, with a
bias) or the weight gradient first (mm, without). Read off MemTracker's
allocation log of the reference decoder; checked by ``tests/step/test_timeline.py``.
"""
from .norms import norm_backward, norm_forward
from .ops import (BHSS, CAUSAL_MASK, INPUT_GRADIENT, BSd, BSF, Shape, block_output, define_grads, dropout_ops,
                  io_names, qkv_width, widths_of)
from .selective import recompute_core, recompute_flash, selective_forward_core
from ..core.symbols import B, S


def _dropout(p, c, where, mask, shape, alloc_out=True):
    """A dropout call: its mask (saved) and its output (a transient); returns the output's name."""
    out = p.new(f"{where} dropout output", shape, c.dtype, "the dropout's output, until the next op consumes it")
    dropout_ops(p, c, where, mask, out)
    return out



def layer_forward(p, c: Shape):
    """One block's forward pass (no recomputation). Its input is live; its output is ``next: <input>``."""
    a, drop = c.dtype, c.dropout
    BSq = widths_of(c)[0]
    x, xm = io_names(c)
    norm_forward(p, c, "1", "Q/K/V projection input")
    leftovers = []
    if c.selective:
        leftovers = selective_forward_core(p, c)
    elif c.attention == "flash":
        p.op("QKV projection (q, k, v stay views of it)", alloc=["Q", "K", "V"])
        p.op("flash attention", alloc=["output projection input", "softmax log-sum-exp"])
    else:
        if c.single and not c.gqa:
            p.op("QKV projection (B = 1: q, k, v stay views of it)", alloc=["Q", "K", "V"])
        else:
            qkv = p.new("QKV projection output", (B, S, qkv_width(c.gqa, c.head_dim)), a,
                        "the fused projection's output, alive while the block's q, k, v views are")
            p.op("QKV projection", alloc=[qkv])
            if c.gqa:       # the grouped core: q folded to (B, H_kv, G*S, d/H), K and V contiguous at H_kv heads
                p.op("q copied: a group's query heads as one batch", alloc=["Q"])
                p.op("k, v made contiguous at H_kv heads", alloc=["K", "V"])
            else:
                p.op("q, k copied for the batched matmul", alloc=["Q", "K"])
            leftovers.append(qkv)
        raw = p.new("scores QK^T", BHSS, a, "q @ k^T, before scaling")
        scaled = p.new("scaled scores", BHSS, a, "scores * 1/sqrt(d/H), a Python local until the core returns")
        masked = p.new("masked scores", BHSS, a, "masked_fill's output, softmax's input")
        p.op("QK^T", alloc=[raw])
        p.op("scale", alloc=[scaled])
        p.op("causal masked_fill", free=[raw], alloc=[masked])
        p.op("softmax", alloc=["softmax output"])
        p.op("softmax done", free=[masked])
        if drop:
            dropout_ops(p, c, "attention", "attention dropout mask", "attention dropout output")
        out4 = p.new("attention output (B, H, S, d/H)", BSq, a, "probabilities @ v, a Python local until the block "
                     "returns")
        p.op("probabilities @ V", alloc=([] if c.single or c.gqa else ["V"]) + [out4])
        p.op("attention core done", free=[scaled])
        p.op("heads merged (a copy)", alloc=["output projection input"])
        leftovers.append(out4)
    po = p.new("output projection output", BSd, a, "the attention branch before the residual add")
    p.op("output projection", alloc=[po])
    if drop:
        dout = _dropout(p, c, "attention residual", "attention residual dropout mask", BSd)
        p.op("residual add", free=[po], alloc=[xm])
        p.op("residual done", free=[dout])
    else:
        p.op("residual add", alloc=[xm])
        p.op("residual done", free=[po])
    norm_forward(p, c, "2", "MLP input")
    if c.gpt:
        p.op("up projection", alloc=["GeLU input"])
        p.op("GeLU", alloc=["down-projection input"])
    else:
        p.op("gate projection", alloc=["gate output"])
        p.op("SiLU", alloc=["SiLU output"])
        p.op("up projection", alloc=["up-projection output"])
        p.op("SiLU(gate) * up", alloc=["down-projection input"])
    dn = p.new("down-projection output", BSd, a, "the MLP branch before the residual add")
    p.op("down projection", alloc=[dn])
    if drop:
        mdo = _dropout(p, c, "MLP residual", "MLP residual dropout mask", BSd)
        p.op("residual add", free=[dn], alloc=[block_output(c)])
        last = [mdo]
    else:
        p.op("residual add", alloc=[block_output(c)])
        last = [dn]
    p.op("block returns", free=last + leftovers + ([xm, x] if c.upcast else []))


def _linear_backward(p, c, label, g_in, grads, saved_input, frees=(), recomputed=False):
    """A linear layer's backward: the input gradient and the weight (and bias) gradients; then its saved
    input and ``frees`` are released. nn.Linear with a bias runs addmm (input gradient first), without one
    mm (weight gradient first): ``grads`` has a bias gradient exactly when the layer has a bias. A
    recomputed input is released when unpacked, before the bias gradient."""
    if len(grads) == 1:
        p.op(label, alloc=grads + [g_in])
    elif recomputed:
        p.op(label, alloc=[g_in] + grads[:1])
        p.op("released (unpacked)", free=[saved_input])
        p.op("bias gradient", alloc=grads[1:])
        saved_input = None
    else:
        p.op(label, alloc=[g_in] + grads)
    p.op("released", free=list(frees) + [saved_input])


def layer_backward(p, c: Shape, share, recomputed=False):
    """One block's backward pass: ``dX_out`` (live) -> ``prev: dX_out``; frees the block's saved tensors."""
    a, drop = c.dtype, c.dropout
    BSq, BSkv = widths_of(c)
    g = "dX_out"
    if drop:
        g = p.new("gradient through the MLP dropout", BSd, a, "dX times the mask")
        p.op("MLP residual dropout backward", alloc=[g])
        p.op("mask released", free=["MLP residual dropout mask"])
    gdi = p.new("gradient of the down-projection input", BSF, a, "dL/d(down input)")
    if c.gpt:
        _linear_backward(p, c, "down projection backward", gdi, define_grads(p, ["down.weight", "down.bias"], c, share),
                         "down-projection input", [g if drop else None], recomputed)
        gu = p.new("gradient of the GeLU input", BSF, a, "GeLU backward's output")
        p.op("GeLU backward", alloc=[gu])
        p.op("released", free=[gdi, "GeLU input"])
        gh = p.new("gradient of the MLP input", BSd, a, "the up projection's input gradient")
        _linear_backward(p, c, "up projection backward", gh, define_grads(p, ["up.weight", "up.bias"], c, share),
                         "MLP input", [gu], recomputed)
    else:
        p.op("down projection backward", alloc=define_grads(p, ["down.weight"], c, share) + [gdi])
        p.op("released", free=[g if drop else None, "down-projection input"])
        gs = p.new("gradient of the SiLU output", BSF, a, "dL/d(SiLU(gate)) = g * up")
        gup = p.new("gradient of the up-projection output", BSF, a, "dL/d(up) = g * SiLU(gate)")
        p.op("SiLU(gate) * up backward", alloc=[gs, gup])
        p.op("released", free=[gdi, "up-projection output", "SiLU output"])
        gh_up = p.new("gradient of the MLP input via up", BSd, a, "the up projection's input gradient")
        p.op("up projection backward", alloc=define_grads(p, ["up.weight"], c, share) + [gh_up])
        p.op("released", free=[gup])
        gg = p.new("gradient of the gate output", BSF, a, "SiLU backward's output")
        p.op("SiLU backward", alloc=[gg])
        p.op("released", free=[gs, "gate output"])
        gh_gate = p.new("gradient of the MLP input via gate", BSd, a, "the gate projection's input gradient")
        p.op("gate projection backward", alloc=define_grads(p, ["gate.weight"], c, share) + [gh_gate])
        p.op("released", free=[gg, "MLP input"])
        gh = p.new("gradient of the MLP input", BSd, a, "the two input gradients summed")
        p.op("MLP input gradients summed", alloc=[gh])
        p.op("released", free=[gh_up, gh_gate])
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
    gpi = p.new("gradient of the output projection input", BSq, a, "the output projection's input gradient")
    proj = define_grads(p, ["proj.weight", "proj.bias"], c, share)
    gq, gk, gv = (p.new(f"gradient of {n}", (B, S, w), a, f"dL/d{n}")
                  for n, w in (("q", BSq[2]), ("k", BSkv[2]), ("v", BSkv[2])))
    if c.attention == "flash" and c.selective:       # the projection's input is released; the kernel re-runs
        _linear_backward(p, c, "output projection backward", gpi, proj, "output projection input", (), recomputed)
        again = recompute_flash(p, c)
        p.op("flash attention backward", alloc=[gq, gk, gv])
        p.op("recomputed output released", free=again)
        p.op("released", free=[g if drop else None, gpi, "Q", "K", "V"])
    elif c.attention == "flash":
        _linear_backward(p, c, "output projection backward", gpi, proj, None, (), recomputed)
        p.op("flash attention backward", alloc=[gq, gk, gv])
        p.op("released", free=[g if drop else None, gpi, "Q", "K", "V", "softmax log-sum-exp",
                               "output projection input"])
    else:
        _linear_backward(p, c, "output projection backward", gpi, proj, "output projection input",
                         [g if drop else None], recomputed)
        g4 = gpi
        single = c.single and not c.gqa         # the grouped core copies q, k and v at any B
        if not single:
            g4 = p.new("gradient of the attention output (B, H, S, d/H)", BSq, a, "heads split: a copy")
            p.op("heads split", alloc=[g4])
            p.op("released", free=[gpi])
        if c.selective:
            core = recompute_core(p, c)
        else:       # the saved rows; the copies of a batched matmul are the Q, K (and V) rows themselves
            core = {"q": "Q", "k": "K", "v": None if single else "V", "probs": "softmax output",
                    "mask": "attention dropout mask", "dropped": "attention dropout output",
                    "frame": ["V" if single else None]}
        gp = p.new("gradient of the probabilities", BHSS, a, "g @ v^T")
        p.op("probabilities @ V backward", alloc=[gv, gp])
        p.op("released", free=[g4, core["v"], core["dropped"] if drop else None])
        if drop:
            gp2 = p.new("gradient through the attention dropout", BHSS, a, "times the mask")
            p.op("attention dropout backward", alloc=[gp2])
            p.op("released", free=[gp, core["mask"]])
            gp = gp2
        gm = p.new("gradient of the masked scores", BHSS, a, "softmax backward's output")
        p.op("softmax backward", alloc=[gm])
        p.op("released", free=[gp, core["probs"]])
        gsc = p.new("gradient of the scaled scores", BHSS, a, "masked_fill backward's output")
        p.op("masked_fill backward", alloc=[gsc])
        p.op("released", free=[gm, None if recomputed or c.selective else CAUSAL_MASK])
        gr = p.new("gradient of QK^T", BHSS, a, "times the scale")
        p.op("scale backward", alloc=[gr])
        p.op("released", free=[gsc])
        p.op("QK^T backward", alloc=[gq, gk])
        p.op("released", free=[gr, core["k"], core["q"]] + core["frame"])
    if c.gqa:               # split's backward concatenates; the views of the (B, S, heads, d/H) grads are free
        if c.attention != "flash":      # the eager core's q and v gradients are laid out (B, heads, S, d/H)
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
        gqkv = p.new("gradient of the QKV projection output", (B, S, qkv_width(True, c.head_dim)), a,
                     "split backward: torch.cat of the q, k, v gradients")
        p.op("q, k, v gradients concatenated", alloc=[gqkv])
        p.op("released", free=[gq, gk, gv])
    else:
        stack = p.new("stacked q, k, v gradients", (B, S, 3 * BSq[2]), a, "torch.stack of the three gradients")
        gqkv = p.new("gradient of the QKV projection output", (B, S, 3 * BSq[2]), a, "permuted back: a copy")
        p.op("q, k, v gradients stacked", alloc=[stack])
        p.op("released", free=[gq, gk, gv])
        p.op("permuted back", alloc=[gqkv])
        p.op("released", free=[stack])
    gn1 = p.new("gradient of norm 1's output", BSd, a, "the QKV projection's input gradient")
    _linear_backward(p, c, "QKV projection backward", gn1, define_grads(p, ["qkv.weight", "qkv.bias"], c, share),
                     "Q/K/V projection input", [gqkv], recomputed)
    # A recomputed block's inputs (the checkpoint's x and, eager, the causal mask) are released with the
    # last tensor its recomputation saved: norm 1's input (read off MemTracker's log).
    last = [] if not recomputed else ([io_names(c)[0]] if c.upcast else []) + (
        [CAUSAL_MASK] if c.attention == "eager" else [])
    if fp32_composite:
        norm_backward(p, c, "1", gn1, INPUT_GRADIENT, define_grads(p, ["norm1.weight", "norm1.bias"], c, share),
                      residual=gxm, also_free=last)
    else:
        gx1 = p.new("gradient of norm 1's input", BSd, a, "norm 1 backward's output")
        norm_backward(p, c, "1", gn1, gx1, define_grads(p, ["norm1.weight", "norm1.bias"], c, share),
                      also_free=last)
        p.op("residual gradients summed", alloc=[INPUT_GRADIENT])
        p.op("released", free=[gx1, gxm])
