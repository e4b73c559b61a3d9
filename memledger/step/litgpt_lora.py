"""LoRA as LitGPT builds it (``implementation="litgpt"``): what one layer of ``litgpt.lora.GPT`` saves for backward.

Read from LitGPT 0.5.13, ``litgpt/lora.py`` and ``litgpt/model.py``, with ``mark_only_lora_as_trainable`` (l. 417-448:
every parameter but the adapters' frozen), as ``finetune/lora.py`` (l. 210-212) trains it. The adapters by Hugging Face
names (:data:`FIELDS`): ``q_proj``, ``k_proj``, ``v_proj`` are ``LoRAQKVLinear``'s ``enable_lora`` on the fused QKV
projection, ``o_proj`` is ``lora_projection`` and the MLP's three projections are ``lora_mlp`` together (LitGPT has
no finer choice).

* **RMSNorm** (``model.py`` l. 1315-1322), its weight frozen: ``x.float()`` (saved by ``x * x``), the rstd (saved by
  ``x * rsqrt``) and ``weight.float()`` (an FP32 copy of d, saved by the product with the normalized input, which
  needs no saving: the weight takes no gradient). 4 B S d + 4 B S + 4 d bytes.
* **LoRAQKVLinear.forward** (``lora.py`` l. 381-414): the frozen ``linear`` keeps nothing; ``lora_dropout(x)``
  (``nn.Dropout(p)``: its mask, B S d, bool under CUDA's ``native_dropout`` and a noise tensor in the activations'
  dtype on the CPU, and its output, read by A) or, with p = 0, ``x`` itself (norm 1's output) kept for A's gradient;
  ``after_A`` (B, S, n r), n the enabled slices, kept by ``conv1d`` (``lora.py`` l. 328-362, a grouped 1 x 1
  convolution); ``zero_pad`` (l. 288-326) where not all three are enabled: ``x.new_zeros(..., 3 d).index_copy_(-1,
  lora_ind, after_B)`` saves ``after_B`` (B, S, n d: ``index_copy``'s derivative reads ``source``'s shape) and the
  index, a ``clone()`` of the ``_lora_ind`` buffer (n d int64) made at every call (l. 265-286).
* **CausalSelfAttention** (``model.py`` l. 472-570): q and k new tensors after ``apply_rope`` and ``torch.cat``, the
  fused output whole through v's view, SDPA's output (laid out as q) and FP32 log-sum-exp; the output projection's
  input (``y.reshape``: a copy) only where an adapter on it reads it (``lora_projection`` without dropout).
* **LoRALinear.forward** (l. 165-172): ``(lora_dropout(x) @ A.T @ B.T) * scaling``: the dropout's mask and output (or
  ``x`` with p = 0), and ``x A^T`` (B, S, r) for B's gradient.
* **LLaMAMLP** (``model.py`` l. 827-831): ``fc_1``'s output (SiLU's input), SiLU's output and ``fc_2``'s output (the
  product's two inputs); with ``lora_mlp`` each of the three projections' adapter as above (``fc_1`` and ``fc_2`` read
  norm 2's output, each through its own dropout; ``proj`` the product).

LitGPT's embedding is frozen and nothing makes its output require grad (no ``enable_input_require_grads``): the
first layer's norm 1 and its QKV adapter's dropout see an input that needs no gradient and save nothing
(``first=True``); A still keeps its (dropped) input for its own gradient.

Checked against LitGPT's own model under ``FakeTensorMode``
(:func:`memledger.pytorch.litgpt_lora.lora_layer_saved`, tests/step/test_litgpt_lora.py).
"""
from ..activations.inventory import Saved
from ..core.symbols import B, F, H, S, d, r

__all__ = ["FIELDS", "check_targets", "fields", "layer_rows", "outside_rows"]

#: LitGPT's ``Config`` flag of each Hugging Face target name.
FIELDS = {"q_proj": "lora_query", "k_proj": "lora_key", "v_proj": "lora_value", "o_proj": "lora_projection",
          "gate_proj": "lora_mlp", "up_proj": "lora_mlp", "down_proj": "lora_mlp"}
QKV = ("q_proj", "k_proj", "v_proj")
MLP = ("gate_proj", "up_proj", "down_proj")


def check_targets(targets) -> None:
    """``ValueError`` naming ``targets`` where LitGPT's ``Config`` cannot express them: ``lm_head`` (its head adapter
    is not modelled), or part of the MLP (``lora_mlp`` adapts its three projections together)."""
    if "lm_head" in targets:
        raise ValueError("targets: an lm_head adapter under implementation litgpt (LitGPT's lora_head on its "
                         "128-token head chunks) is not modelled yet")
    mlp = [t for t in MLP if t in targets]
    if mlp and len(mlp) != len(MLP):
        raise ValueError(f"targets: LitGPT adapts the MLP's three projections together (lora_mlp); {', '.join(mlp)} "
                         "alone cannot be built: give gate_proj, up_proj and down_proj, or none")


