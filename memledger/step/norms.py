"""The norms' programs for the step timeline: LayerNorm, fused RMSNorm and composite RMSNorm, op by op.

LayerNorm (``native_layer_norm``) and the fused RMSNorm keep their input and
per-token statistics and run as one kernel each way. ``nn.RMSNorm`` without a
fused kernel (CPU) runs as ATen's composite (``rms_norm_composite`` in
``aten/src/ATen/native/layer_norm.cpp``): an FP32 upcast, pow, mean, rsqrt,
two products and a downcast forward, and their backward formulas, each a
B*S*d FP32 temporary. Under a checkpoint (:attr:`~memledger.step.vocab.Save.DROPPED`)
the same ops run, and what they would save dies as soon as the norm is done.
Read off MemTracker's allocation log of the reference decoder and checked by
``tests/step/test_timeline.py``.
"""
from ..core.symbols import d
from .ops import BS, BSd
from .vocab import OpRole, Save

__all__ = ["norm_backward", "norm_forward"]


def _prefix(c, k):
    norm = "LayerNorm" if c.gpt else "RMSNorm"
    return f"{k} {norm}" if k in ("final", "embedding") else f"{norm} {k}"


def _stats(c, prefix):
    if c.composite or not c.stats:
        return []
    return [f"{prefix} mean", f"{prefix} rstd"] if c.gpt else [f"{prefix} rstd"]


def norm_forward(p, c, k, out, save=Save.KEPT) -> str:
    """LayerNorm, fused or composite RMSNorm ``k`` ("1", "2", "final") writing ``out`` (its input is live);
    returns the output's name. ``save``: KEPT, its input, statistics and output are the inventory's rows;
    DROPPED (under a checkpoint), they are temporaries freed once no op needs them (the output is then
    for its consumer to release)."""
    kept = save is Save.KEPT
    prefix, a, f = _prefix(c, k), c.dtype, "fp32"

    def saved(row, short, shape):
        """What the norm saves: its inventory row, or a temporary under a checkpoint."""
        return row if kept else p.new(f"norm {k}: {short} (checkpointed)", shape, f, "not kept")

    def temporary(short, shape):
        return p.new(f"norm {k}: {short}" + ("" if kept else " (checkpointed)"), shape, f, "composite RMSNorm, FP32")
    if not kept:
        out = p.new(f"norm {k} output (checkpointed)", BSd, a, "the norm's output, until its consumer has run")
    if c.rmsnorm == "hf" and not c.gpt:
        return _hf_forward(p, c, k, prefix, out, kept)
    if not c.composite:
        stats = _stats(c, prefix) if kept else [
            p.new(f"norm {k} {s} (dropped)", BS, f if (not c.gpt and s == "rstd") or a == f else c.stats_dtype or a,
                  "not kept under checkpointing") for s in (("mean", "rstd") if c.gpt else ("rstd",)) if c.stats]
        p.op(f"norm {k}", alloc=[out] + stats)
        if not kept:
            p.op("statistics dropped", free=stats)
        return out
    x32 = saved(f"{prefix} input", "FP32 input", BSd) if kept or c.upcast else None
    sq, ms = temporary("x^2", BSd), temporary("mean(x^2)", BS)
    rstd, xr = saved(f"{prefix} rstd", "rstd", BS), saved(f"{prefix} x*rstd", "x*rstd", BSd)
    if c.upcast:
        p.op(f"norm {k} upcast", alloc=[x32])
    p.op(f"norm {k} rsqrt(mean(x^2))", alloc=[sq, ms, rstd])
    p.op(f"norm {k} x*rstd", free=[ms, sq], alloc=[xr])
    if c.upcast:
        xrw = temporary("x*rstd*w", BSd)
        wcopy = None
        if c.rmsnorm == "litgpt":       # LitGPT's RMSNorm: weight.float(), saved by the product
            wcopy = f"{prefix} weight (FP32 copy)" if kept else p.new(f"norm {k}: weight (FP32 copy, checkpointed)",
                                                                      (d,), f, "weight.float(), until the product")
            p.op(f"norm {k} weight.float()", alloc=[wcopy])
        p.op(f"norm {k} weight", alloc=[xrw])
        if not kept and wcopy:
            p.op("released", free=[wcopy])
        if kept:
            p.op(f"norm {k} downcast", alloc=[out])
            p.op(f"norm {k} done", free=[xrw])
        else:               # read off MemTracker's log: the product and the upcast input go before the downcast
            p.op("released", free=[xrw, x32])
            p.op(f"norm {k} downcast", alloc=[out])
    else:
        p.op(f"norm {k} weight", alloc=[out])
    if not kept:
        p.op("released", free=[xr, rstd])
    return out


