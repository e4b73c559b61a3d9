"""The step timeline's vocabulary: what a tensor is and where it lives (memledger's :class:`Kind` and
:class:`Device`, :mod:`memledger.core.vocabulary`), how long, and what an op does.

Every tensor of a step's programs carries these as fields (:class:`memledger.step.ops.Tensor`); nothing is
read off a tensor's or an op's name. The values are the strings of ``memledger step --json``:
a :class:`enum.StrEnum` member is its value in JSON, in f-strings and in comparisons. Free of SymPy, so that
the command line's compiled peak (:mod:`memledger.step.cache`) reads it without loading SymPy.
"""
from enum import StrEnum

from ..core.vocabulary import Device, Kind

__all__ = ["LANDMARKS", "Action", "Device", "Kind", "Lifetime", "Phase", "Save", "Scope"]

#: The moments at which the live set is exact (docstring of :mod:`memledger.step.timeline`).
LANDMARKS = ("before forward", "after forward", "after backward", "after step")


class Phase(StrEnum):
    """The part of the step an op runs in (the loss is the forward's end and the backward's start)."""
    FORWARD, LOSS, BACKWARD, OPTIMIZER = "forward", "loss", "backward", "optimizer"


class Lifetime(StrEnum):
    """How long a tensor lives; a row's ``phase``, except a temporary's, which is the phase of its op."""
    STEP = "whole step"                         # model states, step counters, ids, the runtime's overhead
    SAVED = "forward to backward"               # saved for backward (the activation inventory's rows)
    GRADIENT = "backward to optimizer step"     # written by backward, read by the optimizer
    TEMPORARY = "temporary"                     # made and freed within one phase


class Scope(StrEnum):
    """Whose tensor a program names when it is not the running block's own (:class:`memledger.step.ops.Ref`)."""
    NEXT = "the next block's"            # after the last block: what follows the blocks
    PREVIOUS = "the previous block's"    # before the first block: what precedes them
    FIRST = "block 0's"                  # named from outside the blocks
    LAST = "block L-1's"
    SHARED = "shared by every block"     # lives outside the blocks; block 0, its last user, releases it


class Action(StrEnum):
    """What an op does besides freeing and allocating tensors."""
    RUN = "run"                                  # a moment of the step (the total after it is sampled)
    LANDMARK = "landmark"                        # no moment: the live set is recorded under the op's label
    COLLECT_GRADIENTS = "collect gradients"      # no moment: the live gradients are noted as collected
    FREE_COLLECTED_GRADIENTS = "free collected"  # a moment: the gradients collected are freed as one
    RELEASE_GRADIENTS = "release gradients"      # a moment: every live gradient is freed (zero_grad)


class Save(StrEnum):
    """What becomes of a tensor a block's forward saves for its backward (the save policy, per region)."""
    KEPT = "kept"                # held by autograd until the backward node that reads it has run
    DROPPED = "dropped"          # forward under a checkpoint: it dies with its last reference
    RECOMPUTED = "recomputed"    # made again just before the backward that reads it
