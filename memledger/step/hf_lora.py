"""PEFT's LoRA on transformers' ``LlamaForCausalLM`` (``LoraLedger(..., implementation="hf")``): the LoRA step's
machinery (:mod:`memledger.step.lora`: frozen bases, adapters, the optimizer over the adapters) on transformers'
code (:mod:`memledger.step.hf`: its norms, separate q/k/v projections and rotary code, its loss, its rotary
buffers, cos, sin and position ids, ``gradient_checkpointing_enable()``'s non-reentrant checkpoint).

What differs from the reference LoRA step, read from transformers 5.25.0 (``models/llama/modeling_llama.py``) and
PEFT 0.22.0 (``peft/tuners/lora/layer.py`` ``Linear.forward``):

* ``LlamaRMSNorm`` with a frozen weight (l. 62-67): keeps its FP32 input and rstd (``pow`` and the product with
  rstd), not the BF16 normalized input (``self.weight * hidden_states.to(input_dtype)`` saves it only for the
  weight's gradient); its FP32 ``x*rstd`` and the BF16 copy are temporaries until it returns. Backward: the
  normalized input's gradient (BF16, ``g * w``), the downcast's (FP32), then as transformers' own norm.
* ``LlamaAttention.forward`` (l. 244-249): ``q_proj``, ``k_proj``, ``v_proj`` each a PEFT ``Linear`` (the frozen base,
  then ``result + lora_B(lora_A(x)) * scaling``), the rotary code on q and k (:func:`memledger.step.hf.qkv_forward`'s
  ops); no fused projection, no ``torch.cat``. Backward: k's and q's rotary code, then v's, k's and q's adapter
  and frozen base, each input gradient summed as it arrives.
* The decoder layer's locals (l. 290-305): norm 1's output lives until ``self_attn`` returns, norm 2's until
  ``self.mlp`` returns; under the checkpoint q, k, v and SDPA's output go when ``LlamaAttention.forward`` returns.
* Outside: the rotary buffers, position ids, cos and sin (:func:`memledger.step.hf.forward_start`), the frozen final
  norm and head, ``ForCausalLMLoss`` (the BF16 logits held by the model's output until the loss is taken, the
  shifted labels kept by ``nll_loss``).

* The final norm's output (``outputs.last_hidden_state``), not saved by the frozen head, is held by the model's
  output with the BF16 logits until ``LlamaForCausalLM.forward`` returns: one B*S*d tensor more than the reference
  LoRA step holds while the loss is taken (its forward phase's peak).

With ``gradient_checkpointing_enable()`` (``recompute="full"``) ``get_peft_model`` calls ``enable_input_require_grads``
(``peft/peft_model.py`` l. 243-244): the embedding's output is a leaf that requires grad, every layer alike (the
checkpoint keeps the layer's input; cos, sin and position ids held by the checkpoints until block 0's is done).
Without it (``recompute="none"``) block 0's input does not require grad: its norm 1 keeps nothing, the attention
residual sum's gradient goes to the attention branch only, SDPA's gradient of a q, k or v without an adapter is
dropped at once, the q, k, v adapters compute their weights' gradients only and nothing runs below them; block 0's
input is ``inputs_embeds``, freed when ``LlamaModel.forward`` returns, and no leaf or input gradient is kept.

Scope: SDPA, no LoRA dropout, no QLoRA, no ``lm_head`` adapter, no chunked loss, no optimizer in backward; without
checkpointing a ``q_proj`` adapter (block 0's rotary backward releases cos and sin). Checked against PEFT on
transformers' model, every landmark, phase peak, layer peak and the peak (``tests/pytorch/test_peft.py``).
"""
from ..core.symbols import B, S
from . import hf, lora, outer
from .ops import BS, BSd, Ref, residual_names, widths_of
from .trace import Part, flatten
from .vocab import Lifetime, OpRole, Scope

__all__ = ["HfLoraBuilt", "hf_lora_refusal"]


