"""Saved activations of one transformer block: the itemized inventory and its sum.

Autograd keeps, from forward until the matching backward, every tensor a
backward formula needs. Listing them (name, why, shape, dtype) and summing
their sizes *derives* Korthikanti et al. (2022), Eq. 1, for a GPT block at
F = 4d with 16-bit activations and 1-byte dropout masks:

    bytes per layer = B*S*d*(34 + 5*H*S/d)

Two itemizations are kept: :data:`ARTICLE_INVENTORY` (the article's table, its
labels) and :func:`inventory` (Korthikanti Sec. 4.1: what autograd really
keeps). Same total, different rows; :data:`ARTICLE_INVENTORY` says, row by
row, which tensor it stands for. Variants: no dropout, FlashAttention
(no S^2 tensors), SwiGLU MLP (LLaMA), tensor/sequence parallelism and
selective or full recomputation (Korthikanti Table 2).
"""
from dataclasses import dataclass
from math import prod

import sympy as sp

from .dtypes import nbytes
from .symbols import B, F, H, L, S, d, t

RECOMPUTE = ("none", "selective", "full")


@dataclass(frozen=True)
class Saved:
    """One tensor saved for backward.

    ``tp_sharded``: split across tensor-parallel ranks (Megatron-LM);
    ``dropout``: exists only because the block trains with dropout;
    ``weight_grad_of``: the projections whose weight gradient is the only reason
    it is kept (a frozen projection needs no saved input: see :mod:`memledger.lora`).
    """
    name: str
    why: str
    shape: tuple
    dtype: str = "bf16"
    block: str = "attention"
    tp_sharded: bool = False
    dropout: bool = False
    same_as: str = ""       # article rows: the autograd tensor this row stands for
    weight_grad_of: tuple = ()

    @property
    def bytes(self) -> sp.Expr:
        """Elements x bytes per element, e.g. B*S*d*2."""
        return prod(self.shape) * nbytes(self.dtype)

    @property
    def quadratic(self) -> bool:
        """True for the attention-score-sized tensors (B x H x S x S)."""
        return sp.degree(prod(self.shape), S) == 2


BSd, BSF, BHSS = (B, S, d), (B, S, F), (B, H, S, S)


def _norm_rows(norm, position):
    return Saved(f"{norm} {position} input", f"{norm} backward needs its input (its statistics are ignored here)",
                 BSd, block="attention" if position == 1 else "mlp")


def inventory(mlp: str = "gelu", norm: str = "LayerNorm", dropout: bool = True,
              flash_attention: bool = False) -> list:
    """What autograd keeps in one block (Korthikanti et al. 2022, Sec. 4.1).

    gelu + dropout gives 11BSd + 5BHS^2 (attention), 19BSd at F = 4d (MLP) and
    4BSd (two norms): B*S*d*(34 + 5*H*S/d). ``mlp="swiglu"`` is LLaMA's gated MLP;
    ``flash_attention`` keeps only fp32 log-sum-exp statistics instead of the
    S x S tensors (Dao et al. 2022).
    """
    if mlp not in ("gelu", "swiglu"):
        raise ValueError(f"mlp must be 'gelu' or 'swiglu', got {mlp!r}")
    rows = [
        _norm_rows(norm, 1),
        Saved("Q/K/V projection input", "the Q, K, V weight gradients need their shared input", BSd,
              weight_grad_of=("q_proj", "k_proj", "v_proj")),
        Saved("Q", "backward of QK^T needs K, and vice versa", BSd, tp_sharded=True),
        Saved("K", "backward of QK^T needs Q, and vice versa", BSd, tp_sharded=True),
    ]
    if flash_attention:
        rows.append(Saved("softmax log-sum-exp", "FlashAttention recomputes the S x S scores from Q, K and these",
                          (B, H, S), "fp32", tp_sharded=True))
    else:
        rows.append(Saved("softmax output", "softmax backward needs its output", BHSS, tp_sharded=True))
        if dropout:
            rows += [
                Saved("attention dropout mask", "dropout backward needs the mask", BHSS, "bool",
                      tp_sharded=True, dropout=True),
                Saved("attention dropout output", "backward of (probabilities x V) needs the probabilities",
                      BHSS, tp_sharded=True, dropout=True),
            ]
    rows += [
        Saved("V", "backward of (probabilities x V) needs V", BSd, tp_sharded=True),
        Saved("output projection input", "the output projection's weight gradient needs its input",
              BSd, tp_sharded=True, weight_grad_of=("o_proj",)),
    ]
    if dropout:
        rows.append(Saved("attention residual dropout mask", "dropout backward needs the mask", BSd, "bool",
                          dropout=True))
    rows += [
        _norm_rows(norm, 2),
        Saved("MLP input", "the up-projection weight gradient needs its input", BSd, block="mlp",
              weight_grad_of=("up_proj",) if mlp == "gelu" else ("gate_proj", "up_proj")),
    ]
    if mlp == "gelu":
        rows += [
            Saved("GeLU input", "GeLU backward needs its input", BSF, block="mlp", tp_sharded=True),
            Saved("down-projection input", "the down-projection weight gradient needs its input (GeLU output)",
                  BSF, block="mlp", tp_sharded=True, weight_grad_of=("down_proj",)),
        ]
    else:
        rows += [
            Saved("gate output", "SiLU backward needs its input", BSF, block="mlp", tp_sharded=True),
            Saved("SiLU output", "backward of SiLU(gate) x up needs both factors", BSF, block="mlp",
                  tp_sharded=True),
            Saved("up-projection output", "backward of SiLU(gate) x up needs both factors", BSF, block="mlp",
                  tp_sharded=True),
            Saved("down-projection input", "the down-projection weight gradient needs its input",
                  BSF, block="mlp", tp_sharded=True, weight_grad_of=("down_proj",)),
        ]
    if dropout:
        rows.append(Saved("MLP residual dropout mask", "dropout backward needs the mask", BSd, "bool",
                          block="mlp", dropout=True))
    return rows


