"""The discrete choices that decide which parameter and activation tensors a model has.

Plain Python (the command line imports it without SymPy). :mod:`memledger.models.parameters`
turns a :class:`Features` record into parameter formulas, :mod:`memledger.activations.inventory`
into saved tensors; :meth:`memledger.models.architecture.Architecture.features` reads it off
an architecture.
"""
from fractions import Fraction
from typing import NamedTuple

from ..core.vocabulary import Style

__all__ = ["STYLES", "Features", "swiglu_width"]

STYLES = tuple(s.value for s in Style)


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
    positions: bool = False       # learned positions (n_positions x d)
    token_types: bool = False     # BERT's segment embeddings (n_token_types x d)
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



def swiglu_width(d_model: int, multiple_of: int = 256, ffn_dim_multiplier=None) -> int:
    """LLaMA-1/2's SwiGLU width: 2/3 of 4d, optionally scaled, rounded up to a multiple.

    Meta's ``llama/model.py`` (``FeedForward.__init__``): ``hidden_dim = int(2 * 4d / 3)``;
    ``int(ffn_dim_multiplier * hidden_dim)`` if given; then rounded up to
    ``multiple_of``. 4096 -> 11008 (7B), 5120 -> 13824 (13B), 8192 with 1.3 and
    4096 -> 28672 (70B). Computed in exact rationals (no float rounding).
    """
    hidden = (2 * 4 * d_model) // 3
    if ffn_dim_multiplier is not None:
        hidden = int(Fraction(str(ffn_dim_multiplier)) * hidden)
    return -(-hidden // multiple_of) * multiple_of
