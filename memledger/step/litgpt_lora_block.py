"""One layer of LitGPT's LoRA ``GPT`` (``implementation="litgpt"``) op by op, forward and backward, the first layer's
own programs beside it (:class:`~memledger.step.trace.FirstBlock`). What each layer saves: :mod:`memledger.step.litgpt_lora`.

Read from LitGPT 0.5.13 (``litgpt/model.py``, ``litgpt/lora.py``) and MemTracker's allocation log of its own model
(PyTorch 2.13, CPU):

* **RMSNorm** with a frozen weight (``model.py`` l. 1315-1322): ``x.float()``, ``x * x``, ``mean``, ``+ eps``,
  ``rsqrt``, ``x * rsqrt``, ``weight.float()``, the product, ``.to(dtype)``; ``norm_x`` is a local until the norm
  returns. Saved: the FP32 input, rstd and the weight's FP32 copy, where the input requires grad; in the first layer
  nothing (each tensor dies with its last reference). Backward (no weight gradient): the output gradient upcast,
  times the FP32 weight, the two paths of ``x * rsqrt`` and the three of ``x * x`` (``mean``'s backward expanded),
  summed in FP32 and cast back.
* **LoRAQKVLinear.forward** (``lora.py`` l. 381-414): the frozen ``linear`` (its output a local), ``lora_dropout``
  (CPU: ``empty_like`` + ``bernoulli_`` noise, then the product), A (``F.linear``: ``after_A``), ``conv1d`` (a
  grouped 1 x 1 convolution: ``after_B``, laid out (B, n d, S)), ``zero_pad`` (``new_zeros`` of 3 d, a clone of
  ``_lora_ind``, ``index_copy_`` in place) where not every slice is adapted, ``* scaling``, ``pretrained + lora``:
  the fused output, whose view v keeps it whole. Backward: ``* scaling``, ``index_copy_``'s source gradient
  (``index_select``), ``conv1d``'s (A's output's gradient and B's weight gradient at once), A's (its weight's
  gradient, then its input's where that requires grad), the dropout's, the frozen linear's input gradient, summed.
  In the first layer neither the frozen linear nor A has an input gradient to compute: the fused output's gradient
  goes with the scaling's backward.
* **CausalSelfAttention.forward** (l. 472-570): ``apply_rope`` on q and k (l. 1144-1173), ``torch.cat`` with their
  empty unrotated parts; ``q_roped`` and ``k_roped`` are locals until the attention returns; SDPA's flash kernel;
  ``y.reshape`` (a copy, the frozen output projection's input, a local). Backward: each ``torch.cat``'s empty part
  (``slice_backward``: zeros of q's or k's size), k's rotary backward then q's, each copied back to (B, S, d), the
  split's backward (``cat``).
* **Block.forward** (l. 307-343): ``x_normed`` (norm 1's output) lives until norm 2 replaces it,
  ``attention_output`` until the block returns; **LLaMAMLP** (l. 827-831): ``fc_1``, ``fc_2``, SiLU, the product (a
  local: the frozen ``proj`` keeps no input).

Checked against LitGPT's own model and ``finetune/lora.py``'s loop under ``FakeTensorMode``
(tests/step/test_litgpt_lora_step.py).
"""
from ..core.symbols import B, S, d, r
from .litgpt import ATTENTION_OUTPUT, QKV, _rope
from .ops import BS, BSd, BSF, INPUT_GRADIENT, Ref, dropout_ops, gradient
from .vocab import OpRole, Scope

__all__ = ["block_backward", "block_forward"]

X, XM = "block input", "attention residual sum"


def _prefix(k):
    return f"RMSNorm {k}"


