"""LitGPT's ``GPT`` (``implementation="litgpt"``) as its block runs, op by op: what differs from the reference
decoder's block (:mod:`memledger.step.block` runs the rest).

Read from LitGPT 0.5.13, ``litgpt/model.py``:

* ``RMSNorm.forward`` (l. 1315-1322): ``x.float()``, ``torch.mean(x * x)``, ``x * torch.rsqrt(norm_x + eps)``,
  ``(x_normed * weight.float()).to(dtype)``: the FP32 input, rstd and FP32 ``x*rstd`` as PyTorch's composite
  ``nn.RMSNorm`` keeps them, and an FP32 copy of the weight (``rmsnorm`` "litgpt":
  :func:`memledger.step.norms.norm_forward`); the norm runs in FP32 ops, so no fused kernel on CUDA either.
* ``CausalSelfAttention.forward`` (l. 472-513, 566-570): the fused ``qkv`` projection split into views;
  ``apply_rope`` (l. 1144-1173) on q and k: ``torch.cat((-x2, x1))``, ``(x * cos) + (rotated * sin)`` with LitGPT's
  FP32 cos and sin cache (type promotion: FP32 products), ``.to(x.dtype)``; then ``torch.cat((q_roped, q[...,
  rope_n_elem:]))``: q and k are new tensors laid out (B, H, S, d/H), while v stays a view of the fused output,
  which keeps its whole storage alive. SDPA's output follows q's layout, so ``y.transpose(1, 2).reshape(B, T, C)``
  is a copy: the output projection's input, beside the kernel's own saved output.
* ``LLaMAMLP.forward`` (l. 827-831): ``fc_1``, ``fc_2``, SiLU, the product, ``proj``.

Activation checkpointing (``recompute="full"``): LitGPT 0.5.13 checkpoints each ``Block`` where it trains on more
than one device (``litgpt/finetune/full.py`` l. 107-114: ``FSDPStrategy(activation_checkpointing_policy={Block})``,
which Lightning applies with PyTorch's non-reentrant ``checkpoint_wrapper``). Under the checkpoint nothing is saved
and each tensor dies with its last Python reference (:func:`attention_checkpointed`; ``Block.forward``'s
``x_normed`` until ``norm_2`` replaces it, its ``attention_output`` until it returns; ``LLaMAMLP.forward``'s
``x_fc_1`` and ``x_fc_2`` until it returns): a layer keeps its input, and its forward's rise equals LitGPT's own
under MemTracker (``tests/pytorch/test_torchtune_litgpt.py``). ``apply_rope``'s output is a local
(``q_roped``) of ``CausalSelfAttention.forward`` until it returns.

Measured with LitGPT's own model under ``FakeTensorMode`` (:func:`memledger.pytorch.libraries.saved_per_layer`):
one layer's saved bytes. LitGPT's head and loss as ``finetune/full.py`` runs them, its RoPE cache buffers and what its
loop keeps into the next iteration: :mod:`memledger.step.litgpt_loss`.
"""
import sympy as sp

from ..core.symbols import B, H, S, d
from .ops import BSd, qkv_width
from .vocab import OpRole

__all__ = ["QKV", "ATTENTION_OUTPUT", "layer_rows", "qkv_backward", "qkv_forward", "rope_width"]

QKV = "QKV projection output (v's view keeps it whole)"
ATTENTION_OUTPUT = "attention output (SDPA's, laid out as q)"


def rope_width(c):
    """The width (all heads) ``apply_rope`` rotates: ``H * int(fraction * d/H)`` (``config.rope_n_elem`` per head,
    ``int(rotary_percentage * head_size)``, ``litgpt/config.py``; pythia's fraction 0.25: ``Shape.rotary``); ``d``
    for a LLaMA block (full rotary)."""
    if getattr(c, "rotary", None) is None:
        return d
    return H * sp.floor(sp.nsimplify(c.rotary) * d / H)


