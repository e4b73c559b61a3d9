"""LoRA and QLoRA in the step timeline: a frozen base, rank-r adapters, NF4 weights dequantized per layer.

The programs of :mod:`memledger.pytorch.lora`'s reference (PEFT's ``LoraLayer`` on the LLaMA block):

* **Frozen base.** No base gradient and no optimizer state; a frozen projection's backward computes only
  its input gradient, and a frozen norm's backward no weight gradient. What autograd saves follows: a
  linear saves its input only for its weight's gradient (``mm``'s derivative formula saves ``self`` only if
  ``mat2`` requires grad), so the Q/K/V projection input, the MLP input and the down projection's input are
  kept only where an adapter without dropout reads them (A's weight gradient); composite RMSNorm's FP32
  ``x*rstd`` (kept for the norm weight's gradient) goes at once. SiLU, the gate product and the flash
  kernel save what they always save.
* **The blocks' inputs require grad** (PEFT's ``enable_input_require_grads``: the embedding's output is made
  a leaf): every block runs the same program; the leaf is held by the graph and its ``.grad`` (the first
  block's input gradient) lives until the graph is freed with the loss. The embedding gets no gradient.
* **Adapters** on the targets (Hugging Face names): ``result + lora_B(lora_A(dropout(x))) * scaling``;
  kept for backward: A's output (B's weight gradient) and A's input, and with dropout the mask and the
  dropped copy instead of the input. On the fused QKV projection an adapter's output is added to its
  column slice and the slices concatenated again (``torch.cat``). Backward runs each adapter before its
  frozen base (autograd runs the node created last first); the input gradients of a tensor's consumers are
  summed as they arrive (one out-of-place add each).
* **The LM head as a target** (``lm_head``, as PEFT's ``target_modules`` allows): one adapter (A: r x d,
  B: V x r) on the frozen head, computed and differentiated as a block projection's; its input (or, with dropout
  or FP32 adapters, the copy A reads) and A x kept for backward, a V-wide delta added to the frozen head's output;
  its input gradient summed with the frozen head's. Its tensors come last in ``model.parameters()``.
* **QLoRA**: each block projection is NF4 (packed uint8, an 8-bit absmax per 64 weights, an FP32 constant per
  256 absmax, per tensor rounded up). Forward is bitsandbytes' ``gemm_4bit`` (:mod:`memledger.step.nf4`): past
  M = B*S = 1536 rows or for an input width not a multiple of 64 ``_dequant_linear_fallback`` (two FP32 absmax
  arrays and the weight in the compute dtype, freed after the matmul), else the fused kernel (the output only;
  the field ``LoraSpec.nf4_fallback`` names the bases on the fallback). Backward (``dequantize_4bit``) dequantizes
  the absmax (FP32, freed on return) and the weight, runs the matmul and frees the weight (see
  :mod:`memledger.pytorch.lora`).
* **Optimizer**: the adapter recipe over the adapters only (``torch.optim.AdamW`` as
  :mod:`memledger.step.outer` models it; bitsandbytes' 32-bit optimizers update in place in one fused
  kernel, ``optimizer_update_32bit``, and allocate no temporaries).

* **FP32 adapters** on the BF16 base (PEFT's ``autocast_adapter_dtype=True``, ``get_peft_model``'s default):
  each adapter copies its input to FP32 (``_cast_input_dtype``; kept for A's weight gradient instead of the
  16-bit input), the sum with the base's output is FP32 (type promotion) and is cast back; backward casts
  the output gradient to FP32, gives the base a 16-bit copy, and casts the input gradient back.

* **Full recomputation** (each block under ``checkpoint(..., use_reentrant=False)``, as the reference's and
  torchtune's activation checkpointing run it): forward saves nothing but the block's input, each tensor dying with
  its last reference; backward re-runs the forward with saving when it first unpacks a saved tensor (the down
  projection's, or its adapter B's: the adapter's scaling saves nothing and runs first) and stops at the pack hook
  of the last tensor saved (autograd saves an op's inputs before its kernel: before the down projection's or B's
  matmul; bitsandbytes' ``MatMul4Bit`` after its forward). Hugging Face's ``gradient_checkpointing_enable()``
  defaults to the reentrant checkpoint, which re-runs the whole block and is not modelled.
* **The chunked loss** (``loss_chunks``, ``loss_impl``): torchtune's or LitGPT's on the frozen head
  (:mod:`memledger.step.lora_loss`); not with an ``lm_head`` adapter.
* **The optimizer in backward** (``optimizer_in_backward``): one AdamW per adapter tensor, stepped and its gradient
  freed in its hook (:func:`memledger.step.optim.in_backward`); not with FP32 masters or bitsandbytes.

* **torchtune's code** (``implementation="torchtune"``): its ``lora_llama2`` as ``lora_finetune_single_device`` runs
  it. What differs from the reference: one ``RotaryPositionalEmbeddings`` a layer and the recipe's loop tensors
  (:mod:`memledger.step.torchtune`); no leaf (``set_trainable_params`` only, no ``enable_input_require_grads``), so the
  first layer's input requires no grad (:func:`first_block`); ``TransformerSelfAttentionLayer.forward``'s ``attn_out``
  lives until the layer returns; under the checkpoint its attention's q, k, v and SDPA output die when the attention
  returns, and ``LoRALinear``'s ``lora_out`` (A's output) lives through the scaling. Its middle blocks otherwise run
  the reference's ops (fused QKV, no RoPE ops), which tests/pytorch/test_torchtune_lora.py finds equal at every
  landmark and peak. Adapters in the model's dtype only. Its QLoRA (``quantize_base``: every block projection a
  torchao ``NF4Tensor``, :mod:`memledger.states.torchao`'s storage): q, k and v are three projections in turn (the
  earlier outputs alive; backward v, k, q, each adapter before its base), each ``linear_nf4`` dequantizing its weight
  in forward and again in backward (:func:`_torchao_dequantized`: ``get_original_weight``'s locals beside the BF16
  weight, gone as it returns; the weight freed after the matmul); under the checkpoint the recomputation stops after
  the down projection's forward (``LinearNF4`` saves its weight as its forward returns). Proved to the byte at every
  landmark and peak against torchtune's QLoRA step (tests/pytorch/test_torchtune_lora.py).

Scope: LLaMA blocks (multi-head or grouped-query), the SDPA flash kernel, composite (CPU) or fused RMSNorm,
no, selective (the attention core checkpointed: its flash output and log-sum-exp not saved, the core re-run in
backward) or full recomputation (non-reentrant), one GPU, a BF16 (or NF4) base, FP32 adapters or
adapters in the base's dtype. Read off MemTracker's allocation log of the reference (PyTorch 2.13, CPU);
checked by ``tests/step/test_lora.py``, ``test_lora_head.py`` and ``test_lora_recompute.py``.
"""
from dataclasses import dataclass, replace
from typing import NamedTuple

import sympy as sp

from ..activations.backends import get_backend
from ..activations.inventory import Saved, inventory
from ..activations.outside import outside_inventory
from ..core.dtypes import nbytes
from ..core.exact import evaluate_expr
from ..core.symbols import B, F, H, L, O, S, V, d, r
from ..core.vocabulary import Role, State
from ..states.bnb import nf4_gemm_fallback, nf4_parts
from ..states.torchao import nf4_bytes, nf4_dequant_locals
from ..states.recipes import get_recipe
from . import loss, optim, outer, torchtune as tune
from .build import IDS, Built
from .lora_loss import lora_chunked_backward_start, lora_chunked_forward_end
from .ops import BS, BSd, BSF, INPUT_GRADIENT, Program, Ref, Tensor, dropout_ops, gradient, qkv_width, \
    residual_names, widths_of
from .implementations import not_modelled
from .inputs import inputs_of
from .outer import Param
from .structure import BNB_KINDS, OPTIMIZER_OF, StepStructure
from .timeline import Step
from .nf4 import nf4_forward_ops
from .norms import norm_forward
from .trace import GRADIENT_LUMP, SAVED_LUMP, Part, explicit_layers, flatten
from .vocab import LANDMARKS, Action, Device, Kind, Lifetime, OpRole, Save, Scope

__all__ = ["BLOCK_TARGETS", "LoraSpec", "LoraStep", "LoraStructure", "adapter_shape", "build_lora", "lora_rows"]

#: The block projections an adapter may target, in the order the reference builds (and AdamW walks) them.
BLOCK_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
QKV = ("q_proj", "k_proj", "v_proj")
#: The frozen base projections of a block (reference name, Hugging Face names of what it computes).
BASES = (("qkv", QKV), ("proj", ("o_proj",)), ("gate", ("gate_proj",)), ("up", ("up_proj",)),
         ("down", ("down_proj",)))
#: The composite RMSNorms' FP32 x*rstd rows (:func:`memledger.activations.inventory.norm_rows`: the block's norms 1
#: and 2, the final norm), each kept only for its norm's weight gradient, which a frozen norm never computes.
NORM_WEIGHT_ONLY = ("RMSNorm 1 x*rstd", "RMSNorm 2 x*rstd", "final RMSNorm x*rstd")


class LoraSpec(NamedTuple):
    """The discrete LoRA choices a step's programs depend on (the rank r stays a symbol)."""
    targets: tuple          # block projections with adapters, in BLOCK_TARGETS order
    dropout: bool           # LoRA dropout on each adapter's input
    qlora: bool             # the block projections in NF4
    fused_optimizer: bool   # bitsandbytes' in-place 32-bit update (no temporaries)
    fp32_adapters: bool = False   # FP32 adapters on the 16-bit base: PEFT's casts (input to FP32, sum back)
    head: bool = False      # an adapter on the LM head (``lm_head``: A r x d, B V x r, once)
    nf4_fallback: tuple = ()  # QLoRA: the bases whose forward runs bitsandbytes' dequantize-then-F.linear fallback


@dataclass(frozen=True)
class LoraStructure(StepStructure):
    """A :class:`~memledger.step.structure.StepStructure` with its :class:`LoraSpec`."""
    lora: LoraSpec = None