_ART = "as the article lists it"
#: The article's per-layer table, its labels, with F written as 4d as there.
ARTICLE_INVENTORY = [
    Saved("LayerNorm input", _ART, BSd, same_as="LayerNorm 1 input"),
    Saved("Q projection output", _ART, BSd, same_as="Q"),
    Saved("K projection output", _ART, BSd, same_as="K"),
    Saved("V projection output", _ART, BSd, same_as="V"),
    Saved("attention scores QK^T/sqrt(d_h)", _ART, BHSS, same_as="attention dropout output"),
    Saved("softmax output", _ART, BHSS, same_as="softmax output"),
    Saved("attention dropout mask", _ART, BHSS, "bool", same_as="attention dropout mask"),
    Saved("attention output softmax x V", _ART, BSd, same_as="output projection input"),
    Saved("output projection output", _ART, BSd, same_as="Q/K/V projection input"),
    Saved("residual dropout mask", _ART, BSd, "bool", same_as="attention residual dropout mask"),
    Saved("LayerNorm input", _ART, BSd, block="mlp", same_as="LayerNorm 2 input"),
    Saved("up projection output", _ART, (B, S, 4 * d), block="mlp", same_as="GeLU input"),
    Saved("GeLU output", _ART, (B, S, 4 * d), block="mlp", same_as="down-projection input"),
    Saved("down projection output", _ART, BSd, block="mlp", same_as="MLP input"),
    Saved("residual dropout mask", _ART, BSd, "bool", block="mlp", same_as="MLP residual dropout mask"),
]

#: Article rows whose label names a tensor autograd does not keep; the tensor
#: of the same size that it does keep is in ``same_as``.
RELABELLED = {
    "attention scores QK^T/sqrt(d_h)": "softmax backward needs only its output, so the pre-softmax scores "
                                       "are freed; the dropout output (the operand of probabilities x V) is kept",
    "output projection output": "no backward formula reads it (the next op is dropout, which keeps a mask); "
                                "the LayerNorm output feeding Q/K/V is kept instead",
    "down projection output": "no backward formula reads it; the LayerNorm output feeding the MLP is kept instead",
}


def closed_form() -> sp.Expr:
    """Korthikanti et al. (2022), Eq. 1: B*S*d*(34 + 5*H*S/d) bytes per layer."""
    return B * S * d * (34 + 5 * H * S / d)


def per_layer_bytes(rows, recompute: str = "none", tp: bool = False, sequence_parallel: bool = False) -> sp.Expr:
    """Saved bytes of one layer, summed (and expanded) from ``rows``.

    selective: drop the S x S tensors (Korthikanti Sec. 5); full: keep only the
    layer input, 2BSd. With ``tp`` the tensor-parallel rows are divided by t,
    and with ``sequence_parallel`` all rows are (Korthikanti Table 2).
    """
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    if sequence_parallel and not tp:
        raise ValueError("sequence parallelism needs tensor parallelism (tp > 1)")
    if recompute == "full":
        kept = [Saved("layer input", "the checkpoint: backward re-runs the layer's forward from it", BSd,
                      tp_sharded=False)]
    elif recompute == "selective":
        kept = [r for r in rows if not r.quadratic]
    else:
        kept = rows
    return sp.expand(sum((r.bytes / t if tp and (r.tp_sharded or sequence_parallel) else r.bytes) for r in kept))


def activation_bytes(rows, recompute: str = "none", tp: bool = False, sequence_parallel: bool = False) -> sp.Expr:
    """All L layers: L x :func:`per_layer_bytes` (full checkpointing: L*B*S*d*2)."""
    return L * per_layer_bytes(rows, recompute, tp, sequence_parallel)


def quadratic_share(rows) -> sp.Expr:
    """Fraction of a layer's saved bytes held by the S x S tensors: 5HS/(34d + 5HS) for Eq. 1."""
    quad = sum(r.bytes for r in rows if r.quadratic)
    return sp.factor(quad / sum(r.bytes for r in rows))
