"""The framework a step runs under (issue 15), and the options each one reads.

``plain`` is memledger's own loop (ZeRO's arithmetic on top). ``ddp``: PyTorch's ``DistributedDataParallel``
(its gradient buckets: :mod:`memledger.step.ddp`). An option of one framework given with another is refused
(``ValueError`` naming the field), never ignored.
"""
from numbers import Real

from ..core.choices import FRAMEWORKS, check_choice, check_flag

__all__ = ["FRAMEWORKS", "FRAMEWORK_OPTIONS", "check_framework"]

#: The Ledger fields each framework reads beyond the plain loop's.
FRAMEWORK_OPTIONS = {"ddp": ("ddp_bucket_mb", "gradient_as_bucket_view")}
_DEFAULTS = {"ddp_bucket_mb": None, "gradient_as_bucket_view": False}


def check_framework(ledger, recipe) -> None:
    """``ValueError`` (``TypeError`` for a wrong type) naming the field, unless ``ledger``'s framework and its
    options fit together and with the rest of the setup."""
    check_choice("framework", ledger.framework, FRAMEWORKS)
    check_flag("gradient_as_bucket_view", ledger.gradient_as_bucket_view)
    cap = ledger.ddp_bucket_mb
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, Real)):
        raise TypeError(f"ddp_bucket_mb must be a number of MiB, got {cap!r}")
    if cap is not None and not 0 < cap <= 2 ** 40:
        raise ValueError(f"ddp_bucket_mb must be a positive number of MiB, got {cap!r}")
    for framework, fields in FRAMEWORK_OPTIONS.items():
        for field in fields:
            if ledger.framework != framework and getattr(ledger, field) != _DEFAULTS[field]:
                raise ValueError(f"{field} is an option of framework {framework}, not of {ledger.framework}")
    if ledger.framework == "ddp":
        _check_ddp(ledger, recipe)


def _check_ddp(ledger, recipe) -> None:
    if ledger.zero_stage != 0:
        raise ValueError("framework ddp replicates every model state: zero_stage must be 0 (ZeRO sharding is "
                         "DeepSpeed's or FSDP's)")
    if ledger.tp != 1:
        raise ValueError("framework ddp is modelled on data parallelism alone: tp must be 1")
    if ledger.offload_optimizer != "none" or ledger.offload_params != "none":
        raise ValueError("framework ddp keeps every state on the GPU: offload_optimizer and offload_params must "
                         "be none")
    param = next(c for c in recipe.components if c.role == "param")
    if recipe.grad_component.dtype != param.dtype or not param.plain:
        raise ValueError(f"framework ddp needs gradients in the parameters' dtype (its buckets take the "
                         f"parameters' dtype): recipe {ledger.recipe} keeps {recipe.grad_component.dtype} gradients "
                         f"of {param.dtype} parameters")