def adapter_shape(c, target) -> tuple:
    """(out, in) of ``target``'s projection in the reference block (GQA and head size applied)."""
    q, kv = widths_of(c)[0][2], widths_of(c)[1][2]
    return {"q_proj": (q, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, q), "gate_proj": (F, d),
            "up_proj": (F, d), "down_proj": (d, F), "lm_head": (V, d)}[target]


def _base_shapes(c) -> dict:
    return {"qkv": (qkv_width(c), d), "proj": (widths_of(c)[0][2], d), "gate": (F, d), "up": (F, d), "down": (d, F)}


def _kept_inputs(c, spec: LoraSpec) -> set:
    """Inventory rows kept only for weight gradients that adapters (without dropout, in the base's dtype: FP32
    adapters read an FP32 copy) still need."""
    if spec.dropout or spec.fp32_adapters:
        return set()
    kept = set()
    if set(QKV) & set(spec.targets):
        kept.add("Q/K/V projection input")
    if {"gate_proj", "up_proj"} & set(spec.targets):
        kept.add("MLP input")
    if "down_proj" in spec.targets:
        kept.add("down-projection input")
    return kept


def _o_proj_reads(spec) -> bool:
    """An adapter on ``o_proj`` keeps the attention output itself for A's weight gradient."""
    return "o_proj" in spec.targets and not spec.dropout and not spec.fp32_adapters


def lora_rows(c, spec: LoraSpec, opts: dict) -> list:
    """One block's saved tensors (:class:`~memledger.activations.inventory.Saved`): the inventory's, less what
    only frozen weights' gradients needed, plus each adapter's."""
    rows = inventory("swiglu", "RMSNorm", False, gqa=c.gqa, head_dim=c.head_dim, **opts)
    kept = _kept_inputs(c, spec)
    out = []
    for row in rows:
        if row.name in NORM_WEIGHT_ONLY:
            continue              # composite RMSNorm keeps x*rstd for its (frozen) weight's gradient only
        if row.weight_grad_of and row.name != "output projection input" and row.name not in kept:
            continue              # the flash kernel saves its output, the output projection's input, anyway
        if c.recompute == "selective" and (row.name == "softmax log-sum-exp" or (
                row.name == "output projection input" and not _o_proj_reads(spec))):
            continue              # the checkpointed core saves nothing; an o_proj adapter may keep its input
        out.append(row)
    ad = _adapter_dtype(c, spec)
    for t in spec.targets:
        _, inp = adapter_shape(c, t)
        if spec.dropout:
            out += [Saved(f"LoRA {t} dropout mask", "the adapter's dropout backward needs the mask", (B, S, inp),
                          "bool" if opts["mask_dtype"] == "bool" else ad),
                    Saved(f"LoRA {t} dropout output", "A's weight gradient needs its (dropped) input", (B, S, inp),
                          ad)]
        elif spec.fp32_adapters:
            out.append(Saved(f"LoRA {t} input (FP32 copy)", "A's weight gradient needs its input, cast to FP32 "
                             "(PEFT's _cast_input_dtype)", (B, S, inp), "fp32"))
        out.append(Saved(f"LoRA {t} A output", "B's weight gradient needs its input, A x", (B, S, r), ad))
    return out


def _adapter_dtype(c, spec):
    return "fp32" if spec.fp32_adapters else c.dtype


def _prefix(k):
    return "final RMSNorm" if k == "final" else f"RMSNorm {k}"


def _norm_forward(p, c, k, out):
    """A norm with a frozen weight writing ``out`` (its input live): fused keeps input and rstd; composite its
    FP32 input and rstd, and x*rstd only until the weight's product is made."""
    prefix, f = _prefix(k), "fp32"
    if not c.composite:
        p.op(f"norm {k}", alloc=[out] + ([f"{prefix} rstd"] if c.stats else []))
        return
    x32 = f"{prefix} input"
    sq, ms = p.new(f"norm {k}: x^2", BSd, f, "composite RMSNorm"), p.new(f"norm {k}: mean(x^2)", BS, f, "")
    xr = p.new(f"norm {k}: x*rstd", BSd, f, "not kept: only the frozen weight's gradient would read it")
    if c.upcast:
        p.op(f"norm {k} upcast", alloc=[x32])
    p.op(f"norm {k} rsqrt(mean(x^2))", alloc=[sq, ms, f"{prefix} rstd"])
    p.op(f"norm {k} x*rstd", free=[ms, sq], alloc=[xr])
    if c.upcast:
        xrw = p.new(f"norm {k}: x*rstd*w", BSd, f, "composite RMSNorm, FP32")
        p.op(f"norm {k} weight", alloc=[xrw])
        p.op("released", free=[xr])
        p.op(f"norm {k} downcast", alloc=[out])
        p.op(f"norm {k} done", free=[xrw])
    else:
        p.op(f"norm {k} weight", alloc=[out])
        p.op("released", free=[xr])


def _norm_backward(p, c, k, g_out, g_in, also_free=()):
    """Backward of a norm with a frozen weight: ``g_out`` -> ``g_in`` (no weight gradient is kept); ``also_free``
    goes with its saved input."""
    prefix, a, f = _prefix(k), c.dtype, "fp32"
    if not c.composite:
        dw = p.new(f"norm {k} backward: weight gradient (discarded)", (d,), a,
                   "_fused_rms_norm_backward computes it; autograd drops it")
        p.op(f"norm {k} backward", alloc=[g_in, dw])
        p.op(f"norm {k} released", free=[dw, g_out, f"{prefix} input"] + ([f"{prefix} rstd"] if c.stats else [])
             + list(also_free))
        return
    t = {n: p.new(f"norm {k} backward: {n}", shape, f, "composite RMSNorm backward") for n, shape in [
        ("g32", BSd), ("g*w", BSd), ("g*rstd", BSd), ("g*x", BSd), ("g_rstd", BS), ("rsqrt'", BS),
        ("rsqrt''", BS), ("g_ms", BS), ("g_mean", BSd), ("pow'", BSd), ("pow''", BSd), ("g_pow", BSd),
        ("g_x32", BSd)]}
    x32, rstd = f"{prefix} input", f"{prefix} rstd"
    if c.upcast:
        p.op(f"norm {k} backward: upcast", alloc=[t["g32"]])
        p.op("released", free=[g_out])
        p.op(f"norm {k} backward: g*w", alloc=[t["g*w"]])
        p.op("released", free=[t["g32"]])
    else:
        p.op(f"norm {k} backward: g*w", alloc=[t["g*w"]])
        p.op("released", free=[g_out])
    p.op(f"norm {k} backward: x*rstd", alloc=[t["g*rstd"], t["g*x"], t["g_rstd"]])
    p.op("released", free=[t["g*x"], t["g*w"]])
    p.op(f"norm {k} backward: rsqrt", alloc=[t["rsqrt'"], t["rsqrt''"], t["g_ms"]])
    p.op("released", free=[t["rsqrt'"], t["rsqrt''"], t["g_rstd"], rstd])
    p.op(f"norm {k} backward: mean", alloc=[t["g_mean"]])
    p.op(f"norm {k} backward: pow", free=[t["g_ms"]], alloc=[t["pow'"], t["pow''"], t["g_pow"]])
    p.op("released", free=[t["pow'"], t["pow''"], t["g_mean"], x32] + list(also_free))
    total = t["g_x32"] if c.upcast else g_in
    p.op(f"norm {k} backward: sum", alloc=[total])
    p.op("released", free=[t["g*rstd"], t["g_pow"]])
    if c.upcast:
        p.op(f"norm {k} backward: downcast", alloc=[g_in])
        p.op("released", free=[t["g_x32"]])


def _dequantized(p, c, base):
    """QLoRA: the absmax (FP32) and the weight (the compute dtype) of ``base``, dequantized."""
    out, inp = _base_shapes(c)[base]
    scales = p.new(f"{base}: absmax dequantized", (sp.ceiling(out * inp / 64),), "fp32",
                   "bitsandbytes: the 8-bit absmax to FP32 (double quantization)")
    weight = p.new(f"{base}: weight dequantized", (out, inp), c.dtype, "bitsandbytes: the NF4 weight, dequantized")
    return scales, weight


#: torchtune's QLoRA base in the step: torchao's NF4Tensors' codes, and their scalers, factors, means and tables
TORCHAO_ROWS = ("frozen NF4 projections (torchao): quantized_data (4-bit codes)",
                "frozen NF4 projections (torchao): scalers, BF16 factors, means, tables")
#: torchtune's q, k and v projections (three ``nn.Linear``s or ``LoRALinear``s): their base names
TUNE_QKV = {"q_proj": "q", "k_proj": "k", "v_proj": "v"}


def _torchao_dequantized(p, c, base) -> str:
    """torchao's ``weight.to(dtype)`` of ``base``'s ``NF4Tensor`` (``LinearNF4.forward``/``backward``,
    ``torchao/dtypes/nf4tensor.py`` l. 1037-1048; ``get_original_weight`` l. 829-855): its locals
    (:func:`memledger.states.torchao.nf4_dequant_locals`) beside the BF16 weight at its peak, gone as it returns;
    returns the weight, which the caller frees after its matmul."""
    shapes = _base_shapes(c) | {v: adapter_shape(c, t) for t, v in TUNE_QKV.items()}
    out, inp = shapes[base]
    scratch = p.new(f"{base}: get_original_weight's locals", (nf4_dequant_locals(out * inp),), "int8",
                    "int64 codes, looked-up and scaled BF16 halves, the scalers (torchao)")
    weight = p.new(f"{base}: weight dequantized (torchao)", (out, inp), c.dtype, "NF4Tensor.to(bf16)")
    p.op(f"{base}: NF4 weight dequantized (torchao)", alloc=[scratch, weight])
    p.op("released (get_original_weight returns)", free=[scratch])
    return weight


