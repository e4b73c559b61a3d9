"""What serving keeps besides the weights (:mod:`memledger.ledger.inference`): the KV cache and the prefill's
working buffer, as SymPy expressions (compiled for the command line by :mod:`memledger.formulas`).

* KV cache: every layer keeps K and V for every token of every sequence, each B x S x H_kv x d_h:
  2*L*B*S*H_kv*d_h*bytes (grouped-query aware).
* Working buffer, a stated convention (not measured; the op-by-op prefill is :mod:`memledger.step.prefill`):
  one layer's forward over the whole prompt with no S x S scores: input and output 2BSd, Q, K, V and the
  attention output BS(2q + 2kv), the MLP's gate, up and product 3BSF (GeLU: 2BSF), in the activation dtype,
  plus the last position's FP32 logits 4BV.
"""
import sympy as sp

from ..core.symbols import B, F, H_kv, L, S, V, d, d_h
from ..models.parameters import widths

__all__ = ["kv_cache_expr", "working_expr"]


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
