"""Packed sequences in the step: n documents in each row of S tokens, each attending only to itself
(``Ledger(packed=n)``; the reference decoder's :mod:`memledger.pytorch.packing`).

What changes, by the backend's ``packing`` (:mod:`memledger.activations.backends`):

* ``"mask"`` (CPU: SDPA with a boolean block-causal mask, as torchtune's ``_sdpa_or_flex_attention`` passes
  ``mask[:, None, :, :]``; pytorch/torchtune 13036950 ``torchtune/modules/attention_utils.py``): the batch carries
  (B, S) int64 document ids; the forward builds one (B, S, S) bool mask (``ones(S, S).tril()``, the (B, S, S)
  document equality, and'ed), freed when the decoder's forward returns (after the LM head); at every block SDPA
  turns it into an additive (B, 1, S, S) mask in the activation dtype (ATen ``convert_boolean_attn_mask``:
  ``where`` over two 0-d scalars), which the CPU flash kernel saves for the block's backward: B*S^2 x 2 bytes
  (BF16) per block, a row of the saved activations. Measured: PyTorch 2.13, MemTracker under FakeTensorMode
  (tests/step/test_packing.py). Under recomputation (``torch.utils.checkpoint``, non-reentrant) the additive
  mask is dropped as the checkpointed call returns and made again (``where``, then the kernel) when the
  block's backward recomputes it, freed with the kernel's recomputed output after its backward; the bool
  mask is an input of every block's checkpointed call, so each frame holds it and it lives until block 0's
  backward releases its frame (:func:`frame`), a row after the forward pass (tests/step/test_packing_slow.py).
* ``"eager"`` (the eager core: GPT blocks under any backend, LLaMA blocks under ``article``; the reference's
  ``masked_fill``, Megatron-LM's ``attention_mask_func`` convention, :mod:`memledger.pytorch.packing`): the
  forward builds the (B, S, S) bool block-causal mask as above, then inverts it (``~``, True = masked) and frees
  it; every block's ``masked_fill`` saves a (B, 1, S, S) view of the inverted mask, so it stands where the
  unpacked core's shared (S, S) "causal mask" stands (one storage, not per block; freed by block 0's
  ``masked_fill`` backward), B*S^2 bytes instead of S^2. Measured: tests/step/test_packing_eager.py.
* ``"varlen"`` (CUDA: flash-attention's varlen kernel, as Hugging Face's FA2 path with ``position_ids`` does for
  TRL's padding-free packing: ``prepare_fa_kwargs_from_position_ids`` in
  ``src/transformers/modeling_flash_attention_utils.py``): no mask at all; the batch carries (B, S) int64
  position ids and the (B*n + 1) int32 ``cu_seqlens``; the flash kernel keeps what it keeps unpacked. From the
  sources, not measured here (no CUDA).
* The loss: unchanged. The labels a packed row must not predict hold -100, which ``F.cross_entropy``'s default
  ``ignore_index`` skips without a tensor of its own (torchtune's ``PackedDataset`` pads with
  ``CROSS_ENTROPY_IGNORE_IDX``).
"""
from ..activations.inventory import Saved
from ..core.symbols import B, S
from .ops import Ref, Tensor
from .structure import Shape
from .vocab import Kind, Lifetime, OpRole, Scope

__all__ = ["ADDITIVE", "MASK", "additive_mask", "forward_end", "forward_start", "frame", "held_by_frames", "inputs",
           "outside_rows", "saved_names", "saved_rows"]

MASK = "block-causal mask (B, S, S) bool"
ADDITIVE = "packed attention mask (additive, B x 1 x S x S)"


def saved_rows(c: Shape) -> list:
    """The per-block row the ``"mask"`` packing adds to the saved activations."""
    if c.packing != "mask" or c.recompute == "selective":      # selective: dropped and recomputed with the core
        return []
    return [Saved(ADDITIVE, "SDPA's convert_boolean_attn_mask: the block-causal mask as -inf/0 in q's dtype, saved "
                            "by the CPU flash kernel for its backward", (B, 1, S, S), c.dtype, replicated=True)]


def outside_rows(rows: list, c: Shape, offloaded: bool = False) -> list:
    """``rows`` (outside the blocks) with the eager core's shared mask at (B, S, S) under ``"eager"`` packing; under
    ``"mask"`` packing with recomputation, the bool mask, which every block's checkpoint frame holds (:func:`frame`;
    ``offloaded``: its saved copies are on the host, the GPU's goes as the forward returns)."""
    if held_by_frames(c, offloaded):
        return rows + [Saved(MASK, "the block-causal mask, an input of every block's checkpointed call: held by its "
                                   "frame until that block's backward (block 0's last)", (B, S, S), "bool",
                             block="outside", replicated=True)]
    if c.packing != "eager":
        return rows
    return [Saved(r.name, "the block-causal mask inverted (True = masked), (B, S, S) bool, built once per forward; "
                          "every block's masked_fill saves a (B, 1, S, S) view of it", (B, S, S), "bool",
                  block="outside", replicated=True) if r.name == "causal mask" else r for r in rows]