def _nf4_fallback(c, values) -> tuple:
    """The bases whose NF4 forward runs bitsandbytes' ``_dequant_linear_fallback`` at these values: M = B*S rows
    past 1536, or an input width not a multiple of 64 (:func:`memledger.states.bnb.nf4_gemm_fallback`)."""
    def value(x):
        return int(sp.sympify(x).subs({s: values[s.name] for s in sp.sympify(x).free_symbols}))
    widths = {"qkv": d, "proj": widths_of(c)[0][2], "gate": d, "up": d, "down": F}
    return tuple(base for base, _ in BASES if nf4_gemm_fallback(value(B * S), value(widths[base])))


def _base_forward(p, c, spec, base, out, role: OpRole = None):
    """A frozen base projection writing ``out`` (a name or a list of names: views of one output); under QLoRA
    bitsandbytes' ``gemm_4bit`` (:func:`memledger.step.nf4.nf4_forward_ops`): the fallback for the bases in
    ``spec.nf4_fallback``, else the fused kernel."""
    if not spec.qlora:
        out = [out] if isinstance(out, str) else list(out)
        p.op(f"{base} (frozen)", alloc=out, role=role)
        return
    if tune.on(c):
        weight = _torchao_dequantized(p, c, base)
        p.op(f"{base} (frozen, NF4): F.linear", alloc=[out] if isinstance(out, str) else list(out), role=role)
        p.op("released (the BF16 weight: LinearNF4.forward returns)", free=[weight])
        return
    nf4_forward_ops(p, c.dtype, base, out, _base_shapes(c)[base], base in spec.nf4_fallback, f"{base} (frozen, NF4)",
                    role)


def _base_backward(p, c, spec, base, g_in, frees=()):
    """A frozen base projection's backward: only its input gradient ``g_in``; then ``frees`` go."""
    if spec.qlora and tune.on(c):
        weight = _torchao_dequantized(p, c, base)
        p.op(f"{base} backward: grad_output @ weight (input gradient only)", alloc=[g_in])
        p.op("released", free=[weight] + list(frees))
        return
    if spec.qlora:
        scales, weight = _dequantized(p, c, base)
        p.op(f"{base} backward: dequantize absmax", alloc=[scales])
        p.op(f"{base} backward: dequantize weight", alloc=[weight])
        p.op("released", free=[scales])
        p.op(f"{base} backward (input gradient only)", alloc=[g_in])
        p.op("released", free=[weight] + list(frees))
        return
    p.op(f"{base} backward (input gradient only)", alloc=[g_in])
    p.op("released", free=list(frees))


def _adapter_forward(p, c, spec, t, x, dropped=False, role_b: OpRole = None, unsaved_mask=False):
    """An adapter on input ``x`` (live; FP32 adapters first copy it to FP32): returns its output's name and the
    temporaries the sum with the base frees (:func:`_adapter_sum`). ``dropped`` (under a whole-block checkpoint):
    nothing is saved; A's output goes once B has read it, the dropout's mask when the dropout returns, its output
    and the FP32 copy (locals) when the adapter's (PEFT's) call returns. ``unsaved_mask``: ``x`` requires no grad
    (torchtune's first block), so the dropout's mask goes as the dropout returns."""
    out, inp = adapter_shape(c, t)
    ad = _adapter_dtype(c, spec)
    src, cast, gone = x, None, []
    if spec.fp32_adapters:
        src = f"LoRA {t} input (FP32 copy)"
        if spec.dropout or dropped:
            cast = p.new(src + (" (checkpointed)" if dropped else ""), (B, S, inp), "fp32",
                         "x.to(float32), until the adapter's call returns")
            src = cast
        p.op(f"LoRA {t}: input to FP32", alloc=[src])
    mask = None
    if spec.dropout:
        src, mask = f"LoRA {t} dropout output", f"LoRA {t} dropout mask"
        if dropped:
            mask_dtype = "bool" if c.mask_dtype == "bool" else ad
            mask = p.new(mask + " (dropped)", (B, S, inp), mask_dtype, "not kept under the checkpoint")
            src = p.new(src + " (checkpointed)", (B, S, inp), ad, "Adapter.forward's local x")
            gone.append(src)
        dropout_ops(p, c, f"LoRA {t}", mask, src)
        if unsaved_mask and not dropped:
            p.op("released (the input requires no grad: the mask is not saved)", free=[mask])
    a_out = f"LoRA {t} A output" if not dropped else p.new(f"LoRA {t} A output (checkpointed)", (B, S, r), ad,
                                                             "not kept: freed once lora_B has read it")
    b = p.new(f"LoRA {t} B output", (B, S, out), ad, "lora_B's output, until the scaling")
    delta = p.new(f"LoRA {t} delta", (B, S, out), ad, "lora_B(lora_A(x)) * scaling")
    p.op(f"LoRA {t} A", alloc=[a_out], free=[mask] if dropped else [])
    p.op(f"LoRA {t} B", alloc=[b], role=role_b)
    late = dropped and tune.on(c)   # torchtune's lora_out = scale * lora_b(lora_out): A's output outlives the product
    p.op(f"LoRA {t} scaling", alloc=[delta], free=[a_out] if dropped and not late else [])
    if late:
        p.op("released (lora_out rebound)", free=[a_out])
    return b, delta, cast, gone


def _adapter_sum(p, c, spec, t, adapter, out, raw=None, after=()):
    """``result + delta`` into ``out`` (PEFT's ``Linear.forward``); ``raw``: the base's output, freed by the add
    (the local is reassigned); ``after``: freed when the call returns. FP32 adapters: the sum is FP32 (type
    promotion), then cast back to the base's dtype."""
    b, delta, cast, gone = adapter
    if not spec.fp32_adapters:
        p.op(f"{t} + adapter", free=[b, delta, raw] + gone, alloc=[out])
        if after:
            p.op("released", free=list(after))
        return
    width, _ = adapter_shape(c, t)
    s32 = p.new(f"LoRA {t} sum (FP32)", (B, S, width), "fp32", "the base's output plus the FP32 delta, promoted")
    p.op(f"{t} + adapter (FP32)", free=[b, delta, raw] + gone, alloc=[s32])
    p.op(f"{t}: back to {c.dtype}", alloc=[out])
    p.op("released", free=[s32, cast] + list(after))


def _adapter_backward(p, c, spec, t, x, share, last_reader, g_out=None, role_b: OpRole = None, input_grad=True):
    """An adapter's backward from its output gradient: returns (the gradient of its input, the gradient its base
    reads: None where it is the same tensor). ``x``: its saved input (without dropout, in the base's dtype),
    freed here if ``last_reader``; ``g_out``: the output gradient, freed here once read (FP32 adapters only:
    otherwise the base reads it too). ``input_grad`` False: its input requires no grad (torchtune's first block):
    A's backward makes its weight gradient only, and the input gradient returned is None."""
    out, inp = adapter_shape(c, t)
    a, ad = c.dtype, _adapter_dtype(c, spec)
    gb = None
    if spec.fp32_adapters:
        g32 = p.new(f"LoRA {t} output gradient in FP32", (B, S, out), "fp32", ".to() backward: the sum's gradient")
        gb = p.new(f"LoRA {t} base's share of the gradient", (B, S, out), a, "add backward: cast to the base's dtype")
        p.op(f"LoRA {t}: back-to-{a} backward", alloc=[g32])
        p.op("released", free=[g_out])
        p.op(f"LoRA {t}: add backward", alloc=[gb])
    gs = p.new(f"LoRA {t} scaled gradient", (B, S, out), ad, "mul backward: g * scaling")
    ga = p.new(f"LoRA {t} gradient of A output", (B, S, r), ad, "lora_B's input gradient")
    gx = p.new(f"LoRA {t} input gradient", (B, S, inp), ad, "lora_A's input gradient") if input_grad else None
    grad_b = gradient(p, f"{t}.lora_B", out * r, c, share)
    grad_a = gradient(p, f"{t}.lora_A", r * inp, c, share)
    p.op(f"LoRA {t} scaling backward", alloc=[gs])
    if spec.fp32_adapters:
        p.op("released", free=[g32])
    p.op(f"LoRA {t} B backward", alloc=[grad_b, ga], role=role_b)
    p.op("released", free=[gs, f"LoRA {t} A output"])
    p.op(f"LoRA {t} A backward", alloc=[grad_a, gx])
    if not input_grad:
        p.op("released", free=[ga, f"LoRA {t} dropout output" if spec.dropout else x if last_reader else None])
        return None, gb
    if not spec.dropout:
        saved = f"LoRA {t} input (FP32 copy)" if spec.fp32_adapters else (x if last_reader else None)
        p.op("released", free=[ga, saved])
    else:
        p.op("released", free=[ga, f"LoRA {t} dropout output"])
        g = p.new(f"LoRA {t} gradient through dropout", (B, S, inp), ad, "times the mask")
        p.op(f"LoRA {t} dropout backward", alloc=[g])
        p.op("released", free=[gx, f"LoRA {t} dropout mask"])
        gx = g
    if spec.fp32_adapters:
        g = p.new(f"LoRA {t} input gradient in {a}", (B, S, inp), a, "x.to(float32) backward: cast back")
        p.op(f"LoRA {t}: input cast backward", alloc=[g])
        p.op("released", free=[gx])
        gx = g
    return gx, gb


class _Sum:
    """Autograd's input buffer of one tensor: gradients summed as they arrive (an out-of-place add each)."""

    def __init__(self, p, name, shape, dtype):
        self.p, self.name, self.shape, self.dtype, self.value, self.n = p, name, shape, dtype, None, 0

    def add(self, g):
        if self.value is None:
            self.value = g
            return
        self.n += 1
        total = self.p.new(f"{self.name} (sum {self.n})", self.shape, self.dtype, "gradients of its consumers summed")
        self.p.op(f"{self.name}: gradients summed", alloc=[total])
        self.p.op("released", free=[self.value, g])
        self.value = total


