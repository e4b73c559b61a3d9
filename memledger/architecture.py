"""Transformer architectures: their parameter count, and the named presets.

Two block styles:

* ``"gpt"``: LayerNorm (weight + bias), biased Q/K/V/O and MLP linears,
  GeLU MLP of width F (4d in GPT), dropout; per layer 4d^2 + 2dF + F + 9d
  parameters, i.e. 12d^2 + 13d at F = 4d (Kaplan et al. 2020; Korthikanti
  et al. 2022). Tied input/output embedding Vd, optional learned positions.
* ``"llama"``: RMSNorm (weight only), no biases, SwiGLU MLP with three d x F
  matrices, untied embeddings, no dropout: L(4d^2 + 3dF + 2d) + 2Vd + d
  (Touvron et al. 2023).

Refinements a real checkpoint's ``config.json`` sets
(:meth:`Architecture.from_hf_config`): grouped-query attention
(``n_kv_heads``), a head size that is not d/H (``head_size``), tied or untied
embeddings, Q/K/V biases (Qwen2), learned token types, BERT's pooler and
embedding LayerNorm, encoder-only attention (``causal=False``), mixture of
experts (``n_experts``, ``top_k``). :attr:`Architecture.features` names the
choices; :mod:`memledger.parameters` derives the parts from them.
"""
from dataclasses import dataclass, field, fields, replace
from functools import cache

