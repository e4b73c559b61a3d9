"""Transformer architectures: their shape, their parameter count, and the named presets.

Two block styles, refined by the fields a real checkpoint's ``config.json``
sets (:meth:`Architecture.from_hf_config`):

* ``"gpt"``: LayerNorm (weight + bias), biased Q/K/V/O and MLP linears,
  GeLU MLP of width F (4d in GPT), dropout; per layer 4d^2 + 2dF + F + 9d
  parameters, i.e. 12d^2 + 13d at F = 4d (Kaplan et al. 2020; Korthikanti
  et al. 2022). Tied input/output embedding Vd, optional learned positions.
* ``"llama"``: RMSNorm (weight only), no biases, SwiGLU MLP with three d x F
  matrices, untied embeddings, no dropout: L(4d^2 + 3dF + 2d) + 2Vd + d
  (Touvron et al. 2023).

Refinements: grouped-query attention (``n_kv_heads``), a head size that is not
d/H (``head_size``), tied or untied embeddings, Q/K/V biases (Qwen2), learned
token types, BERT's pooler and embedding LayerNorm, encoder-only attention
(``causal=False``), mixture of experts (``n_experts``, ``top_k``). The parts
are derived in :mod:`memledger.parameters`.
"""
from dataclasses import dataclass, field, replace

import sympy as sp

from .parameters import (
    STYLES,
    Features,
    active_param_count_expr,
    block_params_expr,
    block_parts,  # noqa: F401  (re-exported: the old home of these helpers)
    param_count_expr,
    param_parts,
    swiglu_width,
)
from .symbols import E, F, H, H_kv, L, V, d, d_h, k


@dataclass(frozen=True)
class Architecture:
    """A transformer. ``n_params`` overrides the computed count
    (the article works with a nominal 7x10^9)."""
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int = None
    vocab_size: int = 32000
    style: str = "gpt"
    n_positions: int = 0          # learned position embeddings (GPT-2/3, BERT); 0 for RoPE
    n_params: int = None
    description: str = field(default="", compare=False)
    n_kv_heads: int = None        # None: n_heads (multi-head); 1: multi-query
    head_size: int = None         # config's head_dim where it is not d_model // n_heads (Gemma-7B)
    tied_embeddings: bool = None  # None: as the style says (gpt tied, llama untied)
    qkv_bias: bool = None         # None: as the style says (gpt yes, llama no)
    n_token_types: int = 0        # BERT's segment embeddings (2)
    pooler: bool = False          # BERT's pooler (d^2 + d)
    embedding_norm: bool = False  # BERT: LayerNorm on the embeddings instead of a final norm
    causal: bool = True           # False: encoder-only (BERT), no causal mask
    n_experts: int = 0            # 0: dense MLP; Mixtral: 8
    top_k: int = 0                # experts per token (Mixtral: 2)
    model_type: str = field(default="", compare=False)   # the config.json's model_type, where read from one

    def __post_init__(self):
        if self.style not in STYLES:
            raise ValueError(f"style must be one of {', '.join(STYLES)}, got {self.style!r}")
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        for name in ("d_model", "n_layers", "n_heads", "d_ff", "vocab_size"):
            _check_positive(name, getattr(self, name))
        for name in ("n_positions", "n_token_types", "n_experts", "top_k"):
            _check_positive(name, getattr(self, name), allow_zero=True)
        for name in ("tied_embeddings", "qkv_bias"):
            if getattr(self, name) not in (None, True, False):
                raise ValueError(f"{name} must be True, False or None, got {getattr(self, name)!r}")
        for name in ("pooler", "embedding_norm", "causal"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.n_params is not None:
            _check_positive("n_params", self.n_params)
        if self.head_size is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        else:
            _check_positive("head_size", self.head_size)
        if self.n_kv_heads is not None:
            _check_positive("n_kv_heads", self.n_kv_heads)
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        if (self.n_experts == 0) != (self.top_k == 0) or self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be between 1 and n_experts ({self.n_experts}), "
                             "or both 0 for a dense MLP")
        if self.n_experts and self.style != "llama":
            raise ValueError("mixture of experts (n_experts > 0) needs the gated llama-style MLP (style='llama')")

    @property
    def dropout(self) -> bool:
        """GPT-style blocks train with dropout; LLaMA-style blocks do not."""
        return self.style == "gpt"

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or ``n_heads`` for multi-head attention."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def head_dim(self) -> int:
        """Per-head size: ``head_size`` if the config gives one, else d/H."""
        return self.d_model // self.n_heads if self.head_size is None else self.head_size

    @property
    def features(self) -> Features:
        """The discrete choices that decide the parameter and activation formulas."""
        return Features(self.style, self.kv_heads != self.n_heads, self.head_dim * self.n_heads != self.d_model,
                        self.tied_embeddings, self.qkv_bias, self.n_positions, self.n_token_types, self.pooler,
                        self.embedding_norm, self.n_experts > 0)

    @property
    def mlp(self) -> str:
        """The MLP kind for :func:`memledger.activations.inventory`: "gelu" or "swiglu" (gated)."""
        return "gelu" if self.style == "gpt" else "swiglu"

    @property
    def norm(self) -> str:
        return "LayerNorm" if self.style == "gpt" else "RMSNorm"

    def bindings(self) -> dict:
        """Symbol -> value for every shape symbol a formula of this architecture may contain."""
        return {d: self.d_model, L: self.n_layers, H: self.n_heads, F: self.d_ff, V: self.vocab_size,
                H_kv: self.kv_heads, d_h: self.head_dim, E: max(self.n_experts, 1), k: max(self.top_k, 1)}

    def evaluate(self, expr) -> int:
        """``expr`` at this architecture's shape, as an exact int."""
        value = sp.sympify(expr).subs(self.bindings())
        if not (value.is_Integer):
            raise ValueError(f"{expr} does not evaluate to a whole number at this shape (got {value})")
        return int(value)

    @property
    def computed_params(self) -> int:
        """The parameter count from the architecture (ignores ``n_params``)."""
        return self.evaluate(param_count_expr(self.features))

    @property
    def active_params(self) -> int:
        """Parameters one token passes through (= ``computed_params`` for a dense model)."""
        return self.evaluate(active_param_count_expr(self.features)) if self.n_experts else self.computed_params

    @property
    def params(self) -> int:
        """The count the ledger uses: ``n_params`` if given, else the computed one."""
        return self.n_params if self.n_params is not None else self.computed_params

    def parts(self) -> dict:
        """Parameters by part (attention, MLP, norms, embeddings, ...) as exact ints."""
        return {name: self.evaluate(expr) for name, expr in param_parts(self.features).items()}

    @property
    def largest_layer_params(self) -> int:
        """Parameters of the largest single module (a block or the embedding)."""
        return max(self.evaluate(block_params_expr(self.features)), self.vocab_size * self.d_model)

    def check_tp(self, tp: int) -> None:
        """``ValueError`` unless tensor parallelism ``tp`` divides the hidden size, the heads,
        the key/value heads and the MLP width (Megatron-LM splits each of them tp ways)."""
        sizes = {"d_model": self.d_model, "n_heads": self.n_heads, "n_kv_heads": self.kv_heads, "d_ff": self.d_ff}
        bad = [f"{name} ({n})" for name, n in sizes.items() if n % tp]
        if bad:
            raise ValueError(f"tp ({tp}) must divide d_model ({self.d_model}), n_heads ({self.n_heads}), "
                             f"n_kv_heads ({self.kv_heads}) and d_ff ({self.d_ff}); it does not divide "
                             + ", ".join(bad))

    def with_changes(self, **changes) -> "Architecture":
        """A copy with fields changed; a changed shape drops the nominal ``n_params``."""
        if set(changes) - {"n_params", "description"} and "n_params" not in changes:
            changes["n_params"] = None
        return replace(self, **changes)

    @classmethod
    def from_hf_config(cls, config, description: str = "") -> "Architecture":
        """The architecture a Hugging Face ``config.json`` describes (a path or a dict), read offline.

        Supported ``model_type``: see :data:`memledger.hf_config.SUPPORTED`.
        """
        from .hf_config import architecture_kwargs, load_config
        return cls(**architecture_kwargs(load_config(config)), description=description)


