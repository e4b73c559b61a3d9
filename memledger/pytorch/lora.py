"""The reference decoder under LoRA and QLoRA: a frozen base, rank-r adapters, an NF4 base (docs/step.md).

The LLaMA decoder of :mod:`memledger.pytorch.reference` with every base parameter frozen
(``requires_grad=False``) and adapters as PEFT's ``LoraLayer`` computes them
(``peft/tuners/lora/layer.py``, ``Linear.forward``): ``result = result + lora_B(lora_A(dropout(x))) *
scaling``, A (r x in) and B (out x r) bias-free linears in the model's dtype, or in FP32 (``fp32_adapters``:
PEFT's ``autocast_adapter_dtype``; then, as ``Linear.forward`` does, the input is cast to the adapter's dtype
and the sum back to the base's), ``scaling = alpha / r``, ``dropout`` an ``nn.Dropout(p)`` per adapted
projection (p = 0: no call at all, PEFT's ``nn.Identity``). The frozen tensors are held as buffers (the same
bytes; MemTracker hooks every parameter's gradient, which a frozen one cannot take).

* **Targets** by Hugging Face names (:data:`TARGETS`). The reference fuses q, k and v into one frozen
  ``qkv`` projection: an adapter on ``q_proj`` (``k_proj``, ``v_proj``) adds its output to the q (k, v)
  column slice of the fused output, the slices being ``split`` and put back with ``torch.cat`` (the
  projection's output width is unchanged, so attention runs as before). ``lm_head`` adapts the LM head.
* **The blocks' inputs require grad**: the embedding's output is made a leaf that requires grad
  (``output.requires_grad_(True)`` in a forward hook: PEFT's ``enable_input_require_grads``, which
  ``prepare_model_for_kbit_training`` calls by default). Every block then runs the same graph; the
  embedding itself gets no gradient, and the leaf (with its ``.grad``) lives until the graph is freed.
* **QLoRA** (``qlora=True``): the block projections stored as NF4, frozen: the packed weight (uint8, two
  4-bit codes per byte), one 8-bit absmax per 64 weights and one FP32 constant per 256 of those (double
  quantization), each ``ceil``-ed per tensor as bitsandbytes allocates them. :class:`NF4Linear` is
  bitsandbytes' ``MatMul4Bit`` (``bitsandbytes/autograd/_functions.py`` lines 300-362 and 383, commit 95f9af30):
  forward is ``gemm_4bit`` on CUDA (:func:`gemm_4bit`): at M = B*S > 1536 rows ``_dequant_linear_fallback``
  (``backends/cuda/ops.py`` lines 904-914: the absmax dequantized to FP32, ``absmax_dq + absmax_offset`` a second
  FP32 array, the weight in the input's dtype, then ``F.linear``; all three live until it returns), below that
  the fused kernel (lines 846-901: only the output); only the packed weight is saved (lines 357-360), and
  backward dequantizes it with ``dequantize_4bit`` (``functional.py`` l. 992-1070: one FP32 absmax, the offset
  added in place, the weight; the absmax freed on return) for the input gradient. The reference allocates what
  those kernels allocate without computing NF4's values: it checks memory, not numbers. Embeddings, norms and the
  LM head stay in the model dtype.

``RefConfig(recompute="selective")`` runs the attention core under ``checkpoint(..., use_reentrant=False)`` as
:class:`~memledger.pytorch.reference.Block` does; ``recompute="full"`` each block, as
:class:`~memledger.pytorch.reference.Decoder` does (torchtune's full activation checkpointing wraps each layer with
``CheckpointImpl.NO_REENTRANT, use_reentrant=False``: ``torchtune/training/activations.py`` l. 18-27 at
6ace7c26; Hugging Face's ``gradient_checkpointing_enable()`` in transformers 4.x defaults to
``use_reentrant=True``, which needs an input that requires grad, hence PEFT's ``enable_input_require_grads``:
the reentrant checkpoint re-runs the whole block and is not run here). ``loss_chunks``/``loss_impl``: the LM head (and
its adapter) once per chunk, as :class:`~memledger.pytorch.reference.Decoder` and torchtune's ``chunked_output``.

The loop is :class:`memledger.pytorch.reference.Trainer` over the trainable parameters only (the adapters):
``bf16-pure-adamw``, ``bf16-adamw`` (FP32 masters of the adapters) or, with FP32 adapters on the BF16 base,
``fp32-adamw``.
"""
from dataclasses import dataclass
import math

