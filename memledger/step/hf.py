"""transformers' ``LlamaForCausalLM`` (``implementation="hf"``) as its code runs, op by op: what differs from the
reference decoder's block (:mod:`memledger.step.block`, which runs the rest: the norms' places, the residual
adds, the MLP, the flash kernel's saved tensors).

Read from transformers 5.25.0, ``transformers/models/llama/modeling_llama.py``:

* ``LlamaRMSNorm.forward`` (l. 62-67): ``hidden_states.to(torch.float32)``, ``pow(2).mean(-1, keepdim=True)``,
  ``hidden_states * torch.rsqrt(variance + eps)``, ``self.weight * hidden_states.to(input_dtype)``: it keeps the
  FP32 input (pow's and the product's), the FP32 rstd and the **BF16** normalized input (the weight's product),
  where PyTorch's composite ``nn.RMSNorm`` keeps an FP32 ``x*rstd`` (``rmsnorm`` "hf":
  :func:`memledger.step.norms.norm_forward`). The weight multiplies after the downcast, so no fused RMSNorm kernel
  runs on CUDA either.
* ``LlamaRotaryEmbedding.forward`` (l. 110-116): cos and sin made once per forward in FP32 from ``position_ids``
  (1, S) and cast to the activation dtype: (1, S, d/H) each, kept by every layer's products until block 0's
  backward. ``LlamaModel.forward`` (l. 377-380): ``position_ids = torch.arange(S) + past_seen_tokens``, a local
  until it returns.
* ``LlamaAttention.forward`` (l. 244-249): separate ``q_proj``, ``k_proj``, ``v_proj`` (views (B, H, S, d/H) of
  their outputs), ``apply_rotary_pos_emb`` (l. 145-149: ``(q * cos) + (rotate_half(q) * sin)``, ``rotate_half``
  l. 119-123 a ``torch.cat`` of ``-x2`` and ``x1``): the rotated q and k are new tensors, the products save only
  cos and sin (autograd saves a factor only where the other one needs a gradient), and the projections' outputs
  go when the rotated ones replace them. v stays a view of ``v_proj``'s output.
* SDPA (``transformers/integrations/sdpa_attention.py`` l. 183-197): ``is_causal`` with no mask, the output
  ``transpose(1, 2).contiguous()``: on the CPU the flash kernel's output follows q's memory layout, (B, S, H, d/H),
  so it is already the output projection's input (no copy; measured).
* eager (``eager_attention_forward``, l. 180-202): ``matmul(q, k^T) * scaling``, ``+ attention_mask`` (a (B, 1, S, S)
  mask in the activation dtype made once per forward), ``softmax(dtype=torch.float32)`` (its FP32 output saved),
  ``.to(query.dtype)`` (the BF16 probabilities saved by ``@ v``), ``transpose(1, 2).contiguous()`` (a copy: the
  output projection's input).
* The loss (``transformers/loss/loss_utils.py`` ``ForCausalLMLoss`` l. 52-74, ``fixed_cross_entropy`` l. 35-49):
  ``logits.float()``, the labels padded by one ``ignore_index`` column and shifted (``labels[..., 1:]
  .contiguous()``: a copy of B*S int64 ids, or at B = 1 a view of the padded (1, S + 1) ids, already contiguous),
  ``F.cross_entropy`` in FP32 (the shifted labels are what ``nll_loss`` keeps). The logits go with the model's
  output once the loss is taken (``Trainer.compute_loss`` returns ``outputs.loss``).

Activation checkpointing (``recompute="full"``): ``model.gradient_checkpointing_enable()`` (transformers 5.25,
``transformers/modeling_utils.py`` l. 3202-3217, an alias of ``activation_checkpointing_enable``; its default
``{"use_reentrant": False}`` l. 3159-3160) gives every ``LlamaDecoderLayer`` (a ``GradientCheckpointingLayer``,
``transformers/modeling_layers.py`` l. 89-124) ``torch.utils.checkpoint.checkpoint(partial(forward, self, **kwargs),
hidden_states, use_reentrant=False)`` (l. 123: ``forward`` is checkpointed, not ``__call__``, so the layer's module
hooks run once). Each layer keeps its input; the ``partial`` holds the keyword arguments ``LlamaModel.forward``
passes every layer (``modeling_llama.py`` l. 393-402: ``position_embeddings`` (cos, sin), ``position_ids``, eager's
``attention_mask``), so they live until block 0's checkpoint is done (:func:`checkpoint_frame`), and block 0's input
(``inputs_embeds``) is its checkpoint's, not ``LlamaModel.forward``'s, to release. Under the checkpoint
``LlamaRMSNorm``'s tensors die with their Python references (:func:`memledger.step.norms.norm_forward`), q, k, v
and SDPA's output when ``LlamaAttention.forward`` returns, the eager core's BF16 probabilities (returned as
``attn_weights``) when the layer returns (its ``hidden_states, _ = self.self_attn(...)``). The backward re-runs the
layer as :func:`memledger.step.block.block_backward` does the reference's.

Checked against transformers' own model under ``FakeTensorMode`` (:mod:`memledger.pytorch.libraries`,
``tests/pytorch/test_libraries.py``).
"""
from ..activations.inventory import Saved
from ..core.symbols import B, H, S
from .ops import BSd, Ref, final_input, residual_names
from .vocab import OpRole, Scope

