"""A GPT-style family under a library's own code (issue 28): LitGPT's pythia (GPT-NeoX), ``implementation="litgpt"``.

LitGPT 0.5.13 ships pythia as ``Config.from_name("pythia-...")`` (``litgpt/config.py``): ``bias=True`` (every
linear and LayerNorm), ``norm_class_name="LayerNorm"`` (``torch.nn.LayerNorm``), ``mlp_class_name="GptNeoxMLP"``
(``litgpt/model.py`` l. 804-815: ``fc``, ``F.gelu(approximate="none")``, ``proj``), ``parallel_residual=True``,
``shared_attention_norm=False``, ``rotary_percentage=0.25`` (``rope_n_elem = int(0.25 * head_size)``), an untied
head without a bias. What its block runs beside memledger's reference GPT-NeoX block (:mod:`memledger.step.parallel`):

* ``Block.forward`` (l. 375-387): ``x_normed = norm_1(x)``, the attention, ``x_normed = norm_2(x)``, ``x =
  attention_output + x`` (a new tensor, before the MLP runs), ``return mlp(x_normed) + x``; the attention's output
  is a local until the block returns. The reference adds ``x + attn`` after its MLP (the same saved tensors, a
  different forward height).
* ``CausalSelfAttention.forward`` (l. 472-513, 566-570) as for LLaMA (:mod:`memledger.step.litgpt`): the fused
  ``qkv`` (with its bias), ``apply_rope`` on ``q[..., :rope_n_elem]`` and ``k[..., :rope_n_elem]`` (its temporaries
  ``rope_n_elem`` wide per head: :func:`rope_width`), ``torch.cat((q_roped, q[..., rope_n_elem:]))`` new q and k, v a
  view of the fused output (kept whole), SDPA's flash kernel, the output's reshape a copy.
* the model's ``cos`` and ``sin`` buffers (``rope_cache``, l. 43-62): (S, rope_n_elem) FP32 each
  (:func:`memledger.step.litgpt_loss.statics`).
* ``model.parameters()`` order within a block (:func:`block_params`): norm_1, attn (qkv, proj), norm_2, mlp (fc,
  proj), each weight before its bias.

Backward runs as the reference's parallel block (:func:`memledger.step.parallel.parallel_backward`, autograd's order
is the same: the adds allocate nothing) with LitGPT's attention backward (:func:`memledger.step.block.attention_backward`).
Checked against LitGPT's own model and ``finetune/full.py``'s loop under ``FakeTensorMode``
(tests/pytorch/test_gpt_style.py).

Refused (:func:`lacks`): another GPT-style family under LitGPT (Phi's shared norm, Falcon's), any under transformers'
code, recomputation, dropout.
"""
from ..core.symbols import B, S, d
from . import hf, litgpt
from .norms import norm_forward
from .ops import BSd, Ref, block_output, residual_names
from .vocab import OpRole, Scope

__all__ = ["hf_forward", "hf_qkv_backward", "layer_rows", "litgpt_forward"]


def layer_rows(rows, c) -> list:
    """transformers' GPT-NeoX layer under SDPA keeps what LitGPT's does (measured: the same storages), the fused
    output whole through v's view, the new q and k, SDPA's output beside its copy (:func:`memledger.step.litgpt.
    layer_rows`)."""
    if not (c.hf and c.gpt and c.attention == "flash"):
        return rows
    from dataclasses import replace
    return litgpt.layer_rows(rows, replace(c, implementation="litgpt"))