class _BlockForward:
    """One block's forward under LoRA, step by step (:func:`lora_block_forward`): ``dropped``, the whole block under
    ``checkpoint(..., use_reentrant=False)``: nothing is saved, each tensor dies with its last reference. Locals of
    the block (:meth:`local`) go when it returns."""

    def __init__(self, p, c, spec: LoraSpec, dropped: bool, first: bool = False):
        self.p, self.c, self.spec, self.dropped, self.first = p, c, spec, dropped, first
        self.kept = set() if dropped else _kept_inputs(c, spec)
        self.temps = []

    def local(self, name, shape=BSd, why="a local of the block"):
        """A tensor of the block's own that lives until the block returns (or :meth:`release`)."""
        self.temps.append(name)
        return self.p.new(name, shape, self.c.dtype, why)

    def release(self, name):
        """A local the block no longer reads goes now; a kept tensor stays."""
        if name in self.temps:
            self.p.op("released", free=[name])
            self.temps.remove(name)

    def norm(self, k, kept_output) -> str:
        """Norm ``k`` with its frozen weight; returns its output: ``kept_output`` (a saved row) where an adapter keeps
        it for A's weight gradient, else a local. Under the checkpoint a frozen norm saves what a trained one does:
        nothing."""
        p, c = self.p, self.c
        if self.dropped:
            out = norm_forward(p, c, k, None, Save.DROPPED)
            self.temps.append(out)
            return out
        out = kept_output if kept_output in self.kept else self.local(f"norm {k} output")
        start = len(p.ops)
        _norm_forward(p, c, k, out)
        if self.first and k == "1":         # an input without grad: rms_norm's autograd node saves nothing
            saved = [n for op in p.ops[start:] for n in op.allocs
                     if n != out and p.tensors[n].lifetime is Lifetime.SAVED]
            p.op("released (no gradient into the first block: nothing saved)", free=saved)
        return out

    def qkv(self, h1):
        """The frozen QKV projection on ``h1``; with adapters on q, k or v, each added to its column slice and the
        slices concatenated again (``torch.cat``; q, k, v: views of it)."""
        p, c, spec = self.p, self.c, self.spec
        if spec.qlora and tune.on(c):
            self._three_projections(h1)
            return
        qkv = ["Q", "K", "V"] if not self.dropped else [self.local(
            "q, k, v (checkpointed)", (B, S, qkv_width(c)), "the fused projection's output, q, k, v views of it")]
        self.qkv_out = qkv[:1]
        adapted = [t for t in QKV if t in spec.targets]
        if not adapted:
            _base_forward(p, c, spec, "qkv", qkv)     # q, k, v: views of the frozen projection's output
            return
        base = p.new("frozen QKV projection output", (B, S, qkv_width(c)), c.dtype, "split into q, k, v column slices")
        _base_forward(p, c, spec, "qkv", base)
        every = len(adapted) == len(QKV)              # every slice replaced: the base output goes with the last sum
        sums = [self._slice_plus_adapter(t, h1, after=[base] if every and t == adapted[-1] else ()) for t in adapted]
        p.op("torch.cat: the fused output again (q, k, v: views of it)", alloc=qkv)
        p.op("released", free=sums + ([] if every else [base]))

    def _three_projections(self, h1):
        """torchtune's ``q_proj``, ``k_proj``, ``v_proj`` in turn on ``h1`` (QLoRA: each ``NF4Tensor`` dequantized
        with the earlier outputs alive), each its adapter's sum where it has one; q, k, v separate tensors."""
        p, c, spec = self.p, self.c, self.spec
        names = ["Q", "K", "V"]
        if self.dropped:
            names = [self.local(f"{n} (checkpointed)", (B, S, adapter_shape(c, t)[0]), "a local of the attention")
                     for n, t in zip(names, QKV)]
        self.qkv_out = names
        for (t, base), out in zip(TUNE_QKV.items(), names):
            if t not in spec.targets:
                _base_forward(p, c, spec, base, out)
                continue
            raw = p.new(f"{base} output (frozen)", (B, S, adapter_shape(c, t)[0]), c.dtype, "before the adapter's sum")
            _base_forward(p, c, spec, base, raw)
            adapter = _adapter_forward(p, c, spec, t, h1, self.dropped, unsaved_mask=self.first)
            _adapter_sum(p, c, spec, t, adapter, out, raw=raw)

    def _slice_plus_adapter(self, t, h1, after) -> str:
        """One q, k or v column slice plus its adapter's output (on ``h1``); ``after``: freed when the sum returns.
        In the first block without an input gradient the dropout's mask is not saved."""
        p, c, spec = self.p, self.c, self.spec
        adapter = _adapter_forward(p, c, spec, t, h1, self.dropped, unsaved_mask=self.first)
        out, _ = adapter_shape(c, t)
        total = p.new(f"{t} slice + adapter", (B, S, out), c.dtype, "the slice plus the adapter's output")
        _adapter_sum(p, c, spec, t, adapter, total, after=after)
        return total

    def attention(self) -> str:
        """The flash kernel (its core checkpointed under selective recomputation: its log-sum-exp dropped, its
        output a local unless an ``o_proj`` adapter keeps it); returns its output, the output projection's input."""
        p, c = self.p, self.c
        pi = "output projection input"
        if c.recompute != "selective" and not self.dropped:
            p.op("flash attention", alloc=[pi, "softmax log-sum-exp"])
            return pi
        if self.dropped or not _o_proj_reads(self.spec):
            pi = self.local("attention output (checkpointed)", widths_of(c)[0], "the local a, until the block returns")
        lse = p.new("log-sum-exp (dropped)", (B, H, S), "fp32", "not kept: the checkpointed core recomputes it")
        p.op("flash attention (checkpointed)", alloc=[pi, lse])
        p.op("log-sum-exp dropped", free=[lse])
        return pi

    def attention_branch(self, pi, xm) -> str:
        """The frozen output projection on ``pi`` (with an ``o_proj`` adapter, PEFT's sum), then the residual add
        into ``xm`` (a local under the checkpoint); returns the residual sum's name."""
        p, c, spec = self.p, self.c, self.spec
        po = p.new("output projection output", BSd, c.dtype, "the attention branch before the residual add")
        _base_forward(p, c, spec, "proj", po)
        branch = po
        if self.dropped:
            xm = p.new("attention residual sum (checkpointed)", BSd, c.dtype, "x + attention")
        if "o_proj" in spec.targets:
            adapter = _adapter_forward(p, c, spec, "o_proj", pi, self.dropped)
            branch = p.new("o_proj output + adapter", BSd, c.dtype, "the attention branch")
            _adapter_sum(p, c, spec, "o_proj", adapter, branch, raw=po)
        if self.dropped and tune.on(c):     # torchtune's q, k, v and SDPA's output: locals of its attention's forward
            for name in self.qkv_out:       # (modules/attention.py l. 182-304), not the layer's
                self.release(name)
            self.release(pi)
        p.op("residual add", alloc=[xm])
        if tune.on(c):      # TransformerSelfAttentionLayer.forward's attn_out (transformer.py l. 122-132): until it returns
            self.temps.append(branch)
        else:
            p.op("residual done", free=[branch])
        return xm

    def projection(self, base, t, x, out, shape, role=None, role_b=None):
        """The frozen ``base`` projection on ``x`` writing ``out``, plus the adapter on target ``t`` if there is
        one; ``role``: the base's op's, ``role_b``: the adapter's B's."""
        p, c, spec = self.p, self.c, self.spec
        if t not in spec.targets:
            _base_forward(p, c, spec, base, out, role)
            return
        raw = p.new(f"{base} output (frozen)", shape, c.dtype, "the base's output, before the adapter's is added")
        _base_forward(p, c, spec, base, raw, role)
        _adapter_sum(p, c, spec, t, _adapter_forward(p, c, spec, t, x, self.dropped, role_b), out, raw=raw)

    def mlp(self, h2) -> str:
        """SwiGLU on ``h2``: gate, SiLU, up, their product, the down projection; returns the down projection's
        output. Under the checkpoint each intermediate goes once its last reader has run."""
        p, c, dropped = self.p, self.c, self.dropped
        kept_prod = "down-projection input" in self.kept
        prod = "down-projection input" if kept_prod else p.new(
            "SiLU(gate) * up", BSF, c.dtype, "not kept: only the frozen down projection's weight gradient would read it")
        names = ("gate output", "SiLU output", "up-projection output")
        gate, silu, up = names if not dropped else [p.new(f"{n} (checkpointed)", BSF, c.dtype,
                                                          "not kept under the checkpoint") for n in names]
        self.projection("gate", "gate_proj", h2, gate, BSF)
        p.op("SiLU", alloc=[silu])
        if dropped:
            p.op("released", free=[gate])
        self.projection("up", "up_proj", h2, up, BSF)
        p.op("SiLU(gate) * up", alloc=[prod])
        if dropped:
            p.op("released", free=[silu, up])
        dn = p.new("down-projection output", BSd, c.dtype, "the MLP branch before the residual add")
        self.projection("down", "down_proj", prod, dn, BSd, OpRole.DOWN_PROJECTION, OpRole.LORA_DOWN_B)
        self.mlp_temporary = [] if kept_prod else [prod]
        return dn

    def returns(self, dn, xm):
        """The residual add into the next block's input; the block returns: its locals go (the checkpoint keeps
        the block's input)."""
        p, c = self.p, self.c
        x = residual_names(c)[0]
        p.op("residual add", free=self.mlp_temporary, alloc=[Ref(Scope.NEXT, x, _final_input(c))])
        held = (xm,) if self.dropped else (xm, x)
        leftovers = [dn] + [n for n in held if p.tensors[n].lifetime is Lifetime.TEMPORARY] + self.temps
        p.op("block returns", free=leftovers, role=OpRole.BLOCK_RETURNS)


