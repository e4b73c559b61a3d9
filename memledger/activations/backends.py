"""Backend conventions: what a kernel keeps, said out loud instead of assumed.

The same model keeps different tensors on different backends. Each switch
below is one such difference; :data:`BACKENDS` bundles them. ``"article"``
(the default everywhere) reproduces the article and Korthikanti et al. (2022):
1-byte dropout masks, norm statistics not booked, eager attention.

* ``dropout_mask``: ``"bool"``, the fused CUDA kernel (``native_dropout``,
  ATen ``aten/src/ATen/native/cuda/Dropout.cu``) keeps a 1-byte mask;
  ``"activation"``, the CPU path of ``F.dropout`` (``_dropout_impl`` in
  ``aten/src/ATen/native/Dropout.cpp``: ``input * noise`` with ``noise``
  ``empty_like(input)``) keeps it in the activation dtype. Measured: PyTorch 2.13 CPU.
* ``norm_stats``: LayerNorm's per-token mean and rstd (and RMSNorm's rstd):
  ``None`` (not booked), ``"activation"`` (CPU: ``layer_norm_cpu`` allocates
  them like the input, measured) or ``"fp32"`` (CUDA: ``layer_norm_cuda``
  allocates them in the accumulate type, ATen ``layer_norm_kernel.cu``).
* ``rmsnorm``: ``"fused"`` (``_fused_rms_norm``: input + FP32 rstd, CUDA) or
  ``"composite"`` (CPU: ``nn.RMSNorm`` decomposes into FP32 ops; measured).
* ``attention``: ``"eager"`` for every style, or ``"reference"``: GPT blocks
  eager, LLaMA blocks ``F.scaled_dot_product_attention`` (:mod:`memledger.pytorch.reference`). SDPA
  runs a flash kernel (q, k, v, output, FP32 log-sum-exp) except on CPU with
  dropout, where it falls back to the math kernel (FP32 upcasts).
* ``step_counters``: Adam's per-tensor ``step`` (a 0-d FP32 tensor per
  parameter tensor, ``torch/optim/adam.py`` ``_init_group``): ``None`` (not
  booked), ``"device"`` (CPU runs: on the parameters' device) or ``"host"``
  (CUDA, not capturable, not fused: ``torch.tensor(0.0)`` lives on the CPU).
* ``foreach``: ``torch.optim.AdamW(foreach=...)``: ``False`` keeps two
  temporaries of one parameter at a time; ``True`` one for the whole group.
  ``AdamW()`` with neither ``foreach`` nor ``fused`` given runs foreach when
  every parameter is on a device with foreach kernels, CUDA but not the CPU
  (``torch/optim/optimizer.py`` ``_default_to_fused_or_foreach``, called from
  ``adam()`` in ``torch/optim/adam.py``; ``torch/utils/_foreach_utils.py``
  ``_get_foreach_kernels_supported_devices``; PyTorch 2.13.0): ``True`` under
  ``"cuda"``, ``False`` under ``"cpu"`` (measured) and the article's.
* ``packing``: packed documents (``Ledger(packed=n)``, :mod:`memledger.step.packing`): ``"mask"`` (CPU: SDPA
  with a (B, 1, S, S) boolean block-causal mask, which ATen's ``convert_boolean_attn_mask`` turns into an
  additive mask in q's dtype at every call and the flash kernel saves; measured) or ``"varlen"`` (CUDA:
  flash-attention's varlen kernel with ``cu_seqlens``, no mask; Hugging Face's
  ``prepare_fa_kwargs_from_position_ids``); ``None``: not modelled (the article's eager core).
* FP16 autocast's weight cache (recipe ``fp16-amp-adamw``, :mod:`memledger.step.amp`) is no switch: ATen's
  ``cached_cast`` (``aten/src/ATen/autocast_mode.cpp``) caches a weight's FP16 cast on every device type, and
  the CPU's (measured) is CUDA's.
* ``fused``: ``AdamW(fused=True)`` / ``SGD(fused=True)``: one kernel updates every tensor in place, no
  temporaries (measured on the CPU kernel; ``torch._fused_adamw_``), Adam's ``step`` on the parameters'
  device (``torch/optim/adam.py`` ``_init_group``); excludes ``foreach`` (:mod:`memledger.step.optim`).
"""
from dataclasses import dataclass, replace

from ..core.choices import check_choice

__all__ = ["ATTENTIONS", "BACKENDS", "COUNTERS", "MASKS", "PACKINGS",
           "RMSNORMS", "STATS", "SWITCHES", "Backend", "get_backend",
           "conventions_table"]

MASKS = ("bool", "activation")
STATS = (None, "activation", "fp32")
RMSNORMS = ("fused", "composite")
ATTENTIONS = ("eager", "reference")
COUNTERS = (None, "device", "host")
PACKINGS = (None, "mask", "varlen")