def fields(targets, rank: int, dropout: float) -> dict:
    """LitGPT's ``Config`` LoRA fields of ``targets`` (every flag, False where not a target)."""
    check_targets(targets)
    flags = {f: False for f in FIELDS.values()} | {FIELDS[t]: True for t in targets}
    return {"lora_r": rank, "lora_dropout": dropout, "lora_head": False} | flags


def _norm(k, a="fp32") -> list:
    return [Saved(f"RMSNorm {k} input (FP32)", "x.float(), saved by x * x", (B, S, d), a),
            Saved(f"RMSNorm {k} rstd", "saved by x * rsqrt(...)", (B, S), a),
            Saved(f"RMSNorm {k} weight (FP32 copy)", "weight.float(), saved by its product with x_normed", (d,), a)]


def _reads(name, x, width, dropout, mask_dtype, dtype, grad_input=True) -> list:
    """What A keeps of its input ``x`` (B, S, width): the dropout's mask (only where ``x`` requires grad) and output,
    or ``x`` itself without dropout."""
    if not dropout:
        return [Saved(x, f"{name}'s A keeps its input (lora_dropout is the identity)", (B, S, width), dtype)]
    mask = [Saved(f"LoRA {name} dropout mask", "nn.Dropout's backward needs it", (B, S, width), mask_dtype)]
    return (mask if grad_input else []) + [Saved(f"LoRA {name} dropout output", "A's weight gradient reads it",
                                                 (B, S, width), dtype)]


def _qkv(enabled, dropout, mask_dtype, dtype, grad) -> list:
    n = len(enabled)
    if not n:
        return []
    rows = _reads("qkv", "norm 1 output", d, dropout, mask_dtype, dtype, grad) + [
        Saved("LoRA qkv A output", "conv1d keeps its input, after_A transposed", (B, S, n * r), dtype)]
    if n < len(QKV):
        rows += [Saved("LoRA qkv B output", "zero_pad's index_copy_ keeps its source, after_B", (B, S, n * d), dtype),
                 Saved("LoRA qkv lora_ind (a clone)", "index_copy_ keeps its index, a clone of _lora_ind", (n * d,),
                       "int64")]
    return rows


def _linear(name, x, width, dropout, mask_dtype, dtype, grad=True) -> list:
    return _reads(name, x, width, dropout, mask_dtype, dtype, grad) + [
        Saved(f"LoRA {name} A output", "x A^T, kept for B's weight gradient", (B, S, r), dtype)]


def _attention(dtype) -> list:
    return [Saved("Q", "apply_rope's output concatenated: a new tensor", (B, S, d), dtype),
            Saved("K", "apply_rope's output concatenated: a new tensor", (B, S, d), dtype),
            Saved("QKV projection output (v's view keeps it whole)", "SDPA keeps v, a view of it", (B, S, 3 * d),
                  dtype),
            Saved("softmax log-sum-exp", "SDPA's flash kernel", (B, H, S), "fp32"),
            Saved("attention output (SDPA's, laid out as q)", "SDPA's flash kernel keeps its output", (B, S, d), dtype)]


def _mlp(targets, dropout, mask_dtype, dtype, grad) -> list:
    """norm 2, LLaMAMLP and its adapters (``lora_mlp``); ``grad``: norm 2's input requires grad."""
    adapted = bool(set(MLP) & set(targets))
    if not grad and not adapted:
        return []
    rows = _norm("2") if grad else []
    if adapted:
        if not dropout:         # fc_1's and fc_2's A both keep norm 2's output: one tensor
            rows += _reads("fc_1, fc_2", "norm 2 output", d, dropout, mask_dtype, dtype)
        for name in ("fc_1", "fc_2"):
            rows += _linear(name, "norm 2 output", d, dropout, mask_dtype, dtype, grad)[0 if dropout else 1:]
    rows += [Saved("fc_1 output", "SiLU's input", (B, S, F), dtype),
             Saved("SiLU output", "the product's input", (B, S, F), dtype),
             Saved("fc_2 output", "the product's input", (B, S, F), dtype)]
    if adapted:
        rows += _linear("proj (MLP)", "SiLU(fc_1) * fc_2", F, dropout, mask_dtype, dtype)
    return rows


def layer_rows(targets, dropout: bool, mask_dtype: str = "bool", dtype: str = "bf16", first: bool = False) -> list:
    """One layer's saved tensors (:class:`~memledger.activations.inventory.Saved`) of LitGPT's LoRA ``Block`` with
    adapters on ``targets`` (Hugging Face names), ``dropout``: ``lora_dropout`` > 0; ``mask_dtype``: its mask's
    (``"bool"`` on CUDA, the activations' dtype on the CPU); ``first``: the first layer, whose input needs no
    gradient: nothing is saved for backward before its first adapter, and a dropout on an input that needs no
    gradient keeps no mask."""
    check_targets(targets)
    grad = not first
    qkv = [t for t in QKV if t in targets]
    rows = (_norm("1") if grad else []) + _qkv(qkv, dropout, mask_dtype, dtype, grad)
    grad = grad or bool(qkv)
    rows += _attention(dtype) if grad else []
    if "o_proj" in targets:
        rows += _linear("proj", "output projection input", d, dropout, mask_dtype, dtype, grad)
    return rows + _mlp(targets, dropout, mask_dtype, dtype, grad or "o_proj" in targets)