def lora_block_forward(p, c, spec: LoraSpec, dropped=False, first=False):
    """One block's forward under LoRA (its input is live; its output is the next block's input). ``dropped``:
    the whole block under ``checkpoint(..., use_reentrant=False)`` (full recomputation): nothing is saved, each
    tensor dies with its last reference, the checkpoint keeps the block's input. ``first``: the block's input
    requires no grad (torchtune's first layer, :func:`first_block`)."""
    block = _BlockForward(p, c, spec, dropped, first)
    h1 = block.norm("1", "Q/K/V projection input")
    block.qkv(h1)
    block.release(h1)
    pi = block.attention()
    xm = block.attention_branch(pi, residual_names(c)[1])
    h2 = block.norm("2", "MLP input")
    dn = block.mlp(h2)
    block.returns(dn, xm)


def _final_input(c):
    return "final norm input" if c.upcast else "final RMSNorm input"


def _recompute(p, c, spec, first=False):
    """Full recomputation: the block's forward re-run with saving (its first saved tensor unpacked by the down
    projection's backward), stopped by the pack hook of the last tensor the forward saved
    (``_StopRecomputationError``, ``torch/utils/checkpoint.py``); the temporaries alive then are dropped (the
    block's input stays). Autograd saves an op's inputs before the kernel runs (a linear's frozen weight, A's
    input, B's input A x): the run stops before the down projection's matmul, or before its adapter's B; under
    QLoRA bitsandbytes' ``MatMul4Bit`` saves the packed weight after its forward (output made, dequantized weight
    freed). The recomputation runs when the backward first unpacks a saved tensor: the down projection's
    backward, or with an adapter on it, its B's (the adapter's scaling, and FP32 adapters' casts, save nothing
    and run before)."""
    q = p.fork()
    lora_block_forward(q, c, spec, first=first)
    roles = [op.role for op in q.ops]
    if "down_proj" in spec.targets:
        stop = roles.index(OpRole.LORA_DOWN_B)
    elif spec.qlora:     # LinearNF4 saves after its forward: the BF16 weight (torchao's, bnb's fallback's) freed
        stop = roles.index(OpRole.DOWN_PROJECTION) + (2 if "down" in spec.nf4_fallback or tune.on(c) else 1)
    else:
        stop = roles.index(OpRole.DOWN_PROJECTION)
    alive = []
    for op in q.ops[:stop]:
        alive = [n for n in alive if n not in op.frees] + list(op.allocs)
    x = residual_names(c)[0]
    q.ops[stop:] = []
    q.op("recomputation stops", free=[n for n in alive if isinstance(n, str) and n != x
                                      and p.tensors[n].lifetime is Lifetime.TEMPORARY], role=OpRole.RECOMPUTATION_STOPS)
    return q.ops


def _with_recomputation(p, c, spec, start, first=False):
    """Insert the recomputation (:func:`_recompute`) into the block's backward ``p.ops[start:]`` where the first
    saved tensor is unpacked."""
    at = start
    if "down_proj" in spec.targets:
        at = next(i for i in range(start, len(p.ops)) if p.ops[i].role is OpRole.LORA_DOWN_B_BACKWARD)
    p.ops[at:at] = _recompute(p, c, spec, first)


def _projection_backward(p, c, spec, share, total, t, base, x, last_reader, g_out, frozen_grad, role_b=None):
    """A projection's backward: its adapter on target ``t`` (if there is one; its saved input ``x``, freed here if
    ``last_reader``) before the frozen ``base`` (autograd runs the node created last first), each input gradient
    summed into ``total`` (a :class:`_Sum`). ``g_out``: the output gradient the frozen base frees (None: freed by
    the caller); ``frozen_grad``: (name, shape, why) of the base's input gradient; ``role_b``: the adapter B's
    backward op's role."""
    gb = g_out
    if t in spec.targets:
        gx, gb = _adapter_backward(p, c, spec, t, x, share, last_reader, g_out, role_b)
        total.add(gx)
    name, shape, why = frozen_grad
    g = p.new(name, shape, c.dtype, why)
    _base_backward(p, c, spec, base, g, [gb or g_out])
    total.add(g)


def _mlp_backward(p, c, spec, share) -> str:
    """The MLP's backward from ``dX_out``: down, SiLU(gate) * up, up, SiLU, gate (each frozen projection after its
    adapter); returns the MLP input's gradient (the up and gate paths summed)."""
    a, T = c.dtype, spec.targets
    g_prod = _Sum(p, "gradient of the down-projection input", BSF, a)
    _projection_backward(p, c, spec, share, g_prod, "down_proj", "down", "down-projection input", True, None, (
        "gradient of the down-projection input (frozen down)", BSF, "the frozen down projection's"),
        OpRole.LORA_DOWN_B_BACKWARD)
    gs = p.new("gradient of the SiLU output", BSF, a, "dL/d(SiLU(gate)) = g * up")
    gup = p.new("gradient of the up-projection output", BSF, a, "dL/d(up) = g * SiLU(gate)")
    p.op("SiLU(gate) * up backward", alloc=[gs, gup])
    p.op("released", free=[g_prod.value, "up-projection output", "SiLU output"])
    g_h2 = _Sum(p, "gradient of the MLP input", BSd, a)
    _projection_backward(p, c, spec, share, g_h2, "up_proj", "up", "MLP input", "gate_proj" not in T, gup, (
        "gradient of the MLP input via up (frozen)", BSd, "the frozen up projection's"))   # a gate adapter reads it last
    gg = p.new("gradient of the gate output", BSF, a, "SiLU backward's output")
    p.op("SiLU backward", alloc=[gg])
    p.op("released", free=[gs, "gate output"])
    _projection_backward(p, c, spec, share, g_h2, "gate_proj", "gate", "MLP input", True, gg, (
        "gradient of the MLP input via gate (frozen)", BSd, "the frozen gate projection's"))
    return g_h2.value


def _norm2_backward(p, c, g_h2) -> str:
    """Norm 2's backward (frozen weight) from the MLP input's gradient, summed with the skip's ``dX_out``; returns
    the attention residual sum's gradient."""
    gn2 = p.new("gradient of norm 2's input", BSd, c.dtype, "norm 2 backward's output")
    _norm_backward(p, c, "2", g_h2, gn2)
    gxm = p.new("gradient of the attention residual sum", BSd, c.dtype, "skip and norm gradients summed")
    p.op("residual gradients summed", alloc=[gxm])
    p.op("released", free=[gn2, "dX_out"])
    return gxm


def _attention_backward(p, c, spec, share, g_branch=None) -> str:
    """The output projection (after its adapter), the flash kernel (re-run first under selective recomputation),
    q, k, v's gradients put back together; returns the QKV projection output's gradient. ``g_branch``: the attention
    residual sum's gradient, released after the output projection, its last reader (the block's input requires no
    grad: torchtune's first block)."""
    BSq = widths_of(c)[0]
    g_pi = _Sum(p, "gradient of the output projection input", BSq, c.dtype)
    _projection_backward(p, c, spec, share, g_pi, "o_proj", "proj", "output projection input", False, None, (
        "gradient of the output projection input (frozen)", BSq, "the frozen output projection's"))
    if g_branch:
        p.op("released (the skip's gradient goes nowhere: the block's input requires no grad)", free=[g_branch])
    grads = _flash_backward(p, c, spec, g_pi.value)
    return grads if spec.qlora and tune.on(c) else _qkv_gradient(p, c, *grads)


def _flash_backward(p, c, spec, g_pi) -> tuple:
    """The flash kernel's backward from its output's gradient ``g_pi`` (selective recomputation: the core re-run
    first, its output and statistics freed after); returns the q, k, v gradients."""
    BSq, BSkv = widths_of(c)
    gq, gk, gv = (p.new(f"gradient of {n}", (B, S, w), c.dtype, f"dL/d{n}")
                  for n, w in (("q", BSq[2]), ("k", BSkv[2]), ("v", BSkv[2])))
    selective = c.recompute == "selective"
    if selective:                   # the checkpoint re-runs the core when its backward unpacks
        again = [p.new("flash output (recomputed)", BSq, c.dtype, "the re-run kernel's output"),
                 p.new("softmax log-sum-exp (recomputed)", (B, H, S), "fp32", "the re-run kernel's statistics")]
        p.op("flash attention recomputed", alloc=again)
    p.op("flash attention backward", alloc=[gq, gk, gv], role=OpRole.FLASH_ATTENTION_BACKWARD)
    if selective:
        p.op("recomputed output released", free=again)
    kept_core = ["softmax log-sum-exp", "output projection input"] if not selective else \
        (["output projection input"] if _o_proj_reads(spec) else [])
    p.op("released", free=[g_pi, "Q", "K", "V"] + kept_core)
    return gq, gk, gv


def _qkv_gradient(p, c, gq, gk, gv) -> str:
    """q, k, v's gradients put back into the QKV projection output's: concatenated (GQA), else stacked and permuted
    back (a copy)."""
    gqkv = p.new("gradient of the QKV projection output", (B, S, qkv_width(c)), c.dtype,
                 "q, k, v gradients put back together")
    if c.gqa:
        p.op("q, k, v gradients concatenated", alloc=[gqkv])
        p.op("released", free=[gq, gk, gv])
        return gqkv
    stack = p.new("stacked q, k, v gradients", (B, S, qkv_width(c)), c.dtype, "torch.stack of the three gradients")
    p.op("q, k, v gradients stacked", alloc=[stack])
    p.op("released", free=[gq, gk, gv])
    p.op("permuted back", alloc=[gqkv])
    p.op("released", free=[stack])
    return gqkv