def layer_rows(rows, c) -> list:
    """The reference block's rows as LitGPT's keeps them: Q and K new tensors, the fused projection's output whole in
    V's place, SDPA's output beside its copy (the output projection's input)."""
    if c.implementation != "litgpt":
        return rows
    from dataclasses import replace
    out = []
    for r in rows:
        if r.name == "Q":
            out.append(replace(r, why="apply_rope's output concatenated: a new (B, H, S, d/H) tensor"))
        elif r.name == "K":
            out.append(replace(r, why="apply_rope's output concatenated: a new tensor"))
        elif r.name == "V":
            out.append(replace(r, name=QKV, shape=(B, S, qkv_width(c)), why="v, a view of the fused QKV output, "
                               "keeps its whole storage alive"))
        elif r.name == "output projection input":
            out += [replace(r, name=ATTENTION_OUTPUT, why="SDPA saves its output, laid out (B, H, S, d/H) as q is"),
                    replace(r, why="y.transpose(1, 2).reshape(B, T, C): a copy")]
        else:
            out.append(r)
    return out


def _rope(p, c, n, out, mark="", hold=False):
    """``apply_rope`` on ``n`` and the concatenation with its (empty) unrotated part into ``out``; ``mark``: under
    the layer's checkpoint, " (checkpointed)" (``{n}_roped``, a local of ``CausalSelfAttention.forward``, is then
    returned to be freed when it returns); ``hold``: return it so too, without the mark (LitGPT's LoRA layers,
    :mod:`memledger.step.litgpt_lora_block`)."""
    a, f, w = c.dtype, "fp32", (B, S, rope_width(c))     # q[..., :rope_n_elem] of every head
    neg = p.new(f"-{n}2" + mark, (B, S, w[2] / 2), a, "apply_rope: -x2")
    rot = p.new(f"rotated {n}" + mark, w, a, "torch.cat((-x2, x1), dim=-1)")
    t1 = p.new(f"{n} * cos (FP32)" + mark, w, f, "times LitGPT's FP32 cos cache: type promotion")
    t2 = p.new(f"rotated {n} * sin (FP32)" + mark, w, f, "times the FP32 sin cache")
    roped32 = p.new(f"{n} roped (FP32)" + mark, w, f, "the sum")
    roped = p.new(f"{n} roped" + mark, w, a, "roped.to(dtype=x.dtype)")
    p.op(f"-{n}2", alloc=[neg])
    p.op(f"rotated {n}: cat", alloc=[rot])
    p.op("released", free=[neg])
    p.op(f"{n} * cos", alloc=[t1])
    p.op(f"rotated {n} * sin", alloc=[t2])
    p.op(f"{n} roped", alloc=[roped32])
    p.op("released", free=[t1, t2])
    p.op(f"{n} roped.to(dtype)", alloc=[roped])
    p.op("released", free=[roped32, rot])
    p.op(f"torch.cat(({n}_roped, {n}[..., rope_n_elem:]))", alloc=[out])
    if mark or hold:
        return roped
    p.op("released", free=[roped])


def qkv_forward(p, c):
    """The fused projection (its output a saved row: v's view keeps it whole) and the rotary code for q and k."""
    p.op("QKV projection (v: a view of it)", alloc=[QKV], role=OpRole.QKV_PROJECTION)
    _rope(p, c, "q", "Q")
    _rope(p, c, "k", "K")


def flash(p, c):
    """SDPA's flash kernel (its output and log-sum-exp saved) and the output's reshape (a copy)."""
    p.op("flash attention", alloc=[ATTENTION_OUTPUT, "softmax log-sum-exp"])
    p.op("y.transpose(1, 2).reshape(B, T, C): a copy", alloc=["output projection input"])


def attention_checkpointed(p, c) -> tuple:
    """``CausalSelfAttention.forward`` (l. 472-513, 566-570) under the layer's checkpoint, nothing saved: the fused
    output, the new q and k and the roped halves are its locals until it returns, SDPA's log-sum-exp goes at once and
    its output when ``y.reshape`` replaces it. Returns (the output projection's input, the locals freed when the
    attention returns, after ``proj``)."""
    a, mark = c.dtype, " (checkpointed)"
    qkv = p.new(QKV + mark, (B, S, qkv_width(c)), a, "a local of the attention (q, k, v are views of it)")
    q, k = (p.new(f"{n} (concatenated){mark}", BSd, a, "torch.cat((roped, rest)): a local") for n in "qk")
    out = p.new(ATTENTION_OUTPUT + mark, BSd, a, "SDPA's output, until y.reshape replaces it")
    lse = p.new("log-sum-exp" + mark, (B, H, S), "fp32", "not kept under the checkpoint")
    pin = p.new("output projection input" + mark, BSd, a, "y.reshape(B, T, C): a copy, a local until it returns")
    p.op("QKV projection (v: a view of it)", alloc=[qkv], role=OpRole.QKV_PROJECTION)
    held = [_rope(p, c, "q", q, mark), _rope(p, c, "k", k, mark)]
    p.op("flash attention", alloc=[out, lse])
    p.op("released", free=[lse])
    p.op("y.transpose(1, 2).reshape(B, T, C): a copy", alloc=[pin])
    p.op("released", free=[out])
    return pin, [pin, qkv, q, k] + held


