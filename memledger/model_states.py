"""Model states per device: recipe x ZeRO stage x data-parallel degree x offload.

ZeRO (Rajbhandari et al. 2020) shards over N_d data-parallel ranks:
stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the
parameters. With K = 12 optimizer bytes (Adam, FP32 master + m + v):

    baseline 16P,  stage 1 4P + 12P/N_d,  stage 2 2P + 14P/N_d,  stage 3 16P/N_d

Tensor parallelism (t) first splits every component t ways. A shard is
rounded up to whole elements, ceil(P/(t*N_d)), so bytes stay integers.

Offload placements:

* ``"article"``: only the optimizer states (FP32 master, m, v) leave the GPU;
  parameters and gradients stay (the article's 28 GB resident, 84 GB on CPU).
* ``"zero-offload"``: gradients stream to the CPU too and the optimizer step
  runs there; only the BF16 parameters stay, 2P (Ren et al. 2021).
"""
from dataclasses import dataclass

import sympy as sp

from .dtypes import nbytes
from .recipes import Recipe
from .symbols import N_d, P, t

ZERO_STAGES = (0, 1, 2, 3)
#: Which component roles each ZeRO stage shards over the data-parallel ranks.
ZERO_SHARDS = {0: (), 1: ("optimizer",), 2: ("optimizer", "grad"), 3: ("optimizer", "grad", "param")}
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
PLACEMENTS = ("article", "zero-offload")


@dataclass(frozen=True)
class StateRow:
    """One component's bytes on one device, as a SymPy expression."""
    name: str
    role: str
    device: str
    expr: sp.Expr


def check_zero_stage(stage) -> int:
    if stage not in ZERO_STAGES or isinstance(stage, bool):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {stage!r}")
    return stage


def elements_per_device(sharded: bool, exact: bool = True) -> sp.Expr:
    """Parameters a device holds of one component: ceil(P/(t*N_d)) if ZeRO shards it,
    else ceil(P/t). ``exact=False`` drops the rounding, as the ZeRO paper writes it."""
    share = P / (t * N_d) if sharded else P / t
    return sp.ceiling(share) if exact else share


def device_of(role: str, offload_optimizer: str, offload_params: str, placement: str) -> str:
    """Where a component with ZeRO ``role`` lives under the offload settings."""
    if role == "optimizer" and offload_optimizer != "none":
        return offload_optimizer
    if role == "grad" and offload_optimizer != "none" and placement == "zero-offload":
        return "cpu"            # gradients go to host memory, where the optimizer step runs
    if role == "param" and offload_params != "none":
        return offload_params
    return "gpu"


def component_bytes(component, sharded: bool, exact: bool = True, style=None) -> sp.Expr:
    """Bytes one device holds of ``component``: :meth:`Component.bytes_for` its share of P.
    A factored (Adafactor) state is rows + columns of each matrix of the ``style``'s
    architecture (:func:`memledger.tensors.factored_elements_expr`), shared the same way."""
    if component.factored:
        if style is None:
            raise ValueError(f"{component.name} needs the matrix shapes: give an architecture")
        from .tensors import factored_elements_expr
        share = factored_elements_expr(style) / (t * N_d if sharded else t)
        return nbytes(component.dtype) * (sp.ceiling(share) if exact else share)
    return component.bytes_for(elements_per_device(sharded, exact))


def state_rows(recipe: Recipe, zero_stage: int = 0, offload_optimizer: str = "none",
               offload_params: str = "none", placement: str = "article", exact: bool = True, style=None) -> list:
    """One :class:`StateRow` per recipe component, per device (GPU rank); ``style``
    (an architecture style) is needed only by factored components."""
    check_zero_stage(zero_stage)
    for name, value in (("offload_optimizer", offload_optimizer), ("offload_params", offload_params)):
        if value not in OFFLOAD_DEVICES:
            raise ValueError(f"{name} must be one of {', '.join(OFFLOAD_DEVICES)}, got {value!r}")
    if placement not in PLACEMENTS:
        raise ValueError(f"offload_placement must be one of {', '.join(PLACEMENTS)}, got {placement!r}")
    if offload_params != "none" and zero_stage != 3:
        raise ValueError(f"offload_params needs zero_stage 3 (ZeRO-Infinity), got zero_stage {zero_stage}")
    return [StateRow(c.name, c.role, device_of(c.role, offload_optimizer, offload_params, placement),
                     component_bytes(c, c.role in ZERO_SHARDS[zero_stage], exact, style))
            for c in recipe.components]


def zero_formula(recipe: Recipe, zero_stage: int) -> sp.Expr:
    """Per-device model-state bytes as the ZeRO paper writes them (no TP, no rounding):
    e.g. 2P + 2P + 12P/N_d for stage 1 of the 16 B/param recipe."""
    rows = state_rows(recipe, zero_stage, exact=False)
    return sp.expand(sum(r.expr for r in rows).subs(t, 1))