def norm_forward(p, c, k, out, grad=True, also_free=()):
    """LitGPT's RMSNorm ``k`` ("1", "2", "final") with its frozen weight writing ``out``; ``grad``: its input
    requires grad (its FP32 input, rstd and FP32 weight saved), else nothing is kept. ``also_free``: released when
    the norm returns."""
    f, pre = "fp32", _prefix(k)

    def tensor(name, shape, why):
        return p.new(f"norm {k}: {name}", shape, f, why)
    saved = [f"{pre} input (FP32)", f"{pre} rstd", f"{pre} weight (FP32 copy)"] if grad else [
        tensor("x.float() (not kept)", BSd, "its input needs no gradient"), tensor("rstd (not kept)", BS, ""),
        tensor("weight.float() (not kept)", (d,), "")]
    x32, rstd, w32 = saved
    sq, ms, mse = tensor("x * x", BSd, "mean's input"), tensor("norm_x", BS, "a local"), tensor("norm_x + eps", BS, "")
    xn, prod = tensor("x_normed", BSd, "x * rsqrt"), tensor("x_normed * weight", BSd, "")
    p.op(f"norm {k}: x.float()", alloc=[x32])
    p.op(f"norm {k}: x * x", alloc=[sq])
    p.op(f"norm {k}: mean", alloc=[ms])
    p.op(f"norm {k}: + eps", alloc=[mse], free=[sq])
    p.op(f"norm {k}: rsqrt", alloc=[rstd])
    p.op(f"norm {k}: x * rsqrt", alloc=[xn], free=[mse])
    p.op(f"norm {k}: weight.float()", alloc=[w32], free=[] if grad else [rstd])
    p.op(f"norm {k}: * weight", alloc=[prod])
    p.op(f"norm {k}: .to(dtype)", alloc=[out], free=[] if grad else [w32])
    p.op(f"norm {k} returns", free=[xn, prod, ms] + ([] if grad else [x32]) + list(also_free))


def norm_backward(p, c, k, g_out, g_in):
    """The frozen RMSNorm ``k``'s backward: ``g_out`` (its output's gradient, freed) -> ``g_in``."""
    f, pre = "fp32", _prefix(k)
    t = {n: p.new(f"norm {k} backward: {n}", shape, f, why) for n, shape, why in [
        ("g32", BSd, ".to(dtype) backward"), ("g*w", BSd, "times the FP32 weight"),
        ("g*rstd", BSd, "x * rsqrt backward, to x"), ("g*x", BSd, "x * rsqrt backward, to rsqrt"),
        ("g_rstd", BS, "summed over d"), ("pow", BS, "rsqrt backward"), ("pow*", BS, "rsqrt backward"),
        ("g_ms", BS, "rsqrt backward's output"), ("g_mean", BSd, "mean backward: expanded, divided by d"),
        ("x*g", BSd, "x * x backward, one side"), ("g*x'", BSd, "x * x backward, the other"),
        ("sum 1", BSd, "autograd's input buffer"), ("sum 2", BSd, "autograd's input buffer")]}
    p.op(f"norm {k} backward: upcast", alloc=[t["g32"]])
    p.op("released", free=[g_out])
    p.op(f"norm {k} backward: * weight", alloc=[t["g*w"]])
    p.op("released", free=[t["g32"], f"{pre} weight (FP32 copy)"])
    p.op(f"norm {k} backward: x * rsqrt", alloc=[t["g*rstd"]])
    p.op(f"norm {k} backward: x * rsqrt, rsqrt's side", alloc=[t["g*x"]])
    p.op(f"norm {k} backward: sum", alloc=[t["g_rstd"]])
    p.op("released", free=[t["g*x"], t["g*w"]])
    p.op(f"norm {k} backward: rsqrt", alloc=[t["pow"], t["pow*"], t["g_ms"]])
    p.op("released", free=[t["pow"], t["pow*"], t["g_rstd"], f"{pre} rstd"])
    p.op(f"norm {k} backward: mean", alloc=[t["g_mean"]])
    p.op("released", free=[t["g_ms"]])
    p.op(f"norm {k} backward: x * x", alloc=[t["x*g"], t["g*x'"]])
    p.op("released", free=[t["g_mean"], f"{pre} input (FP32)"])
    p.op(f"norm {k} backward: summed", alloc=[t["sum 1"]])
    p.op("released", free=[t["g*rstd"]])
    p.op(f"norm {k} backward: summed again", alloc=[t["sum 2"]])
    p.op("released", free=[t["sum 1"], t["x*g"], t["g*x'"]])
    p.op(f"norm {k} backward: downcast", alloc=[g_in])
    p.op("released", free=[t["sum 2"]])


def _n(targets) -> int:
    return len(targets)