import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from ..states.bnb import nf4_gemm_fallback
from .reference import LOOPS, Block, Decoder, RefConfig

__all__ = ["TARGETS", "Adapter", "LoraBlock", "LoraDecoder", "LoraRef", "NF4Linear", "QuantLinear", "gemm_4bit",
           "make_lora_model", "nf4_fallback_linear", "nf4_sizes"]

#: Hugging Face's projection names and the reference's module each adapts.
TARGETS = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "o_proj": "proj", "gate_proj": "gate",
           "up_proj": "up", "down_proj": "down", "lm_head": "head"}


@dataclass(frozen=True)
class LoraRef:
    """Adapters of ``rank`` on ``targets`` (:data:`TARGETS`), scaling ``alpha / rank``, dropout ``p``; ``qlora``:
    the block projections in NF4; ``fp32_adapters``: the adapters in FP32 on a 16-bit base (PEFT's
    ``autocast_adapter_dtype=True``, ``get_peft_model``'s default)."""
    rank: int = 8
    targets: tuple = ("q_proj", "v_proj")
    alpha: float = 16.0
    dropout: float = 0.0
    qlora: bool = False
    fp32_adapters: bool = False

    def __post_init__(self):
        unknown = [t for t in self.targets if t not in TARGETS]
        if unknown:
            raise ValueError(f"targets {unknown} are not among {', '.join(TARGETS)}")


def nf4_sizes(n: int) -> tuple:
    """Elements of (packed uint8 weight, 8-bit absmax, FP32 absmax of the absmax) for ``n`` weights."""
    return (n + 1) // 2, math.ceil(n / 64), math.ceil(math.ceil(n / 64) / 256)


def nf4_fallback_linear(x, blocks: int, shape, bias=None, offset=0.0):
    """bitsandbytes' ``_dequant_linear_fallback`` (``backends/cuda/ops.py`` l. 904-914 at 95f9af30) on an NF4
    weight of ``shape`` (out, in) with ``blocks`` double-quantized absmax: ``absmax_dq`` (FP32), ``absmax_dq +
    absmax_offset`` (a second FP32 array), the weight in ``x``'s dtype, ``F.linear``; the three live until it
    returns. Allocates, without computing NF4's values."""
    absmax_dq = torch.empty(blocks, dtype=torch.float32, device=x.device)
    _absmax = absmax_dq + offset                # bitsandbytes rebinds absmax: it lives until return
    weight = torch.empty(shape, dtype=x.dtype, device=x.device)
    return F.linear(x, weight, bias)


