"""What one training step allocates and frees, op by op: the programs behind the step timeline.

Each program is a list of ops ``(label, frees, allocs)``: the named tensors an
op's inputs release just before it runs (Python references dropped, autograd
nodes released after they ran) and the tensors it creates. The total after
each op is a moment of the step; :mod:`memledger.step` runs the programs and
takes the largest total, the peak (PyTorch's ``MemTracker`` samples the same
moments: after every op).

The programs follow the reference decoder of ``docs/step.md``
(:mod:`memledger.torchref`): eager PyTorch, autograd's order of execution,
the lifetimes of Python locals (q, k, v and the attention output live until a
block returns). Saved tensors are the rows of :func:`memledger.activations.inventory`
and :func:`memledger.outside.outside_inventory`, by name; every other tensor
is a transient defined here with its shape and reason. The sequences were
read off MemTracker's allocation log of the reference (PyTorch 2.13, CPU) and
are checked against it by ``tests/test_step.py``.
"""
from dataclasses import dataclass

from .dtypes import nbytes
from .symbols import B, F, H, S, d

GRAD_KIND = "grad"
TRANSIENT = "transient"


@dataclass(frozen=True)
class Tensor:
    """One tensor of a program: ``expr`` bytes; ``kind`` activation/transient/grad; ``why`` it exists."""
    name: str
    expr: object
    kind: str
    why: str
    tp_sharded: bool = False


class Program:
    """A growing list of ops over a table of named tensors."""

    def __init__(self, tensors: dict):
        self.tensors, self.ops = tensors, []

    def new(self, name, shape, dtype, why, tp=False, kind=TRANSIENT):
        """Define a transient (bytes = product of ``shape`` x bytes of ``dtype``) and return its name."""
        size = nbytes(dtype)
        for n in shape:
            size = size * n
        self.tensors[name] = Tensor(name, size, kind, why, tp)
        return name

    def op(self, label, alloc=(), free=()):
        self.ops.append((label, tuple(n for n in free if n), tuple(n for n in alloc if n)))


@dataclass(frozen=True)
class Shape:
    """The discrete choices a layer's program depends on (see :mod:`memledger.backends`)."""
    style: str              # "gpt" (LayerNorm, GeLU, biases) or "llama" (RMSNorm, SwiGLU)
    attention: str          # "eager", "flash" or "math"
    dropout: bool
    rmsnorm: str            # "fused" or "composite"
    dtype: str              # activation dtype, "bf16" or "fp32"
    stats: bool             # norm statistics booked (inventory rows exist)
    single: bool            # B == 1: q, k, v stay views of the fused projection (no copies)
    grad_dtype: str = "bf16"

    @property
    def gpt(self):
        return self.style == "gpt"

    @property
    def composite(self):
        return not self.gpt and self.rmsnorm == "composite"

    @property
    def upcast(self):
        """Composite RMSNorm copies a 16-bit input to FP32 (an FP32 input is used as is)."""
        return self.composite and self.dtype != "fp32"


BSd, BSF, BHSS, BS = (B, S, d), (B, S, F), (B, H, S, S), (B, S)


def block_param_tensors(style: str) -> list:
    """(name, elements) of one block's parameter tensors in ``model.parameters()`` order."""
    if style == "gpt":
        return [("norm1.weight", d), ("norm1.bias", d), ("norm2.weight", d), ("norm2.bias", d),
                ("qkv.weight", 3 * d * d), ("qkv.bias", 3 * d), ("proj.weight", d * d), ("proj.bias", d),
                ("up.weight", d * F), ("up.bias", F), ("down.weight", d * F), ("down.bias", d)]
    return [("norm1.weight", d), ("norm2.weight", d), ("qkv.weight", 3 * d * d), ("proj.weight", d * d),
            ("gate.weight", d * F), ("up.weight", d * F), ("down.weight", d * F)]


