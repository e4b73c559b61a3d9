"""The optimizer step op by op beyond AdamW's for-loop and foreach (:func:`memledger.step.outer.optimizer`):
the fused kernels, SGD, Adafactor, and torchtune's optimizer stepped in backward.

* ``AdamW(fused=True)`` and ``SGD(fused=True)`` (``torch._fused_adamw_``, ``torch._fused_sgd_``, CPU and CUDA):
  one kernel updates every tensor in place, no temporaries (measured under ``FakeTensorMode``; the CUDA
  kernels ``aten/src/ATen/native/cuda/fused_adamw_impl.cu`` run ``multi_tensor_apply`` over the lists in
  place). Fused Adam keeps its ``step`` on the parameters' device (``torch/optim/adam.py`` ``_init_group``:
  ``torch.zeros((), ..., device=p.device) if capturable or fused``).
* ``torch.optim.SGD`` (``lr``, ``momentum`` 0 or 0.9, no weight decay): ``buf.mul_(momentum).add_(grad)`` and
  ``param.add_(grad, alpha=-lr)`` in place (``torch/optim/sgd.py`` ``_single_tensor_sgd``; the foreach and
  fused paths likewise): no temporaries, no step counters.
* ``torch.optim.Adafactor`` (``torch/optim/_adafactor.py`` ``_single_tensor_adafactor``; its ``foreach=None``
  default is the for-loop on every device): per tensor, ``param.norm(2)`` (0-d); a matrix's row and column
  norms ``(r, 1)`` and ``(1, k)`` and ``var_estimate = row_var @ col_var`` (r x k, the update, in place),
  ``row_var.mean(-2)`` (1 x 1); a vector's ``grad * grad`` and ``variance.clone()``; ``update.norm(2)``. The
  locals ``row_mean``, ``col_mean``, ``grad_squared`` and ``var_estimate`` live until the next tensor's are
  assigned (``var_estimate`` until ``update``, the same tensor, is: after ``row_var.mean``), all in the
  gradient's dtype. Its state: ``row_var``, ``col_var`` (matrices), ``variance`` (vectors)
  in the gradient's dtype (``p.grad.new_zeros``), one ``step`` per tensor on the host.
* Optimizer in backward (pytorch/torchtune bd2a0fc7c, ``torchtune/training/memory.py`` lines 222-245,
  ``register_optim_in_bwd_hooks``): one
  optimizer per parameter, stepped in the parameter's post-accumulate-grad hook, then its gradient set to None:
  each gradient is stepped and freed as soon as backward writes it (:func:`in_backward`), so no gradient
  outlives its op and the optimizer phase does nothing.
"""
from dataclasses import replace

import sympy as sp

from ..core.dtypes import nbytes
from ..core.symbols import F, L, V, d
from .ops import block_params, qkv_width, widths_of
from .outer import Param, head_params
from .structure import Shape
from .trace import GRADIENT_LUMP, Op
from .vocab import Action, Kind, Lifetime, OpRole, Phase

__all__ = ["adafactor", "factored_bytes", "in_backward", "one_parameter", "param_shape", "temporaries"]


def _shapes(c: Shape) -> dict:
    """A parameter's shape by its name inside a block or outside the blocks (``nn.Linear``: (out, in))."""
    qkv, q = qkv_width(c), widths_of(c)[0][2]
    shapes = {"qkv.weight": (qkv, d), "proj.weight": (d, q), "up.weight": (F, d), "gate.weight": (F, d),
              "down.weight": (d, F), "up.bias": (F,), "qkv.bias": (qkv,),
              "embedding.weight": (V, d), "head.weight": (V, d), "head.bias": (V,)}
    return shapes


def factored_bytes(c: Shape, component):
    """Adafactor's second moment over the reference decoder's tensors (``model.parameters()``): rows + columns
    of each matrix, every element of a vector, in ``component``'s dtype. The decoder's fused QKV projection is
    one (H + 2 H_kv) d_h x d matrix: rows + columns (H + 2 H_kv) d_h + d, where the three separate projections of
    :func:`memledger.models.tensors.factored_elements_expr` (Hugging Face's modules) keep 2d more per block."""
    def factored(shape):
        return shape[0] + shape[1] if len(shape) == 2 else shape[0]
    block = sum(factored(param_shape(c, n)) for n, _ in block_params(c))
    outside = [("embedding.weight", None)] + head_params(c)
    return nbytes(component.dtype) * sp.expand(L * block + sum(factored(param_shape(c, n)) for n, _ in outside))


def param_shape(c: Shape, base: str) -> tuple:
    """The shape of parameter ``base``, its name in its module ("qkv.weight", "embedding.weight", "final
    norm.bias"); a vector of d elements unless named otherwise (norms, the output projection's and the down
    projection's biases)."""
    shape = _shapes(c).get(base, (d,))
    sizes = dict(block_params(c))
    if base in sizes and sp.expand(sp.Mul(*shape) - sizes[base]) != 0:
        raise AssertionError(f"{base}: shape {shape} does not hold {sizes[base]} elements")
    return shape