def gemm_4bit(x, blocks: int, shape, bias=None, offset=0.0):
    """``torch.ops.bitsandbytes.gemm_4bit`` as its CUDA kernel dispatches (l. 943-983): the fallback
    (:func:`nf4_fallback_linear`) past 1536 rows or for an input width not a multiple of 64
    (:func:`memledger.states.bnb.nf4_gemm_fallback`), else the fused ``cgemm_4bit`` (``_gemm_4bit_kernel_impl``,
    l. 846-901: ``A.contiguous()`` and the output, bias added in the kernel)."""
    if nf4_gemm_fallback(x.numel() // x.shape[-1], x.shape[-1]):
        return nf4_fallback_linear(x, blocks, shape, bias, offset)
    x = x.contiguous()
    return torch.empty((*x.shape[:-1], shape[0]), dtype=x.dtype, device=x.device)


class NF4Linear(torch.autograd.Function):
    """``MatMul4Bit``: forward :func:`gemm_4bit`; backward ``dequantize_4bit`` (absmax, then weight; the absmax
    freed on return), then the matmul."""

    @staticmethod
    def forward(ctx, x, packed, absmax, absmax2, shape, bias=None):
        out = gemm_4bit(x, absmax.shape, shape, bias)
        ctx.save_for_backward(packed, absmax, absmax2)
        ctx.shape = shape
        return out

    @staticmethod
    def backward(ctx, grad):
        packed, absmax, _ = ctx.saved_tensors
        scales = torch.empty(absmax.shape, dtype=torch.float32, device=grad.device)     # absmax (+= offset)
        weight = torch.empty(ctx.shape, dtype=grad.dtype, device=grad.device)            # the weight
        del scales
        return torch.matmul(grad, weight), None, None, None, None, None


class QuantLinear(nn.Module):
    """A frozen linear (out x in) stored as NF4 with double-quantized absmax (bitsandbytes' ``Linear4bit``; a bias
    stays in the model's dtype)."""

    def __init__(self, inp: int, out: int, bias: bool = False):
        super().__init__()
        self.shape = (out, inp)
        packed, absmax, absmax2 = nf4_sizes(out * inp)
        self.packed = nn.Parameter(torch.empty(packed, dtype=torch.uint8), requires_grad=False)
        self.absmax = nn.Parameter(torch.empty(absmax, dtype=torch.uint8), requires_grad=False)
        self.absmax2 = nn.Parameter(torch.empty(absmax2, dtype=torch.float32), requires_grad=False)
        self.bias = nn.Parameter(torch.empty(out), requires_grad=False) if bias else None

    def forward(self, x):
        return NF4Linear.apply(x, self.packed, self.absmax, self.absmax2, self.shape, self.bias)


class Adapter(nn.Module):
    """PEFT's LoRA branch: ``lora_B(lora_A(dropout(x))) * scaling``."""

    def __init__(self, inp: int, out: int, lora: LoraRef):
        super().__init__()
        dtype = torch.float32 if lora.fp32_adapters else None
        self.lora_A = nn.Linear(inp, lora.rank, bias=False, dtype=dtype)
        self.lora_B = nn.Linear(lora.rank, out, bias=False, dtype=dtype)
        self.p, self.scaling = lora.dropout, lora.alpha / lora.rank

    def forward(self, x):
        if self.p:
            x = F.dropout(x, self.p)
        return self.lora_B(self.lora_A(x)) * self.scaling


def _adapted(base, adapter, x):
    """PEFT's ``Linear.forward``: the frozen base, plus the adapter's output where there is one, the input cast to
    the adapter's dtype and the sum back to the base's (copies only where the dtypes differ)."""
    return _plus(base(x), adapter, x)


def _plus(result, adapter, x):
    if adapter is None:
        return result
    dtype = result.dtype
    x = x.to(adapter.lora_A.weight.dtype)
    result = result + adapter(x)
    return result.to(dtype)


class LoraBlock(Block):
    """The LLaMA block with frozen projections (NF4 under QLoRA) and adapters on the targeted ones."""

    def __init__(self, c: RefConfig, lora: LoraRef):
        super().__init__(c)
        if c.style != "llama" or c.kernel != "sdpa" or c.tp != 1:
            raise ValueError("the LoRA reference is the LLaMA block with SDPA on one rank")
        self.lora = lora
        hd, kv = c.hd, c.kv_heads
        self.widths = {"q_proj": c.H * hd, "k_proj": kv * hd, "v_proj": kv * hd}
        shapes = {"q_proj": (c.d, c.H * hd), "k_proj": (c.d, kv * hd), "v_proj": (c.d, kv * hd),
                  "o_proj": (c.H * hd, c.d), "gate_proj": (c.d, c.F), "up_proj": (c.d, c.F), "down_proj": (c.F, c.d)}
        if lora.qlora:
            for name in ("qkv", "proj", "gate", "up", "down"):
                linear = getattr(self, name)
                setattr(self, name, QuantLinear(linear.in_features, linear.out_features, linear.bias is not None))
        self.adapters = nn.ModuleDict({t: Adapter(*shapes[t], lora) for t in lora.targets if t in shapes})

    def _adapter(self, target):
        return self.adapters[target] if target in self.adapters else None

    def _qkv(self, h):
        qkv = self.qkv(h)
        fused = [t for t in ("q_proj", "k_proj", "v_proj") if t in self.adapters]
        if not fused:
            return qkv
        parts = list(qkv.split(list(self.widths.values()), dim=-1))
        del qkv
        for i, t in enumerate(self.widths):
            if t in fused:
                parts[i] = _plus(parts[i], self.adapters[t], h)
        return torch.cat(parts, dim=-1)

    def forward(self, x, mask):
        c = self.c
        hd = c.hd
        H, kv = c.local_heads
        get = self._adapter
        qkv = self._qkv(self.norm1(x))
        B, S, _ = qkv.shape
        if c.kv_heads == c.H:
            q, k, v = qkv.view(B, S, 3, H, hd).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = qkv.split([H * hd, kv * hd, kv * hd], dim=-1)
            q, k, v = (t.view(B, S, -1, hd).transpose(1, 2) for t in (q, k, v))
        if c.recompute == "selective":          # the attention core under the checkpoint (Block.forward's)
            a = checkpoint(self._core, q, k, v, mask, use_reentrant=False)
        else:
            a = self._core(q, k, v, mask)
        x = x + _adapted(self.proj, get("o_proj"), a.transpose(1, 2).reshape(B, S, H * hd))
        h = self.norm2(x)
        return x + _adapted(self.down, get("down_proj"), F.silu(_adapted(self.gate, get("gate_proj"), h)) *
                            _adapted(self.up, get("up_proj"), h))


class LoraDecoder(Decoder):
    """The LLaMA decoder, frozen, with :class:`LoraBlock` blocks; its embedding's output requires grad."""

    def __init__(self, c: RefConfig, lora: LoraRef):
        super().__init__(c)
        self.lora = lora
        self.blocks = nn.ModuleList(LoraBlock(c, lora) for _ in range(c.L))
        self.head_adapter = Adapter(c.d, c.V, lora) if "lm_head" in lora.targets else None
        trainable = {id(p) for m in self.modules() if isinstance(m, Adapter) for p in m.parameters()}
        for module in self.modules():         # frozen tensors held as buffers: the same bytes (MemTracker
            for name, p in list(module._parameters.items()):      # hooks every parameter's gradient)
                if p is not None and id(p) not in trainable:
                    del module._parameters[name]
                    module.register_buffer(name, p.detach().requires_grad_(False))
        self.embed.register_forward_hook(lambda module, args, output: output.requires_grad_(True))

    def forward(self, ids):
        x = self.embed(ids)
        for block in self.blocks:
            x = checkpoint(block, x, None, use_reentrant=False) if self.c.recompute == "full" else block(x, None)
        h = self.norm(x)
        n = self.c.loss_chunks
        if n > 1:                   # torchtune's chunked_output (LitGPT's split): the head once per chunk
            chunks = h.split(h.shape[1] // n, dim=1) if self.c.loss_impl == "litgpt" else h.tensor_split(n, dim=1)
            return [_adapted(self.head, self.head_adapter, chunk) for chunk in chunks]
        return _adapted(self.head, self.head_adapter, h)


def make_lora_model(c: RefConfig, lora: LoraRef, loop: str) -> LoraDecoder:
    """The LoRA decoder in the loop's dtype (see :func:`memledger.pytorch.reference.make_model`)."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    before = torch.get_default_dtype()
    fp32 = loop == "fp32-adamw" and not lora.fp32_adapters       # FP32 adapters: a BF16 base, AdamW on them
    torch.set_default_dtype(torch.float32 if fp32 else torch.bfloat16)
    try:
        return LoraDecoder(c, lora)
    finally:
        torch.set_default_dtype(before)
