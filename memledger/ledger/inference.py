"""Inference memory, for contrast with training: weights, the KV cache and a working buffer.

Serving keeps no gradients, no optimizer states and no activations for a
backward pass. What it keeps:

* weights: P parameters x bytes of the weight dtype (BF16: 2), split over tp;
* the KV cache: every layer keeps K and V for every token of every sequence,
  each B x S x H_kv x d_h: 2*L*B*S*H_kv*d_h*bytes (GQA-aware: H_kv key/value
  heads, not H; d*2*L*B*S*bytes for multi-head attention), split over tp;
* a working buffer, by this convention (stated, not measured): the transients
  of one layer's forward over the whole prompt (prefill, the largest step),
  with an attention kernel that materializes no S x S scores (FlashAttention):
  the layer's input and output (2BSd), Q, K, V and the attention output
  (BS(2q + 2kv)), the gated MLP's gate, up and product (3BSF; GeLU: 2BSF),
  all in the activation dtype, plus fp32 logits of the last position (4BV);
* the same runtime overhead as the training ledger (CUDA context, workspace).
"""
from dataclasses import dataclass
from functools import cached_property

import sympy as sp

from ..core.choices import check_count, lookup
from ..core.dtypes import BYTES_PER_ELEMENT, nbytes
from ..core.rows import Row, Rows
from .ledger import DEFAULT_OVERHEAD
from ..models.parameters import widths
from ..core.symbols import B, F, H_kv, L, S, V, d, d_h

__all__ = ["Inference", "kv_cache_expr", "working_expr"]

def kv_cache_expr(dtype_bytes=2) -> sp.Expr:
    """K and V of every layer, B x S x H_kv x d_h each: 2*L*B*S*H_kv*d_h*bytes."""
    per_layer = {"K": B * S * H_kv * d_h, "V": B * S * H_kv * d_h}
    return L * sum(per_layer.values()) * dtype_bytes


def working_expr(features, dtype_bytes=2) -> sp.Expr:
    """The working-buffer convention above, as a sum of its tensors."""
    q, kv = widths(features)
    gated = not features.gpt
    tensors = {"layer input and output": 2 * B * S * d, "Q, K, V, attention output": B * S * (2 * q + 2 * kv),
               "MLP intermediates": (3 if gated else 2) * B * S * F}
    return sum(tensors.values()) * dtype_bytes + B * V * 4


@dataclass(frozen=True)
class Inference:
    """Per-GPU memory of serving ``arch`` to ``batch_size`` sequences of ``seq_len`` tokens."""
    arch: object
    batch_size: int = 1
    seq_len: int = 2048
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 1
    overhead_bytes: int = DEFAULT_OVERHEAD

    def __post_init__(self):
        from ..models.architecture import Architecture
        from ..models.presets import get_preset
        arch = get_preset(self.arch) if isinstance(self.arch, str) else self.arch
        if not isinstance(arch, Architecture):
            raise TypeError(f"arch must be an Architecture or a preset name, got {self.arch!r}")
        object.__setattr__(self, "arch", arch)
        arch.check_modelled()
        for name in ("batch_size", "seq_len", "tp"):
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        object.__setattr__(self, "overhead_bytes", check_count("overhead_bytes", self.overhead_bytes, minimum=0))
        for name in ("weight_dtype", "kv_dtype"):           # whole bytes per element (no packed 4-bit types)
            lookup(BYTES_PER_ELEMENT, getattr(self, name), name)
        arch.check_tensor_parallel(self.tp)

    @cached_property
    def rows(self) -> Rows:
        """Weights, KV cache, working buffer and overhead per GPU (group "inference"), exact bytes."""
        a, values = self.arch, dict(self.arch.values, B=self.batch_size, S=self.seq_len)
        from ..core.exact import evaluate_expr
        kv, work = kv_cache_expr(nbytes(self.kv_dtype)), working_expr(a.features, nbytes(self.kv_dtype))
        sizes = [(f"weights ({self.weight_dtype})", -(-a.params * nbytes(self.weight_dtype) // self.tp),
                  f"ceiling(P*{nbytes(self.weight_dtype)}/t)"),
                 (f"KV cache ({self.kv_dtype})", evaluate_expr(kv, values) // self.tp, f"floor(({kv})/t)"),
                 ("working buffer (prefill, one layer)", -(-evaluate_expr(work, values) // self.tp),
                  f"ceiling(({work})/t)"),
                 ("CUDA context + workspace", self.overhead_bytes, "O")]
        return Rows(Row(name, "inference", "gpu", size, formula=formula) for name, size, formula in sizes)

    @property
    def weights(self) -> int:
        """The weights row: P x bytes of the weight dtype, split over tp (rounded up)."""
        return self.rows[0].bytes

    @property
    def total(self) -> int:
        return self.rows.total()

    def to_dict(self) -> dict:
        return {"inputs": {"batch_size": self.batch_size, "seq_len": self.seq_len, "weight_dtype": self.weight_dtype,
                           "kv_dtype": self.kv_dtype, "tp": self.tp, "overhead_bytes": self.overhead_bytes,
                           "n_params": self.arch.params, "n_kv_heads": self.arch.kv_heads,
                           "head_dim": self.arch.head_dim},
                "rows": [r.to_dict() for r in self.rows],
                "totals": {"gpu": self.total, "cpu": 0, "nvme": 0}}