def hf_lora_refusal(setup, config) -> str:
    """What the hf LoRA step does not model under ``setup`` and ``config`` (comma-separated), or ""."""
    lacks = [what for what, off in [
        ("LoRA without gradient_checkpointing_enable() and without a q_proj adapter (block 0's q then needs no "
         "gradient)", setup.recompute == "none" and "q_proj" not in config.targets),
        ("QLoRA", config.base == "nf4"), ("LoRA dropout", config.dropout),
        ("an lm_head adapter", "lm_head" in config.targets), ("a chunked loss", setup.chunked_loss),
        ("optimizer_in_backward", setup.optimizer_in_backward)] if off]
    return ", ".join(lacks)


def _norm(p, c, k, out, kept: bool):
    """``LlamaRMSNorm`` ``k`` with a frozen weight writing ``out``: ``kept``, its FP32 input and rstd are the saved
    rows; else (under the checkpoint) temporaries that die when the product replaces ``hidden_states``."""
    prefix, f = lora._prefix(k), "fp32"
    x32, rstd = f"{prefix} input", f"{prefix} rstd"
    if not kept:
        x32 = p.new(f"norm {k}: FP32 input (checkpointed)", BSd, f, "hidden_states.to(torch.float32)")
        rstd = p.new(f"norm {k}: rstd (checkpointed)", BS, f, "rsqrt(variance + eps), a temporary")
    sq, ms = p.new(f"norm {k}: x^2", BSd, f, "pow(2)"), p.new(f"norm {k}: variance", BS, f, "mean(x^2), a local")
    ve = p.new(f"norm {k}: variance + eps", BS, f, "rsqrt's input")
    xr = p.new(f"norm {k}: x*rstd", BSd, f, "hidden_states * rstd (FP32), a local until the norm returns")
    xn = p.new(f"norm {k}: normalized", BSd, c.dtype, "hidden_states.to(input_dtype): not kept, the weight is frozen")
    p.op(f"norm {k} upcast", alloc=[x32])
    p.op(f"norm {k} pow", alloc=[sq])
    p.op(f"norm {k} mean", alloc=[ms])
    p.op(f"norm {k} + eps", free=[sq], alloc=[ve])
    p.op(f"norm {k} rsqrt", alloc=[rstd])
    if kept:
        p.op(f"norm {k} x*rstd", free=[ve], alloc=[xr])
    else:
        p.op("released", free=[ve])
        p.op(f"norm {k} x*rstd", alloc=[xr])
        p.op("released", free=[rstd, x32])
    p.op(f"norm {k} downcast", alloc=[xn])
    p.op(f"norm {k} weight (frozen)", alloc=[out])
    p.op(f"norm {k} returns", free=[xn, xr, ms])
    return out


def _norm_backward(p, c, k, g_out, g_in, also_free=()):
    """The backward of a frozen ``LlamaRMSNorm``: the normalized input's gradient (``g * w``), the downcast's (FP32),
    the product with rstd, rsqrt, mean, pow, the two FP32 gradients summed, the upcast's (no weight gradient)."""
    prefix, f, a = lora._prefix(k), "fp32", c.dtype
    x32, rstd = f"{prefix} input", f"{prefix} rstd"
    t = {n: p.new(f"norm {k} backward: {n}", shape, dtype, why) for n, shape, dtype, why in [
        ("g*w", BSd, a, "the normalized input's gradient"), ("g32", BSd, f, "the downcast's backward"),
        ("g*rstd", BSd, f, "gradient of x through x*rstd"), ("g*x", BSd, f, "for the rstd gradient"),
        ("g_rstd", BS, f, "the rstd gradient"), ("rsqrt'", BS, f, "rsqrt backward"), ("rsqrt''", BS, f, "rsqrt backward"),
        ("g_ms", BS, f, "gradient of mean(x^2)"), ("g_mean", BSd, f, "mean backward"), ("pow'", BSd, f, "pow backward"),
        ("pow''", BSd, f, "pow backward"), ("g_pow", BSd, f, "gradient of x through x^2"),
        ("g_x32", BSd, f, "sum of both gradients of x (FP32)")]}
    p.op(f"norm {k} backward: normalized input", alloc=[t["g*w"]])
    p.op("released", free=[g_out])
    p.op(f"norm {k} backward: downcast", alloc=[t["g32"]])
    p.op("released", free=[t["g*w"]])
    p.op(f"norm {k} backward: x*rstd", alloc=[t["g*rstd"], t["g*x"]])
    p.op(f"norm {k} backward: rstd gradient", alloc=[t["g_rstd"]])
    p.op("released", free=[t["g*x"], t["g32"]])
    p.op(f"norm {k} backward: rsqrt", alloc=[t["rsqrt'"], t["rsqrt''"], t["g_ms"]])
    p.op(f"norm {k} backward: mean", free=[t["rsqrt''"], t["rsqrt'"], t["g_rstd"], rstd], alloc=[t["g_mean"]])
    p.op(f"norm {k} backward: pow", free=[t["g_ms"]], alloc=[t["pow'"], t["pow''"], t["g_pow"]])
    p.op(f"norm {k} backward: sum", free=[t["pow''"], t["pow'"], t["g_mean"], x32] + list(also_free),
         alloc=[t["g_x32"]])
    p.op(f"norm {k} backward: summed", free=[t["g*rstd"], t["g_pow"]])
    p.op(f"norm {k} backward: upcast's backward", alloc=[g_in])
    p.op(f"norm {k} backward: done", free=[t["g_x32"]])