def _grads(p, names, c, share):
    """Define the gradients of ``names`` (block parameters) and return their tensor names."""
    sizes = dict(block_param_tensors(c.style))
    out = []
    for n in names:
        if n.endswith(".bias") and not c.gpt:
            continue
        t = f"grad {n}"
        p.tensors[t] = Tensor(t, share(sizes[n]) * nbytes(c.grad_dtype), GRAD_KIND,
                              f"the gradient of {n}, written by backward and kept for the optimizer")
        out.append(t)
    return out


def io_names(c: Shape):
    """(block input, attention residual sum) names: saved norm inputs, or transients under composite RMSNorm."""
    norm = "LayerNorm" if c.gpt else "RMSNorm"
    if c.upcast:
        return "block input", "attention residual sum"
    return f"{norm} 1 input", f"{norm} 2 input"


def _prefix(c, k):
    norm = "LayerNorm" if c.gpt else "RMSNorm"
    return f"final {norm}" if k == "final" else f"{norm} {k}"


def _stats(c, prefix):
    if c.composite or not c.stats:
        return []
    return [f"{prefix} mean", f"{prefix} rstd"] if c.gpt else [f"{prefix} rstd"]


def norm_forward(p, c, k, out):
    """LayerNorm, fused or composite RMSNorm ``k`` ("1", "2", "final") writing ``out``; its input is live."""
    prefix = _prefix(c, k)
    if not c.composite:
        p.op(f"norm {k}", alloc=[out] + _stats(c, prefix))
        return
    f = "fp32"
    x32, rstd, xr = f"{prefix} input", f"{prefix} rstd", f"{prefix} x*rstd"
    sq = p.new(f"norm {k}: x^2", BSd, f, "composite RMSNorm: pow(x, 2) in FP32")
    ms = p.new(f"norm {k}: mean(x^2)", BS, f, "composite RMSNorm: its mean over d, FP32")
    if c.upcast:
        p.op(f"norm {k} upcast", alloc=[x32])
    p.op(f"norm {k} rsqrt(mean(x^2))", alloc=[sq, ms, rstd])
    p.op(f"norm {k} x*rstd", free=[ms, sq], alloc=[xr])
    if c.upcast:
        xrw = p.new(f"norm {k}: x*rstd*w", BSd, f, "composite RMSNorm: the FP32 product with the weight")
        p.op(f"norm {k} weight", alloc=[xrw])
        p.op(f"norm {k} downcast", alloc=[out])
        p.op(f"norm {k} done", free=[xrw])
    else:
        p.op(f"norm {k} weight", alloc=[out])