__all__ = ["COS", "PROBS", "SIN", "backward_start", "buffers", "eager_backward", "eager_core", "forward_end",
           "forward_start", "layer_rows", "outside_rows", "qkv_backward", "qkv_forward"]

COS, SIN = "rotary cos", "rotary sin"
#: The shifted labels ``nll_loss`` keeps.
LABELS = "shifted labels (int64)"
POSITIONS = "position ids (int64)"


def checkpoint_frame(c) -> list:
    """What the layers' checkpoints (``gradient_checkpointing_enable()``) hold besides each layer's input, released
    with block 0's: the arguments ``LlamaModel.forward`` passes every layer (``position_embeddings``: cos and sin;
    ``position_ids``), kept by each checkpoint's ``partial(forward, self, **kwargs)`` (``modeling_layers.py``
    l. 123)."""
    if not (c.hf and c.recompute == "full"):
        return []
    return [Ref(Scope.SHARED, n) for n in (COS, SIN, POSITIONS) + (("attention mask",) if c.attention == "eager"
                                                                     else ())]


def _dh(c):
    """The rotary tables' width per head: d/H, or a GPT-NeoX model's ``rotary_ndims`` (``Shape.rotary``)."""
    from .litgpt import rope_width
    return rope_width(c) / H


def outside_rows(c, rows) -> list:
    """``rows`` (the reference decoder's outside the layers) as transformers' model keeps them: cos and sin, and the
    shifted labels, added; no shared causal mask (its eager core adds a mask that is a local of the forward)."""
    if not c.hf:
        return rows
    rows = [r for r in rows if r.name != "causal mask"]
    labels = (B, S + 1) if c.single else (B, S)
    return rows + [Saved(COS, "LlamaRotaryEmbedding: cos in the activation dtype, made once per forward, kept by every "
                  "layer's q * cos and k * cos", (S, _dh(c)), c.dtype, block="outside", replicated=True),
            Saved(SIN, "LlamaRotaryEmbedding: sin, kept by every layer's rotate_half(q) * sin and k's", (S, _dh(c)),
                  c.dtype, block="outside", replicated=True),
            Saved(LABELS, "ForCausalLMLoss: labels padded and shifted (a view of the padded ids at B = 1), kept by "
                  "nll_loss", labels, "int64", block="outside", replicated=True)]


