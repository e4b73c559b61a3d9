"""Megatron-LM's ``theoretical_memory_usage.py``: weights + optimizer, and activations, per GPU.

Source: NVIDIA/Megatron-LM at d98e8a64 (2026-08-22),
``megatron/training/theoretical_memory_usage.py``: dense-model parameters
lines 82-103 and 139-178, most-loaded shard 247-267, bytes per parameter
293-303, activations with sequence parallelism + selective recomputation
308-379, without 382-453, printed in MB = 2^20 bytes (line 9, 481-484).
First version: 0bbdc623 (2023-10-30), which reported only the SP + selective case.

Weights and optimizer, most-loaded shard (pipeline stage with the embedding):

    bytes/param = 18 (bf16 params 2, fp32 main grads 4, fp32 main params + Adam 12)
                  or, with the distributed optimizer, 6 + 12/d  (d = data-parallel size)
    params = ((4d^2 + MLP + norms) L / p + Vd [+ Vd untied, p = 1]) / t, no biases counted

Activations (Korthikanti et al. 2022, Table 2), first pipeline stage, p = 1:

    SP + selective:  [S B d (18 + 4F/d) L + 8 S B + S B d + 4 S B d (1 + V/d)] / t
    otherwise:       1.05 x [S B d (10 + 24/t) L + 8 S B + S B d + 2 (S B V / t + S B d)]

The published check is ``docs/user-guide/features/dist_optimizer.md``
lines 16-20: 18 and 6 + 12/d bytes per parameter for bf16 parameters with
fp32 gradients (20 and 4 + 16/d for fp16, 16 and 8 + 8/d for fp32).
"""
import sympy as sp

from ..core.symbols import B, F, L, S, V, d, t
from .base import Convention, Erratum, G, Item, M, p_pp

__all__ = ["DIST_OPTIMIZER_TABLE", "ERRATA", "MEGATRON", "MEGATRON_DISTOPT", "activations", "bytes_per_param",
           "shard_params"]

#: dist_optimizer.md lines 18-20: (non-distributed, distributed(d)) bytes per parameter.
DIST_OPTIMIZER_TABLE = {("fp16", "fp16"): (20, (4, 16)), ("bf16", "fp32"): (18, (6, 12)),
                        ("fp32", "fp32"): (16, (8, 8))}


def shard_params(features) -> sp.Expr:
    """Parameters on the most-loaded shard (p = 1, no expert parallelism): lines 82-103, 139-178,
    247-267. Attention 2 d q + 2 d kv (grouped-query as ``num_query_groups``), MLP 2 d F (x 3/2 gated,
    x E experts + a d x E router), norms 2 d per layer (x 2 for LayerNorm), no biases."""
    from ..models.features import Features
    from ..models.parameters import widths
    from ..core.symbols import E
    f = Features.of(features)
    q, kv = widths(f)
    swiglu, norm = (not f.gpt), (1 if not f.gpt else 2)
    attention = 2 * d * q + 2 * d * kv
    mlp = 2 * d * F * (sp.Rational(3, 2) if swiglu else 1)
    if f.moe:
        mlp = E * mlp + d * E
    tp_sharded = ((attention + mlp) * L / p_pp + V * d) / t
    if not f.is_tied:                                      # untied output layer on the same stage
        tp_sharded += V * d / t
    replicated = 2 * d * norm * L / p_pp + norm * d
    return tp_sharded + replicated


def bytes_per_param(distributed: bool, dp) -> tuple:
    """(param, grad, optimizer) bytes per parameter, lines 293-296."""
    return (2, 4, sp.Rational(12) / dp if distributed else 12)


def activations(sequence_parallel_selective: bool) -> sp.Expr:
    """Lines 317-379 (SP + selective) or 386-453 (otherwise), at p = 1."""
    embedding = 8 * S * B * p_pp + S * B * d * p_pp
    if sequence_parallel_selective:
        layers = (18 * S * B * d + 4 * S * B * F) * L
        return (layers + embedding + 4 * S * B * d + 4 * S * B * V) / t
    layers = S * B * d * (10 + 24 / t) * L
    return sp.Rational(105, 100) * (layers + embedding + 2 * (S * B * V / t + S * B * d))


