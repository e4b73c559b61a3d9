"""A GPT-style family under a library's own code (issue 28): pythia (GPT-NeoX) under LitGPT's
(``implementation="litgpt"``) and transformers' (``"hf"``, sdpa or eager) code.

LitGPT 0.5.13 ships pythia as ``Config.from_name("pythia-...")`` (``litgpt/config.py``): ``bias=True`` (every
linear and LayerNorm), ``norm_class_name="LayerNorm"`` (``torch.nn.LayerNorm``), ``mlp_class_name="GptNeoxMLP"``
(``litgpt/model.py`` l. 804-815: ``fc``, ``F.gelu(approximate="none")``, ``proj``), ``parallel_residual=True``,
``shared_attention_norm=False``, ``rotary_percentage=0.25`` (``rope_n_elem = int(0.25 * head_size)``), an untied
head without a bias. What its block runs beside memledger's reference GPT-NeoX block (:mod:`memledger.step.parallel`):

* ``Block.forward`` (l. 375-387): ``x_normed = norm_1(x)``, the attention, ``x_normed = norm_2(x)``, ``x =
  attention_output + x`` (a new tensor, before the MLP runs), ``return mlp(x_normed) + x``; the attention's output
  is a local until the block returns (:func:`litgpt_forward`).
* ``CausalSelfAttention.forward`` (l. 472-513, 566-570) as for LLaMA (:mod:`memledger.step.litgpt`): the fused
  ``qkv`` (with its bias), ``apply_rope`` on ``q[..., :rope_n_elem]`` and ``k[..., :rope_n_elem]`` (its temporaries
  ``rope_n_elem`` wide per head: :func:`memledger.step.litgpt.rope_width`), ``torch.cat((q_roped, q[...,
  rope_n_elem:]))`` new q and k, v a view of the fused output (kept whole), SDPA's flash kernel, the output's reshape
  a copy; the model's ``cos`` and ``sin`` buffers (S, rope_n_elem) FP32 each.
* ``model.parameters()`` order within a block: norm_1, attn (qkv, proj), norm_2, mlp (fc, proj), each weight before
  its bias (:func:`memledger.step.ops.block_params`).

transformers 5.25 ``GPTNeoXForCausalLM`` (``transformers/models/gpt_neox/modeling_gpt_neox.py``):

* ``GPTNeoXRotaryEmbedding.forward`` (l. 91-97) as LLaMA's (:func:`memledger.step.hf.forward_start`), ``rotary_ndims``
  wide (l. 175-176); cos and sin in the activation dtype, kept by every layer's products until block 0's q backward.
* ``GPTNeoXAttention.forward`` (l. 192-225): ``query_key_value`` viewed (B, S, H, 3 d/H), transposed, ``chunk(3)``:
  q, k, v views; ``apply_rotary_pos_emb`` (l. 125-140) on the first ``rotary_ndims`` of q and k in the activation
  dtype, then ``torch.cat([q_embed, q_pass])`` (new q and k; :func:`hf_forward`). SDPA: the fused output kept whole by
  v, SDPA's output beside its ``transpose(1, 2).contiguous()`` copy, as LitGPT's. Eager (l. 143-166): q and k are read
  as they are, v is copied for ``@ v`` (B > 1; at B = 1 its view, keeping the fused output whole), the FP32 softmax
  output and the BF16 probabilities (:func:`_hf_eager_core`).
* ``GPTNeoXLayer.forward`` (l. 249-270): ``mlp_output + attn_output + hidden_states``; the dropouts at p = 0 allocate
  nothing (measured: the layer's and step's totals are equal without them).

Backward runs as the reference's parallel block (:func:`memledger.step.parallel.parallel_backward`: autograd's order
is the same, the adds allocate nothing), with each library's attention backward; the rotary code's backward
(:func:`_hf_rotate_backward`, LitGPT's in :mod:`memledger.step.litgpt`) is read from the source: no layer's peak sits
in it at the shapes measured. Checked against each library's own model under ``FakeTensorMode``, every landmark,
phase peak, layer peak and the step's peak (tests/pytorch/test_gpt_style.py).

Refused (:func:`memledger.step.implementations.gpt_lacks`): every other GPT-style family under a library's code
(GPT-2, Phi, Falcon, BLOOM, ...), recomputation and dropout with pythia.
"""
from ..core.symbols import B, S, d
from . import hf, litgpt
from .norms import norm_forward
from .ops import BSd, Ref, block_output, residual_names
from .vocab import OpRole, Scope