def litgpt_forward(p, c):
    """LitGPT's parallel ``Block.forward`` (l. 375-387): its input is live; its output is the next block's input."""
    a = c.dtype
    norm_forward(p, c, "1", "Q/K/V projection input")
    litgpt.qkv_forward(p, c)            # the fused projection (its bias), the rotary code on rope_n_elem of each head
    litgpt.flash(p, c)
    attn = p.new("output projection output", BSd, a, "attention_output, a local of Block.forward until it returns")
    p.op("output projection", alloc=[attn], role=OpRole.OUTPUT_PROJECTION)
    norm_forward(p, c, "2", "MLP input")
    xm = residual_names(c)[1] if c.upcast else p.new("attention output + x", BSd, a, "x = attention_output + x: "
                                                     "a new tensor, until the block returns")
    p.op("attention_output + x", alloc=[xm])
    p.op("fc", alloc=["GeLU input"], role=OpRole.UP_PROJECTION)
    p.op("GeLU", alloc=["down-projection input"])
    mlp = p.new("down-projection output", BSd, a, "the MLP's output, until the sum is made")
    p.op("proj", alloc=[mlp], role=OpRole.DOWN_PROJECTION)
    p.op("mlp(x_normed) + x: the block's output", alloc=[block_output(c)])
    p.op("block returns", free=[mlp, attn, xm], role=OpRole.BLOCK_RETURNS)


def _hf_rotate(p, c, n):
    """``apply_rotary_pos_emb`` (``modeling_gpt_neox.py`` l. 125-135) on ``n``'s first ``rotary_ndims`` of each head:
    ``(n_rot * cos) + (rotate_half(n_rot) * sin)`` in the activation dtype (cos and sin are cast by the rotary
    embedding); returns the rotated part's name (B, H, S, rotary_ndims)."""
    a, w = c.dtype, (B, S, litgpt.rope_width(c))
    t1 = p.new(f"{n}_rot * cos", w, a, "apply_rotary_pos_emb's first product")
    neg = p.new(f"-{n}2", (B, S, w[2] / 2), a, "rotate_half: -x2")
    rh = p.new(f"rotate_half({n}_rot)", w, a, "torch.cat((-x2, x1), dim=-1)")
    t2 = p.new(f"rotate_half({n}_rot) * sin", w, a, "apply_rotary_pos_emb's second product")
    out = p.new(f"{n}_embed (rotated part)", w, a, "until torch.cat([q_embed, q_pass]) replaces it")
    p.op(f"{n}_rot * cos", alloc=[t1])
    p.op(f"-{n}2", alloc=[neg])
    p.op(f"rotate_half({n}_rot): cat", alloc=[rh])
    p.op("released", free=[neg])
    p.op(f"rotate_half({n}_rot) * sin", alloc=[t2])
    p.op("released", free=[rh])
    p.op(f"{n}_embed", alloc=[out])
    p.op("released", free=[t1, t2])
    return out


def hf_forward(p, c):
    """transformers' ``GPTNeoXLayer.forward`` (``modeling_gpt_neox.py`` l. 249-270, ``use_parallel_residual``) under
    SDPA: its input is live; its output is the next block's input."""
    a = c.dtype
    norm_forward(p, c, "1", "Q/K/V projection input")
    p.op("query_key_value (q, k, v: views of it)", alloc=[litgpt.QKV], role=OpRole.QKV_PROJECTION)
    q, k = _hf_rotate(p, c, "q"), _hf_rotate(p, c, "k")
    p.op("torch.cat([q_embed, q_pass])", alloc=["Q"])
    p.op("released", free=[q])
    p.op("torch.cat([k_embed, k_pass])", alloc=["K"])
    p.op("released", free=[k])
    litgpt.flash(p, c)                  # sdpa_attention_forward: transpose(1, 2).contiguous() of q's layout: a copy
    attn = p.new("output projection output", BSd, a, "attn_output, a local of the layer until it returns")
    p.op("dense", alloc=[attn], role=OpRole.OUTPUT_PROJECTION)
    norm_forward(p, c, "2", "MLP input")
    p.op("dense_h_to_4h", alloc=["GeLU input"], role=OpRole.UP_PROJECTION)
    p.op("GeLU", alloc=["down-projection input"])
    mlp = p.new("down-projection output", BSd, a, "mlp_output, until the sum is made")
    p.op("dense_4h_to_h", alloc=[mlp], role=OpRole.DOWN_PROJECTION)
    partial = p.new("mlp_output + attn_output", BSd, a, "the sum's first add, a temporary")
    p.op("mlp_output + attn_output", alloc=[partial])
    p.op("+ hidden_states: the block's output", alloc=[block_output(c)])
    p.op("block returns", free=[partial, mlp, attn], role=OpRole.BLOCK_RETURNS)