def _items(ledger, inputs, distributed: bool = False) -> list:
    if ledger.arch is None:
        raise ValueError("the Megatron-LM convention counts parameters from the shape: give an architecture")
    shard = shard_params(ledger.arch.features)
    dp = G * M / t
    param, grad, opt = bytes_per_param(distributed, dp)
    sp_selective = ledger.recompute == "selective" and ledger.tp > 1
    return [Item("bf16 parameters", "model_states", "gpu", sp.ceiling(param * shard), "param"),
            Item("fp32 main gradients", "model_states", "gpu", sp.ceiling(grad * shard), "grad"),
            Item("fp32 main parameters + Adam m, v" + (" (distributed)" if distributed else ""), "model_states",
                 "gpu", sp.ceiling(opt * shard), "optimizer"),
            Item("activations (SP + selective)" if sp_selective else "activations (without SP, x1.05)",
                 "activations", "gpu", sp.ceiling(activations(sp_selective)))]


def _printed(ledger, inputs, rows) -> str:
    weights = sum(r.bytes for r in rows if r.group == "model_states") / 2**20
    act = sum(r.bytes for r in rows if r.group == "activations") / 2**20
    return (f"Theoretical memory footprints: weight and optimizer={weights:.2f} MB, "
            f"activation={act:.2f} MB, total={weights + act:.2f} MB")


ERRATA = (
    Erratum("Megatron-LM", "megatron/training/theoretical_memory_usage.py lines 386-453",
            "activations without sequence parallelism: S B d (10 + 24/t) per layer, whatever the recomputation",
            "S B d (10 + 24/t + 5 H S/(d t)) per layer without recomputation",
            "10 + 24/t is Korthikanti's Table 2 row for tensor parallelism *with selective recomputation*; the "
            "function is also used when recompute_granularity is not 'selective' (line 466), where the S x S "
            "attention tensors, 5 H S/(d t) per S B d, are kept", "inconsistent"),
    Erratum("Megatron-LM", "megatron/training/theoretical_memory_usage.py lines 317-319",
            "S B d (18 + 4F/d) per layer for every MLP", "S B d (18 + 8F/d) for SwiGLU",
            "the 4F/d term is the GeLU MLP's two F-wide 2-byte tensors; a SwiGLU MLP keeps four (gate output, "
            "SiLU output, up output, down input): 8 S B F bytes, while the same file counts SwiGLU's third "
            "matrix in the parameters (line 22, gated_linear_multiplier)", "inconsistent"),
)

MEGATRON = Convention(
    "megatron", "Megatron-LM theoretical_memory_usage.py (no distributed optimizer)",
    "NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py lines 293-453 (d98e8a64)",
    _items, reads=("tp", "dp", "recompute", "batch_size", "seq_len"), printed=_printed, errata=ERRATA,
    differs="fp32 main gradients: 2 + 4 + 12 = 18 B/param; parameters counted without biases; activations "
            "from Korthikanti's Table 2 with a 5% margin (or its SP + selective row), 8-byte token ids and fp32 "
            "logits included; prints MiB as 'MB'")
MEGATRON_DISTOPT = Convention(
    "megatron-distopt", "Megatron-LM theoretical_memory_usage.py with the distributed optimizer (6 + 12/d)",
    "NVIDIA/Megatron-LM megatron/training/theoretical_memory_usage.py line 296; dist_optimizer.md lines 16-20",
    lambda ledger, inputs: _items(ledger, inputs, distributed=True), reads=MEGATRON.reads, printed=_printed,
    differs="like 'megatron' but the 12 bytes of fp32 parameters and Adam states sharded over the data-parallel "
            "ranks (ZeRO-1): 6 + 12/d B/param")