def buffers(c) -> list:
    """(name, bytes, why) of the model's buffers: ``LlamaRotaryEmbedding``'s ``inv_freq`` and ``original_inv_freq``
    (``modeling_llama.py`` l. 87-88), d/H/2 FP32 values each."""
    if not c.hf:
        return []
    return [("rotary inv_freq and original_inv_freq (FP32 buffers)", 2 * (_dh(c) / 2) * 4,
             "LlamaRotaryEmbedding's two buffers, d/H/2 FP32 values each")]


def forward_start(p, c):
    """The embedding, ``position_ids`` (a local of ``LlamaModel.forward``), the rotary embedding's cos and sin; eager:
    the (B, 1, S, S) mask."""
    from .families import embedding_forward
    embedding_forward(p, c)
    f, dh = "fp32", _dh(c)
    arange = p.new("torch.arange(S)", (S,), "int64", "position_ids before + past_seen_tokens")
    p.new(POSITIONS, (S,), "int64", "position_ids, a local of LlamaModel.forward until it returns")
    p.op("position_ids: arange(S)", alloc=[arange])
    p.op("+ past_seen_tokens", alloc=[POSITIONS])
    p.op("released", free=[arange])
    if c.attention == "eager":
        p.new("attention mask", (B, S, S), c.dtype, "create_causal_mask for eager: a (B, 1, S, S) additive mask in "
              "the activation dtype, a local of LlamaModel.forward")
        p.op("causal mask", alloc=["attention mask"])
    pos = p.new("position_ids.float()", (S,), f, "position_ids[..., None].float()")
    freqs = p.new("rotary freqs", (S, dh / 2), f, "positions times inv_freq")
    emb = p.new("rotary emb", (S, dh), f, "torch.cat((freqs, freqs), dim=-1)")
    cos32, sin32 = (p.new(f"rotary {n} (FP32)", (S, dh), f, f"emb.{n}()") for n in ("cos", "sin"))
    cos_s, sin_s = (p.new(f"rotary {n} * attention_scaling", (S, dh), f, "times attention_scaling")
                    for n in ("cos", "sin"))
    p.op("position_ids.float()", alloc=[pos])
    p.op("positions * inv_freq", alloc=[freqs])
    p.op("released", free=[pos])
    p.op("torch.cat((freqs, freqs))", alloc=[emb])
    p.op("emb.cos()", alloc=[cos32])
    p.op("* attention_scaling", alloc=[cos_s])
    p.op("released", free=[cos32])
    p.op("emb.sin()", alloc=[sin32])
    p.op("* attention_scaling", alloc=[sin_s])
    p.op("released", free=[sin32])
    p.op("cos.to(x.dtype)", alloc=[COS])
    p.op("sin.to(x.dtype)", alloc=[SIN])
    p.op("rotary embedding returns", free=[freqs, emb, cos_s, sin_s])


def _width(c, n):
    """(B, S, width) of q's (H*d/H) or k's and v's (H_kv*d/H) tensors."""
    from .ops import widths_of
    return widths_of(c)[0 if n == "q" else 1]


def _half(shape):
    return shape[:-1] + (shape[-1] / 2,)


def _rotate(p, c, n, out):
    """``(n * cos) + (rotate_half(n) * sin)`` (``apply_rotary_pos_emb``): ``out`` is the rotated tensor."""
    a, w = c.dtype, _width(c, n)
    t1 = p.new(f"{n} * cos", w, a, "apply_rotary_pos_emb's first product")
    neg = p.new(f"-{n}2", _half(w), a, "rotate_half: -x2")
    rh = p.new(f"rotate_half({n})", w, a, "torch.cat((-x2, x1), dim=-1)")
    t2 = p.new(f"rotate_half({n}) * sin", w, a, "apply_rotary_pos_emb's second product")
    p.op(f"{n} * cos", alloc=[t1])
    p.op(f"-{n}2", alloc=[neg])
    p.op(f"rotate_half({n}): cat", alloc=[rh])
    p.op("released", free=[neg])
    p.op(f"rotate_half({n}) * sin", alloc=[t2])
    p.op("released", free=[rh])
    p.op(f"{n} rotated", alloc=[out])
    p.op("released", free=[t1, t2])


