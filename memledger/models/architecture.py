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
choices; :mod:`memledger.models.parameters` derives the parts from them.
"""
from dataclasses import dataclass, field, fields, replace

from ..core import keyed
from ..core.choices import check_choice, check_count, check_flag
from ..core.vocabulary import Norm, Style
from .features import STYLES, Features, ModelKey

__all__ = ["BLOCKS", "Architecture"]
#: What each block style saves for backward: (MLP kind, norm) of :func:`memledger.activations.inventory.inventory`.
BLOCKS = {Style.GPT.value: ("gelu", Norm.LAYERNORM.value), Style.LLAMA.value: ("swiglu", Norm.RMSNORM.value)}


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
    # model families (issue 16): memledger.models.hf_config reads them from gpt_neox, phi, bloom, gpt_bigcode, t5
    parallel: bool = False        # attention and MLP both read the block input (GPT-NeoX use_parallel_residual, Phi)
    shared_norm: bool = False     # one norm per block feeds both (Phi)
    head_bias: bool = False       # the LM head has a bias (Phi)
    alibi: bool = False           # ALiBi attention biases instead of positions (BLOOM)
    input_norm: bool = False      # a LayerNorm on the embeddings and a final one (BLOOM)
    gated: bool = None            # None: as the style says; T5 1.0's ReLU MLP False, T5 1.1's gated GeLU True
    n_decoder_layers: int = 0     # T5: decoder blocks (self- and cross-attention) after n_layers encoder blocks
    relative_buckets: int = 0     # T5: relative_attention_num_buckets (an N_rb x H bias per stack)
    rotary_fraction: float = None  # the share of each head RoPE rotates (GPT-NeoX rotary_pct, Phi partial_rotary_factor)
    no_dropout: bool = False      # every dropout probability of the config is 0 (Pythia, BLOOM)
    attention_dropout: bool = True  # with dropout, the attention probabilities' dropout runs (p > 0); False: Phi-2's
    #                                 attention_dropout 0.0 beside resid_pdrop 0.1 (ATen's dropout returns its input)

    def __post_init__(self):
        check_choice("style", self.style, STYLES)
        counts = ("d_model", "n_layers", "n_heads") + (("d_ff",) if self.d_ff is not None else ()) + (
            "vocab_size",) + (("n_params",) if self.n_params is not None else ())
        for name in counts:
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        for name in ("n_positions", "n_token_types", "n_experts", "top_k", "n_decoder_layers", "relative_buckets"):
            object.__setattr__(self, name, check_count(name, getattr(self, name), minimum=0))
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        for name in ("tied_embeddings", "qkv_bias"):
            check_flag(name, getattr(self, name), allow_none=True)
        check_flag("gated", self.gated, allow_none=True)
        if self.rotary_fraction is not None and (isinstance(self.rotary_fraction, bool) or not isinstance(
                self.rotary_fraction, (int, float)) or not 0 < self.rotary_fraction <= 1):
            raise ValueError(f"rotary_fraction must be a number in (0, 1], got {self.rotary_fraction!r}")
        if self.shared_norm and not self.parallel:
            raise ValueError("shared_norm (one norm per block) needs parallel attention and MLP (parallel=True)")
        if self.relative_buckets and not self.n_decoder_layers:
            raise ValueError("relative_buckets: T5's relative bias is modelled for encoder-decoders (n_decoder_layers)")
        for name in ("pooler", "embedding_norm", "causal", "parallel", "shared_norm", "head_bias", "alibi",
                     "input_norm", "no_dropout", "attention_dropout"):
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
        """GPT-style blocks train with dropout (unless the config sets it to 0); LLaMA-style blocks do not."""
        return self.style == "gpt" and not self.no_dropout

    @property
    def mlp(self) -> str:
        """The MLP kind the activation inventory saves tensors for: gelu or swiglu (any gated MLP)."""
        return "swiglu" if self.features.is_gated else "gelu"

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

    def check_modelled(self) -> None:
        """The ledger books a decoder's or an encoder's blocks: an encoder-decoder (T5) is refused in one line
        (its parameter count stands: :attr:`computed_params`)."""
        if self.n_decoder_layers:
            name = f"model_type {self.model_type!r}" if self.model_type else "an encoder-decoder"
            raise ValueError(f"arch: {name} is an encoder-decoder ({self.n_layers} encoder and {self.n_decoder_layers} "
                             "decoder blocks with cross-attention); the ledger and the step model decoder-only and "
                             "encoder-only blocks, not its two stacks")

    @property
    def kv_heads(self) -> int:
        """Key/value heads: ``n_kv_heads``, or ``n_heads`` for multi-head attention."""
        return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

    @property
    def features(self) -> Features:
        """The discrete choices that decide the parameter and activation formulas."""
        return Features(self.style, self.kv_heads != self.n_heads, self.head_dim * self.n_heads != self.d_model,
                        self.tied_embeddings, self.qkv_bias, self.n_positions > 0, self.n_token_types > 0,
                        self.pooler, self.embedding_norm, self.n_experts > 0, self.parallel, self.shared_norm,
                        self.head_bias, self.alibi, self.input_norm, self.gated, self.n_decoder_layers > 0,
                        self.relative_buckets > 0)

    @property
    def values(self) -> dict:
        """Symbol name -> value for every shape symbol a formula of this architecture may contain."""
        return {"d": self.d_model, "L": self.n_layers, "H": self.n_heads, "F": self.d_ff, "V": self.vocab_size,
                "H_kv": self.kv_heads, "d_h": self.head_dim, "E": max(self.n_experts, 1), "k": max(self.top_k, 1),
                "n_positions": self.n_positions, "n_token_types": self.n_token_types,
                "L_dec": self.n_decoder_layers, "n_relative_buckets": self.relative_buckets}

    def evaluate(self, expr) -> int:
        """Any SymPy formula at this architecture's shape, as an exact int."""
        from ..core.exact import evaluate_expr
        return evaluate_expr(expr, self.values)

    @property
    def head_dim(self) -> int:
        """Per-head size: ``head_size`` if the config gives one, else d/H."""
        return self.d_model // self.n_heads if self.head_size is None else self.head_size

    @property
    def computed_params(self) -> int:
        """The parameter count from the architecture (ignores ``n_params``)."""
        return keyed.evaluate(ModelKey("params", self.features), self.values, lambda: self._count("param_count_expr"))

    @property
    def active_params(self) -> int:
        """Parameters one token passes through: k of the E experts (= ``computed_params`` if dense)."""
        if not self.n_experts:
            return self.computed_params
        return keyed.evaluate(ModelKey("active params", self.features), self.values,
                              lambda: self._count("active_param_count_expr"))

    def _count(self, formula: str) -> int:
        """A count of :mod:`memledger.models.parameters` (SymPy) evaluated at this shape."""
        from . import parameters
        return self.evaluate(getattr(parameters, formula)(self.features))

    @property
    def params(self) -> int:
        """The count the ledger uses: ``n_params`` if given, else the computed one."""
        return self.n_params if self.n_params is not None else self.computed_params

    def parts(self) -> dict:
        """Parameters by part (attention, MLP, norms, embeddings, ...) as exact ints."""
        from .parameters import param_parts
        return {name: self.evaluate(expr) for name, expr in param_parts(self.features).items()}

    @property
    def largest_unit_params(self) -> int:
        """Parameters of the largest unit ZeRO-3 gathers at once: a block or the embedding (not DeepSpeed's
        ``largest_layer_params``, one module's own tensors: :func:`memledger.models.tensors.largest_module_params`)."""
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

        Supported ``model_type``: :data:`memledger.models.hf_config.SUPPORTED`.
        """
        from .hf_config import architecture_kwargs, load_config
        return cls(**architecture_kwargs(load_config(config)), description=description)


_REFINEMENTS = ("n_kv_heads", "head_size", "tied_embeddings", "qkv_bias", "n_token_types", "pooler",
                "embedding_norm", "causal", "n_experts", "top_k", "model_type", "parallel", "shared_norm", "head_bias",
                "alibi", "input_norm", "gated", "n_decoder_layers", "relative_buckets", "rotary_fraction", "no_dropout",
                "attention_dropout")