def _check_positive(name, value, allow_zero=False):
    ok = isinstance(value, int) and not isinstance(value, bool) and (value >= 0 if allow_zero else value > 0)
    if not ok:
        kind = "a non-negative" if allow_zero else "a positive"
        raise ValueError(f"{name} must be {kind} integer, got {value!r}")


PRESETS = {
    "article-7b": Architecture(4096, 32, 32, 16384, 32000, "gpt", n_params=7 * 10**9,
        description="the article's spec (d 4096, L 32, H 32, d_ff 4d), nominal 7x10^9 "
                    "parameters; vocabulary not given there, LLaMA-2's 32000 assumed for the count"),
    "llama2-7b": Architecture(4096, 32, 32, swiglu_width(4096), 32000, "llama",
        description="LLaMA-2 7B (Touvron et al. 2023): SwiGLU, RMSNorm, untied embeddings"),
    "llama2-13b": Architecture(5120, 40, 40, swiglu_width(5120), 32000, "llama",
        description="LLaMA-2 13B (Touvron et al. 2023)"),
    "gpt2": Architecture(768, 12, 12, 3072, 50257, "gpt", n_positions=1024,
        description="GPT-2 small (Radford et al. 2019), 124M"),
    "gpt3-175b": Architecture(12288, 96, 96, 49152, 50257, "gpt", n_positions=2048,
        description="GPT-3 175B (Brown et al. 2020)"),
    "megatron-22b": Architecture(6144, 48, 64, 24576, 51200, "gpt",
        description="Korthikanti et al. 2022, Table 3, 22B"),
    "mt-nlg-530b": Architecture(20480, 105, 128, 81920, 51200, "gpt",
        description="Korthikanti et al. 2022, Table 3, 530B (MT-NLG)"),
    "megatron-1t": Architecture(25600, 128, 160, 102400, 51200, "gpt",
        description="Korthikanti et al. 2022, Table 3, 1T"),
}


def _add_config_presets():
    from .hf_config import shipped_presets
    for name, arch in shipped_presets().items():
        PRESETS.setdefault(name, arch)


_add_config_presets()


def get_preset(name: str) -> Architecture:
    """The preset called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(PRESETS)}") from None