def _rope_backward(p, c, n, g, into):
    """apply_rope's backward from ``g`` (the concatenation's gradient) into ``into`` (q's or k's, laid out as the
    fused output's view: the view's backward copies)."""
    a, f, w = c.dtype, "fp32", (B, S, rope_width(c))     # the rotated part (pythia: not pinned op by op)
    g32 = p.new(f"grad {n}: FP32", w, f, "roped.to(dtype) backward")
    gs32 = p.new(f"grad {n}: g * sin (FP32)", w, f, "rotated * sin backward")
    gs = p.new(f"grad {n}: g * sin", w, a, "cast back to the rotated tensor's dtype")
    gneg = p.new(f"grad {n}: -g", (B, S, w[2] / 2), a, "the negation's backward")
    g2 = p.new(f"grad {n}: x2 slice backward", w, a, "slice_backward: zeros with the gradient copied in")
    g1 = p.new(f"grad {n}: x1 slice backward", w, a, "slice_backward")
    gc32 = p.new(f"grad {n}: g * cos (FP32)", w, f, "x * cos backward")
    gc = p.new(f"grad {n}: g * cos", w, a, "cast back")
    p.op(f"{n} roped.to backward", alloc=[g32])
    p.op("released", free=[g])
    p.op(f"rotated {n} * sin backward", alloc=[gs32])
    p.op("cast", alloc=[gs])
    p.op("released", free=[gs32])
    p.op(f"-{n}2 backward", alloc=[gneg])
    p.op(f"{n}2 slice backward", alloc=[g2])
    p.op("released", free=[gneg])
    p.op(f"{n}1 slice backward", alloc=[g1])
    p.op("released", free=[gs])
    p.op(f"{n} * cos backward", alloc=[gc32])
    p.op("released", free=[g32])
    p.op("cast", alloc=[gc])
    p.op("released", free=[gc32])
    p.op(f"{n} gradients summed", alloc=[into])
    p.op("released", free=[g1, g2, gc])


def qkv_backward(p, c, gq, gk, gv, grads) -> str:
    """From the flash kernel's q, k, v gradients to norm 1's output's: the rotary code's backward (k, then q), q's and
    k's gradients copied back to (B, S, d), the split's backward (a concatenation), the fused projection's."""
    a = c.dtype
    gkr, gqr = (p.new(f"gradient of {n} before the rotary code", BSd, a, "(B, H, S, d/H)") for n in "kq")
    _rope_backward(p, c, "k", gk, gkr)
    _rope_backward(p, c, "q", gq, gqr)
    gkc, gqc = (p.new(f"gradient of {n}, copied back", BSd, a, "the view's backward: (B, H, S, d/H) to (B, S, d)")
                for n in "kq")
    p.op("k gradient copied back", alloc=[gkc])
    p.op("released", free=[gkr])
    p.op("q gradient copied back", alloc=[gqc])
    p.op("released", free=[gqr])
    gqkv = p.new("gradient of the QKV projection output", (B, S, qkv_width(c)), a, "split backward: a concatenation")
    p.op("split backward", alloc=[gqkv])
    p.op("released", free=[gqc, gkc, gv])
    gn1 = p.new("gradient of norm 1's output", BSd, a, "the QKV projection's input gradient")
    p.op("QKV projection backward", alloc=grads + [gn1], role=OpRole.QKV_PROJECTION_BACKWARD)
    p.op("released", free=[gqkv, "Q/K/V projection input"])
    return gn1
