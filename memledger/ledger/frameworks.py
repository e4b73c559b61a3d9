"""Which ledger setups a framework other than the plain loop runs, checked in one place (a ValueError or
TypeError naming the field).

FSDP2 (PyTorch's ``fully_shard``, docs/fsdp2.md) shards the model states itself: ZeRO stages, offload and
tensor parallelism are other setups. HSDP: ``dp_replicate`` replicas of a ``dp / dp_replicate``-rank shard
group (a 2-D mesh; FSDP2 shards over the second dimension and all-reduces across the first). Its parameters
are the optimizer's (no master copy): the recipe says their dtype and the optimizer's, ``fp32-adamw`` (FP32
shards, as torchtitan and torchtune keep them) or ``bf16-pure-adamw``; ``MixedPrecisionPolicy(param_dtype,
reduce_dtype)`` says the compute and reduce dtypes.
"""
from ..core.choices import FSDP_DTYPES, check_choice, check_flag

__all__ = ["FSDP2_RECIPES", "check_fsdp2"]

#: The recipes FSDP2's step models: the sharded parameters are the masters, AdamW's moments in their dtype.
FSDP2_RECIPES = ("fp32-adamw", "bf16-pure-adamw")


def check_fsdp2(ledger) -> None:
    """``ValueError``/``TypeError`` unless ``ledger`` is a setup the FSDP2 step models."""
    check_choice("fsdp_param_dtype", ledger.fsdp_param_dtype, FSDP_DTYPES)
    check_choice("fsdp_reduce_dtype", ledger.fsdp_reduce_dtype, FSDP_DTYPES)
    check_flag("reshard_after_forward", ledger.reshard_after_forward, allow_none=True)
    if ledger.arch is None:
        raise ValueError("framework fsdp2 needs an architecture (a preset or --hidden/--layers/--heads)")
    if ledger.zero_stage != 0:
        raise ValueError(f"framework fsdp2 shards the model states itself: zero_stage must be 0, got "
                         f"{ledger.zero_stage}")
    if ledger.offload_optimizer != "none" or ledger.offload_params != "none":
        raise ValueError("framework fsdp2: offload (CPUOffloadPolicy) is not modelled; offload_optimizer and "
                         "offload_params must be none")
    if ledger.tp != 1:
        raise ValueError(f"framework fsdp2: FSDP2 x tensor parallelism is not modelled; tp must be 1, got {ledger.tp}")
    if ledger.dp % ledger.dp_replicate:
        raise ValueError(f"framework fsdp2: dp_replicate ({ledger.dp_replicate}) must divide dp ({ledger.dp})")
    if ledger.dp // ledger.dp_replicate < 2:
        raise ValueError("framework fsdp2 shards over dp ranks (dp / dp_replicate under HSDP): dp must be at least 2"
                         + (f" x dp_replicate ({ledger.dp_replicate})" if ledger.dp_replicate > 1 else ""))
    if ledger.recipe not in FSDP2_RECIPES:
        raise ValueError(f"framework fsdp2: recipe must be one of {', '.join(FSDP2_RECIPES)} (the sharded "
                         f"parameters are the masters; fsdp_param_dtype is the compute dtype), got {ledger.recipe}")