def _qkv_backward(p, c, spec, share, gqkv, first=False) -> str:
    """The q, k, v adapters (v first) and the frozen QKV projection (the adapted slices' gradients concatenated
    first: split's backward); returns the gradient of norm 1's output, summed. ``first``: norm 1's output requires
    no grad (torchtune's first block): the adapters' weight gradients only, then the QKV output's gradient goes."""
    h1 = "Q/K/V projection input"
    g_h1 = _Sum(p, "gradient of norm 1's output", BSd, c.dtype)
    adapted = [t for t in QKV if t in spec.targets]
    if isinstance(gqkv, tuple):         # torchtune's three projections (QLoRA)
        return _three_backward(p, c, spec, share, gqkv, adapted, g_h1, first)
    assert h1 not in _kept_inputs(c, spec) or adapted         # a kept Q/K/V input is an adapter's
    slices = []
    for t in reversed(adapted):
        gx, gb = _adapter_backward(p, c, spec, t, h1, share, t == adapted[0], input_grad=not first)
        g_h1.add(gx)
        slices.append(gb)
    if first:
        p.op("released", free=[gqkv] + slices)
        return None
    g = p.new("gradient of norm 1's output (frozen QKV)", BSd, c.dtype, "the frozen QKV projection's")
    if adapted:
        gbase = p.new("gradient of the frozen QKV output", (B, S, qkv_width(c)), c.dtype,
                      "split backward: the slices' gradients concatenated")
        p.op("split backward", alloc=[gbase])
        p.op("released", free=[gqkv] + slices)
        gqkv = gbase
    _base_backward(p, c, spec, "qkv", g, [gqkv])
    g_h1.add(g)
    return g_h1.value


def _three_backward(p, c, spec, share, grads, adapted, g_h1, first) -> str:
    """torchtune's v, k, q projections' backward in turn (the node made last first), each adapter before its frozen
    base; ``grads``: q, k, v's gradients. ``first``: the adapters' weight gradients only."""
    h1 = "Q/K/V projection input"
    for (t, base), g in reversed(list(zip(TUNE_QKV.items(), grads))):
        if first:
            if t in spec.targets:
                _adapter_backward(p, c, spec, t, h1, share, t == adapted[0], input_grad=False)
            p.op("released", free=[g])
            continue
        _projection_backward(p, c, spec, share, g_h1, t, base, h1, t == adapted[0], g, (
            f"gradient of norm 1's output via {base} (frozen)", BSd, f"the frozen {base} projection's"))
    return g_h1.value


def _norm1_backward(p, c, g_h1, gxm):
    """Norm 1's backward (frozen weight) from its output's gradient, summed with the skip's ``gxm`` into the block
    input's gradient. A recomputed block's input (the checkpoint's) goes with the last tensor its recomputation
    saved, norm 1's input."""
    gx1 = p.new("gradient of norm 1's input", BSd, c.dtype, "norm 1 backward's output")
    last = [residual_names(c)[0]] if c.recompute == "full" and c.upcast else []
    _norm_backward(p, c, "1", g_h1, gx1, last)
    p.op("residual gradients summed", alloc=[INPUT_GRADIENT])
    p.op("released", free=[gx1, gxm])


def lora_block_backward(p, c, spec: LoraSpec, share, first=False):
    """One block's backward under LoRA: ``dX_out`` (live) -> the previous block's; frees the saved tensors (under
    full recomputation, those of the forward re-run first). ``first``: the block's input requires no grad
    (torchtune's first layer): no input gradient past the q, k, v adapters, no norm 1 backward; under the
    checkpoint its input goes when its backward is done."""
    start = len(p.ops)
    gxm = _norm2_backward(p, c, _mlp_backward(p, c, spec, share))
    g_h1 = _qkv_backward(p, c, spec, share, _attention_backward(p, c, spec, share, gxm if first else None), first)
    if first and c.recompute == "full":
        p.op("the checkpoint's input released", free=[residual_names(c)[0]])
    elif not first:
        _norm1_backward(p, c, g_h1, gxm)
    if c.recompute == "full":
        _with_recomputation(p, c, spec, start, first)


def _head_kept(spec) -> bool:
    """The LM head's input is kept for its adapter's A (no dropout, the base's dtype: else A reads a copy)."""
    return spec.head and not spec.dropout and not spec.fp32_adapters


def head_adapter_rows(c, spec: LoraSpec, opts: dict) -> list:
    """What the LM head's adapter saves (:class:`~memledger.activations.inventory.Saved`): as a block
    projection's adapter (:func:`lora_rows`) on the head's input (B, S, d)."""
    if not spec.head:
        return []
    ad, t = _adapter_dtype(c, spec), "lm_head"
    if spec.dropout:
        rows = [Saved(f"LoRA {t} dropout mask", "the adapter's dropout backward needs the mask", (B, S, d),
                      "bool" if opts["mask_dtype"] == "bool" else ad),
                Saved(f"LoRA {t} dropout output", "A's weight gradient needs its (dropped) input", (B, S, d), ad)]
    elif spec.fp32_adapters:
        rows = [Saved(f"LoRA {t} input (FP32 copy)", "A's weight gradient needs its input, cast to FP32 "
                      "(PEFT's _cast_input_dtype)", (B, S, d), "fp32")]
    else:
        rows = []
    return rows + [Saved(f"LoRA {t} A output", "B's weight gradient needs its input, A x", (B, S, r), ad)]


def _forward_end(p, c, spec):
    """Final norm (frozen), LM head (frozen; with an adapter on ``lm_head``, PEFT's sum), FP32 upcast,
    log_softmax, nll_loss."""
    a = c.dtype
    head_in = "LM head input" if _head_kept(spec) else p.new("LM head input", BSd, a, "not kept: the LM head is "
                                                             "frozen, its adapter reads a copy")
    _norm_forward(p, c, "final", head_in)
    logits = p.new("logits", outer.LOGITS, a, "the LM head's output")
    done = ([] if _head_kept(spec) else [head_in]) + ([_final_input(c)] if c.upcast else [])
    if spec.head:
        raw = p.new("LM head output (frozen)", outer.LOGITS, a, "the frozen head's output, before the adapter's")
        p.op("LM head (frozen)", alloc=[raw])
        _adapter_sum(p, c, spec, "lm_head", _adapter_forward(p, c, spec, "lm_head", head_in), logits, raw=raw,
                     after=done)
    else:
        p.op("LM head (frozen)", alloc=[logits])
        p.op("released", free=done)
    src = p.new("logits in FP32", outer.LOGITS, "fp32", "logits.float(): cross-entropy runs in FP32")
    p.op("logits.float()", alloc=[src])
    p.op("BF16 logits released", free=[logits])
    outer.cross_entropy(p, src)


def _backward_start(p, c, spec, share=lambda n: n):
    """Back through the loss, the frozen LM head and the final norm; ends with the last block's ``dX_out``."""
    a = c.dtype
    dl = p.new("gradient of the loss", (), "fp32", "loss.backward() seeds a 1")
    g1 = p.new("nll_loss gradient", outer.LOGITS, "fp32", "nll_loss backward: B*S*V FP32")
    g2 = p.new("log_softmax gradient", outer.LOGITS, "fp32", "log_softmax backward: B*S*V FP32")
    p.op("loss.backward()", alloc=[dl], role=OpRole.LOSS_BACKWARD)
    p.op("nll_loss backward", alloc=[g1])
    p.op("released", free=["nll_loss total weight"], role=OpRole.LABELS_RELEASED)
    p.op("log_softmax backward", alloc=[g2])
    p.op("released", free=[g1, "log-softmax output (FP32)"])
    g = p.new("logits gradient", outer.LOGITS, a, "downcast to the logits' dtype")
    p.op("logits.float() backward", alloc=[g])
    p.op("released", free=[g2])
    total = _Sum(p, "gradient of the LM head input", BSd, a)
    gb = None
    if spec.head:
        gx, gb = _adapter_backward(p, c, spec, "lm_head", "LM head input", share, True, g)
        total.add(gx)
    gfn = p.new("gradient of the LM head input (frozen head)", BSd, a, "the frozen LM head's input gradient")
    p.op("LM head backward (input gradient only)", alloc=[gfn])
    p.op("released", free=[gb or g])
    total.add(gfn)
    _norm_backward(p, c, "final", total.value, Ref(Scope.LAST, "dX_out"))


def _backward_end(p, c):
    """The graph goes with the loss: the embedding output (a leaf held by the graph) and its ``.grad``; under
    torchtune's code there is no leaf (:func:`first_block`)."""
    leaf = [] if tune.on(c) else ["grad of the embedding output", Ref(Scope.FIRST, residual_names(c)[0])]
    p.op("graph freed", free=leaf + ["gradient of the loss", "loss"], role=OpRole.LOSS_RELEASED)


def _block_params(c, spec) -> list:
    """(name, elements) of one block's adapter tensors in ``model.parameters()`` order: A (r x in), B (out x r)."""
    block = []
    for t in spec.targets:
        out, inp = adapter_shape(c, t)
        block += [(f"{t}.lora_A", r * inp), (f"{t}.lora_B", out * r)]
    return block


def _params(c, spec, layers) -> list:
    """The adapters' :class:`~memledger.step.outer.Param` in ``model.parameters()`` order; blocks 1..L-2 as one
    lump where ``layers`` skips some."""
    block = _block_params(c, spec)
    params = []
    for i in layers:
        params += [Param(f"block {i} {n}", e) for n, e in block]
        if i == 0 and layers[-1] > 1 and layers != list(range(layers[-1] + 1)):
            params.append(Param("@blocks 1..L-2", (L - 2) * sum(e for _, e in block), lump=True))
            params += [Param(f"block L-1 {n}", e) for n, e in block]
            break
    return params + [Param(n, e) for n, e in _head_params(spec)]


def _head_params(spec) -> list:
    """(name, elements) of the LM head's adapter (registered after the blocks: last in ``model.parameters()``)."""
    return [("lm_head.lora_A", r * d), ("lm_head.lora_B", V * r)] if spec.head else []


def first_block(ops, first) -> list:
    """``ops`` with block 0's forward and backward ops taken from ``first`` (the same step flattened with
    :func:`lora_block_forward` and :func:`lora_block_backward` under ``first=True``): torchtune's LoRA model makes no
    leaf of the embedding's output (``set_trainable_params`` trains the adapters only; no
    ``enable_input_require_grads``), so its first layer's input requires no grad: norm 1 saves nothing, the q, k, v
    adapters' dropout masks are not kept, backward stops at those adapters' weight gradients, and the embedding's
    output goes when the first layer returns (under the checkpoint, when its backward is done)."""
    out, done = [], set()
    for op in ops:
        if op.layer == 0:
            if op.phase not in done:
                done.add(op.phase)
                out += [o for o in first if o.layer == 0 and o.phase is op.phase]
            continue
        out.append(op)
    return out


