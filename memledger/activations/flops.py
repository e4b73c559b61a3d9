"""Training FLOPs per iteration and what recomputation adds (Korthikanti et al. 2022, Sec. 5-6).

The forward matmuls of one GPT block at F = 4d, itemized in :data:`FORWARD_MATMULS`,
sum to 24*B*S*d^2*(1 + S/(6d)); backward costs twice the forward, and the
logit layer adds 6*B*S*d*V. Model FLOPs of a GPT-style model (matmuls only):
    72*B*L*S*d^2 * (1 + S/(6d) + V/(12dL))
Full recomputation re-runs every layer's forward (not the logits):
    96*B*L*S*d^2 * (1 + S/(6d) + V/(16dL))
Selective recomputation re-runs only QK^T, softmax, dropout and attn x V:
    72*B*L*S*d^2 * (1 + S/(3d) + V/(12dL))
"""
import sympy as sp

from ..core.choices import RECOMPUTE, check_choice
from ..core.symbols import B, H, L, S, V, d

__all__ = ["FORWARD_MATMULS", "forward_flops_per_layer", "recompute_overhead", "training_flops"]

#: (matmul, forward FLOPs) of one block: 2 FLOPs per multiply-add, F = 4d.
FORWARD_MATMULS = [
    ("Q, K, V projections", 2 * B * S * d * 3 * d),
    ("scores Q K^T", 2 * B * H * S * S * (d / H)),
    ("probabilities x V", 2 * B * H * S * S * (d / H)),
    ("output projection", 2 * B * S * d * d),
    ("MLP up-projection", 2 * B * S * d * 4 * d),
    ("MLP down-projection", 2 * B * S * 4 * d * d),
]


def forward_flops_per_layer() -> sp.Expr:
    """Sum of :data:`FORWARD_MATMULS`: 24*B*S*d^2 + 4*B*S^2*d."""
    return sp.expand(sum(flops for _, flops in FORWARD_MATMULS))


def training_flops(recompute: str = "none") -> sp.Expr:
    """Hardware FLOPs of one training iteration under ``recompute`` (none = model FLOPs)."""
    check_choice("recompute", recompute, RECOMPUTE)
    base = B * L * S * d**2
    if recompute == "full":
        return 96 * base * (1 + S / (6 * d) + V / (16 * d * L))
    quadratic = S / (3 * d) if recompute == "selective" else S / (6 * d)
    return 72 * base * (1 + quadratic + V / (12 * d * L))


def recompute_overhead(recompute: str) -> sp.Expr:
    """Extra FLOPs relative to no recomputation: ~1/3 for full (one more forward), small for selective."""
    return sp.simplify(training_flops(recompute) / training_flops("none") - 1)