def qkv_forward(p, c, dropped=False):
    """``q_proj``, ``k_proj``, ``v_proj`` and the rotary code: the saved rows Q, K (rotated) and V (a view of
    ``v_proj``'s output); the projections' outputs of q and k go when the rotated ones replace them. ``dropped``
    (the layer under ``gradient_checkpointing_enable()``'s checkpoint): q, k and v are locals of
    ``LlamaAttention.forward``, freed when it returns; returns their names."""
    a = c.dtype
    qp, kp = (p.new(f"{n}_proj output" + (" (checkpointed)" if dropped else ""), _width(c, n), a,
                    "until apply_rotary_pos_emb returns") for n in "qk")
    if dropped:
        q, k, v = (p.new(f"{n} (checkpointed)", _width(c, n[0]), a, "a local of LlamaAttention.forward until it "
                         "returns") for n in ("q rotated", "k rotated", "v_proj output"))
    else:
        q, k, v = _eager_inputs(p, c)
    p.op("q_proj", alloc=[qp], role=OpRole.QKV_PROJECTION)
    p.op("k_proj", alloc=[kp])
    p.op("v_proj (v: a view of its output)", alloc=[v])
    _rotate(p, c, "q", q)
    _rotate(p, c, "k", k)
    p.op("q_proj's and k_proj's outputs released", free=[qp, kp])
    return q, k, v


def _copied(c) -> bool:
    """The eager core's batched matmuls copy q, k and v (``matmul`` reshapes (B, H, S, d/H) laid out as (B, S, H,
    d/H) to (B*H, S, d/H): a view at B = 1 only); the copies are what ``bmm`` saves."""
    return c.attention == "eager" and not c.single


def _eager_inputs(p, c) -> tuple:
    """The names of the rotated q, k and of v: the saved rows, or temporaries where the core copies them."""
    if not _copied(c):
        return "Q", "K", "V"
    return tuple(p.new(name, _width(c, name[0]), c.dtype, "a local of the attention until it returns (the core "
                       "saves a copy)") for name in ("q rotated", "k rotated", "v_proj output"))


def layer_rows(rows, c) -> list:
    """The eager core's rows as transformers keeps them: the softmax output in FP32 (``softmax(dtype=torch.float32)``)
    and the BF16 probabilities (``.to(query.dtype)``, saved by ``@ v``)."""
    if not (c.hf and c.attention == "eager"):
        return rows
    from dataclasses import replace
    out = []
    for r in rows:
        if r.name == "softmax output":
            r = replace(r, dtype="fp32", why="eager_attention_forward: softmax(..., dtype=torch.float32) keeps its "
                                             "FP32 output")
            out += [r, replace(r, name=PROBS, dtype=c.dtype, why="the probabilities cast back to the activation "
                                                                  "dtype, saved by the matmul with v")]
        elif r.name == "output projection input":
            out.append(replace(r, why="attn_output.transpose(1, 2).contiguous(): a copy"))
        else:
            out.append(r)
    return out


PROBS = "attention probabilities"


def eager_core(p, c):
    """``eager_attention_forward`` (``modeling_llama.py`` l. 190-200) from the rotated q, k and v to the output
    projection's input (a copy); with dropout 0 ``F.dropout`` returns its input."""
    from .ops import BHSS, per_rank, widths_of
    a, f = c.dtype, "fp32"
    scores = per_rank(c, BHSS)
    raw, scaled, masked = (p.new(f"{n}", scores, a, "a temporary of the eager core")
                           for n in ("scores QK^T", "scaled scores", "scores + attention_mask"))
    up = p.new("softmax input in FP32", scores, f, "softmax(dtype=torch.float32) converts its input first")
    out = p.new("attention output (B, H, S, d/H)", widths_of(c)[0], a, "probabilities @ v, until it is copied")
    if _copied(c):
        p.op("q copied for the batched matmul", alloc=["Q"])
        p.op("k^T copied for the batched matmul", alloc=["K"])
    p.op("QK^T", alloc=[raw])
    p.op("* scaling", alloc=[scaled])
    p.op("released", free=[raw])
    p.op("+ attention_mask", alloc=[masked])
    p.op("released", free=[scaled])
    p.op("softmax: upcast", alloc=[up])
    p.op("softmax", alloc=["softmax output"])
    p.op("released", free=[up])
    p.op(".to(query.dtype)", alloc=[PROBS])
    p.op("released", free=[masked])
    if _copied(c):
        p.op("v copied for the batched matmul", alloc=["V"])
    p.op("probabilities @ V", alloc=[out])
    p.op("transpose(1, 2).contiguous()", alloc=["output projection input"])
    p.op("released", free=[out])
    p.op("attention returns", free=["q rotated", "k rotated", "v_proj output"] if _copied(c) else [])