class _Block(lora._BlockForward):
    """One decoder layer's forward under PEFT (:class:`memledger.step.lora._BlockForward` with transformers' norms,
    projections, rotary code and locals); ``dropped``: under the layer's checkpoint."""

    first = False       # block 0 without the checkpoint: its input does not require grad

    def norm(self, k, kept_output) -> str:
        """``LlamaRMSNorm`` ``k`` (frozen); its output a saved row where an adapter keeps it, else a local. Block 0's
        norm 1 without the checkpoint keeps nothing: its input does not require grad."""
        p, c = self.p, self.c
        if not self.dropped and kept_output in self.kept:
            out = kept_output
        else:
            out = self.local(f"norm {k} output" + (" (checkpointed)" if self.dropped else ""))
        return _norm(p, c, k, out, not self.dropped and not (self.first and k == "1"))

    def returns(self, dn, xm):
        """The residual add into the next layer's input; the layer returns: its locals go, and its input unless the
        checkpoint keeps it or it is block 0's (``inputs_embeds``, held by ``LlamaModel.forward`` until it returns)."""
        p, c = self.p, self.c
        x = residual_names(c)[0]
        p.op("residual add", free=self.mlp_temporary, alloc=[Ref(Scope.NEXT, x, lora._final_input(c))])
        held = [xm] if self.dropped else [xm, Ref(Scope.NOT_FIRST, x)]
        p.op("block returns", free=[dn] + held + self.temps, role=OpRole.BLOCK_RETURNS)

    def qkv(self, h1):
        """``q_proj``, ``k_proj``, ``v_proj`` (each with its adapter, if any) and the rotary code on q and k: Q, K
        (rotated, new tensors) and V (a view of ``v_proj``'s output) saved; under the checkpoint, locals of
        ``LlamaAttention.forward`` (freed when it returns: :meth:`attention_branch`)."""
        p, c = self.p, self.c
        mark = " (checkpointed)" if self.dropped else ""
        qp, kp = (p.new(f"{n}_proj output{mark}", hf._width(c, n), c.dtype, "until apply_rotary_pos_emb returns")
                  for n in "qk")
        if self.dropped:
            q, k, v = (p.new(f"{n}{mark}", hf._width(c, n[0]), c.dtype, "a local of LlamaAttention.forward")
                       for n in ("q rotated", "k rotated", "v_proj output"))
            self.attention_locals = [q, k, v]
        else:
            q, k, v = "Q", "K", "V"
            self.attention_locals = []
        for n, out in (("q", qp), ("k", kp), ("v", v)):
            self.projection(f"{n}_proj", f"{n}_proj", h1, out, hf._width(c, n),
                            role=OpRole.QKV_PROJECTION if n == "q" else None)
        hf._rotate(p, c, "q", q)
        hf._rotate(p, c, "k", k)
        p.op("q_proj's and k_proj's outputs released", free=[qp, kp])

    def attention_branch(self, pi, xm) -> str:
        """``o_proj`` (with its adapter), ``LlamaAttention.forward`` returns (its locals go; norm 1's output, the
        layer's ``hidden_states``, is replaced), the residual add."""
        p, c = self.p, self.c
        branch = p.new("o_proj output", BSd, c.dtype, "the attention branch before the residual add")
        self.projection("proj", "o_proj", pi, branch, BSd)
        gone = self.attention_locals + [n for n in self.temps if n in (pi, self.h1)]
        self.temps = [n for n in self.temps if n not in gone]
        p.op("attention returns", free=gone)
        if self.dropped:
            xm = p.new("attention residual sum (checkpointed)", BSd, c.dtype, "x + attention")
        p.op("residual add", alloc=[xm])
        p.op("residual done", free=[branch])
        return xm

    def mlp_returns(self, h2):
        """``LlamaMLP.forward`` returns: its product and norm 2's output (``hidden_states``) go."""
        gone = self.mlp_temporary + [n for n in self.temps if n == h2]
        self.temps = [n for n in self.temps if n not in gone]
        self.mlp_temporary = []
        if any(gone):
            self.p.op("MLP returns", free=gone)