def qkv_forward(p, c, targets, dropout, h1, grad):
    """``LoRAQKVLinear.forward`` on norm 1's output ``h1``: the fused output (the saved row :data:`QKV`); returns the
    locals freed as the attention starts."""
    a, n = c.dtype, _n(targets)
    base = p.new("frozen QKV output", (B, S, 3 * d), a, "pretrained = self.linear(x): a local")
    p.op("QKV projection (frozen)", alloc=[base], role=OpRole.QKV_PROJECTION)
    src = h1
    if dropout:
        mask = "LoRA qkv dropout mask" if grad else p.new("LoRA qkv dropout mask (not kept)", BSd, "bool" if
                                                          c.mask_dtype == "bool" else a, "x needs no gradient")
        src = "LoRA qkv dropout output"
        dropout_ops(p, c, "LoRA qkv", mask, src)
    p.op("LoRA qkv A", alloc=["LoRA qkv A output"], free=[mask] if dropout and not grad else [])
    after_b = "LoRA qkv B output" if n < 3 else p.new("LoRA qkv conv1d output", (B, S, 3 * d), a, "after_B: "
                                                      "not kept (no zero_pad)")
    p.op("LoRA qkv conv1d (B)", alloc=[after_b])
    padded = after_b
    if n < 3:
        padded = p.new("LoRA qkv zero_pad output", (B, S, 3 * d), a, "x.new_zeros(..., 3 d), index_copy_ in place")
        p.op("zero_pad: new_zeros", alloc=[padded])
        p.op("zero_pad: lora_ind.clone(), index_copy_", alloc=["LoRA qkv lora_ind (a clone)"])
    delta = p.new("LoRA qkv delta", (B, S, 3 * d), a, "zero_pad(after_B) * scaling")
    p.op("LoRA qkv * scaling", alloc=[delta])
    p.op("pretrained + lora", alloc=[QKV], free=[padded])
    return [base, delta]


def attention_forward(p, c, locals_):
    """From the fused output to the output projection's output (a local until the block returns): rotary code,
    SDPA, ``y.reshape`` (a copy), the frozen ``proj``; q_roped, k_roped and y go when the attention returns."""
    a = c.dtype
    p.op("attention: the QKV locals released", free=locals_)
    held = [_rope(p, c, "q", "Q", hold=True), _rope(p, c, "k", "K", hold=True)]
    p.op("flash attention", alloc=[ATTENTION_OUTPUT, "softmax log-sum-exp"])
    y = p.new("output projection input", BSd, a, "y.reshape(B, T, C): a copy; the frozen proj keeps none")
    p.op("y.transpose(1, 2).reshape(B, T, C): a copy", alloc=[y])
    po = p.new("output projection output", BSd, a, "attention_output: a local of Block.forward")
    p.op("output projection (frozen)", alloc=[po], role=OpRole.OUTPUT_PROJECTION)
    p.op("residual add (the attention returned)", alloc=[XM], free=[y] + held)
    return po


def mlp_forward(p, c, h2):
    """LLaMAMLP on ``h2`` with frozen projections; returns (its output, the product: a local)."""
    a = c.dtype
    prod = p.new("fc_1 SiLU * fc_2", BSF, a, "the frozen proj keeps no input")
    dn = p.new("MLP output", BSd, a, "a local until the block returns")
    p.op("fc_1 (frozen)", alloc=["fc_1 output"], role=OpRole.GATE_PROJECTION)
    p.op("fc_2 (frozen)", alloc=["fc_2 output"], role=OpRole.UP_PROJECTION)
    p.op("SiLU", alloc=["SiLU output"])
    p.op("SiLU * fc_2", alloc=[prod])
    p.op("proj (frozen)", alloc=[dn], role=OpRole.DOWN_PROJECTION)
    return dn, prod


def block_forward(p, c, targets, dropout, first=False):
    """One layer's forward: its input (:data:`X`) live, its output the next layer's input; ``first``: the first
    layer (its input needs no gradient)."""
    a = c.dtype
    h1 = "norm 1 output" if not dropout else p.new("norm 1 output (a local)", BSd, a, "x_normed, until norm 2 "
                                                   "replaces it (A reads the dropout's output)")
    norm_forward(p, c, "1", h1, grad=not first)
    po = attention_forward(p, c, qkv_forward(p, c, targets, dropout, h1, not first))
    h2 = p.new("norm 2 output", BSd, a, "x_normed, until the block returns")
    norm_forward(p, c, "2", h2, also_free=[] if h1 == "norm 1 output" else [h1])
    dn, prod = mlp_forward(p, c, h2)
    p.op("residual add", alloc=[Ref(Scope.NEXT, X, "final norm input")], free=[prod])
    p.op("block returns", free=[po, dn, h2, XM, X], role=OpRole.BLOCK_RETURNS)


