"""What the optimizer stepped in backward (torchtune's ``optimizer_in_bwd``) can apply to.

pytorch/torchtune (bd2a0fc7c) ``torchtune/training/memory.py`` ``register_optim_in_bwd_hooks`` (lines 222-245)
gives every parameter its own optimizer, stepped in the parameter's post-accumulate-grad hook, then
``zero_grad()``: a gradient lives only from the backward op that writes it to its step
(:func:`memledger.step.optim.in_backward`). So it steps the model's own parameters (no FP32 master copies a
loop would convert gradients into), once per backward (no gradient accumulation:
``recipes/full_finetune_single_device.py`` lines 157-160 raise "Gradient accumulation is not supported with
optimizer_in_bwd: True"; the Ledger has no accumulation field, and pipeline micro-batches are refused by
the command line), on one device (memledger does not model it with ZeRO, tensor parallelism or offloading),
for an optimizer the step models.
"""
from ..core.choices import check_flag

__all__ = ["check_in_backward"]


def check_in_backward(ledger, recipe) -> None:
    """``ValueError`` naming what ``optimizer_in_backward`` cannot apply to in ``ledger``."""
    from ..step.structure import OPTIMIZER_OF
    check_flag("optimizer_in_backward", ledger.optimizer_in_backward)
    if ledger.arch is None:
        raise ValueError("optimizer_in_backward changes the step's peak: give an architecture")
    if any(c.name == "FP32 master weights" for c in recipe.components):
        raise ValueError(f"optimizer_in_backward steps the model's own parameters: recipe {recipe.name} keeps FP32 "
                         "master weights (use a recipe without them, e.g. bf16-pure-adamw)")
    if recipe.name not in OPTIMIZER_OF:
        raise ValueError(f"optimizer_in_backward: the step does not model recipe {recipe.name}'s optimizer")
    if ledger.zero_stage or ledger.tp > 1 or (ledger.offload_optimizer, ledger.offload_params) != ("none", "none") \
            or getattr(ledger, "framework", "plain") != "plain":
        raise ValueError("optimizer_in_backward is modelled on one device: no ZeRO, tp 1, no offload, no framework's "
                         "buffers (framework plain)")
    from dataclasses import replace
    from ..activations.backends import get_backend
    from ..step.structure import StepStructure
    try:       # the blocks the step models; offloading's conventions are the step's backend's, checked by it
        probe = replace(ledger, offload_activations=False, optimizer_in_backward=False) \
            if ledger.offload_activations else ledger
        StepStructure.of(probe, get_backend())
    except ValueError as e:
        raise ValueError(f"optimizer_in_backward is judged by the step's peak, which is not modelled here: {e}") \
            from None
