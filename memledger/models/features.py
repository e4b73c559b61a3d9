"""The discrete choices that decide which parameter and activation tensors a model has.

Plain Python (the command line imports it without SymPy). :mod:`memledger.models.parameters`
turns a :class:`Features` record into parameter formulas, :mod:`memledger.activations.inventory`
into saved tensors; :meth:`memledger.models.architecture.Architecture.features` reads it off
an architecture.
"""
from dataclasses import dataclass
from fractions import Fraction
from typing import NamedTuple, Union

from ..core.keyed import FormulaKey
from ..core.vocabulary import Style

__all__ = ["FAMILY_DEFAULTS", "STYLES", "Features", "ModelKey", "swiglu_width"]

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
    # model families (issue 16); a :attr:`key` names them only where set, so the older keys stay as they were
    parallel: bool = False        # attention and MLP read the block's input, one residual sum (GPT-NeoX, Phi)
    shared_norm: bool = False     # one norm feeds attention and MLP (Phi: input_layernorm only)
    head_bias: bool = False       # the LM head has a bias (Phi: lm_head.bias, V)
    alibi: bool = False           # ALiBi: a per-head linear bias on the scores, no position parameters (BLOOM)
    input_norm: bool = False      # a LayerNorm on the embeddings as well as the final one (BLOOM)
    gated: bool = None            # None: as the style says (llama gated, gpt not); T5 1.0: False, T5 1.1: True
    encoder_decoder: bool = False  # T5: L encoder blocks, L_dec decoder blocks with cross-attention
    relative_bias: bool = False   # T5: a bucketed relative-position bias, N_rb x H, in each stack's first block

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

    @property
    def is_gated(self) -> bool:
        """A gated MLP (three d x F matrices): LLaMA's SwiGLU, Gemma's GeGLU, T5 1.1's gated GeLU."""
        return not self.gpt if self.gated is None else self.gated

    @property
    def key(self) -> tuple:
        """The tuple a formula key carries: the first ten fields always, the families' fields only from the
        first one set on (so every key made before them is unchanged)."""
        values = tuple(self)
        defaults = tuple(FAMILY_DEFAULTS)
        tail = values[_BASE:]
        while tail and tail[-1] == defaults[len(tail) - 1]:
            tail = tail[:-1]
        return values[:_BASE] + tail



_BASE = 10
#: The defaults of the families' fields (after the first ten).
FAMILY_DEFAULTS = tuple(Features._field_defaults[name] for name in Features._fields[_BASE:])


@dataclass(frozen=True)
class ModelKey(FormulaKey):
    """The key of a formula of a model's tensors (:mod:`memledger.formulas`: ``"params"``, ``"active params"``,
    ``"largest unit"``, ``"projections"``, ``"working buffer"``): the formula's name, the model's
    :class:`Features` (or a style name, the style's own), and the formula's own choices written before them (the
    working buffer's bytes per element)."""
    formula: str
    features: Union[Features, str]
    before: tuple = ()

    def positional(self) -> tuple:
        """``(formula,) + before + features.key``, or ``(formula,) + before + (style,)`` for a style name."""
        f = self.features
        return (self.formula,) + self.before + ((f,) if isinstance(f, str) else f.key)


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