def block_forward(p, c, spec, dropped=False, first=False):
    """One decoder layer's forward under PEFT (its input live; its output the next layer's input); ``first``: block
    0 without the checkpoint (its input does not require grad)."""
    block = _Block(p, c, spec, dropped)
    block.first = first
    block.h1 = h1 = block.norm("1", "Q/K/V projection input")
    block.qkv(h1)
    pi = block.attention()
    xm = block.attention_branch(pi, residual_names(c)[1])
    h2 = block.norm("2", "MLP input")
    dn = block.mlp(h2)
    block.mlp_returns(h2)
    block.returns(dn, xm)


def _needs_grad(spec, first, n) -> bool:
    """Whether ``n`` (q, k or v) requires grad: always, but in block 0 without the checkpoint only with an adapter."""
    return not first or f"{n}_proj" in spec.targets


def _qkv_backward(p, c, spec, share, gq, gk, gv, first=False):
    """k's and q's rotary code (:func:`memledger.step.hf._rotate_backward`), then v's, k's and q's projection (each
    adapter before its frozen base), the input gradients summed as they arrive; returns norm 1's output gradient.
    ``first`` (block 0 without the checkpoint): SDPA's gradient of a q, k or v without an adapter is dropped as its
    node returns; the adapters compute their weights' gradients only, the frozen bases nothing (returns None)."""
    dropped = [g for n, g in (("q", gq), ("k", gk), ("v", gv)) if not _needs_grad(spec, first, n)]
    if dropped:
        p.op("gradients no input needs released", free=dropped)
    grads = {"v": gv}
    for n, g in (("k", gk), ("q", gq)):
        if _needs_grad(spec, first, n):
            grads[n] = p.new(f"gradient of {n}_proj's output", hf._width(c, n), c.dtype,
                             "the rotary code's input gradient")
            hf._rotate_backward(p, c, n, g, grads[n])
    total = lora._Sum(p, "gradient of norm 1's output", BSd, c.dtype)
    adapted = [t for t in lora.QKV if t in spec.targets]
    for n in (n for n in "vkq" if n in grads):
        t = f"{n}_proj"
        if first:
            _adapter_weights_backward(p, c, spec, t, share, t == adapted[0], grads[n])
            continue
        lora._projection_backward(p, c, spec, share, total, t, t, "Q/K/V projection input",
                                  bool(adapted) and t == adapted[0], grads[n],
                                  (f"gradient of norm 1's output via {t} (frozen)", BSd, f"the frozen {t}'s"))
    return total.value


