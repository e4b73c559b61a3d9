"""What one training step allocates and frees, op by op: the programs' building blocks.

A program is a list of ops (:class:`ProgramOp`): the tensors an op's inputs
release just before it runs (Python references dropped, autograd nodes
released after they ran) and the tensors it creates. The total after each op
is a moment of the step; :mod:`memledger.step.timeline` evaluates every moment
and takes the largest, the peak (PyTorch's ``MemTracker`` samples the same
moments: after every op).

Every tensor is a :class:`Tensor` of one table: its bytes (SymPy), what it is,
how long and where it lives (:mod:`memledger.step.vocab`). Saved tensors are
the rows of :func:`memledger.activations.inventory.inventory` and
:func:`memledger.activations.outside.outside_inventory`, by name; every other
one is a temporary defined with its shape. A program names its own block's
tensors by name and another block's by a :class:`Ref`.

The programs follow the reference decoder (:mod:`memledger.pytorch.reference`):
:mod:`memledger.step.block` (one block, under its save policy),
:mod:`memledger.step.norms` (the norms), :mod:`memledger.step.outer`
(embedding, loss, optimizer). The sequences were read off MemTracker's
allocation log of the reference (PyTorch 2.13, CPU) and are checked against it
by ``tests/step/test_timeline.py``.
"""

from ..core.dtypes import nbytes
from ..core.symbols import B, F, H, S, d, t
from ..models.features import Features
from ..models.parameters import widths
from .program import CAUSAL_MASK, INPUT_GRADIENT, Placement, Program, ProgramOp, Ref, Tensor
from .structure import Shape
from .vocab import Kind, Lifetime, Scope

__all__ = ["BHSS", "BS", "BSF", "BSd", "CAUSAL_MASK", "INPUT_GRADIENT", "Placement", "Program",
           "ProgramOp", "Ref", "Tensor", "block_output", "block_params", "define_grads", "dropout_ops", "final_input",
           "gradient", "per_rank", "residual_names", "qkv_width", "widths_of"]


BSd, BSF, BHSS, BS = (B, S, d), (B, S, F), (B, H, S, S), (B, S)


def widths_of(c: Shape) -> tuple:
    """(B, S, width of Q and of the output projection's input), (B, S, width of K and of V): d, or H*d_h where
    a config gives the head size (Gemma-7B: 16 x 256 = 4096 != d = 3072); K and V H_kv*d/H (H_kv*d_h) wide
    with grouped-query attention (Ainslie et al. 2023); :func:`memledger.models.parameters.widths`."""
    q, kv = widths(Features(gqa=c.gqa, head_dim=c.head_dim))
    if c.tp:                    # column-wise QKV: the rank's H/t and H_kv/t heads (memledger.step.tensor)
        q, kv = q / t, kv / t
    return (B, S, q), (B, S, kv)


def per_rank(c: Shape, shape: tuple) -> tuple:
    """``shape`` on one tensor-parallel rank: F and H divided by t (the column-wise MLP and QKV
    projections' outputs, the attention core's heads); as is without tensor parallelism."""
    return tuple(n.subs({F: F / t, H: H / t}) for n in shape) if c.tp else shape


def qkv_width(c: Shape):
    """The fused QKV projection's output width: (H + 2 H_kv) * d/H (3d multi-head; d_h for d/H where given)."""
    (_, _, q), (_, _, kv) = widths_of(c)
    return q + 2 * kv