__all__ = ["hf_forward", "hf_qkv_backward", "layer_rows", "litgpt_forward"]


def layer_rows(rows, c) -> list:
    """transformers' GPT-NeoX layer under SDPA keeps what LitGPT's does (measured: the same storages), the fused
    output whole through v's view, the new q and k, SDPA's output beside its copy
    (:func:`memledger.step.litgpt.layer_rows`); under eager (the FP32 softmax output and BF16 probabilities:
    :func:`memledger.step.hf.layer_rows`) ``probabilities @ v`` saves a copy of v (B > 1: the view of the fused output
    cannot be batched without one) or, at B = 1, v itself, whose view keeps the fused output whole."""
    if not (c.hf and c.gpt):
        return rows
    from dataclasses import replace
    if c.attention == "flash":
        return litgpt.layer_rows(rows, replace(c, implementation="litgpt"))
    if not c.single:
        return [replace(r, why="matmul's copy of v (a view of query_key_value's output)") if r.name == "V" else r
                for r in rows]
    return [replace(r, shape=(B, S, 3 * d), why="v, a view of query_key_value's output, keeps it whole")
            if r.name == "V" else r for r in rows]


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
    eager = c.attention == "eager"
    qkv = litgpt.QKV if not eager else "V" if c.single else p.new(
        "query_key_value output", (B, S, 3 * d), a, "q, k, v are views of it, until the attention returns")
    p.op("query_key_value (q, k, v: views of it)", alloc=[qkv], role=OpRole.QKV_PROJECTION)
    q, k = _hf_rotate(p, c, "q"), _hf_rotate(p, c, "k")
    p.op("torch.cat([q_embed, q_pass])", alloc=["Q"])
    p.op("released", free=[q])
    p.op("torch.cat([k_embed, k_pass])", alloc=["K"])
    p.op("released", free=[k])
    if eager:
        _hf_eager_core(p, c)
        p.op("attention returns", free=[] if c.single else [qkv])
    else:
        litgpt.flash(p, c)              # sdpa_attention_forward: transpose(1, 2).contiguous() of q's layout: a copy
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


def _hf_eager_core(p, c):
    """``eager_attention_forward`` (``modeling_gpt_neox.py`` l. 153-166) from the new q and k (contiguous: the
    batched matmul reads them as they are) to the output projection's input: the scaled, masked scores, the softmax
    upcast, its FP32 output, the BF16 probabilities, v copied for ``@ v`` (B > 1), the output's
    ``transpose(1, 2).contiguous()`` (a copy)."""
    from .ops import BHSS
    a, f = c.dtype, "fp32"
    raw, scaled, masked = (p.new(n, BHSS, a, "a temporary of the eager core")
                           for n in ("scores QK^T", "scaled scores", "scores + attention_mask"))
    up = p.new("softmax input in FP32", BHSS, f, "softmax(dtype=torch.float32) converts its input first")
    out = p.new("attention output (B, H, S, d/H)", BSd, a, "probabilities @ v, until it is copied")
    p.op("QK^T", alloc=[raw])
    p.op("* scaling", alloc=[scaled])
    p.op("released", free=[raw])
    p.op("+ attention_mask", alloc=[masked])
    p.op("released", free=[scaled])
    p.op("softmax: upcast", alloc=[up])
    p.op("softmax", alloc=["softmax output"])
    p.op("released", free=[up])
    p.op(".to(query.dtype)", alloc=[hf.PROBS])
    p.op("released", free=[masked])
    if not c.single:
        p.op("v copied for the batched matmul", alloc=["V"])
    p.op("probabilities @ V", alloc=[out])
    p.op("transpose(1, 2).contiguous()", alloc=["output projection input"])
    p.op("released", free=[out])


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
