"""Transformer architectures: their parameter count, and the named presets.

Two block styles:

* ``"gpt"``: LayerNorm (weight + bias), biased Q/K/V/O and MLP linears,
  GeLU MLP of width F (4d in GPT), dropout; per layer 4d^2 + 2dF + F + 9d
  parameters, i.e. 12d^2 + 13d at F = 4d (Kaplan et al. 2020; Korthikanti
  et al. 2022). Tied input/output embedding Vd, optional learned positions.
* ``"llama"``: RMSNorm (weight only), no biases, SwiGLU MLP with three d x F
  matrices, untied embeddings, no dropout: L(4d^2 + 3dF + 2d) + 2Vd + d
  (Touvron et al. 2023).
"""
from dataclasses import dataclass, field, replace

from .choices import check_choice, check_count, lookup

STYLES = ("gpt", "llama")
#: What each block style saves for backward: (MLP kind, norm) of :func:`memledger.activations.inventory`.
BLOCKS = {"gpt": ("gelu", "LayerNorm"), "llama": ("swiglu", "RMSNorm")}


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer. ``n_params`` overrides the computed count
    (the article works with a nominal 7x10^9)."""
    d_model: int
    n_layers: int
    n_heads: int
    d_ff: int = None
    vocab_size: int = 32000
    style: str = "gpt"
    n_positions: int = 0          # learned position embeddings (GPT-2/3); 0 for RoPE
    n_params: int = None
    description: str = field(default="", compare=False)

    def __post_init__(self):
        check_choice("style", self.style, STYLES)
        counts = ("d_model", "n_layers", "n_heads") + (("d_ff",) if self.d_ff is not None else ()) + (
            "vocab_size",) + (("n_params",) if self.n_params is not None else ())
        for name in counts:
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        object.__setattr__(self, "n_positions", check_count("n_positions", self.n_positions, minimum=0))
        if self.d_ff is None:
            object.__setattr__(self, "d_ff", 4 * self.d_model)
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})")

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
        """Megatron-LM splits heads and the MLP width over tp ranks: tp must divide d_model, n_heads and d_ff."""
        widths = {"d_model": self.d_model, "n_heads": self.n_heads, "d_ff": self.d_ff}
        bad = [f"{name} ({value})" for name, value in widths.items() if value % tp]
        if bad:
            raise ValueError(f"tp ({tp}) must divide d_model, n_heads and d_ff; it does not divide {', '.join(bad)}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def computed_params(self) -> int:
        """The parameter count from the architecture (ignores ``n_params``)."""
        from .formulas import evaluate
        return evaluate(("params", self.style), {"d": self.d_model, "L": self.n_layers, "F": self.d_ff,
                                                 "V": self.vocab_size, "n_positions": self.n_positions})

    @property
    def params(self) -> int:
        """The count the ledger uses: ``n_params`` if given, else the computed one."""
        return self.n_params if self.n_params is not None else self.computed_params

    def parts(self) -> dict:
        """Parameters by part (attention, MLP, norms, embeddings) as exact ints."""
        from .symbols import F, L, V, d
        values = {d: self.d_model, L: self.n_layers, F: self.d_ff, V: self.vocab_size}
        return {name: int(expr.subs(values)) for name, expr in param_parts(self.style, self.n_positions).items()}

    @property
    def largest_layer_params(self) -> int:
        """Parameters of the largest single module (a block or the embedding)."""
        from .symbols import F, d
        block = int(block_params_expr(self.style).subs({d: self.d_model, F: self.d_ff}))
        return max(block, self.vocab_size * self.d_model)

    def with_changes(self, **changes) -> "Architecture":
        """A copy with fields changed; a changed shape drops the nominal ``n_params``."""
        if set(changes) - {"n_params", "description"} and "n_params" not in changes:
            changes["n_params"] = None
        return replace(self, **changes)


def block_parts(style: str = "gpt") -> dict:
    """Parameters of one block by part.

    gpt:   attention 4d^2 + 4d (Q, K, V, O with biases), MLP 2dF + F + d, two LayerNorms 4d.
    llama: attention 4d^2, SwiGLU MLP 3dF (gate, up, down), two RMSNorms 2d.
    """
    from .symbols import F, d
    if style == "gpt":
        return {"attention": 4 * d**2 + 4 * d, "MLP": 2 * d * F + F + d, "norms": 4 * d}
    return {"attention": 4 * d**2, "MLP": 3 * d * F, "norms": 2 * d}


def block_params_expr(style: str = "gpt"):
    """Parameters of one transformer block: 12d^2 + 13d for gpt at F = 4d."""
    return sum(block_parts(style).values())


def param_parts(style: str = "gpt", n_positions: int = 0) -> dict:
    """Whole-model parameters by part: L blocks, the final norm, the embeddings.

    gpt:   tied embedding Vd (+ learned positions), final LayerNorm 2d.
    llama: untied input and output embeddings 2Vd, final RMSNorm d.
    """
    from .symbols import L, V, d
    parts = {name: L * expr for name, expr in block_parts(style).items()}
    if style == "gpt":
        parts["norms"] += 2 * d
        parts["embeddings"] = V * d + n_positions * d
    else:
        parts["norms"] += d
        parts["embeddings"] = 2 * V * d
    return parts


def param_count_expr(style: str = "gpt", n_positions: int = 0):
    """Whole-model parameter count.

    gpt:   L(4d^2 + 2dF + F + 9d) + Vd + n_positions*d + 2d = 12Ld^2 + 13Ld + Vd + ... at F = 4d.
    llama: L(4d^2 + 3dF + 2d) + 2Vd + d (Touvron et al. 2023).
    """
    return sum(param_parts(style, n_positions).values())


PRESETS = {
    "article-7b": Architecture(4096, 32, 32, 16384, 32000, "gpt", n_params=7 * 10**9,
        description="the article's spec (d 4096, L 32, H 32, d_ff 4d), nominal 7x10^9 "
                    "parameters; vocabulary not given there, LLaMA-2's 32000 assumed for the count"),
    "llama2-7b": Architecture(4096, 32, 32, 11008, 32000, "llama",
        description="LLaMA-2 7B (Touvron et al. 2023): SwiGLU, RMSNorm, untied embeddings"),
    "llama2-13b": Architecture(5120, 40, 40, 13824, 32000, "llama",
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


def get_preset(name: str) -> Architecture:
    """The preset called ``name``; ``ValueError`` listing the known ones otherwise."""
    return lookup(PRESETS, name, "preset")