def _adapter_weights_backward(p, c, spec, t, share, last_reader, g_out):
    """An adapter on an input that does not require grad (block 0's q, k, v without the checkpoint): B's weight
    gradient and A's input gradient, A's weight gradient only; FP32 adapters cast the output gradient to FP32 (the
    frozen base's share is not computed); ``g_out`` goes once read, the saved input with its ``last_reader``."""
    out, inp = lora.adapter_shape(c, t)
    ad = lora._adapter_dtype(c, spec)
    g = g_out
    if spec.fp32_adapters:
        g = p.new(f"LoRA {t} output gradient in FP32", (B, S, out), "fp32", ".to() backward: the sum's gradient")
        p.op(f"LoRA {t}: back-to-{c.dtype} backward", alloc=[g])
        p.op("released", free=[g_out])
    gs = p.new(f"LoRA {t} scaled gradient", (B, S, out), ad, "mul backward: g * scaling")
    ga = p.new(f"LoRA {t} gradient of A output", (B, S, lora.r), ad, "lora_B's input gradient")
    grad_b = lora.gradient(p, f"{t}.lora_B", out * lora.r, c, share)
    grad_a = lora.gradient(p, f"{t}.lora_A", lora.r * inp, c, share)
    p.op(f"LoRA {t} scaling backward", alloc=[gs])
    p.op("released", free=[g])
    p.op(f"LoRA {t} B backward", alloc=[grad_b, ga])
    p.op("released", free=[gs, f"LoRA {t} A output"])
    p.op(f"LoRA {t} A backward (its weight's gradient only)", alloc=[grad_a])
    saved = f"LoRA {t} input (FP32 copy)" if spec.fp32_adapters else ("Q/K/V projection input" if last_reader else None)
    p.op("released", free=[ga, saved])


def block_backward(p, c, spec, share, first=False):
    """One decoder layer's backward under PEFT: ``dX_out`` (live) -> the previous layer's; under the checkpoint the
    layer re-run first, where the down projection's backward (or its adapter B's) unpacks. ``first``: block 0
    without the checkpoint, whose input does not require grad: the attention residual sum's gradient goes to the
    attention branch only (freed once ``o_proj`` has read it), and nothing runs below the q, k, v adapters."""
    start = len(p.ops)
    g_h2 = lora._mlp_backward(p, c, spec, share)
    gn2 = p.new("gradient of norm 2's input", BSd, c.dtype, "norm 2 backward's output")
    _norm_backward(p, c, "2", g_h2, gn2)
    gxm = p.new("gradient of the attention residual sum", BSd, c.dtype, "skip and norm gradients summed")
    p.op("residual gradients summed", alloc=[gxm])
    p.op("released", free=[gn2, "dX_out"])
    g_pi = lora._Sum(p, "gradient of the output projection input", widths_of(c)[0], c.dtype)
    lora._projection_backward(p, c, spec, share, g_pi, "o_proj", "o_proj", "output projection input", False,
                              gxm if first else None,
                              ("gradient of the output projection input (frozen)", widths_of(c)[0], "o_proj's"))
    g_h1 = _qkv_backward(p, c, spec, share, *lora._flash_backward(p, c, spec, g_pi.value), first=first)
    if first:
        return
    gx1 = p.new("gradient of norm 1's input", BSd, c.dtype, "norm 1 backward's output")
    # the checkpoint's input and the arguments its partial holds (cos, sin, position_ids) go with norm 1's input
    full = c.recompute == "full"
    _norm_backward(p, c, "1", g_h1, gx1, [residual_names(c)[0]] + hf.checkpoint_frame(c) if full else [])
    p.op("residual gradients summed", alloc=[lora.INPUT_GRADIENT])
    p.op("released", free=[gx1, gxm])
    if full:
        _with_recomputation(p, c, spec, start)


def _recompute(p, c, spec):
    """The layer's forward re-run with saving, stopped at the pack hook of the last tensor it saves (before the
    down projection's matmul, or its adapter B's): :func:`memledger.step.lora._recompute` on transformers' layer."""
    q = p.fork()
    block_forward(q, c, spec)
    roles = [op.role for op in q.ops]
    stop = roles.index(OpRole.LORA_DOWN_B if "down_proj" in spec.targets else OpRole.DOWN_PROJECTION)
    alive = []
    for op in q.ops[:stop]:
        alive = [n for n in alive if n not in op.frees] + list(op.allocs)
    x = residual_names(c)[0]
    q.ops[stop:] = []
    q.op("recomputation stops", free=[n for n in alive if isinstance(n, str) and n != x
                                      and p.tensors[n].lifetime is Lifetime.TEMPORARY], role=OpRole.RECOMPUTATION_STOPS)
    return q.ops


def _with_recomputation(p, c, spec, start):
    at = start
    if "down_proj" in spec.targets:
        at = next(i for i in range(start, len(p.ops)) if p.ops[i].role is OpRole.LORA_DOWN_B_BACKWARD)
    p.ops[at:at] = _recompute(p, c, spec)