def _rope_backward(p, c, n, g, tail):
    """``apply_rope``'s backward for ``n`` from ``g`` (its concatenation's gradient, freed), then the sum with
    ``tail`` (the empty unrotated part's ``slice_backward``: zeros); returns the gradient of ``n`` (B, H, S, d/H)."""
    a, f = c.dtype, "fp32"

    def t(name, shape, dtype, why):
        return p.new(f"grad {n}: {name}", shape, dtype, why)
    g32, s32, s = t("FP32", BSd, f, ".to(dtype) backward"), t("* sin (FP32)", BSd, f, ""), t("* sin", BSd, a, "")
    c32, cg = t("* cos (FP32)", BSd, f, ""), t("* cos", BSd, a, "x * cos backward, cast back")
    neg, sl2 = t("-x2", (B, S, d / 2), a, "neg backward"), t("x2 slice_backward", BSd, a, "zeros, copied in")
    sl1, acc1, acc2 = t("x1 slice_backward", BSd, a, ""), t("sum 1", BSd, a, ""), t("sum 2", BSd, a, "")
    out = t("summed with the empty part's", BSd, a, "autograd's input buffer")
    p.op(f"{n} roped.to backward", alloc=[g32])
    p.op("released", free=[g])
    p.op(f"rotated {n} * sin backward", alloc=[s32])
    p.op("cast", alloc=[s])
    p.op("released", free=[s32])
    p.op(f"{n} * cos backward", alloc=[c32])
    p.op("cast", alloc=[cg])
    p.op("released", free=[c32])
    p.op("released", free=[g32])
    p.op(f"-{n}2 backward", alloc=[neg])
    p.op(f"{n}2 slice backward", alloc=[sl2])
    p.op("released", free=[neg])
    p.op(f"{n} gradients summed", alloc=[acc1])
    p.op("released", free=[cg, sl2])
    p.op(f"{n}1 slice backward", alloc=[sl1])
    p.op("released", free=[s])
    p.op(f"{n} gradients summed", alloc=[acc2])
    p.op("released", free=[acc1, sl1])
    p.op(f"{n} gradients summed", alloc=[out])
    p.op("released", free=[acc2, tail])
    return out


def mlp_backward(p, c) -> str:
    """LLaMAMLP's backward with frozen projections from ``dX_out``; returns norm 2's output's gradient."""
    a = c.dtype
    g_prod = p.new("gradient of the MLP product", BSF, a, "proj's input gradient")
    g_silu, g_fc2, g_fc1 = (p.new(f"gradient of the {n}", BSF, a, "") for n in ("SiLU output", "fc_2 output",
                                                                                "fc_1 output"))
    gx2, gx1, g_h2 = (p.new(f"gradient of norm 2's output{n}", BSd, a, "") for n in (" (fc_2)", " (fc_1)", ""))
    p.op("proj backward (input gradient only)", alloc=[g_prod], role=OpRole.DOWN_PROJECTION_BACKWARD)
    p.op("SiLU * fc_2 backward", alloc=[g_silu, g_fc2], role=OpRole.SWIGLU_PRODUCT_BACKWARD)
    p.op("released", free=[g_prod, "SiLU output", "fc_2 output"])
    p.op("SiLU backward", alloc=[g_fc1], role=OpRole.SILU_BACKWARD)
    p.op("released", free=[g_silu, "fc_1 output"])
    p.op("fc_2 backward (input gradient only)", alloc=[gx2], role=OpRole.UP_PROJECTION_BACKWARD)
    p.op("released", free=[g_fc2])
    p.op("fc_1 backward (input gradient only)", alloc=[gx1], role=OpRole.GATE_PROJECTION_BACKWARD)
    p.op("released", free=[g_fc1])
    p.op("gradients summed", alloc=[g_h2])
    p.op("released", free=[gx1, gx2])
    return g_h2


def attention_backward(p, c, gxm, first) -> str:
    """From the attention residual sum's gradient ``gxm`` (freed here in the first layer, whose input takes none)
    to the fused output's gradient."""
    a = c.dtype
    g_y = p.new("gradient of the output projection input", BSd, a, "the frozen proj's input gradient")
    gq, gk, gv = (p.new(f"gradient of {n}", BSd, a, "SDPA's backward") for n in "qkv")
    p.op("output projection backward (input gradient only)", alloc=[g_y], role=OpRole.OUTPUT_PROJECTION_BACKWARD)
    if first:
        p.op("released", free=[gxm])
    p.op("flash attention backward", alloc=[gq, gk, gv], role=OpRole.FLASH_ATTENTION_BACKWARD)
    p.op("released", free=[g_y, "Q", "K", ATTENTION_OUTPUT, "softmax log-sum-exp", QKV])
    tails = [p.new(f"gradient of {n}'s empty unrotated part", BSd, a, "cat backward: slice_backward, zeros")
             for n in "kq"]
    p.op("k's cat backward: slice_backward", alloc=[tails[0]])
    p.op("q's cat backward: slice_backward", alloc=[tails[1]])
    gk2 = _rope_backward(p, c, "k", gk, tails[0])
    gq2 = _rope_backward(p, c, "q", gq, tails[1])
    copies = [p.new(f"gradient of {n}, copied back", BSd, a, "(B, H, S, d/H) to (B, S, d): a clone") for n in "kq"]
    p.op("k gradient copied back", alloc=[copies[0]])
    p.op("released", free=[gk2])
    p.op("q gradient copied back", alloc=[copies[1]])
    p.op("released", free=[gq2])
    gqkv = p.new("gradient of the QKV projection output", (B, S, 3 * d), a, "split backward: a concatenation")
    p.op("split backward", alloc=[gqkv])
    p.op("released", free=copies + [gv])
    return gqkv