#: The roles of a block's norms' backward nodes that read saved tensors: (norm, node) -> OpRole.
NODE_ROLES = {("1", "weight"): OpRole.NORM1_WEIGHT_BACKWARD, ("1", "x*rstd"): OpRole.NORM1_X_RSTD_BACKWARD,
              ("1", "rsqrt"): OpRole.NORM1_RSQRT_BACKWARD, ("1", "pow"): OpRole.NORM1_POW_BACKWARD,
              ("2", "weight"): OpRole.NORM2_WEIGHT_BACKWARD, ("2", "x*rstd"): OpRole.NORM2_X_RSTD_BACKWARD,
              ("2", "rsqrt"): OpRole.NORM2_RSQRT_BACKWARD, ("2", "pow"): OpRole.NORM2_POW_BACKWARD}


def norm_backward(p, c, k, g_out, g_in, grads, residual=None, also_free=()):
    """Backward of norm ``k``: ``g_out`` (live) -> ``g_in``; frees what the norm saved; writes ``grads``.

    ``residual``: the gradient already waiting for the norm's input (the skip
    connection's). With an FP32 input, composite RMSNorm's two paths into x
    are summed into it inside the norm's backward (autograd's input buffer),
    and ``g_in`` is that sum; otherwise the caller adds ``residual``. ``also_free``: tensors released
    with the norm's input.
    """
    prefix = _prefix(c, k)
    if c.rmsnorm == "hf" and not c.gpt:
        return _hf_backward(p, c, k, prefix, g_out, g_in, grads, also_free)
    if not c.composite:
        p.op(f"norm {k} backward", alloc=[g_in] + grads)
        p.op(f"norm {k} released", free=[g_out, f"{prefix} input"] + _stats(c, prefix) + list(also_free))
        return
    x32, rstd, xr = f"{prefix} input", f"{prefix} rstd", f"{prefix} x*rstd"
    t = _composite_temporaries(p, k)
    role = {node: NODE_ROLES.get((k, node)) for node in ("weight", "x*rstd", "rsqrt", "pow")}
    if c.upcast:
        p.op(f"norm {k} backward: upcast", alloc=[t["g32"]])
        p.op(f"norm {k} backward: weight", free=[g_out], alloc=[t["g*w"], t["g*xr"]], role=role["weight"])
        p.op(f"norm {k} backward: weight sum", alloc=[t["sum g*xr"]])
        p.op(f"norm {k} backward: weight gradient", free=[t["g*xr"]] + (
            [f"{prefix} weight (FP32 copy)"] if c.rmsnorm == "litgpt" else []), alloc=grads)
        p.op(f"norm {k} backward: x*rstd", free=[t["sum g*xr"], t["g32"], xr], alloc=[t["g*rstd"], t["g*x"]],
             role=role["x*rstd"])
        p.op(f"norm {k} backward: rstd gradient", alloc=[t["g_rstd"]])
        first, pending = t["g*rstd"], [t["g*x"], t["g*w"]]
    else:
        p.op(f"norm {k} backward: weight", alloc=[t["g*w"], t["g*xr"]], role=role["weight"])
        p.op(f"norm {k} backward: weight gradient", alloc=grads)
        p.op(f"norm {k} backward: x*rstd", free=[t["g*xr"], g_out, xr], alloc=[t["g*rstd"], t["g*x"]],
             role=role["x*rstd"])
        p.op(f"norm {k} backward: rstd gradient", alloc=[t["g_rstd"]])
        first, pending = t["g*rstd"], [t["g*x"], t["g*w"]]
        if residual:
            p.op(f"norm {k} backward: add to the skip gradient", free=pending, alloc=[t["g_x+res"]])
            p.op(f"norm {k} backward: buffer", free=[residual, t["g*rstd"]])
            first, pending = t["g_x+res"], []
    p.op(f"norm {k} backward: rsqrt", free=pending, alloc=[t["rsqrt'"], t["rsqrt''"], t["g_ms"]], role=role["rsqrt"])
    p.op(f"norm {k} backward: mean", free=[t["rsqrt''"], t["rsqrt'"], t["g_rstd"], rstd], alloc=[t["g_mean"]])
    if c.rmsnorm == "litgpt":
        return _square_backward(p, k, t, first, x32, also_free, role["pow"], g_in)
    p.op(f"norm {k} backward: pow", free=[t["g_ms"]], alloc=[t["pow'"], t["pow''"], t["g_pow"]], role=role["pow"])
    total = t["g_x32"] if c.upcast else g_in
    p.op(f"norm {k} backward: sum", free=[t["pow''"], t["pow'"], t["g_mean"], x32] + list(also_free), alloc=[total])
    p.op(f"norm {k} backward: summed", free=[first, t["g_pow"]])
    if c.upcast:
        p.op(f"norm {k} backward: downcast", alloc=[g_in])
        p.op(f"norm {k} backward: done", free=[t["g_x32"]])