def norm_backward(p, c, k, g_out, g_in, grads, residual=None):
    """Backward of norm ``k``: ``g_out`` (live) -> ``g_in``; frees what the norm saved; writes ``grads``.

    ``residual``: the gradient already waiting for the norm's input (the skip
    connection's). With an FP32 input, composite RMSNorm's two paths into x
    are summed into it inside the norm's backward (autograd's input buffer),
    and ``g_in`` is that sum; otherwise the caller adds ``residual``.
    """
    prefix = _prefix(c, k)
    f = "fp32"
    if not c.composite:
        p.op(f"norm {k} backward", alloc=[g_in] + grads)
        p.op(f"norm {k} released", free=[g_out, f"{prefix} input"] + _stats(c, prefix))
        return
    x32, rstd, xr = f"{prefix} input", f"{prefix} rstd", f"{prefix} x*rstd"
    t = {n: p.new(f"norm {k} backward: {n}", shape, f, why) for n, shape, why in [
        ("g32", BSd, "the output gradient upcast to FP32"),
        ("g*w", BSd, "gradient of x*rstd: g times the weight"),
        ("g*xr", BSd, "for the weight gradient: g times x*rstd"),
        ("sum g*xr", (d,), "the weight gradient before its downcast"),
        ("g*rstd", BSd, "gradient of x through x*rstd"),
        ("g*x", BSd, "for the rstd gradient: g times x"),
        ("g_rstd", BS, "the rstd gradient"),
        ("rsqrt'", BS, "rsqrt backward: a per-token temporary"),
        ("rsqrt''", BS, "rsqrt backward: a per-token temporary"), ("g_ms", BS, "gradient of mean(x^2)"),
        ("g_mean", BSd, "mean backward: expanded over d, divided by d"),
        ("pow'", BSd, "pow backward: a temporary"), ("pow''", BSd, "pow backward: a temporary"),
        ("g_pow", BSd, "gradient of x through x^2"), ("g_x32", BSd, "sum of both gradients of x (FP32)"),
        ("g_x+res", BSd, "autograd's input buffer: the skip gradient plus the first norm gradient")]}
    if c.upcast:
        p.op(f"norm {k} backward: upcast", alloc=[t["g32"]])
        p.op(f"norm {k} backward: weight", free=[g_out], alloc=[t["g*w"], t["g*xr"], t["sum g*xr"]])
        p.op(f"norm {k} backward: weight gradient", free=[t["g*xr"]], alloc=grads)
        p.op(f"norm {k} backward: x*rstd", free=[t["sum g*xr"], t["g32"], xr],
             alloc=[t["g*rstd"], t["g*x"], t["g_rstd"]])
        first, pending = t["g*rstd"], [t["g*x"], t["g*w"]]
    else:
        p.op(f"norm {k} backward: weight", alloc=[t["g*w"], t["g*xr"]] + grads)
        p.op(f"norm {k} backward: x*rstd", free=[t["g*xr"], g_out, xr], alloc=[t["g*rstd"], t["g*x"], t["g_rstd"]])
        first, pending = t["g*rstd"], [t["g*x"], t["g*w"]]
        if residual:
            p.op(f"norm {k} backward: add to the skip gradient", free=pending, alloc=[t["g_x+res"]])
            p.op(f"norm {k} backward: buffer", free=[residual, t["g*rstd"]])
            first, pending = t["g_x+res"], []
    p.op(f"norm {k} backward: rsqrt", free=pending, alloc=[t["rsqrt'"], t["rsqrt''"], t["g_ms"]])
    p.op(f"norm {k} backward: mean", free=[t["rsqrt''"], t["rsqrt'"], t["g_rstd"], rstd], alloc=[t["g_mean"]])
    p.op(f"norm {k} backward: pow", free=[t["g_ms"]], alloc=[t["pow'"], t["pow''"], t["g_pow"]])
    total = t["g_x32"] if c.upcast else g_in
    p.op(f"norm {k} backward: sum", free=[t["pow''"], t["pow'"], t["g_mean"], x32], alloc=[total])
    p.op(f"norm {k} backward: summed", free=[first, t["g_pow"]])
    if c.upcast:
        p.op(f"norm {k} backward: downcast", alloc=[g_in])
        p.op(f"norm {k} backward: done", free=[t["g_x32"]])


def _dropout(p, c, where, mask, shape, alloc_out=True):
    """A dropout call: its mask (saved) and its output (a transient); returns the output's name."""
    out = p.new(f"{where} dropout output", shape, c.dtype, "the dropout's output, until the next op consumes it")
    p.op(f"{where} dropout mask", alloc=[mask])
    p.op(f"{where} dropout", alloc=[out])
    return out