def eager_core_checkpointed(p, c) -> list:
    """``eager_attention_forward`` under the layer's checkpoint (nothing saved): ``matmul``'s copies of q and k^T
    (B > 1) go when it returns, each score tensor when the next replaces it, the FP32 softmax output with its
    ``.to(query.dtype)``; the BF16 probabilities are returned as ``attn_weights`` and held by
    ``LlamaDecoderLayer.forward``'s ``hidden_states, _ = self.self_attn(...)`` until the layer returns. Returns the
    names freed when the layer returns (the probabilities) and leaves the output projection's input live."""
    from .ops import BHSS, per_rank, widths_of
    a, f, mark = c.dtype, "fp32", " (checkpointed)"
    scores = per_rank(c, BHSS)
    copies = _copied(c)
    qc, kc, vc = (p.new(f"{n} copied for the batched matmul" + mark, _width(c, n), a, "matmul's reshape: a copy, "
                        "freed when it returns") for n in "qkv") if copies else (None, None, None)
    raw, scaled, masked = (p.new(n + mark, scores, a, "a temporary of the eager core")
                           for n in ("scores QK^T", "scaled scores", "scores + attention_mask"))
    up = p.new("softmax input in FP32" + mark, scores, f, "softmax(dtype=torch.float32) converts its input first")
    sm = p.new("softmax output" + mark, scores, f, "softmax's FP32 output, until .to(query.dtype) returns")
    probs = p.new(PROBS + mark, scores, a, "attn_weights: returned, held by the decoder layer's `_` until it returns")
    out = p.new("attention output (B, H, S, d/H)" + mark, widths_of(c)[0], a, "probabilities @ v, until it is copied")
    pin = p.new("output projection input" + mark, widths_of(c)[0], a, "transpose(1, 2).contiguous(): a copy")
    p.op("q, k^T copied for the batched matmul" if copies else "QK^T reads the views", alloc=[qc, kc])
    p.op("QK^T", alloc=[raw])
    p.op("released", free=[qc, kc])
    p.op("* scaling", alloc=[scaled])
    p.op("released", free=[raw])
    p.op("+ attention_mask", alloc=[masked])
    p.op("released", free=[scaled])
    p.op("softmax: upcast", alloc=[up])
    p.op("softmax", alloc=[sm])
    p.op("released", free=[up])
    p.op(".to(query.dtype)", alloc=[probs])
    p.op("released", free=[sm, masked])
    if copies:
        p.op("v copied for the batched matmul", alloc=[vc])
    p.op("probabilities @ V", alloc=[out])
    p.op("released", free=[vc])
    p.op("transpose(1, 2).contiguous()", alloc=[pin])
    p.op("released", free=[out])
    return pin, [probs]