def _square_backward(p, k, t, first, x32, also_free, role, g_in):
    """LitGPT's ``torch.mean(x * x)`` (``litgpt/model.py`` l. 1319) backward, where the composite's ``pow`` makes three
    B*S*d FP32 tensors: ``MulBackward0`` of ``x * x`` writes the gradient times the other operand for each (two FP32
    B*S*d products; the mean's gradient and the FP32 input go once it returns), and autograd's input buffer of
    ``x.float()``, which holds ``first`` (the gradient through ``x * rstd``), adds each to it out of place (under
    ``FakeTensorMode`` on the CPU: the :mod:`memledger.step.norms` convention of the composite's sum); the downcast
    back to the activation dtype. Read off MemTracker's log of LitGPT's own ``GPT`` (0.5.13), checked by
    ``tests/pytorch/test_torchtune_litgpt.py``."""
    f = "fp32"
    a, b = (p.new(f"norm {k} backward: g*x ({n})", BSd, f, "x * x backward: the gradient times the other operand")
            for n in ("self", "other"))
    once = p.new(f"norm {k} backward: buffer, first sum", BSd, f, "autograd's input buffer: first plus self's")
    p.op(f"norm {k} backward: x*x", free=[t["g_ms"]], alloc=[a, b], role=role)
    p.op("released", free=[t["g_mean"], x32] + list(also_free))
    p.op(f"norm {k} backward: sum", alloc=[once])
    p.op("released", free=[first])
    p.op(f"norm {k} backward: summed", alloc=[t["g_x32"]])
    p.op("released", free=[once, a, b])
    p.op(f"norm {k} backward: downcast", alloc=[g_in])
    p.op(f"norm {k} backward: done", free=[t["g_x32"]])