def forward_end(p, c):
    """``LlamaModel.forward``'s frozen final norm and return, the frozen LM head, ``ForCausalLMLoss``
    (:func:`memledger.step.hf.forward_end`'s): the norm's output, not kept by the frozen head, is held by the model's
    output with the BF16 logits until the loss is taken."""
    a = c.dtype
    head_in = p.new("LM head input", BSd, a, "outputs.last_hidden_state: not saved (the head is frozen), held by the "
                    "model's output until its forward returns")
    _norm(p, c, "final", head_in, True)
    full = c.recompute == "full"        # the layers' checkpoints hold position_ids and block 0's input (the leaf)
    p.op("LlamaModel.forward returns", free=[hf.final_input(c), None if full else hf.POSITIONS,
                                             None if full else Ref(Scope.FIRST, residual_names(c)[0])],
         role=OpRole.FINAL_NORM_INPUT_RELEASED)
    logits = p.new("logits", outer.LOGITS, a, "the LM head's output, held by the model's output until the loss")
    p.op("LM head (frozen)", alloc=[logits], role=OpRole.LM_HEAD)
    src = p.new("logits in FP32", outer.LOGITS, "fp32", "ForCausalLMLoss: logits.float()")
    p.op("logits.float()", alloc=[src])
    padded = None
    if c.single:
        p.op("labels padded (the shifted labels: a view)", alloc=[hf.LABELS])
    else:
        padded = p.new("padded labels", (B, S + 1), "int64", "nn.functional.pad(labels, (0, 1), value=-100)")
        p.op("labels padded", alloc=[padded])
        p.op("labels[..., 1:].contiguous()", alloc=[hf.LABELS])
    p.op("log_softmax", alloc=["log-softmax output (FP32)"])
    p.op("nll_loss", alloc=["loss", "nll_loss total weight"])
    p.op("loss computed", free=[src, padded], role=OpRole.LOSS_COMPUTED)
    p.op("the model's output released", free=[logits, head_in])


def backward_start(p, c):
    """Back through the loss (the shifted labels go with ``nll_loss``'s total weight), the frozen LM head (its input
    gradient only) and the frozen final norm; ends with the last layer's ``dX_out``."""
    a = c.dtype
    dl = p.new("gradient of the loss", (), "fp32", "loss.backward() seeds a 1")
    g1 = p.new("nll_loss gradient", outer.LOGITS, "fp32", "nll_loss backward: B*S*V FP32")
    g2 = p.new("log_softmax gradient", outer.LOGITS, "fp32", "log_softmax backward: B*S*V FP32")
    g = p.new("logits gradient", outer.LOGITS, a, "downcast to the logits' dtype")
    gfn = p.new("gradient of the LM head input", BSd, a, "the frozen LM head's input gradient")
    p.op("loss.backward()", alloc=[dl], role=OpRole.LOSS_BACKWARD)
    p.op("nll_loss backward", alloc=[g1])
    p.op("released", free=["nll_loss total weight", hf.LABELS], role=OpRole.LABELS_RELEASED)
    p.op("log_softmax backward", alloc=[g2])
    p.op("released", free=[g1, "log-softmax output (FP32)"])
    p.op("logits.float() backward", alloc=[g])
    p.op("released", free=[g2])
    p.op("LM head backward (input gradient only)", alloc=[gfn])
    p.op("released", free=[g])
    _norm_backward(p, c, "final", gfn, Ref(Scope.LAST, "dX_out"))


def _loss_released(p):
    """Without the checkpoint the graph frees the loss and its gradient only (no leaf, no input gradient)."""
    p.op("loss released", free=["gradient of the loss", "loss"], role=OpRole.LOSS_RELEASED)
    return p.ops


def _with_first(ops, first) -> list:
    """``ops`` (every layer the same programs) with block 0's forward and backward taken from ``first`` (the same
    step with block 0's own programs)."""
    runs, prev = [], None
    for op in first:
        if op.layer == 0:
            if prev != 0:
                runs.append([])
            runs[-1].append(op)
        prev = op.layer
    out, prev = [], None
    for op in ops:
        if op.layer == 0 and prev != 0:
            out += runs.pop(0)
        if op.layer != 0:
            out.append(op)
        prev = op.layer
    return out


