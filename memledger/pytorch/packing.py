"""Packed sequences in the reference decoder: several documents in one row of S tokens, each attending only
to itself (``RefConfig(packed=n)``).

* The batch carries each row's **document ids**, (B, S) int64: torchtune's ``_get_document_ids_from_seq_lens``
  (pytorch/torchtune 13036950, ``torchtune/modules/attention_utils.py`` l. 64-92), here n documents of S/n
  tokens each (:func:`document_ids`).
* One **block-causal mask** per forward (:func:`block_causal_mask`): token i attends to token j when both lie
  in the same document and j <= i, the mask of torchtune's ``create_block_causal_mask`` (same file, l. 95-130:
  ``torch.block_diag`` of ``tril(ones)`` per document, ``torch.stack`` over the batch) and of its flex-attention
  ``mask_mod`` (``causal_mask & document_mask``), built here over the whole batch at once: ``ones(S, S).tril()``
  and ``documents[:, :, None] == documents[:, None, :]`` (B, S, S), and'ed into the (B, S, S) bool mask.
  Every block passes it to SDPA as ``mask[:, None]`` (torchtune's ``_sdpa_or_flex_attention``, its SDPA branch).
* SDPA turns a boolean ``attn_mask`` into an additive one in q's dtype at every call (ATen
  ``aten/src/ATen/native/transformers/attention.cpp`` ``convert_boolean_attn_mask``), and the CPU flash kernel
  saves it for backward (``_scaled_dot_product_flash_attention_for_cpu``; measured, PyTorch 2.13): one
  (B, 1, S, S) tensor per block, kept until that block's backward.
* The **eager core** (GPT blocks, and LLaMA blocks under ``attention="eager"``, the article backend's) masks
  its S x S scores with ``masked_fill`` where the mask is ``True``: the decoder inverts the block-causal mask
  once per forward (:func:`masked_positions`, (B, S, S) bool, ``~``) and every block passes it as
  ``mask[:, None]``, (B, 1, S, S), broadcast over the heads. This is Megatron-LM's convention for packed
  documents: ``get_ltor_masks_and_position_ids(..., reset_attention_mask=True)`` (``megatron/training/utils.py``)
  builds a (B, 1, S, S) mask per document, ``< 0.5`` (True = masked), and ``attention_mask_func``
  (``megatron/core/transformer/utils.py``, 00caa53a) applies it with ``masked_fill_``. Each block's
  ``masked_fill`` saves the mask for its backward: one storage, shared by every block, alive until block 0's
  backward (the unpacked core's (S, S) causal mask, B times larger).
* The loss is unchanged: labels of the tokens not to be predicted hold ``-100``, which ``F.cross_entropy``'s
  default ``ignore_index`` skips without a tensor of its own (torchtune's ``PackedDataset`` pads labels with
  ``CROSS_ENTROPY_IGNORE_IDX`` = -100).
"""
import torch

__all__ = ["block_causal_mask", "document_ids", "masked_positions"]


def document_ids(batch: int, seq: int, n: int) -> torch.Tensor:
    """(B, S) int64: n documents of S/n tokens in each row (S a multiple of n)."""
    if seq % n:
        raise ValueError(f"packed: seq_len ({seq}) must be a multiple of the documents per row ({n})")
    return (torch.arange(seq) // (seq // n)).expand(batch, seq).contiguous()


def block_causal_mask(documents: torch.Tensor) -> torch.Tensor:
    """(B, S, S) bool: ``True`` where token i may attend to token j (same document, j <= i)."""
    S = documents.shape[1]
    causal = torch.ones(S, S, dtype=torch.bool, device=documents.device).tril()
    return (documents[:, :, None] == documents[:, None, :]) & causal


def masked_positions(documents: torch.Tensor) -> torch.Tensor:
    """(B, 1, S, S) bool view of one (B, S, S) tensor: ``True`` where the eager core's ``masked_fill`` writes
    -inf (another document, or a later token): the block-causal mask inverted."""
    return (~block_causal_mask(documents))[:, None]