def _composite_temporaries(p, k):
    """The FP32 temporaries of composite RMSNorm ``k``'s backward (``x * rsqrt(mean(x^2) + eps) * w`` under
    autograd), by the step each stands for: the weight's and x*rstd's products, rsqrt's, mean's and pow's
    backward, the two gradients of x summed and the skip gradient added."""
    f = "fp32"
    return {n: p.new(f"norm {k} backward: {n}", shape, f, why) for n, shape, why in [
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


def _hf_forward(p, c, k, prefix, out, kept):
    """transformers' ``LlamaRMSNorm.forward`` (``modeling_llama.py`` l. 62-67; :mod:`memledger.step.hf`): upcast,
    ``pow(2)``, ``mean`` (``variance``, a local until the norm returns), ``+ eps``, ``rsqrt``, the product, the
    downcast (saved by the weight's product), the weight's product."""
    f = "fp32"
    x32, rstd, xn = f"{prefix} input", f"{prefix} rstd", f"{prefix} normalized"
    if not kept:        # under the layer's checkpoint: each tensor dies with its last Python reference
        x32, rstd = p.new(f"norm {k}: FP32 input (checkpointed)", BSd, f, "hidden_states.to(torch.float32)"), \
            p.new(f"norm {k}: rstd (checkpointed)", BS, f, "rsqrt(variance + eps), a temporary")
        xn = p.new(f"norm {k}: normalized (checkpointed)", BSd, c.dtype, "hidden_states.to(input_dtype)")
    sq, ms = p.new(f"norm {k}: x^2", BSd, f, "pow(2)"), p.new(f"norm {k}: variance", BS, f, "mean(x^2), a local")
    ve = p.new(f"norm {k}: variance + eps", BS, f, "rsqrt's input")
    xr = p.new(f"norm {k}: x*rstd", BSd, f, "hidden_states * rstd (FP32), a local until the norm returns")
    p.op(f"norm {k} upcast", alloc=[x32])
    p.op(f"norm {k} pow", alloc=[sq])
    p.op(f"norm {k} mean", alloc=[ms])
    p.op(f"norm {k} + eps", free=[sq], alloc=[ve])
    p.op(f"norm {k} rsqrt", alloc=[rstd])
    if not kept:        # rsqrt's input goes once rsqrt returns; the product replaces hidden_states (x32)
        p.op("released", free=[ve])
        p.op(f"norm {k} x*rstd", alloc=[xr])
        p.op("released", free=[rstd, x32])
        p.op(f"norm {k} downcast", alloc=[xn])
        p.op(f"norm {k} weight", alloc=[out])
        p.op(f"norm {k} returns", free=[xn, xr, ms])
        return out
    p.op(f"norm {k} x*rstd", free=[ve], alloc=[xr])
    p.op(f"norm {k} downcast", alloc=[xn])
    p.op(f"norm {k} weight", alloc=[out])
    p.op(f"norm {k} returns", free=[xr, ms])
    return out


def _hf_backward(p, c, k, prefix, g_out, g_in, grads, also_free):
    """The backward of transformers' ``LlamaRMSNorm``: the weight's product (the weight's gradient, a B*S*d product
    reduced to d, then the input's), the downcast's (an FP32 copy), the product with rstd, rsqrt, mean and pow, the
    two FP32 gradients of the upcast input summed, the upcast's (back to the activation dtype)."""
    f, a = "fp32", c.dtype
    x32, rstd, xn = f"{prefix} input", f"{prefix} rstd", f"{prefix} normalized"
    t = {n: p.new(f"norm {k} backward: {n}", shape, dtype, why) for n, shape, dtype, why in [
        ("g*xn", BSd, a, "the weight's gradient before it is summed to (d,)"),
        ("g*w", BSd, a, "the normalized input's gradient"),
        ("g32", BSd, f, "the downcast's backward: an FP32 copy"),
        ("g*rstd", BSd, f, "gradient of x through x*rstd"),
        ("g*x", BSd, f, "for the rstd gradient: g times x"),
        ("g_rstd", BS, f, "the rstd gradient"),
        ("rsqrt'", BS, f, "rsqrt backward: a per-token temporary"),
        ("rsqrt''", BS, f, "rsqrt backward: a per-token temporary"), ("g_ms", BS, f, "gradient of mean(x^2)"),
        ("g_mean", BSd, f, "mean backward: expanded over d, divided by d"),
        ("pow'", BSd, f, "pow backward: a temporary"), ("pow''", BSd, f, "pow backward: a temporary"),
        ("g_pow", BSd, f, "gradient of x through x^2"), ("g_x32", BSd, f, "sum of both gradients of x (FP32)")]}
    p.op(f"norm {k} backward: weight", alloc=[t["g*xn"]], role=NODE_ROLES.get((k, "weight")))
    p.op(f"norm {k} backward: normalized input", alloc=[t["g*w"]])
    p.op(f"norm {k} backward: weight gradient", alloc=grads)
    p.op("released", free=[t["g*xn"], g_out, xn])
    p.op(f"norm {k} backward: downcast", alloc=[t["g32"]])
    p.op("released", free=[t["g*w"]])
    p.op(f"norm {k} backward: x*rstd", alloc=[t["g*rstd"], t["g*x"]], role=NODE_ROLES.get((k, "x*rstd")))
    p.op(f"norm {k} backward: rstd gradient", alloc=[t["g_rstd"]])
    p.op("released", free=[t["g*x"], t["g32"]])
    p.op(f"norm {k} backward: rsqrt", alloc=[t["rsqrt'"], t["rsqrt''"], t["g_ms"]], role=NODE_ROLES.get((k, "rsqrt")))
    p.op(f"norm {k} backward: mean", free=[t["rsqrt''"], t["rsqrt'"], t["g_rstd"], rstd], alloc=[t["g_mean"]])
    p.op(f"norm {k} backward: pow", free=[t["g_ms"]], alloc=[t["pow'"], t["pow''"], t["g_pow"]],
         role=NODE_ROLES.get((k, "pow")))
    p.op(f"norm {k} backward: sum", free=[t["pow''"], t["pow'"], t["g_mean"], x32] + list(also_free),
         alloc=[t["g_x32"]])
    p.op(f"norm {k} backward: summed", free=[t["g*rstd"], t["g_pow"]])
    p.op(f"norm {k} backward: upcast's backward", alloc=[g_in])
    p.op(f"norm {k} backward: done", free=[t["g_x32"]])
