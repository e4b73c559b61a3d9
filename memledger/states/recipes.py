"""The recipe catalog: the article's table (:data:`RECIPES`) and those people fine-tune with
(:mod:`memledger.states.extra`), by name."""
from ..core.choices import lookup
from .extra import EXTRA_RECIPES
from ..core.vocabulary import State
from .recipe import Component, Recipe

__all__ = ["ALL_RECIPES", "DEFAULT_RECIPE", "FINETUNE_RECIPES", "RECIPES", "get_recipe"]

_PARAMS = Component("BF16 parameters", "bf16", "param", "the working weights forward and backward read")
_GRADS = Component("BF16 gradients", "bf16", "grad", "dLoss/dtheta, one per parameter, written by backward")
_MASTER = Component("FP32 master weights", "fp32", "optimizer",
                    "BF16 has 7 fraction bits: small updates round away without an FP32 copy", state=State.MASTER)
_ADAM_M = Component("Adam first moment m", "fp32", "optimizer", "running mean of gradients")
_ADAM_V = Component("Adam second moment v", "fp32", "optimizer", "running mean of squared gradients",
                    state=State.SECOND_MOMENT)

RECIPES = {r.name: r for r in [
    Recipe("bf16-adamw", "BF16 mixed precision + AdamW (16 B/param)",
           (_PARAMS, _GRADS, _MASTER, _ADAM_M, _ADAM_V),
           "the article; ZeRO (Rajbhandari et al. 2020, K = 12); EleutherAI Transformer Math 101"),
    Recipe("bf16-adamw-fp32-grads", "BF16 mixed precision + AdamW, FP32 gradients (18 B/param)",
           (_PARAMS, Component("FP32 gradients", "fp32", "grad", "gradients kept/accumulated in FP32"),
            _MASTER, _ADAM_M, _ADAM_V),
           "HF 'model memory anatomy'; Bekman, ML Engineering; Megatron-LM without distributed optimizer"),
    Recipe("bf16-adamw-fp32-accum", "BF16 mixed precision + AdamW + FP32 grad accumulation (20 B/param)",
           (_PARAMS, _GRADS, Component("FP32 gradient accumulator", "fp32", "grad",
                                       "sums micro-batch gradients in FP32"),
            _MASTER, _ADAM_M, _ADAM_V),
           "HF Ultra-Scale Playbook (FP32 gradient accumulation)"),
    Recipe("fp32-adamw", "pure FP32 + AdamW (16 B/param, no master copy needed)",
           (Component("FP32 parameters", "fp32", "param", "the weights are their own master copy"),
            Component("FP32 gradients", "fp32", "grad", "dLoss/dtheta in FP32"),
            _ADAM_M, _ADAM_V),
           "EleutherAI Transformer Math 101"),
    Recipe("bf16-pure-adamw", "pure BF16 + AdamW, no master copy (8 B/param)",
           (_PARAMS, _GRADS,
            Component("Adam first moment m (BF16)", "bf16", "optimizer",
                      "torch.optim.AdamW keeps its moments in the parameters' dtype (zeros_like(p))"),
            Component("Adam second moment v (BF16)", "bf16", "optimizer", "likewise, in BF16", state=State.SECOND_MOMENT)),
           "torch/optim/adam.py, Adam._init_group: exp_avg, exp_avg_sq = torch.zeros_like(p)"),
    Recipe("bf16-sgd-momentum", "BF16 mixed precision + SGD with momentum (12 B/param)",
           (_PARAMS, _GRADS, _MASTER, Component("SGD momentum", "fp32", "optimizer", "running gradient average")),
           "EleutherAI Transformer Math 101 (8 B of optimizer state: master + momentum)"),
    Recipe("bf16-adam-8bit", "BF16 mixed precision + 8-bit Adam (10 B/param)",
           (_PARAMS, _GRADS, _MASTER,
            Component("Adam m (8-bit)", "int8", "optimizer", "block-quantized first moment"),
            Component("Adam v (8-bit)", "int8", "optimizer", "block-quantized second moment", state=State.SECOND_MOMENT)),
           "Dettmers et al. 2022, 8-bit optimizers; Transformer Math 101 (6 B of optimizer state)"),
]}
DEFAULT_RECIPE = "bf16-adamw"

#: The recipes people fine-tune and train with beyond the article's (:mod:`memledger.states.extra`):
#: kept apart so that :data:`RECIPES` stays the article's table the chapters print.
FINETUNE_RECIPES = {r.name: r for r in EXTRA_RECIPES}
#: Every recipe a ledger, the CLI and :func:`get_recipe` accept.
ALL_RECIPES = {**RECIPES, **FINETUNE_RECIPES}


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``ValueError`` listing the known ones otherwise."""
    return lookup(ALL_RECIPES, name, "recipe")