def _hold_leaf(ops, x):
    """The embedding's output is a leaf the graph holds: block 0 never frees it (:func:`_backward_end` does)."""
    out = []
    for op in ops:
        if op.layer == 0 and (0, x) in op.frees:
            op = replace(op, frees=tuple(n for n in op.frees if n != (0, x)))
        out.append(op)
    return out


def _one_rank(name):
    """One rank, nothing sharded: a gradient's name as it is."""
    return name


def _chunked(c) -> bool:
    """The chunked loss (:mod:`memledger.step.lora_loss`) runs: chunks, or LitGPT's loss."""
    return c.loss_chunks > 1 or c.loss_impl == "litgpt"


def _saved_rows(s: LoraStructure) -> tuple:
    """(a block's saved rows, the rows outside the blocks): the inventory's under LoRA (:func:`lora_rows`); outside,
    less what only the frozen final norm's weight or the frozen head would read and what the chunked loss keeps as
    other tensors, plus the head adapter's."""
    c, spec = s.shape, s.lora
    opts = s.conventions.inventory_options(c.style, c.dtype, False) | {"attention": c.attention}
    outside = [row for row in outside_inventory(c.style, **{k: opts[k] for k in (
        "dtype", "norm_stats", "rmsnorm", "attention")}) if row.name not in NORM_WEIGHT_ONLY
        and (row.name != "LM head input" or _head_kept(spec))
        and (not _chunked(c) or row.name not in loss.replaced_rows(c))] + head_adapter_rows(c, spec, opts)
    return lora_rows(c, spec, opts), outside


#: The temporaries every LoRA program names beside the saved rows (B x S x d each, in the activations' dtype).
_TRANSIENTS = [("dX_out", "the gradient flowing back into the block's output"),
               ("grad of the embedding output", "the first block's input gradient: the leaf's .grad"),
               ("block input", "the block's input, held by the caller until the block returns"),
               ("attention residual sum", "x + attention, norm 2's input"),
               ("final norm input", "the last block's output, until the LM head has run")]


def _tensors(c, rows) -> dict:
    """The programs' tensors to begin with: the saved ``rows`` and :data:`_TRANSIENTS`."""
    tensors = {}
    for row in rows:
        tensors[row.name] = Tensor(row.name, row.bytes, Kind.ACTIVATION, Lifetime.SAVED, why=row.why)
    for name, why in _TRANSIENTS:
        tensors[name] = Tensor(name, B * S * d * nbytes(c.dtype), Kind.TRANSIENT, Lifetime.TEMPORARY, why=why)
    return tensors


def _outside_programs(p, c, spec) -> dict:
    """The programs outside the blocks, by :class:`~memledger.step.trace.Part`: the embedding, the frozen final norm
    and head with the loss (chunked: :mod:`memledger.step.lora_loss`), back through them, the graph freed."""
    chunked = _chunked(c)
    makers = {Part.FORWARD_START: lambda q: outer.forward_start(q, c),
              Part.FORWARD_END: lambda q: lora_chunked_forward_end(q, c, _norm_forward) if chunked
              else _forward_end(q, c, spec),
              Part.BACKWARD_START: lambda q: lora_chunked_backward_start(q, c, _norm_backward) if chunked
              else _backward_start(q, c, spec),
              Part.BACKWARD_END: lambda q: _backward_end(q, c)}
    outside = {}
    for part, make in makers.items():
        q = p.fork()
        make(q)
        outside[part] = q.ops
    return outside


def _optimizer_program(opt, s: LoraStructure, params, moments, master):
    """The adapters' optimizer step into ``opt``: bitsandbytes' fused in-place update (no temporaries), or
    ``torch.optim.AdamW`` over ``params`` (:func:`memledger.step.outer.optimizer`)."""
    c = s.shape
    if s.lora.fused_optimizer:
        opt.op("gradients collected")
        opt.op("bitsandbytes: fused in-place update")
        opt.op("gradients released", action=Action.RELEASE_GRADIENTS)
    else:
        outer.optimizer(opt, params, moments, master and c.grad_dtype != "fp32", s.conventions.foreach, c.grad_dtype)
    return opt


def _lumps(tensors, c, spec, layer_rows):
    """The lumped middle blocks' saved tensors (under full recomputation the checkpoint keeps the block's input
    only) and adapter gradients, one tensor each."""
    saved = sum((tensors[row.name].expr for row in layer_rows), sp.Integer(0))
    if c.recompute == "full":           # the checkpoint keeps the block's input only
        tensors["layer input"] = Tensor("layer input", tensors[residual_names(c)[0]].expr, Kind.ACTIVATION,
                                        Lifetime.SAVED, why="the checkpoint")
        saved = tensors["layer input"].expr
    grads = sum((tensors[f"grad {t}.lora_{m}"].expr for t in spec.targets for m in "AB"), sp.Integer(0))
    tensors[SAVED_LUMP] = Tensor(SAVED_LUMP, (L - 4) * saved, Kind.ACTIVATION, Lifetime.SAVED)
    tensors[GRADIENT_LUMP] = Tensor(GRADIENT_LUMP, (L - 4) * grads, Kind.GRAD, Lifetime.GRADIENT)


def _optimizer_in_backward(ops, tensors, p, s: LoraStructure, moments) -> list:
    """``ops`` with one AdamW per adapter tensor, stepped in its hook (:func:`memledger.step.optim.in_backward`)."""
    c, conv, spec = s.shape, s.conventions, s.lora
    sizes = dict(_block_params(c, spec) + _head_params(spec))
    impl = "fused" if conv.fused else ("foreach" if conv.foreach else "for-loop")
    return optim.in_backward(ops, tensors, lambda layer, name: optim.one_parameter(
        p.fork(), c, "adamw", impl, name, moments, c.grad_dtype, Device.GPU, elements=sizes[name]))


def _block_programs(p, c, spec, first) -> tuple:
    """(one block's forward, its backward); ``first``: the block's input requires no grad (:func:`first_block`)."""
    fwd, bwd = p.fork(), p.fork()
    lora_block_forward(fwd, c, spec, dropped=c.recompute == "full", first=first)
    lora_block_backward(bwd, c, spec, _one_rank, first)
    return fwd, bwd


class LoraBuilt(Built):
    """The programs and compiled sizes of a :class:`LoraStructure` (:class:`~memledger.step.build.Built`'s
    methods read them)."""

    def __init__(self, s: LoraStructure):
        self.shape = c = s.shape
        self.structure = s
        spec, recipe = s.lora, get_recipe(s.recipe)
        self.layer_rows, self.outside_rows = _saved_rows(s)
        tensors = _tensors(c, self.layer_rows + self.outside_rows)
        self.placement = Program(tensors).placement
        p = Program(tensors, self.placement)
        outside = _outside_programs(p, c, spec)
        outside = tune.outside(outside, c, p.fork)     # torchtune's recipe around the model (memledger.step.torchtune)
        fwd, bwd = _block_programs(p, c, spec, False)
        moments, master = outer.adamw(recipe)
        params = _params(c, spec, explicit_layers(s.layers or 5))
        opt = _optimizer_program(p.fork(), s, params, moments, master)
        opt.ops[:] = tune.optimizer(opt.ops, c, p.fork)     # torchtune's recipe: scale_grads, then its resets
        _lumps(tensors, c, spec, self.layer_rows)
        self.ops = flatten(s.layers or 5, c, outside, fwd.ops, bwd.ops, opt.ops)
        if tune.on(c):
            f0, b0 = _block_programs(p, c, spec, True)
            self.ops = first_block(self.ops, flatten(s.layers or 5, c, outside, f0.ops, b0.ops, opt.ops))
        else:
            self.ops = _hold_leaf(self.ops, residual_names(c)[0])
        if s.in_backward:
            self.ops = _optimizer_in_backward(self.ops, tensors, p, s, moments)
        self.tensors = tensors
        self._lora_static(recipe, spec, len(params) and 2 * len(spec.targets))
        self._compile()

    def loss_saved(self) -> list:
        """What the chunked loss keeps for backward (:func:`memledger.step.loss.saved_names`) that the programs
        save: the frozen head keeps no copy of its chunks' input (:mod:`memledger.step.lora_loss` makes none)."""
        return [n for n in loss.saved_names(self.shape)
                if n in self.tensors and self.tensors[n].lifetime is Lifetime.SAVED]

    def _lora_static(self, recipe, spec, per_block):
        """The frozen base (16-bit or NF4), the adapters' states, step counters, ids, overhead."""
        c, conv, t_ = self.shape, self.structure.conventions, self.tensors
        self.static = []

        def static(name, expr, kind, why=""):
            t_[name] = Tensor(name, expr, kind, Lifetime.STEP, Device.GPU, why)
            self.static.append((None, name))
        a = nbytes(c.dtype)
        dense = (2 * V * d + d) * a + L * 2 * d * a          # embedding, LM head (untied), final norm, norms
        if c.is_tied:
            dense -= V * d * a
        shapes = _base_shapes(c)
        if c.has_qkv_bias:
            dense += L * qkv_width(c) * a
        packed = absmax = sp.Integer(0)
        if spec.qlora and tune.on(c):       # torchao's NF4Tensor per projection, q, k and v separate
            shapes = {k: v for k, v in shapes.items() if k != "qkv"} | {v: adapter_shape(c, t)
                                                                           for t, v in TUNE_QKV.items()}
        for out, inp in shapes.values():
            n = out * inp
            if spec.qlora and tune.on(c):   # memledger.states.torchao: the codes, then the rest
                packed += L * n / 2
                absmax += L * (nf4_bytes(n) - n / 2)
            elif spec.qlora:
                parts = nf4_parts(n)                # memledger.states.bnb: bitsandbytes' NF4 storage
                packed += L * parts["packed"]
                absmax += L * parts["absmax"]
            else:
                dense += L * n * a
        static(f"frozen base weights ({c.dtype}; no grads, no states)", dense, Kind.PARAM,
               "frozen: requires_grad=False")
        if spec.qlora and tune.on(c):
            static(TORCHAO_ROWS[0], packed, Kind.PARAM, "to_nf4's quantized_data: two 4-bit codes a byte")
            static(TORCHAO_ROWS[1], absmax, Kind.PARAM,
                   "to_nf4: int8 scalers per 64, a BF16 factor per 256 scalers, scaler mean and 16-entry table")
        elif spec.qlora:
            static("frozen NF4 projections: packed 4-bit weights", packed, Kind.PARAM, "two 4-bit codes per byte")
            static("frozen NF4 projections: absmax (8-bit) and their FP32 constants", absmax, Kind.PARAM,
                   "double quantization: one 8-bit absmax per 64 weights, one FP32 per 256 absmax")
        P = L * sum(e for _, e in _block_params(c, spec)) + sum(e for _, e in _head_params(spec))
        self.adapter_params = P
        grad = recipe.grad_component
        self.grad_row = _GradRow(f"LoRA adapters: {grad.name}", grad.bytes_for(1))
        self.masters = frozenset(f"LoRA adapters: {x.name}" for x in recipe.components if x.state is State.MASTER)
        for x in recipe.components:
            if x.role != Role.GRAD:
                static(f"LoRA adapters: {x.name}", x.bytes_for(P), _kind(x.role), "the adapter recipe's component")
        if conv.step_counters and outer.adamw(recipe)[0] is not None and not spec.fused_optimizer:
            static("Adam step counters", 4 * (L * per_block + len(_head_params(spec))), Kind.OPTIMIZER,
                   "one 0-d FP32 step tensor per adapter tensor (torch.optim.Adam)")
        for name in IDS:
            static(name, t_[name].expr, Kind.ACTIVATION, t_[name].why)
        for name, expr, kind, why in tune.statics(c, ropes=L):     # lora_llama2's RoPE buffers, the recipe's tensors
            static(name, expr, kind, why)
        static("CUDA context + workspace", O, Kind.OVERHEAD, "the runtime's context and workspaces")


