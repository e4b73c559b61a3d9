"""The step timeline's vocabulary: what a tensor is and where it lives (memledger's :class:`Kind` and
:class:`Device`, :mod:`memledger.core.vocabulary`), how long, and what an op does.

Every tensor of a step's programs carries these as fields (:class:`memledger.step.ops.Tensor`); nothing is
read off a tensor's or an op's name. The values are the strings of ``memledger step --json``:
a :class:`enum.StrEnum` member is its value in JSON, in f-strings and in comparisons. Free of SymPy, so that
the command line's compiled peak (:mod:`memledger.step.cache`) reads it without loading SymPy.
"""
from enum import StrEnum

from ..core.vocabulary import Device, Kind

__all__ = ["LANDMARKS", "Action", "Device", "Kind", "Lifetime", "OpRole", "Phase", "Save", "Scope", "Stream"]

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


class Stream(StrEnum):
    """The CUDA stream a tensor's memory is allocated on: the caching allocator keeps a pool per stream and reuses a
    cached block only for the stream that allocated it (``get_free_block()`` in ``c10/cuda/CUDACachingAllocator.cpp``
    searches by (stream, size)), so where the step's tensors are allocated on side streams their segments are apart.
    Where each FSDP2 buffer is allocated: :mod:`memledger.step.fsdp2`; every other tensor, DDP's buckets included, is
    allocated on the default stream (:mod:`memledger.ledger.replay`)."""
    DEFAULT = "default"
    ALL_GATHER_COPY_IN = "FSDP2 all-gather copy-in"      # FSDPCommContext.all_gather_copy_in_stream
    REDUCE_SCATTER = "FSDP2 reduce-scatter"              # FSDPCommContext.reduce_scatter_stream
    ALL_REDUCE = "FSDP2 all-reduce"                      # FSDPCommContext.all_reduce_stream (HSDP)


class Scope(StrEnum):
    """Whose tensor a program names when it is not the running block's own (:class:`memledger.step.ops.Ref`)."""
    NEXT = "the next block's"            # after the last block: what follows the blocks
    PREVIOUS = "the previous block's"    # before the first block: what precedes them
    FIRST = "block 0's"                  # named from outside the blocks
    LAST = "block L-1's"
    SHARED = "shared by every block"     # lives outside the blocks; block 0, its last user, releases it
    NOT_FIRST = "the block's own, but block 0's is not"  # transformers: block 0's input is held past the blocks


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


class OpRole(StrEnum):
    """What an op is, for the transforms that find it in a program (TP/SP, FSDP2, AMP, LoRA, offloading, packing,
    the optimizer in backward); set where the op is made. An op's label is for display only: nothing selects by it.
    None: an op no transform looks for."""
    LM_HEAD = "LM head"                                   # the LM head's matmul (the logits made; unchunked)
    LM_HEAD_BACKWARD = "LM head backward"
    LOSS_COMPUTED = "loss computed"
    LOSS_STARTS = "the loss starts"                       # the loss's first op, after the model returns
    LABELS_RELEASED = "labels released"                   # nll_loss's backward done: its saved labels released
    LOSS_BACKWARD = "loss.backward()"                     # the loss's gradient seeded
    DECODER_RETURNS = "the decoder returns"               # the chunked loss: the decoder's output handed over
    LOSS_RELEASED = "loss released"                       # the loss freed after backward starts
    FINAL_NORM_INPUT_RELEASED = "final norm input released"
    OPTIMIZER_STEP_DONE = "after step"                    # the landmark after the optimizer step
    BLOCK_RETURNS = "block returns"                       # a block's output made (its residual sum)
    RECOMPUTATION_STOPS = "recomputation stops"           # full recomputation: the re-run forward ends
    FLASH_ATTENTION_BACKWARD = "flash attention backward"
    # a block's linear layers: forward (the output made) and backward (the input and weight gradients made)
    QKV_PROJECTION = "QKV projection"
    OUTPUT_PROJECTION = "output projection"
    GATE_PROJECTION = "gate projection"
    UP_PROJECTION = "up projection"
    DOWN_PROJECTION = "down projection"
    QKV_PROJECTION_BACKWARD = "QKV projection backward"
    OUTPUT_PROJECTION_BACKWARD = "output projection backward"
    GATE_PROJECTION_BACKWARD = "gate projection backward"
    UP_PROJECTION_BACKWARD = "up projection backward"
    DOWN_PROJECTION_BACKWARD = "down projection backward"
    SWIGLU_PRODUCT_BACKWARD = "SiLU(gate) * up backward"
    SILU_BACKWARD = "SiLU backward"
    # composite RMSNorm's backward nodes that unpack saved tensors, per norm of a block (activation offloading)
    NORM1_WEIGHT_BACKWARD = "norm 1 backward: weight"
    NORM1_X_RSTD_BACKWARD = "norm 1 backward: x*rstd"
    NORM1_RSQRT_BACKWARD = "norm 1 backward: rsqrt"
    NORM1_POW_BACKWARD = "norm 1 backward: pow"
    NORM2_WEIGHT_BACKWARD = "norm 2 backward: weight"
    NORM2_X_RSTD_BACKWARD = "norm 2 backward: x*rstd"
    NORM2_RSQRT_BACKWARD = "norm 2 backward: rsqrt"
    NORM2_POW_BACKWARD = "norm 2 backward: pow"
    EMBEDDING_STEP = "AdamW step: embedding.weight"       # the for-loop AdamW's step of the embedding's weight
    LORA_DOWN_B = "LoRA down_proj B"                      # the down_proj adapter's B matmul
    LORA_DOWN_B_BACKWARD = "LoRA down_proj B backward"
    FSDP2_CLEARED = "FSDP2 root cleared"                  # FSDP2's root post-backward: its buffers cleared
    EMBEDDING = "embedding"                               # the token embedding's lookup (forward)
    EMBEDDING_BACKWARD = "embedding backward"             # the token embedding's backward (its weight gradient)
    AUTOCAST_EXIT = "autocast exits"                      # AMP: the autocast region exits, its cache cleared