def eager_backward(p, c, gpi) -> tuple:
    """The eager core's backward from the output projection input's gradient ``gpi`` (live; that input released):
    returns the q, k, v gradients (v's already copied back to (B, S, d)) for :func:`qkv_backward`."""
    from .ops import BHSS, per_rank, widths_of
    a, f = c.dtype, "fp32"
    scores = per_rank(c, BHSS)
    BSq = widths_of(c)[0]
    g4 = gpi
    if _copied(c):
        g4 = p.new("gradient of the attention output (B, H, S, d/H)", BSq, a, "heads split: a copy")
        p.op("heads split", alloc=[g4])
        p.op("released", free=[gpi])
    gq, gk, gv = (p.new(f"gradient of {n}", BSq, a, f"dL/d{n}") for n in "qkv")
    gp, gp32, gs32, gsm, gr = (p.new(name, scores, dtype, why) for name, dtype, why in [
        ("gradient of the probabilities", a, "g @ v^T"), ("gradient of the probabilities in FP32", f,
                                                            "the downcast's backward"),
        ("gradient of the softmax input (FP32)", f, "softmax backward"),
        ("gradient of the masked scores", a, "the upcast's backward"),
        ("gradient of QK^T", a, "times the scaling")])
    p.op("probabilities @ V backward", alloc=[gp, gv])
    p.op("released", free=[g4, "V", PROBS])
    p.op(".to(query.dtype) backward", alloc=[gp32])
    p.op("released", free=[gp])
    p.op("softmax backward", alloc=[gs32])
    p.op("released", free=[gp32, "softmax output"])
    p.op("softmax upcast backward", alloc=[gsm])
    p.op("released", free=[gs32])
    p.op("* scaling backward", alloc=[gr])
    p.op("released", free=[gsm])
    p.op("QK^T backward", alloc=[gq, gk])
    p.op("released", free=[gr, "Q", "K"])
    return gq, gk, gv


def _rotate_backward(p, c, n, g, into):
    """The rotary code's backward for ``n`` from ``g`` (the rotated tensor's gradient): ``g * sin`` through
    ``rotate_half`` (the negation; the slices' backward: a zero-filled full tensor each), ``g * cos``; summed
    into ``into`` (the projection output's gradient)."""
    a, w = c.dtype, _width(c, n)
    gs = p.new(f"grad {n}: g * sin", w, a, "rotate_half(x) * sin backward")
    gneg = p.new(f"grad {n}: -g", _half(w), a, "the negation's backward")
    g2 = p.new(f"grad {n}: x2 slice backward", w, a, "slice_backward: zeros with the gradient copied in")
    g1 = p.new(f"grad {n}: x1 slice backward", w, a, "slice_backward: zeros with the gradient copied in")
    gc = p.new(f"grad {n}: g * cos", w, a, "x * cos backward")
    # block 0's q products are cos's and sin's last users; under gradient checkpointing the layers' checkpoints hold
    # them (position_embeddings, an argument) until block 0's is done (memledger.step.block.block_backward)
    last = n == "q" and c.recompute != "full"
    p.op(f"rotate_half({n}) * sin backward", alloc=[gs])
    if last:
        p.op("released", free=[Ref(Scope.SHARED, SIN)])
    p.op(f"-{n}2 backward", alloc=[gneg])
    p.op(f"{n}2 slice backward", alloc=[g2])
    p.op("released", free=[gneg])
    p.op(f"{n}1 slice backward", alloc=[g1])
    p.op("released", free=[gs])
    p.op(f"{n} * cos backward", free=[g], alloc=[gc])
    if last:
        p.op("released", free=[Ref(Scope.SHARED, COS)])
    p.op(f"{n} gradients summed", alloc=[into])
    p.op("released", free=[g1, g2, gc])