def outside_rows() -> list:
    """What LitGPT's LoRA model saves outside its layers with the frozen head: the final RMSNorm's (the head's
    128-token chunks keep no input: it is frozen)."""
    return _norm("final")


def activations(targets, dropout: bool, mask_dtype: str = "bool", dtype: str = "bf16"):
    """The layers' saved bytes: L - 1 layers whose input requires grad and the first (:func:`layer_rows`)."""
    from ..core.symbols import L
    from sympy import Integer
    total = lambda rows: sum((row.bytes for row in rows), Integer(0))        # noqa: E731
    return (L - 1) * total(layer_rows(targets, dropout, mask_dtype, dtype)) + total(
        layer_rows(targets, dropout, mask_dtype, dtype, first=True))


#: LitGPT's quantized linears under ``BitsandbytesPrecision`` (``lightning/fabric/plugins/precision/bitsandbytes.py``:
#: every ``nn.Linear`` replaced, the LM head's too), by the Hugging Face names of what each computes: the fused QKV
#: projection is one tensor.
NF4_LINEARS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj",), ("up_proj",), ("down_proj",))


def adapter_tensors(targets) -> list:
    """(name, elements) of one layer's adapter tensors, A then B per adapted module (LitGPT's fused QKV adapter one
    module: A (n r, d), B (n d, r), n its enabled slices)."""
    n = len([t for t in QKV if t in targets])
    out = [("qkv.lora_A", n * r * d), ("qkv.lora_B", n * d * r)] if n else []
    if "o_proj" in targets:
        out += [("proj.lora_A", r * d), ("proj.lora_B", d * r)]
    if set(MLP) & set(targets):
        out += [("fc_1.lora_A", r * d), ("fc_1.lora_B", F * r), ("fc_2.lora_A", r * d), ("fc_2.lora_B", F * r),
                ("mlp.proj.lora_A", r * F), ("mlp.proj.lora_B", d * r)]
    return out


def landmarks(targets, dropout: bool, mask_dtype: str = "bool") -> dict:
    """The step's bytes at its four landmarks as ``finetune/lora.py`` runs it (BF16 model and adapters,
    ``torch.optim.AdamW``: BF16 moments and a 4-byte step per adapter tensor, no gradients after ``zero_grad``):

    * before forward (and after the step): the frozen LLaMA parameters (wte, lm_head, ln_f and L layers) and the
      adapters in BF16, AdamW's state, the batch (``input_ids`` and ``labels``, int64), ``cos`` and ``sin`` (S x d/H
      FP32 each: ``max_seq_length`` set to S, l. 304), each layer's ``_lora_ind`` buffer (made at the first call of
      ``zero_pad``, n d int64) and the previous iteration's ``logits`` (B S V BF16, the list of head chunks) and
      ``loss`` (BF16);
    * after forward: plus the layers' and the final norm's saved tensors (:func:`layer_rows`, :func:`outside_rows`),
      each chunk's log-softmax (B (S - 1) V BF16 together), ``nll_loss``'s total weight (BF16) per chunk of the
      shifted targets (``targets.split(logits[0].size(1))``: ceil((S - 1) / 128) of them; ``zip`` drops a head chunk
      left empty by the slice) and, at B > 1, its targets (``reshape(-1)`` of a strided split: a copy, B (S - 1)
      int64), the token count (int64),
      the new loss and ``loss / 1`` where the previous loss was;
    * after backward: before forward plus the adapters' BF16 gradients.

    Equal to LitGPT's step under MemTracker (tests/step/test_litgpt_lora.py); the peaks are not modelled."""
    from sympy import Integer, Min, ceiling

    from ..core.symbols import L, V
    total = lambda rows: sum((row.bytes for row in rows), Integer(0))        # noqa: E731
    n = len([t for t in QKV if t in targets])
    adapters = L * sum(e for _, e in adapter_tensors(targets))
    frozen = 2 * V * d + d + L * (2 * d + 4 * d * d + 3 * d * F)
    statics = 2 * (frozen + adapters) + 2 * 2 * adapters + 4 * L * len(adapter_tensors(targets)) + 2 * 8 * B * S \
        + 2 * S * (d / H) * 4 + (L * n * d * 8 if 0 < n < len(QKV) else 0) + 2 * B * S * V + 2
    chunks = ceiling((S - 1) / 128)     # targets.split(128): zip stops at the last target chunk
    saved = (L - 1) * total(layer_rows(targets, dropout, mask_dtype)) + total(
        layer_rows(targets, dropout, mask_dtype, first=True)) + total(outside_rows())
    loss = 2 * B * (S - 1) * V + 2 * chunks + 8 * B * (S - 1) * (Min(B, 2) - 1) + 8 + 2
    return {"before forward": statics, "after forward": statics + saved + loss,
            "after backward": statics + 2 * adapters, "after step": statics}