def layer_forward(p, c: Shape):
    """One block's forward pass (no recomputation). Its input is live; its output is ``next: <input>``."""
    a, drop = c.dtype, c.dropout
    x, xm = io_names(c)
    norm_forward(p, c, "1", "Q/K/V projection input")
    leftovers = []
    if c.attention == "flash":
        p.op("QKV projection (q, k, v stay views of it)", alloc=["Q", "K", "V"])
        p.op("flash attention", alloc=["output projection input", "softmax log-sum-exp"])
    else:
        if c.single:
            p.op("QKV projection (B = 1: q, k, v stay views of it)", alloc=["Q", "K", "V"])
        else:
            qkv = p.new("QKV projection output", (B, S, 3 * d), a,
                        "the fused projection's output, alive while the block's q, k, v views are", tp=True)
            p.op("QKV projection", alloc=[qkv])
            p.op("q, k copied for the batched matmul", alloc=["Q", "K"])
            leftovers.append(qkv)
        raw = p.new("scores QK^T", BHSS, a, "q @ k^T, before scaling", tp=True)
        scaled = p.new("scaled scores", BHSS, a, "scores * 1/sqrt(d/H), a Python local until the core returns", tp=True)
        masked = p.new("masked scores", BHSS, a, "masked_fill's output, softmax's input", tp=True)
        p.op("QK^T", alloc=[raw])
        p.op("scale", alloc=[scaled])
        p.op("causal masked_fill", free=[raw], alloc=[masked])
        p.op("softmax", alloc=["softmax output"])
        p.op("softmax done", free=[masked])
        if drop:
            p.op("attention dropout mask", alloc=["attention dropout mask"])
            p.op("attention dropout", alloc=["attention dropout output"])
        out4 = p.new("attention output (B, H, S, d/H)", BSd, a, "probabilities @ v, a Python local until the block "
                     "returns", tp=True)
        p.op("probabilities @ V", alloc=([] if c.single else ["V"]) + [out4])
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
        p.op("residual add", free=[dn], alloc=["next: " + x])
        last = [mdo]
    else:
        p.op("residual add", alloc=["next: " + x])
        last = [dn]
    p.op("block returns", free=last + leftovers + ([xm, x] if c.upcast else []))