def saved_names(c: Shape) -> list:
    """The names a block's attention backward releases beyond the unpacked kernel's."""
    return [ADDITIVE] if c.packing == "mask" and c.recompute != "selective" else []


def forward_start(p, c: Shape):
    """The block-causal mask, built once before the embedding (``"mask"`` packing); ``"eager"``: then inverted
    into the shared "causal mask" the blocks' ``masked_fill`` saves."""
    if c.packing not in ("mask", "eager"):
        return
    ones = p.new("ones (S, S) for the block-causal mask", (S, S), "bool", "torch.ones before .tril()")
    tril = p.new("causal (S, S) bool", (S, S), "bool", "ones(S, S).tril()")
    same = p.new("same document (B, S, S) bool", (B, S, S), "bool", "documents[:, :, None] == documents[:, None, :]")
    if MASK not in p.tensors:       # under recomputation a saved row (outside_rows)
        p.tensors[MASK] = Tensor(MASK, B * S * S, Kind.ACTIVATION, Lifetime.TEMPORARY,
                                 why="the packed rows' mask, a local of the decoder's forward")
    p.op("torch.ones(S, S)", alloc=[ones])
    p.op("tril", alloc=[tril])
    p.op("released", free=[ones])
    p.op("document equality", alloc=[same])
    p.op("causal & same document: the block-causal mask", alloc=[MASK])
    p.op("released", free=[same, tril])
    if c.packing == "eager":
        p.op("~: the masked positions", alloc=["causal mask"])
        p.op("released", free=[MASK])


def held_by_frames(c: Shape, offloaded: bool = False) -> bool:
    """Whether the bool mask outlives the forward on the GPU: an input of every checkpointed call, saved by the
    checkpoint (``_NoopSaveInputs``) unless activation offloading packs those saves to the host."""
    return c.packing == "mask" and c.recompute != "none" and not offloaded


def forward_end(ops: list, c: Shape, offloaded: bool = False) -> list:
    """``ops`` (the program after the blocks) with the bool mask released as the decoder's forward returns,
    right after the LM head (under recomputation every block's checkpoint frame holds it: :func:`frame`)."""
    if c.packing != "mask" or held_by_frames(c, offloaded):
        return ops
    if any(op.role is OpRole.DECODER_RETURNS for op in ops):         # the chunked loss (memledger.step.loss)
        return [op._replace(frees=op.frees + (MASK,)) if op.role is OpRole.DECODER_RETURNS else op for op in ops]
    at = next(i for i, op in enumerate(ops) if op.role is OpRole.LM_HEAD) + 1
    return ops[:at] + [type(ops[0])("block-causal mask released (forward returns)", (MASK,), ())] + ops[at:]


def additive_mask(p, c: Shape, mark: str = ""):
    """The block's SDPA call turns the bool mask into the additive one; returns (the name of the two 0-d scalars
    ``where`` reads, which the flash kernel's call releases; the additive mask's name), (None, None) unpacked.
    ``mark`` "": the saved row; else a temporary of a checkpointed (dropped with the call) or recomputed core."""
    if c.packing != "mask":
        return None, None
    scalars = p.new("where's two 0-d scalars (-inf, 0)" + mark, (2,), c.dtype, "convert_boolean_attn_mask's fill values")
    additive = p.new(ADDITIVE + mark, (B, 1, S, S), c.dtype, "SDPA's additive mask under the checkpoint") \
        if mark else ADDITIVE
    p.op("boolean mask to additive (where)", alloc=[scalars, additive])
    return scalars, additive


def frame(c: Shape) -> list:
    """What a recomputed block's checkpoint frame releases with its inputs: the bool mask (an input of the
    checkpointed call, held by every block's frame; block 0's is the last)."""
    return [Ref(Scope.SHARED, MASK)] if c.packing == "mask" and c.recompute != "none" else []


def inputs(c: Shape) -> list:
    """(name, bytes, why) of what a packed batch carries beyond token and target ids."""
    if c.packing in ("mask", "eager"):
        return [("document ids", B * S * 8, "(B, S) int64: which document each token belongs to "
                                            "(torchtune's _get_document_ids_from_seq_lens)")]
    if c.packing == "varlen":
        return [("position ids", B * S * 8, "(B, S) int64, restarting at each document (TRL's padding-free "
                                            "collator)"),
                ("cu_seqlens", (B * c.packed + 1) * 4, "(B*n + 1) int32: where each document starts, flash-attention "
                                                       "varlen's cumulative lengths")]
    return []