def _hf_rotate_backward(p, c, n, g, into):
    """``apply_rotary_pos_emb``'s backward for ``n`` from ``g`` (the concatenation's gradient, (B, H, S, d/H)):
    ``torch.cat``'s backward narrows it (views); the rotated part's products and ``rotate_half`` (the negation, the
    two slices' backward: zero-filled tensors), the pass-through slice's backward; all summed into ``into``, the
    gradient of ``n`` (a view of the fused output)."""
    a, w = c.dtype, (B, S, litgpt.rope_width(c))
    gs = p.new(f"grad {n}: g * sin", w, a, "rotate_half(x) * sin backward")
    gneg = p.new(f"grad {n}: -g", (B, S, w[2] / 2), a, "the negation's backward")
    g2 = p.new(f"grad {n}: x2 slice backward", w, a, "slice_backward: zeros with the gradient copied in")
    g1 = p.new(f"grad {n}: x1 slice backward", w, a, "slice_backward: zeros with the gradient copied in")
    gc = p.new(f"grad {n}: g * cos", w, a, "x * cos backward")
    grot = p.new(f"grad {n}_rot", w, a, "the rotated part's gradients summed")
    last = n == "q"                     # block 0's q products are cos's and sin's last users (hf._rotate_backward)
    p.op(f"rotate_half({n}) * sin backward", alloc=[gs])
    if last:
        p.op("released", free=[Ref(Scope.SHARED, hf.SIN)])
    p.op(f"-{n}2 backward", alloc=[gneg])
    p.op(f"{n}2 slice backward", alloc=[g2])
    p.op("released", free=[gneg])
    p.op(f"{n}1 slice backward", alloc=[g1])
    p.op("released", free=[gs])
    p.op(f"{n}_rot * cos backward", alloc=[gc])
    if last:
        p.op("released", free=[Ref(Scope.SHARED, hf.COS)])
    p.op(f"{n}_rot gradients summed", alloc=[grot])
    p.op("released", free=[g1, g2, gc])
    p.op(f"{n}_rot and {n}_pass slice backward", alloc=[into])
    p.op("released", free=[grot, g])


def hf_qkv_backward(p, c, gq, gk, gv, grads) -> str:
    """From SDPA's q, k, v gradients to norm 1's output's: the rotary code's backward (k, then q: autograd runs the
    later nodes first), ``chunk``'s backward (a concatenation into (B, H, S, 3 d/H)), the head transpose's and view's
    backward (a copy back to (B, S, 3d)), ``query_key_value``'s backward."""
    a = c.dtype
    gkr, gqr = (p.new(f"gradient of {n} before the rotary code", BSd, a, "(B, H, S, d/H)") for n in "kq")
    _hf_rotate_backward(p, c, "k", gk, gkr)
    _hf_rotate_backward(p, c, "q", gq, gqr)
    cat = p.new("gradient of q, k, v chunks (B, H, S, 3 d/H)", (B, S, 3 * d), a, "chunk backward: a concatenation")
    p.op("chunk backward", alloc=[cat])
    p.op("released", free=[gqr, gkr, gv])
    gqkv = p.new("gradient of the QKV projection output", (B, S, 3 * d), a, "transpose and view backward: a copy")
    p.op("transpose backward: contiguous", alloc=[gqkv])
    p.op("released", free=[cat])
    gn1 = p.new("gradient of norm 1's output", BSd, a, "the QKV projection's input gradient")
    p.op("QKV projection backward", alloc=grads + [gn1], role=OpRole.QKV_PROJECTION_BACKWARD)
    p.op("released", free=[gqkv, "Q/K/V projection input"])
    return gn1