def saved_rows(s) -> tuple:
    """(a layer's saved rows, the rows outside): the LoRA step's with ``LlamaRMSNorm``'s frozen rows (its FP32 input
    and rstd: composite RMSNorm's, less the weight-only ``x*rstd``), plus cos, sin and the shifted labels."""
    from ..activations.outside import outside_inventory
    c, spec = s.shape, s.lora
    opts = s.conventions.inventory_options(c.style, c.dtype, False) | {"attention": c.attention,
                                                                       "rmsnorm": "composite"}
    outside = [row for row in outside_inventory(c.style, **{k: opts[k] for k in (
        "dtype", "norm_stats", "rmsnorm", "attention")}) if row.name not in lora.NORM_WEIGHT_ONLY + ("LM head input",)]
    return lora.lora_rows(c, spec, opts), hf.outside_rows(c, outside)


class HfLoraBuilt(lora.LoraBuilt):
    """The programs of a :class:`~memledger.step.lora.LoraStructure` under transformers' code (PEFT's LoRA)."""

    def __init__(self, s):
        from ..states.recipes import get_recipe
        from .ops import Program
        from .trace import explicit_layers
        self.shape = c = s.shape
        self.structure = s
        spec, recipe = s.lora, get_recipe(s.recipe)
        self.layer_rows, self.outside_rows = saved_rows(s)
        tensors = lora._tensors(c, self.layer_rows + self.outside_rows)
        self.placement = Program(tensors).placement
        p = Program(tensors, self.placement)
        outside = {}
        for part, make in {Part.FORWARD_START: hf.forward_start, Part.FORWARD_END: forward_end,
                           Part.BACKWARD_START: backward_start, Part.BACKWARD_END: lora._backward_end}.items():
            q = p.fork()
            make(q, c)
            outside[part] = q.ops
        full = c.recompute == "full"
        if not full:        # no leaf: block 0's input does not require grad, the graph frees only the loss
            outside[Part.BACKWARD_END] = _loss_released(p.fork())
        fwd, bwd, fwd0, bwd0 = p.fork(), p.fork(), p.fork(), p.fork()
        block_forward(fwd, c, spec, dropped=full)
        block_backward(bwd, c, spec, lora._one_rank)
        block_forward(fwd0, c, spec, dropped=full, first=not full)
        block_backward(bwd0, c, spec, lora._one_rank, first=not full)
        moments, master = outer.adamw(recipe)
        params = lora._params(c, spec, explicit_layers(s.layers or 5))
        opt = lora._optimizer_program(p.fork(), s, params, moments, master)
        lora._lumps(tensors, c, spec, self.layer_rows)
        n = s.layers or 5
        ops = _with_first(flatten(n, c, outside, fwd.ops, bwd.ops, opt.ops),
                          flatten(n, c, outside, fwd0.ops, bwd0.ops, opt.ops))
        self.ops = lora._hold_leaf(ops, residual_names(c)[0]) if full else ops
        self.tensors = tensors
        self._lora_static(recipe, spec, len(params) and 2 * len(spec.targets))
        self._compile()

    @staticmethod
    def check(setup, config, conv):
        """``ValueError`` for what the hf LoRA step does not model (:func:`hf_lora_refusal`, and what
        :func:`memledger.step.implementations.check_step` refuses under transformers' code)."""
        from .implementations import check_step, not_modelled
        check_step(setup, conv)
        if hf_lora_refusal(setup, config):
            raise not_modelled("hf", hf_lora_refusal(setup, config))

    def _lora_static(self, recipe, spec, per_block):
        """The LoRA step's statics and ``LlamaRotaryEmbedding``'s two FP32 buffers (:func:`memledger.step.hf.buffers`)."""
        from .ops import Tensor
        from .vocab import Device, Kind
        super()._lora_static(recipe, spec, per_block)
        for name, expr, why in hf.buffers(self.shape):
            self.tensors[name] = Tensor(name, expr, Kind.PARAM, Lifetime.STEP, Device.GPU, why)
            self.static.append((None, name))


lora.LIBRARY_BUILDERS["hf"] = HfLoraBuilt