def qkv_backward(p, c, gq, gk, gv, grads) -> str:
    """From the core's q, k, v gradients (live; the core's saved tensors released) to the gradient of norm 1's
    output (returned): k's and q's rotary backward, then ``v_proj``'s, ``k_proj``'s and ``q_proj``'s (``mm``: the
    weight's gradient, then the input's), the three input gradients summed. ``grads``: {"q"|"k"|"v": its weight's
    gradient}."""
    a = c.dtype
    gkp, gqp = (p.new(f"gradient of {n}_proj's output", _width(c, n), a, "the rotary code's input gradient")
                for n in "kq")
    _rotate_backward(p, c, "k", gk, gkp)
    _rotate_backward(p, c, "q", gq, gqp)
    eager = c.attention == "eager"      # the core's gradients come laid out (B, H, S, d/H): view's backward copies
    gkc, gqc, gvc = (p.new(f"gradient of {n}_proj's output, copied back", _width(c, n), a, "(B, H, S, d/H) to "
                           "(B, S, d)") for n in "kqv") if eager else (gkp, gqp, gv)
    ins = {n: p.new(f"gradient of norm 1's output via {n}_proj", BSd, a, f"{n}_proj's input gradient")
           for n in "vkq"}
    gn1 = p.new("gradient of norm 1's output", BSd, a, "the three projections' input gradients summed")
    if eager:
        p.op("v gradient copied back", alloc=[gvc])
        p.op("released", free=[gv])
    p.op("v_proj backward", alloc=[grads["v"], ins["v"]], role=OpRole.QKV_PROJECTION_BACKWARD)
    p.op("released", free=[gvc])
    if eager:
        p.op("k gradient copied back", alloc=[gkc])
        p.op("released", free=[gkp])
    p.op("k_proj backward", alloc=[grads["k"], ins["k"]])
    p.op("released", free=[gkc])
    p.op("input gradients summed", alloc=[gn1])
    p.op("released", free=[ins["v"], ins["k"]])
    if eager:
        p.op("q gradient copied back", alloc=[gqc])
        p.op("released", free=[gqp])
    p.op("q_proj backward", alloc=[grads["q"], ins["q"]])
    p.op("released", free=[gqc, "Q/K/V projection input"])
    p.op("input gradients summed (in place)", free=[ins["q"]])
    return gn1


def forward_end(p, c):
    """``LlamaModel.forward``'s final norm and return, the LM head, ``ForCausalLMLoss``."""
    from .norms import norm_forward
    from .outer import LOGITS
    a = c.dtype
    norm_forward(p, c, "final", "LM head input")
    full = c.recompute == "full"        # the layers' checkpoints hold position_ids (an argument) and block 0's input
    saved = c.gpt                       # GPT-NeoX: the LayerNorms save the final norm's and block 0's inputs
    p.op("LlamaModel.forward returns", free=[None if saved else final_input(c), None if full else POSITIONS,
                                             "attention mask" if c.attention == "eager" and not full
                                             else None, None if full or saved else Ref(Scope.FIRST,
                                                                                        residual_names(c)[0])],
         role=OpRole.FINAL_NORM_INPUT_RELEASED)
    logits = p.new("logits", LOGITS, a, "the LM head's output, held by the model's output until the loss is taken")
    p.op("LM head", alloc=[logits], role=OpRole.LM_HEAD)
    src = p.new("logits in FP32", LOGITS, "fp32", "ForCausalLMLoss: logits.float()")
    p.op("logits.float()", alloc=[src])
    padded = None
    if c.single:        # labels[..., 1:] of a (1, S + 1) tensor is contiguous: the view is what nll_loss keeps
        p.op("labels padded (the shifted labels: a view)", alloc=[LABELS])
    else:
        padded = p.new("padded labels", (B, S + 1), "int64", "nn.functional.pad(labels, (0, 1), value=-100)")
        p.op("labels padded", alloc=[padded])
        p.op("labels[..., 1:].contiguous()", alloc=[LABELS])
    p.op("log_softmax", alloc=["log-softmax output (FP32)"])
    p.op("nll_loss", alloc=["loss", "nll_loss total weight"])
    p.op("loss computed", free=[src, padded], role=OpRole.LOSS_COMPUTED)
    p.op("the model's output released", free=[logits])


def backward_start(p, c):
    """Backward through the loss, the LM head and the final norm (:func:`memledger.step.outer.backward_start`, the
    shifted labels released with nll_loss's total weight)."""
    from .outer import backward_start as reference
    reference(p, c, labels=LABELS)
