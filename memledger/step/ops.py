"""What one training step allocates and frees, op by op: the programs' building blocks.

A program is a list of ops ``(label, frees, allocs)``: the named tensors an
op's inputs release just before it runs (Python references dropped, autograd
nodes released after they ran) and the tensors it creates. The total after
each op is a moment of the step; :mod:`memledger.step.timeline` evaluates every moment
and takes the largest, the peak (PyTorch's ``MemTracker`` samples the same
moments: after every op).

The programs follow the reference decoder of ``docs/step.md``
(:mod:`memledger.pytorch.reference`): :mod:`memledger.step.block` (one block),
:mod:`memledger.step.norms` (the norms), :mod:`memledger.step.outer` (embedding,
loss, optimizer), :mod:`memledger.step.recompute` (full recomputation). Saved
tensors are the rows of :func:`memledger.activations.inventory.inventory` and
:func:`memledger.activations.outside.outside_inventory`, by name; every other tensor is a
transient defined with its shape and reason. The sequences were read off
MemTracker's allocation log of the reference (PyTorch 2.13, CPU) and are
checked against it by ``tests/step/test_timeline.py``.
"""
from dataclasses import dataclass

from ..core.dtypes import nbytes
from .structure import Shape  # noqa: F401  (the programs' choices; re-exported for the step modules)
from ..models.features import Features
from ..models.parameters import widths
from ..core.symbols import B, F, H, S, d

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


BSd, BSF, BHSS, BS = (B, S, d), (B, S, F), (B, H, S, S), (B, S)


def q_width(head_dim: bool = False):
    """The width of Q and of the output projection's input: d, or H*d_h where a config gives the head size
    (Gemma-7B: 16 x 256 = 4096 != d = 3072; :func:`memledger.models.parameters.widths`)."""
    return widths(Features(head_dim=head_dim))[0]


def kv_width(gqa: bool = False, head_dim: bool = False):
    """The width of K (and of V): that of Q, or H_kv*d/H (H_kv*d_h) with grouped-query attention (Ainslie et al.
    2023)."""
    return widths(Features(gqa=gqa, head_dim=head_dim))[1]


def qkv_width(gqa: bool = False, head_dim: bool = False):
    """The fused QKV projection's output width: (H + 2 H_kv) * d/H = d + 2 * :func:`kv_width` (3d multi-head;
    H*d_h for d with a given head size)."""
    return q_width(head_dim) + 2 * kv_width(gqa, head_dim)


def block_param_tensors(style: str, gqa: bool = False, qkv_bias: bool = False, head_dim: bool = False) -> list:
    """(name, elements) of one block's parameter tensors in ``model.parameters()`` order; ``gqa``: the fused
    QKV weight is (d + 2 H_kv d/H) x d (:func:`memledger.models.parameters.block_parts`); ``qkv_bias``: a LLaMA
    block's fused QKV projection has a bias (Qwen2); ``head_dim``: Q is H*d_h wide, and the output projection
    (H*d_h) x d (Gemma-7B)."""
    qkv, q = qkv_width(gqa, head_dim), q_width(head_dim)
    if style == "gpt":
        return [("norm1.weight", d), ("norm1.bias", d), ("norm2.weight", d), ("norm2.bias", d),
                ("qkv.weight", qkv * d), ("qkv.bias", qkv), ("proj.weight", q * d), ("proj.bias", d),
                ("up.weight", d * F), ("up.bias", F), ("down.weight", d * F), ("down.bias", d)]
    return [("norm1.weight", d), ("norm2.weight", d), ("qkv.weight", qkv * d)] + (
        [("qkv.bias", qkv)] if qkv_bias else []) + [("proj.weight", q * d), ("gate.weight", d * F),
                                                    ("up.weight", d * F), ("down.weight", d * F)]


def block_params(c) -> list:
    """:func:`block_param_tensors` of a :class:`~memledger.step.structure.Shape`."""
    return block_param_tensors(c.style, c.gqa, bool(c.qkv_bias) and not c.gpt, c.head_dim)


def widths_of(c) -> tuple:
    """(B, S, q width), (B, S, k and v width) of a :class:`~memledger.step.structure.Shape`."""
    return (B, S, q_width(c.head_dim)), (B, S, kv_width(c.gqa, c.head_dim))


def define_grads(p, names, c, share):
    """Define the gradients of ``names`` (block parameters) and return their tensor names."""
    sizes = dict(block_params(c))
    out = []
    for n in names:
        if n not in sizes:             # a bias the block does not have
            continue
        t = f"grad {n}"
        p.tensors[t] = Tensor(t, share(sizes[n]) * nbytes(c.grad_dtype), GRAD_KIND,
                              f"the gradient of {n}, written by backward and kept for the optimizer")
        out.append(t)
    return out


def dropout_ops(p, c, where, mask, out):
    """A dropout call's ops: a 1-byte mask comes with the output from one kernel (``native_dropout``, the
    fused CUDA kernel); CPU ``F.dropout`` makes the mask first (``empty_like`` + ``bernoulli_``), then the
    product (read off MemTracker's log)."""
    if c.mask_dtype == "bool":
        p.op(f"{where} dropout", alloc=[mask, out])
    else:
        p.op(f"{where} dropout mask", alloc=[mask])
        p.op(f"{where} dropout", alloc=[out])


def io_names(c: Shape):
    """(block input, attention residual sum) names: saved norm inputs, or transients under composite RMSNorm."""
    norm = "LayerNorm" if c.gpt else "RMSNorm"
    if c.upcast:
        return "block input", "attention residual sum"
    return f"{norm} 1 input", f"{norm} 2 input"