def qkv_backward(p, c, targets, dropout, share, gqkv, first):
    """``LoRAQKVLinear``'s backward from the fused output's gradient ``gqkv``: the adapter (scaling, zero_pad,
    conv1d, A, the dropout), then, where its input takes a gradient, the frozen linear's; returns norm 1's output's
    gradient (None in the first layer)."""
    a, n = c.dtype, _n(targets)
    gs = p.new("LoRA qkv scaled gradient", (B, S, 3 * d), a, "* scaling backward")
    p.op("LoRA qkv * scaling backward", alloc=[gs])
    if first:
        p.op("released", free=[gqkv])
    g_b = gs
    if n < 3:
        g_b = p.new("LoRA qkv gradient of after_B", (B, S, n * d), a, "index_copy_ backward: index_select")
        p.op("index_copy_ backward: index_select", alloc=[g_b])
        p.op("released", free=[gs, "LoRA qkv B output", "LoRA qkv lora_ind (a clone)"])
    g_a = p.new("LoRA qkv gradient of after_A", (B, S, n * r), a, "conv1d's input gradient")
    grad_b = gradient(p, "qkv.lora_B", n * d * r, c, share)
    grad_a = gradient(p, "qkv.lora_A", n * r * d, c, share)
    p.op("LoRA qkv conv1d backward", alloc=[g_a, grad_b])
    p.op("released", free=[g_b, "LoRA qkv A output"])
    x = "LoRA qkv dropout output" if dropout else "norm 1 output"
    if first:
        p.op("LoRA qkv A backward (weight gradient only)", alloc=[grad_a])
        p.op("released", free=[g_a, x])
        return None
    g_x = p.new("LoRA qkv gradient of A's input", BSd, a, "A's input gradient")
    p.op("LoRA qkv A backward", alloc=[grad_a, g_x])
    p.op("released", free=[g_a, x])
    if dropout:
        g_d = p.new("LoRA qkv gradient through the dropout", BSd, a, "times the mask")
        p.op("LoRA qkv dropout backward", alloc=[g_d])
        p.op("released", free=[g_x, "LoRA qkv dropout mask"])
        g_x = g_d
    g_base = p.new("gradient of norm 1's output (frozen QKV)", BSd, a, "the frozen linear's input gradient")
    g_h1 = p.new("gradient of norm 1's output", BSd, a, "the two summed")
    p.op("QKV projection backward (input gradient only)", alloc=[g_base], role=OpRole.QKV_PROJECTION_BACKWARD)
    p.op("released", free=[gqkv])
    p.op("gradients summed", alloc=[g_h1])
    p.op("released", free=[g_x, g_base])
    return g_h1


def block_backward(p, c, targets, dropout, share, first=False):
    """One layer's backward from ``dX_out`` (live): the previous layer's (none for the first layer)."""
    a = c.dtype
    g_n2 = p.new("gradient of norm 2's input", BSd, a, "norm 2 backward's output")
    norm_backward(p, c, "2", mlp_backward(p, c), g_n2)
    gxm = p.new("gradient of the attention residual sum", BSd, a, "the skip's and norm 2's summed")
    p.op("residual gradients summed", alloc=[gxm])
    p.op("released", free=["dX_out", g_n2])
    g_h1 = qkv_backward(p, c, targets, dropout, share, attention_backward(p, c, gxm, first), first)
    if first:
        return
    g_n1 = p.new("gradient of norm 1's input", BSd, a, "norm 1 backward's output")
    norm_backward(p, c, "1", g_h1, g_n1)
    p.op("residual gradients summed", alloc=[INPUT_GRADIENT])
    p.op("released", free=[gxm, g_n1])