class _GradRow(NamedTuple):
    name: str
    bytes_per_param: object
    sharded: bool = False


def _kind(role):
    """The step's :class:`~memledger.step.vocab.Kind` of a recipe component with ZeRO ``role``."""
    return {Role.PARAM: Kind.PARAM, Role.OPTIMIZER: Kind.OPTIMIZER, Role.GRAD: Kind.GRAD}.get(role, Kind.OPTIMIZER)


_CACHE = {}
#: The LoRA step's builders under a library's code, by implementation, registered by their modules
#: (:mod:`memledger.step.hf_lora`: PEFT on transformers' model).
LIBRARY_BUILDERS = {}


def build_lora(s: LoraStructure) -> LoraBuilt:
    """The programs of ``s``, built once per structure (under LitGPT's code:
    :class:`memledger.step.litgpt_lora_step.LitgptLoraBuilt`)."""
    if s not in _CACHE:
        if s.shape.implementation == "litgpt":
            from .litgpt_lora_step import LitgptLoraBuilt
            _CACHE[s] = LitgptLoraBuilt(s)
        else:
            _CACHE[s] = LIBRARY_BUILDERS.get(s.shape.implementation, LoraBuilt)(s)
    return _CACHE[s]


#: Adapter recipes the LoRA step models: torch.optim.AdamW (with or without FP32 masters) and bitsandbytes'
#: fused 32-bit AdamW (QLoRA's ``paged_adamw_32bit``).
ADAPTER_RECIPES = ("fp32-adamw", "bf16-pure-adamw", "bf16-adamw", "bf16-adamw32-bnb")


def _bitsandbytes(recipe) -> bool:
    """bitsandbytes runs the recipe's optimizer (:data:`memledger.step.structure.OPTIMIZER_OF`): one fused in-place
    update, no temporaries."""
    return OPTIMIZER_OF[recipe.name] in BNB_KINDS


def _fp32_adapters(recipe) -> bool:
    """The adapters' own weights are FP32 (PEFT's ``autocast_adapter_dtype``): the recipe's parameter component."""
    return next(x.dtype for x in recipe.components if x.role == Role.PARAM) == "fp32"


def _check(setup, config, conv):
    """What the LoRA step models, or a ValueError naming the choice it does not."""
    if config.base not in ("bf16", "nf4"):
        raise ValueError(f"the LoRA step models a BF16 base (or NF4 under QLoRA), got base {config.base}")
    if config.adapter_recipe not in ADAPTER_RECIPES:
        raise ValueError(f"the LoRA step models FP32 or BF16 adapters under AdamW: adapter_recipe must be one of "
                         f"{', '.join(ADAPTER_RECIPES)}, got {config.adapter_recipe}")
    if setup.arch.style != "llama":
        raise ValueError("the LoRA step models LLaMA blocks")
    recipe = get_recipe(config.adapter_recipe)
    if setup.optimizer_in_backward and (outer.adamw(recipe)[1] or _bitsandbytes(recipe)):
        raise ValueError(f"optimizer_in_backward steps each adapter in its own hook with torch.optim.AdamW: "
                         f"adapter_recipe {config.adapter_recipe} keeps FP32 masters or is bitsandbytes'; use "
                         f"fp32-adamw or bf16-pure-adamw")
    if "lm_head" in config.targets and setup.chunked_loss:
        raise ValueError("the LoRA step does not model an lm_head adapter with the chunked loss (the adapter per "
                         "chunk): drop lm_head from the targets or use loss_chunks 1")
    if conv.kernel(setup.arch.style, False, setup.flash_attention) != "flash":
        raise ValueError("the LoRA step models the SDPA flash kernel: use --backend cpu or cuda, or "
                         "--flash-attention")
    _check_library(setup, config)


def _check_library(setup, config):
    """What the LoRA step models under a library's code: torchtune's ``lora_llama2`` with its adapters in the model's
    dtype under ``torch.optim.AdamW`` (``bf16-pure-adamw``), a BF16 or NF4 (torchao's) base, an adapter on q, k or
    v; refused in one line (:func:`memledger.step.implementations.not_modelled`) otherwise."""
    impl = setup.implementation
    if impl != "torchtune":     # LitGPT's: memledger.step.litgpt_lora_step.check (LoraLedger.step)
        return
    lacks = [what for what, off in [
        (f"adapter_recipe {config.adapter_recipe} (torchtune's adapters are in the model's dtype: bf16-pure-adamw)",
         config.adapter_recipe != "bf16-pure-adamw"),
        ("LoRA without an adapter on q_proj, k_proj or v_proj (its first layer's attention without a gradient)",
         not set(QKV) & set(config.targets)),
        ("the optimizer in backward", setup.optimizer_in_backward)] if off]
    if lacks:
        raise not_modelled(impl, ", ".join(lacks))


class LoraStep(Step):
    """The step timeline of a :class:`memledger.ledger.lora.LoraLedger` (``LoraLedger(...).step(backend)``)."""

    def __init__(self, setup, config, backend="article", *, record=None, origin=None, **changes):
        """``setup``: the :class:`~memledger.step.inputs.StepInputs` of the frozen base's model and workload (a BF16
        loop without dropout; a Ledger's ``step_inputs``); ``config``: the adapters'
        (:class:`memledger.ledger.lora.LoraConfig`); ``record``: the run's inputs as the JSON echoes them;
        ``origin``: what the step was made from, kept for display (:attr:`ledger`)."""
        setup = inputs_of(setup)
        self.ledger, self.inputs, self.record = origin, setup, dict(record or {})
        self.conventions = conv = get_backend(backend, **changes)
        _check(setup, config, conv)
        if setup.implementation not in ("reference", "torchtune", "litgpt"):    # PEFT's: registered by hf_lora
            from .implementations import lora_not_modelled
            if setup.implementation not in LIBRARY_BUILDERS:
                raise ValueError(f"implementation {setup.implementation}: {lora_not_modelled(setup.implementation)}")
            LIBRARY_BUILDERS[setup.implementation].check(setup, config, conv)
        base = StepStructure.of(setup, conv)
        recipe = get_recipe(config.adapter_recipe)
        shape = replace(base.shape, grad_dtype=recipe.grad_component.dtype)
        spec = LoraSpec(tuple(t for t in BLOCK_TARGETS if t in config.targets), config.dropout,
                        config.base == "nf4", _bitsandbytes(recipe), _fp32_adapters(recipe), "lm_head" in config.targets,
                        _nf4_fallback(shape, setup.values) if config.base == "nf4" and not tune.on(shape) else ())
        fields = {f: getattr(base, f) for f in base.__dataclass_fields__}
        self.structure = LoraStructure(**(fields | {"shape": shape, "recipe": config.adapter_recipe, "lora": spec}))
        self.built = build_lora(self.structure)
        self.values = dict(setup.values) | {"r": config.rank}
        self.values["P"] = evaluate_expr(self.built.adapter_params.subs(r, config.rank), setup.values)

    def to_dict(self) -> dict:
        """The JSON object of ``memledger step --lora-rank ...``: the LoRA ledger's inputs (with the backend),
        landmarks, peak (with what is live there), rows."""
        inputs = self.record | {"loss_chunks": self.inputs.loss_chunks, "loss_impl": self.inputs.loss_impl,
                                "backend": self.conventions.name, "conventions": {
                                    k: v for k, v in vars(self.conventions).items() if k != "name"}}
        return {"inputs": inputs, "landmarks": self.landmarks,
                "peak": {"gpu": self.peak.bytes, "phase": self.peak.phase, "layer": self.peak.layer,
                         "detail": self.peak.detail,
                         "live": [{"name": n, "bytes": b} for n, b in self.live_at_peak()]},
                "rows": [{k: row[k] for k in ("name", "kind", "phase", "device", "bytes", "formula")}
                         | {"live": [m for m in LANDMARKS if m in row.get("live", ())]} for row in self.rows]}