@dataclass(frozen=True)
class Backend:
    """One backend's conventions (see the module docstring for each field)."""
    name: str = "article"
    dropout_mask: str = "bool"
    norm_stats: str = None
    rmsnorm: str = "fused"
    attention: str = "eager"
    step_counters: str = None
    foreach: bool = False
    cpu: bool = False            # SDPA with dropout falls back to the math kernel
    fused: bool = False          # AdamW(fused=True) / SGD(fused=True): one kernel, no temporaries
    packing: str = None          # packed documents: "mask" (SDPA's block-causal mask) or "varlen" (cu_seqlens)

    def __post_init__(self):
        check_choice("dropout_mask", self.dropout_mask, MASKS)
        check_choice("norm_stats", self.norm_stats, STATS)
        check_choice("rmsnorm", self.rmsnorm, RMSNORMS)
        check_choice("attention", self.attention, ATTENTIONS)
        check_choice("step_counters", self.step_counters, COUNTERS)
        if not isinstance(self.foreach, bool):
            raise ValueError(f"foreach must be True or False, got {self.foreach!r}")
        if not isinstance(self.fused, bool):
            raise ValueError(f"fused must be True or False, got {self.fused!r}")
        check_choice("packing", self.packing, PACKINGS)
        if self.fused and self.foreach:
            raise ValueError("fused and foreach exclude each other: give foreach=False with fused=True")

    def kernel(self, style: str, dropout: bool, flash_attention: bool = False) -> str:
        """The attention kernel a block runs: ``"eager"``, ``"flash"`` or ``"math"``."""
        if flash_attention:
            return "flash"
        if self.attention == "eager" or style == "gpt":
            return "eager"
        return "math" if (self.cpu and dropout) else "flash"

    def inventory_options(self, style: str, dtype: str, dropout: bool, flash_attention: bool = False) -> dict:
        """Keyword arguments of :func:`memledger.activations.inventory.inventory` (and ``outside_inventory``)."""
        stats = {"activation": dtype, "fp32": "fp32", None: None}[self.norm_stats]
        return dict(dtype=dtype, mask_dtype="bool" if self.dropout_mask == "bool" else dtype,
                    norm_stats=stats, rmsnorm=self.rmsnorm, attention=self.kernel(style, dropout, flash_attention))


#: What each switch models and where it is read from (one line each, for tables; details above).
SWITCHES = {
    "dropout_mask": "a dropout mask's dtype: 1-byte bool (native_dropout, CUDA's fused kernel) or the "
                    "activation dtype (CPU F.dropout, measured)",
    "norm_stats": "LayerNorm's per-token mean and rstd: not booked, the activation dtype (CPU, measured) or "
                  "FP32 (CUDA, ATen layer_norm_kernel.cu)",
    "rmsnorm": "RMSNorm: fused (input + FP32 rstd, _fused_rms_norm) or composite (FP32 input copy, FP32 x*rstd, "
               "CPU, measured)",
    "attention": "the attention kernel: eager (S x S scores kept) or the reference's SDPA for LLaMA blocks "
                 "(a flash kernel: q, k, v, output, FP32 log-sum-exp)",
    "step_counters": "Adam's per-tensor step: not booked, on the parameters' device (CPU runs) or on the host "
                     "(CUDA, torch/optim/adam.py)",
    "foreach": "AdamW(foreach=...): temporaries of one parameter at a time, or of the whole group (AdamW()'s "
               "default on CUDA, torch/optim/optimizer.py _default_to_fused_or_foreach)",
}

BACKENDS = {
    "article": Backend(),
    "cuda": Backend("cuda", "bool", "fp32", "fused", "reference", "host", foreach=True, packing="varlen"),
    "cpu": Backend("cpu", "activation", "activation", "composite", "reference", "device", cpu=True, packing="mask"),
}


def get_backend(backend="article", **changes) -> Backend:
    """The named backend's conventions, with any field changed (``get_backend("cuda", foreach=True)``)."""
    if isinstance(backend, Backend):
        base = backend
    else:
        check_choice("backend", backend, tuple(BACKENDS))
        base = BACKENDS[backend]
    return replace(base, **changes) if changes else base


def conventions_table(names=("article", "cuda", "cpu")):
    """Every switch, its value under each named backend, and what it models (a
    :class:`memledger.core.table.Table`)."""
    from ..core.table import Table
    chosen = [get_backend(n) for n in names]
    show = lambda v: "not booked" if v is None else str(v)            # noqa: E731
    return Table(("switch",) + tuple(names) + ("what it models",),
                 [(field,) + tuple(show(getattr(c, field)) for c in chosen) + (SWITCHES[field],)
                  for field in SWITCHES])