from .choices import check_choice, check_count, check_flag, lookup
from .features import STYLES, Features, swiglu_width
#: What each block style saves for backward: (MLP kind, norm) of :func:`memledger.activations.inventory`.
BLOCKS = {"gpt": ("gelu", "LayerNorm"), "llama": ("swiglu", "RMSNorm")}


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
    head_size: int = None         # the config's head_dim where it is not d_model // n_heads (Gemma-7B)
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
        check_choice("style", self.style, STYLES)
        counts = ("d_model", "n_layers", "n_heads") + (("d_ff",) if self.d_ff is not None else ()) + (
            "vocab_size",) + (("n_params",) if self.n_params is not None else ())
        for name in counts:
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        for name in ("n_positions", "n_token_types", "n_experts", "top_k"):
            object.__setattr__(self, name, check_count(name, getattr(self, name), minimum=0))
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        for name in ("tied_embeddings", "qkv_bias"):
            check_flag(name, getattr(self, name), allow_none=True)
        for name in ("pooler", "embedding_norm", "causal"):
            check_flag(name, getattr(self, name))
        if self.head_size is None:
            if self.d_model % self.n_heads:
                raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")
        else:
            object.__setattr__(self, "head_size", check_count("head_size", self.head_size))
        if self.n_kv_heads is not None:
            object.__setattr__(self, "n_kv_heads", check_count("n_kv_heads", self.n_kv_heads))
            if self.n_heads % self.n_kv_heads:
                raise ValueError(f"n_heads ({self.n_heads}) must be divisible by n_kv_heads ({self.n_kv_heads})")
        if (self.n_experts == 0) != (self.top_k == 0) or self.top_k > self.n_experts:
            raise ValueError(f"top_k ({self.top_k}) must be between 1 and n_experts ({self.n_experts}), "
                             "or both 0 for a dense MLP")
        if self.n_experts and self.style != "llama":
            raise ValueError("mixture of experts (n_experts > 0) needs the gated llama-style MLP (style='llama')")

    def __repr__(self):
        # the refinements of real checkpoints are shown only where set, so the article's models print as before
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.name not in _REFINEMENTS or getattr(self, f.name) != f.default]
        return f"Architecture({', '.join(shown)})"

    @property
    def dropout(self) -> bool:
        """GPT-style blocks train with dropout; LLaMA-style blocks do not."""
        return self.style == "gpt"

    @property
    def mlp(self) -> str:
        """The MLP kind the activation inventory saves tensors for: gelu or swiglu."""
        return BLOCKS[self.style][0]

    @property
    def norm(self) -> str:
        """The norm: LayerNorm (gpt) or RMSNorm (llama)."""
        return BLOCKS[self.style][1]

    def check_tensor_parallel(self, tp: int) -> None:
        """Megatron-LM splits heads, key/value heads and the MLP width over tp ranks:
        tp must divide d_model, n_heads, n_kv_heads (grouped-query attention) and d_ff."""
        widths = {"d_model": self.d_model, "n_heads": self.n_heads, "d_ff": self.d_ff}
        names = "d_model, n_heads and d_ff"
        if self.kv_heads != self.n_heads:
            widths = {"d_model": self.d_model, "n_heads": self.n_heads, "n_kv_heads": self.kv_heads,
                      "d_ff": self.d_ff}
            names = "d_model, n_heads, n_kv_heads (the key/value heads) and d_ff"
        bad = [f"{name} ({value})" for name, value in widths.items() if value % tp]
        if bad:
            raise ValueError(f"tp ({tp}) must divide {names}; it does not divide {', '.join(bad)}")

    check_tp = check_tensor_parallel

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or ``n_heads`` for multi-head attention."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def features(self) -> Features:
        """The discrete choices that decide the parameter and activation formulas."""
        return Features(self.style, self.kv_heads != self.n_heads, self.head_dim * self.n_heads != self.d_model,
                        self.tied_embeddings, self.qkv_bias, self.n_positions > 0, self.n_token_types > 0,
                        self.pooler, self.embedding_norm, self.n_experts > 0)

    @property
    def values(self) -> dict:
        """Symbol name -> value for every shape symbol a formula of this architecture may contain."""
        return {"d": self.d_model, "L": self.n_layers, "H": self.n_heads, "F": self.d_ff, "V": self.vocab_size,
                "H_kv": self.kv_heads, "d_h": self.head_dim, "E": max(self.n_experts, 1), "k": max(self.top_k, 1),
                "n_positions": self.n_positions, "n_token_types": self.n_token_types}

    def evaluate(self, expr) -> int:
        """Any SymPy formula at this architecture's shape, as an exact int."""
        from .formulas import evaluate_expr
        return evaluate_expr(expr, self.values)

    @property
    def head_dim(self) -> int:
        """Per-head size: ``head_size`` if the config gives one, else d/H."""
        return self.d_model // self.n_heads if self.head_size is None else self.head_size

    @property
    def computed_params(self) -> int:
        """The parameter count from the architecture (ignores ``n_params``)."""
        from .formulas import evaluate
        return evaluate(("params",) + tuple(self.features), self.values)

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: k of the E experts (= ``computed_params`` if dense)."""
        from .formulas import evaluate
        return evaluate(("active params",) + tuple(self.features), self.values) if self.n_experts \
            else self.computed_params

    @property
    def params(self) -> int:
        """The count the ledger uses: ``n_params`` if given, else the computed one."""
        return self.n_params if self.n_params is not None else self.computed_params

    def parts(self) -> dict:
        """Parameters by part (attention, MLP, norms, embeddings, ...) as exact ints."""
        from .parameters import param_parts
        return {name: self.evaluate(expr) for name, expr in param_parts(self.features).items()}

    @property
    def largest_layer_params(self) -> int:
        """Parameters of the largest single module (a block or the embedding)."""
        from .parameters import block_params_expr
        return max(self.evaluate(block_params_expr(self.features)), self.vocab_size * self.d_model)

    def with_changes(self, **changes) -> "Architecture":
        """A copy with fields changed; a changed shape drops the nominal ``n_params``."""
        if set(changes) - {"n_params", "description"} and "n_params" not in changes:
            changes["n_params"] = None
        return replace(self, **changes)

    @classmethod
    def from_hf_config(cls, config, description: str = "") -> "Architecture":
        """The architecture a Hugging Face ``config.json`` describes (a path or a dict), read offline.

        Supported ``model_type``: :data:`memledger.hf_config.SUPPORTED`.
        """
        from .hf_config import architecture_kwargs, load_config
        return cls(**architecture_kwargs(load_config(config)), description=description)


def __getattr__(name):
    # the symbolic helpers live in memledger.parameters (SymPy); this module stays importable without it
    if name in ("block_parts", "block_params_expr", "param_parts", "param_count_expr"):
        from . import parameters
        return getattr(parameters, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


_REFINEMENTS = ("n_kv_heads", "head_size", "tied_embeddings", "qkv_bias", "n_token_types", "pooler",
                "embedding_norm", "causal", "n_experts", "top_k", "model_type")


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
#: The article's own model: the default of every interactive view.
ARTICLE_PRESET = "article-7b"


def preset_names() -> list:
    """Every preset's name: the hand-entered ones, then the shipped configs' (read from their index only)."""
    from .hf_config import shipped_configs
    return list(PRESETS) + [name for name in shipped_configs() if name not in PRESETS]


@cache
def config_presets() -> dict:
    """Presets read from the Hugging Face config.json files shipped in ``memledger/configs/``
    (kept apart from the hand-entered :data:`PRESETS` the book's chapters tabulate); read on first use."""
    from .hf_config import shipped_presets
    return {name: arch for name, arch in shipped_presets().items() if name not in PRESETS}


def all_presets() -> dict:
    """Every preset: the hand-entered ones, then those from shipped configs."""
    return {**PRESETS, **config_presets()}


def get_preset(name: str) -> Architecture:
    """The preset called ``name`` (hand-entered or from a shipped config); ``ValueError`` listing the known ones."""
    if isinstance(name, str) and name in PRESETS:
        return PRESETS[name]
    return lookup(all_presets(), name, "preset")
