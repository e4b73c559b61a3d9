"""Parameter counts, derived part by part from the tensors a transformer holds.

Each part is a sum of weight and bias shapes, in the symbols of
:mod:`memledger.symbols`; the whole count is their sum, never a typed total.
What decides which tensors exist is a :class:`Features` record (discrete
choices, read from a ``config.json`` by :mod:`memledger.hf_config`):

* attention: Q and O of width ``q`` = d (or H*d_h where the config gives a
  head size, as Gemma-7B does), K and V of width ``kv`` = q*H_kv/H
  (grouped-query; H_kv = 1 is multi-query, Shazeer 2019; Ainslie et al. 2023);
  biases on all four (GPT-2, BERT) or on Q, K, V only (Qwen2);
* MLP: GeLU, two d x F matrices with biases (GPT-2, BERT), or gated
  (SwiGLU/GeGLU), three bias-free d x F matrices (LLaMA, Mistral, Gemma);
  mixture of experts: E gated MLPs and a bias-free d x E router (Mixtral);
* norms: LayerNorm (weight and bias, 2d) or RMSNorm (weight, d);
* embeddings: tokens Vd, an untied output layer another Vd, learned positions
  and token types (GPT-2, BERT); BERT's pooler d^2 + d and its embedding
  LayerNorm in place of a final one.

At the defaults (``Features("gpt")``, ``Features("llama")``) this is
12d^2 + 13d per GPT block at F = 4d and L(4d^2 + 3dF + 2d) + 2Vd + d for
LLaMA (Touvron et al. 2023), as before. Megatron-LM's
``compute_weight_and_optimizer_memory`` (``megatron/training/theoretical_memory_usage.py``)
gives the same grouped-query and MoE attention/MLP terms but omits the router.
"""
from typing import NamedTuple

import sympy as sp

from .symbols import E, F, H, H_kv, L, V, d, d_h, k

STYLES = ("gpt", "llama")


class Features(NamedTuple):
    """The discrete choices that decide which parameter tensors exist.

    ``style``: "gpt" (LayerNorm, biased linears, GeLU MLP, tied embeddings) or
    "llama" (RMSNorm, no biases, gated MLP, untied); the other fields
    override or extend it. ``None`` means "as the style says".
    """
    style: str = "gpt"
    gqa: bool = False             # K/V at H_kv heads
    head_dim: bool = False        # head size d_h given (not d/H)
    tied: bool = None
    qkv_bias: bool = None
    n_positions: int = 0          # learned positions (a number: the table's rows)
    n_token_types: int = 0
    pooler: bool = False
    embedding_norm: bool = False  # BERT: LayerNorm on the embeddings, none at the end
    moe: bool = False

    @classmethod
    def of(cls, value) -> "Features":
        """``Features`` from itself or a style name (the old ``style`` arguments)."""
        if isinstance(value, cls):
            return value
        if value not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {value!r}")
        return cls(style=value)

    @property
    def gpt(self) -> bool:
        return self.style == "gpt"

    @property
    def is_tied(self) -> bool:
        return self.gpt if self.tied is None else self.tied

    @property
    def has_qkv_bias(self) -> bool:
        return self.gpt if self.qkv_bias is None else self.qkv_bias


def widths(features) -> tuple:
    """(q, kv): the widths of the Q (and O) and of the K and V projections."""
    f = Features.of(features)
    q = H * d_h if f.head_dim else d
    kv = (H_kv * d_h if f.head_dim else H_kv * d / H) if f.gqa else q
    return q, kv


def norm_params(features) -> sp.Expr:
    """One norm: LayerNorm weight + bias 2d, RMSNorm weight d."""
    return 2 * d if Features.of(features).gpt else d


def block_parts(features="gpt", experts=E) -> dict:
    """Parameters of one block by part.

    gpt:   attention 4d^2 + 4d (Q, K, V, O with biases), MLP 2dF + F + d, two LayerNorms 4d.
    llama: attention 4d^2, gated MLP 3dF (gate, up, down), two RMSNorms 2d.
    GQA: K and V are d x kv; MoE: ``experts`` gated MLPs (E; k for the active
    count), plus a router d x E under the name "router".
    """
    f = Features.of(features)
    q, kv = widths(f)
    attention = 2 * d * q + 2 * d * kv
    if f.has_qkv_bias:
        attention += q + 2 * kv
    if f.gpt:
        attention += d                                  # output-projection bias
    mlp = 2 * d * F + F + d if f.gpt else 3 * d * F
    parts = {"attention": attention, "MLP": experts * mlp if f.moe else mlp, "norms": 2 * norm_params(f)}
    if f.moe:
        parts["router"] = d * E
    return parts


def block_params_expr(features="gpt") -> sp.Expr:
    """Parameters of one transformer block: 12d^2 + 13d for gpt at F = 4d."""
    return sum(block_parts(features).values())


def param_parts(features="gpt", n_positions: int = None, experts=E) -> dict:
    """Whole-model parameters by part: L blocks, the final norm, the embeddings (and BERT's pooler).

    gpt:   tied embedding Vd (+ learned positions), final LayerNorm 2d.
    llama: untied input and output embeddings 2Vd, final RMSNorm d.
    ``n_positions`` (old signature) overrides ``features.n_positions``.
    """
    f = Features.of(features)
    if n_positions is not None:
        f = f._replace(n_positions=n_positions)
    parts = {name: L * expr for name, expr in block_parts(f, experts).items()}
    parts["norms"] += norm_params(f)                  # final norm, or BERT's embedding LayerNorm
    parts["embeddings"] = (V * d * (1 if f.is_tied else 2) + f.n_positions * d + f.n_token_types * d)
    if f.pooler:
        parts["pooler"] = d**2 + d
    return parts


def param_count_expr(features="gpt", n_positions: int = None) -> sp.Expr:
    """Whole-model parameter count.

    gpt:   L(4d^2 + 2dF + F + 9d) + Vd + n_positions*d + 2d = 12Ld^2 + 13Ld + Vd + ... at F = 4d.
    llama: L(4d^2 + 3dF + 2d) + 2Vd + d (Touvron et al. 2023).
    """
    return sum(param_parts(features, n_positions).values())


def active_param_count_expr(features) -> sp.Expr:
    """Parameters one token passes through: k of the E experts (the router stays whole)."""
    return sum(param_parts(features, experts=k).values())


def swiglu_width(d_model: int, multiple_of: int = 256, ffn_dim_multiplier=None) -> int:
    """LLaMA-1/2's SwiGLU width: 2/3 of 4d, optionally scaled, rounded up to a multiple.

    Meta's ``llama/model.py`` (``FeedForward.__init__``): ``hidden_dim = int(2 * 4d / 3)``;
    ``int(ffn_dim_multiplier * hidden_dim)`` if given; then rounded up to
    ``multiple_of``. 4096 -> 11008 (7B), 5120 -> 13824 (13B), 8192 with 1.3 and
    4096 -> 28672 (70B). Computed in exact rationals (no float rounding).
    """
    from fractions import Fraction
    hidden = (2 * 4 * d_model) // 3
    if ffn_dim_multiplier is not None:
        hidden = int(Fraction(str(ffn_dim_multiplier)) * hidden)
    return -(-hidden // multiple_of) * multiple_of