def block_params(c: Shape) -> list:
    """(name, elements) of one block's parameter tensors in ``model.parameters()`` order
    (:mod:`memledger.pytorch.reference`'s ``Block``): the fused QKV weight (H + 2 H_kv) d/H x d, a bias on it in
    GPT blocks and where a LLaMA block has one (Qwen2), the output projection (H*d_h) x d."""
    whole = t if c.tp else 1        # the whole tensors (a tensor-parallel rank's share: ``share``)
    qkv, q = qkv_width(c) * whole, widths_of(c)[0][2] * whole
    if c.gpt and c.implementation == "litgpt":      # LitGPT's pythia Block: norm_1, attn (qkv, proj), norm_2, mlp
        return [("norm1.weight", d), ("norm1.bias", d), ("qkv.weight", qkv * d), ("qkv.bias", qkv),
                ("proj.weight", q * d), ("proj.bias", d), ("norm2.weight", d), ("norm2.bias", d),
                ("up.weight", d * F), ("up.bias", F), ("down.weight", d * F), ("down.bias", d)]
    if c.gpt:       # Phi's block (shared_norm) has no second norm
        norms = [("norm1.weight", d), ("norm1.bias", d)] + ([] if c.shared_norm else [
            ("norm2.weight", d), ("norm2.bias", d)])
        return norms + [("qkv.weight", qkv * d), ("qkv.bias", qkv), ("proj.weight", q * d), ("proj.bias", d),
                        ("up.weight", d * F), ("up.bias", F), ("down.weight", d * F), ("down.bias", d)]
    if c.implementation == "litgpt":     # LitGPT's Block: norm_1, attn (qkv, proj), norm_2, mlp (fc_1, fc_2, proj)
        return [("norm1.weight", d), ("qkv.weight", qkv * d), ("proj.weight", q * d), ("norm2.weight", d),
                ("gate.weight", d * F), ("up.weight", d * F), ("down.weight", d * F)]
    if c.implementation == "torchtitan":     # Llama3TransformerBlock: attention (wqkv, wo), feed_forward (w1, w2, w3),
        return [("qkv.weight", qkv * d), ("proj.weight", q * d), ("gate.weight", d * F),     # its two norms
                ("down.weight", d * F), ("up.weight", d * F), ("norm1.weight", d), ("norm2.weight", d)]
    if c.hf:                # LlamaDecoderLayer: self_attn (q, k, v, o), mlp (gate, up, down), its two norms
        return [("q_proj.weight", q * d), ("k_proj.weight", (qkv - q) / 2 * d), ("v_proj.weight", (qkv - q) / 2 * d),
                ("proj.weight", q * d), ("gate.weight", d * F), ("up.weight", d * F), ("down.weight", d * F),
                ("norm1.weight", d), ("norm2.weight", d)]
    return [("norm1.weight", d), ("norm2.weight", d), ("qkv.weight", qkv * d)] + (
        [("qkv.bias", qkv)] if c.qkv_bias else []) + [("proj.weight", q * d), ("gate.weight", d * F),
                                                      ("up.weight", d * F), ("down.weight", d * F)]


def define_grads(p, names, c, share):
    """Define the gradients of ``names`` (block parameters it has) and return their tensor names."""
    sizes = dict(block_params(c))
    return [gradient(p, n, sizes[n], c, share) for n in names if n in sizes]


def gradient(p, param, elements, c, share):
    """Define ``param``'s gradient (``share`` of its ``elements``: this rank's, in the gradient dtype; written by
    backward, kept for the optimizer step where the recipe keeps gradients) and return its name."""
    name = f"grad {param}"
    p.tensors[name] = Tensor(name, share(elements) * nbytes(c.grad_dtype), Kind.GRAD, Lifetime.GRADIENT,
                             p.placement.gradients, f"the gradient of {param}")
    return name


def dropout_ops(p, c, where, mask, out):
    """A dropout call's ops: a 1-byte mask comes with the output from one kernel (``native_dropout``, the
    fused CUDA kernel); CPU ``F.dropout`` makes the mask first (``empty_like`` + ``bernoulli_``), then the
    product (read off MemTracker's log)."""
    if c.mask_dtype == "bool":
        p.op(f"{where} dropout", alloc=[mask, out])
    else:
        p.op(f"{where} dropout mask", alloc=[mask])
        p.op(f"{where} dropout", alloc=[out])


def residual_names(c: Shape):
    """The residual stream's two tensors in a block, (its input, the attention residual sum): the norms' saved
    inputs, or temporaries where composite RMSNorm saves an FP32 copy instead."""
    norm = "LayerNorm" if c.gpt else "RMSNorm"
    if c.upcast:
        return "block input", "attention residual sum"
    return f"{norm} 1 input", f"{norm} 2 input"


def final_input(c: Shape) -> str:
    """Name of the last block's output (the final norm's input)."""
    norm = "LayerNorm" if c.gpt else "RMSNorm"
    return "final norm input" if c.upcast else f"final {norm} input"


def block_output(c: Shape) -> Ref:
    """What a block's forward returns: the next block's input (after the last block, the final norm's)."""
    return Ref(Scope.NEXT, residual_names(c)[0], final_input(c))