def adafactor(p, c: Shape, params, dtype: str, where, carried: dict = None, end: bool = True) -> dict:
    """``Adafactor.step()``'s for-loop over ``params`` (a lump is skipped: its tensors' locals are those of
    block 0's, which it repeats); ``carried``: the locals left by earlier tensors; ``end``: the step returns
    (every local released)."""
    live = dict(carried or {})

    def assign(local, name, shape, why, then=None):
        t = p.new(f"Adafactor {local} of {name}", shape, dtype, why, device=where)
        p.op(f"Adafactor {local}: {name}", alloc=[t])
        if then:
            then()
        if live.get(local):
            p.op("released", free=[live[local]])
        live[local] = t

    def scalar(name, label, shape=()):
        t = p.new(f"{label} of {name}", shape, dtype, "a 0-d temporary", device=where)
        p.op(label, alloc=[t])
        p.op("released", free=[t])
    for x in params:
        if x.lump:
            continue
        shape = param_shape(c, x.key)
        scalar(x.name, "param.norm(2)")
        if len(shape) == 2:
            r, k = shape
            assign("row_mean", x.name, (r, 1), "torch.norm(grad, dim=-1) squared, / k")
            assign("col_mean", x.name, (1, k), "torch.norm(grad, dim=-2) squared, / r")
            assign("var_estimate", x.name, (r, k), "row_var @ col_var, then the update in place",
                   lambda n=x.name: scalar(n, "row_var.mean(dim=-2)", (1, 1)))   # the previous: ``update``
        else:
            assign("grad_squared", x.name, shape, "grad * grad")
            assign("var_estimate", x.name, shape, "variance.clone(), then the update in place")
        scalar(x.name, "update.norm(2)")
    if end:
        p.op("Adafactor step done", free=[v for v in live.values() if v])
        return {}
    return live


def temporaries(p, c: Shape, kind: str, implementation: str, params, state_dtype: str, grad_dtype: str, where):
    """The temporaries of one optimizer step over ``params`` beyond AdamW's for-loop and foreach: none for SGD
    and the fused kernels; Adafactor's for-loop (:func:`adafactor`)."""
    if kind == "adafactor":
        adafactor(p, c, params, grad_dtype, where)
    else:
        p.op(f"{kind} step ({implementation}): in place")


def one_parameter(p, c: Shape, kind: str, implementation: str, name: str, state_dtype: str, grad_dtype: str,
                  where, elements=None) -> list:
    """The ops of one parameter's own optimizer stepping it in backward (its step returns: every temporary
    released): AdamW's for-loop ``sqrt`` and ``denom``, foreach's step increment and ``_foreach_sqrt``, none
    fused; Adafactor's for-loop; none for SGD. ``elements``: the parameter's size where ``name`` is not one of
    the decoder's (a LoRA adapter's)."""
    elements = sp.Mul(*param_shape(c, name)) if elements is None else elements
    if kind == "adafactor":
        adafactor(p, c, [Param(name, elements)], grad_dtype, where)
    elif kind == "adamw" and implementation == "foreach":
        one = p.new(f"torch.tensor(1.0) for {name}", (), "fp32", "foreach step-count increment", device=where)
        p.op("step counter += 1", alloc=[one])
        p.op("released", free=[one])
        sq = p.new(f"_foreach_sqrt(exp_avg_sq) of {name}", (elements,), state_dtype, "its square root",
                   device=where)
        p.op(f"_foreach_sqrt: {name}", alloc=[sq])
        p.op("released", free=[sq])
    elif kind == "adamw" and implementation == "for-loop":
        s1 = p.new(f"sqrt(exp_avg_sq) of {name}", (elements,), state_dtype, "AdamW(foreach=False): its square root",
                   device=where)
        s2 = p.new(f"denom of {name}", (elements,), state_dtype, "sqrt / bias correction + eps", device=where)
        p.op(f"AdamW step: {name}", alloc=[s1, s2])
        p.op("released", free=[s1])
        p.op("step done", free=[s2])
    return p.ops


def in_backward(ops: list, tensors: dict, step_ops) -> list:
    """``ops`` with each gradient stepped and freed right after the backward op that writes it (torchtune's
    post-accumulate-grad hook; ``step_ops(layer, parameter name)``: that parameter's optimizer step, program
    ops) and the ops that only release what that autograd node held (its inputs and saved tensors are released
    when it returns, before ``AccumulateGrad`` runs); the lumped blocks' gradients never held; the optimizer
    phase one op that does nothing."""
    out, waiting = [], []

    def step(where):
        for layer, name in waiting:
            for q in step_ops(layer, name.removeprefix("grad ")):
                out.append(Op(where.phase, where.layer, q.label, tuple((layer, n) for n in q.frees),
                              tuple((layer, n) for n in q.allocs), q.action))
            out.append(Op(where.phase, where.layer, f"optimizer in backward: {name} freed", ((layer, name),), ()))
        waiting.clear()
    for op in ops:
        if waiting and (op.allocs or op.action is not Action.RUN):
            step(out[-1])
        if op.phase is Phase.OPTIMIZER and op.action is not Action.LANDMARK:
            continue
        if op.role is OpRole.OPTIMIZER_STEP_DONE:
            out.append(Op(Phase.OPTIMIZER, None, "nothing left: every parameter was stepped in backward", (), ()))
        if (None, GRADIENT_LUMP) in op.allocs:
            op = replace(op, allocs=tuple(q for q in op.allocs if q != (None, GRADIENT_LUMP)))
        out.append(op)
        waiting += [q for q in op.allocs if tensors[q[1]].kind is Kind.GRAD and
                    tensors[q[1]].lifetime is Lifetime.GRADIENT]
    return out