def _linear_backward(p, c, label, g_in, grads, saved_input, frees=(), recomputed=False):
    """A linear layer's backward: the input gradient and the weight (and bias) gradients; then its saved
    input and ``frees`` are released. nn.Linear with a bias runs addmm (input gradient first), without one
    mm (weight gradient first). A recomputed input is released when unpacked, before the bias gradient."""
    if not c.gpt:
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
    g = "dX_out"
    if drop:
        g = p.new("gradient through the MLP dropout", BSd, a, "dX times the mask")
        p.op("MLP residual dropout backward", alloc=[g])
        p.op("mask released", free=["MLP residual dropout mask"])
    gdi = p.new("gradient of the down-projection input", BSF, a, "dL/d(down input)", tp=True)
    if c.gpt:
        _linear_backward(p, c, "down projection backward", gdi, _grads(p, ["down.weight", "down.bias"], c, share),
                         "down-projection input", [g if drop else None], recomputed)
        gu = p.new("gradient of the GeLU input", BSF, a, "GeLU backward's output", tp=True)
        p.op("GeLU backward", alloc=[gu])
        p.op("released", free=[gdi, "GeLU input"])
        gh = p.new("gradient of the MLP input", BSd, a, "the up projection's input gradient")
        _linear_backward(p, c, "up projection backward", gh, _grads(p, ["up.weight", "up.bias"], c, share),
                         "MLP input", [gu], recomputed)
    else:
        p.op("down projection backward", alloc=_grads(p, ["down.weight"], c, share) + [gdi])
        p.op("released", free=[g if drop else None, "down-projection input"])
        gs = p.new("gradient of the SiLU output", BSF, a, "dL/d(SiLU(gate)) = g * up", tp=True)
        gup = p.new("gradient of the up-projection output", BSF, a, "dL/d(up) = g * SiLU(gate)", tp=True)
        p.op("SiLU(gate) * up backward", alloc=[gs, gup])
        p.op("released", free=[gdi, "up-projection output", "SiLU output"])
        gh_up = p.new("gradient of the MLP input via up", BSd, a, "the up projection's input gradient")
        p.op("up projection backward", alloc=_grads(p, ["up.weight"], c, share) + [gh_up])
        p.op("released", free=[gup])
        gg = p.new("gradient of the gate output", BSF, a, "SiLU backward's output", tp=True)
        p.op("SiLU backward", alloc=[gg])
        p.op("released", free=[gs, "gate output"])
        gh_gate = p.new("gradient of the MLP input via gate", BSd, a, "the gate projection's input gradient")
        p.op("gate projection backward", alloc=_grads(p, ["gate.weight"], c, share) + [gh_gate])
        p.op("released", free=[gg, "MLP input"])
        gh = p.new("gradient of the MLP input", BSd, a, "the two input gradients summed")
        p.op("MLP input gradients summed", alloc=[gh])
        p.op("released", free=[gh_up, gh_gate])
    fp32_composite = c.composite and not c.upcast
    gn2 = p.new("gradient of norm 2's input", BSd, a, "norm 2 backward's output")
    norm_backward(p, c, "2", gh, gn2, _grads(p, ["norm2.weight", "norm2.bias"], c, share),
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
    gpi = p.new("gradient of the output projection input", BSd, a, "the output projection's input gradient", tp=True)
    proj = _grads(p, ["proj.weight", "proj.bias"], c, share)
    gq, gk, gv = (p.new(f"gradient of {n}", BSd, a, f"dL/d{n}", tp=True) for n in ("q", "k", "v"))
    if c.attention == "flash":
        _linear_backward(p, c, "output projection backward", gpi, proj, None, (), recomputed)
        p.op("flash attention backward", alloc=[gq, gk, gv])
        p.op("released", free=[g if drop else None, gpi, "Q", "K", "V", "softmax log-sum-exp",
                               "output projection input"])
    else:
        _linear_backward(p, c, "output projection backward", gpi, proj, "output projection input",
                         [g if drop else None], recomputed)
        g4 = gpi
        if not c.single:
            g4 = p.new("gradient of the attention output (B, H, S, d/H)", BSd, a, "heads split: a copy", tp=True)
            p.op("heads split", alloc=[g4])
            p.op("released", free=[gpi])
        gp = p.new("gradient of the probabilities", BHSS, a, "g @ v^T", tp=True)
        p.op("probabilities @ V backward", alloc=[gv, gp])
        p.op("released", free=[g4, None if c.single else "V", "attention dropout output" if drop else None])
        if drop:
            gp2 = p.new("gradient through the attention dropout", BHSS, a, "times the mask", tp=True)
            p.op("attention dropout backward", alloc=[gp2])
            p.op("released", free=[gp, "attention dropout mask"])
            gp = gp2
        gm = p.new("gradient of the masked scores", BHSS, a, "softmax backward's output", tp=True)
        p.op("softmax backward", alloc=[gm])
        p.op("released", free=[gp, "softmax output"])
        gsc = p.new("gradient of the scaled scores", BHSS, a, "masked_fill backward's output", tp=True)
        p.op("masked_fill backward", alloc=[gsc])
        p.op("released", free=[gm, "@causal mask"])
        gr = p.new("gradient of QK^T", BHSS, a, "times the scale", tp=True)
        p.op("scale backward", alloc=[gr])
        p.op("released", free=[gsc])
        p.op("QK^T backward", alloc=[gq, gk])
        p.op("released", free=[gr, "K", "Q", "V" if c.single else None])
    stack = p.new("stacked q, k, v gradients", (B, S, 3 * d), a, "torch.stack of the three gradients", tp=True)
    gqkv = p.new("gradient of the QKV projection output", (B, S, 3 * d), a, "permuted back: a copy", tp=True)
    p.op("q, k, v gradients stacked", alloc=[stack])
    p.op("released", free=[gq, gk, gv])
    p.op("permuted back", alloc=[gqkv])
    p.op("released", free=[stack])
    gn1 = p.new("gradient of norm 1's output", BSd, a, "the QKV projection's input gradient")
    _linear_backward(p, c, "QKV projection backward", gn1, _grads(p, ["qkv.weight", "qkv.bias"], c, share),
                     "Q/K/V projection input", [gqkv], recomputed)
    if fp32_composite:
        norm_backward(p, c, "1", gn1, "prev: dX_out", _grads(p, ["norm1.weight", "norm1.bias"], c, share),
                      residual=gxm)
    else:
        gx1 = p.new("gradient of norm 1's input", BSd, a, "norm 1 backward's output")
        norm_backward(p, c, "1", gn1, gx1, _grads(p, ["norm1.weight", "norm1.bias"], c, share))
        p.op("residual gradients summed", alloc=["prev: dX_out"])
        p.op("released", free=[gx1, gxm])
