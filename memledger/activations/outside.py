"""Tensors a training step keeps outside the transformer blocks, at the end of the forward pass.

The article's ledger books the L blocks only. A whole model also keeps, until
backward (the reference decoder of :mod:`memledger.pytorch.reference`, checked in
``tests/pytorch/test_reference.py``):

* the input ids (the embedding's backward needs them) and the target ids, int64;
* the (S, S) causal mask of eager attention, built once and shared by all layers;
* the final norm's input (and statistics), and its output, the LM head's input;
* the FP32 log-softmax of the logits, B*S*V*4 bytes: ``F.cross_entropy`` on
  ``logits.float()`` keeps it for its backward (the BF16 logits and their FP32
  copy are freed by then: they are transients of the loss, :mod:`memledger.step.ops`);
* the loss and ``nll_loss``'s total weight, one FP32 scalar each.

Under tensor parallelism (t ranks) each row is split as Megatron-LM splits it
(:meth:`memledger.activations.inventory.Saved.rank_bytes`; Korthikanti et al. 2022, Sec. 4.3:
final norm input 2sbh/t, output-layer input 2sbh/t, FP32 logits 4sbv/t under
tensor + sequence parallelism). The FP32 log-softmax is vocabulary-parallel, split
under any tensor parallelism (``ColumnParallelLinear`` over V with
``gather_output=False``, ``core/models/gpt/gpt_model.py`` l. 277-288; the loss
``vocab_parallel_cross_entropy`` keeps its B*S*V/t FP32 softmax,
``core/tensor_parallel/cross_entropy.py`` l. 25, 181). The final norm's input and the
LM head's input are split only under sequence parallelism: the embedding scatters
the sequence (``core/models/common/embeddings/language_model_embedding.py``
l. 143-147) and the output layer saves its un-gathered input
(``core/tensor_parallel/layers.py`` l. 604, gathered after, l. 623-629); without it
every rank holds them whole. Token ids, the causal mask and the loss scalars are
never split (``compute_language_model_loss`` reads all labels,
``core/models/common/language_module/language_module.py`` l. 172). Megatron-LM
at commit d98e8a64.
"""

from .inventory import Saved, norm_rows
from ..core.symbols import B, S, V, d

__all__ = ["outside_inventory"]

def outside_inventory(style: str = "gpt", *, dtype: str = "bf16", norm_stats: str = None,
                      rmsnorm: str = "fused", attention: str = "eager", input_norm: bool = False) -> list:
    """Saved tensors outside the blocks at the end of the forward pass (one copy, not per layer);
    ``input_norm``: BLOOM's ``word_embeddings_layernorm`` keeps the embedding output (and its statistics)."""
    norm = "LayerNorm" if style == "gpt" else "RMSNorm"
    rows = [Saved("input ids", "the batch's token ids; the embedding's backward needs them", (B, S), "int64",
                  block="outside", replicated=True),
            Saved("target ids", "the next-token labels the loss reads", (B, S), "int64", block="outside",
                  replicated=True)]
    if attention == "eager":
        rows.append(Saved("causal mask", "one (S, S) bool mask, built once per forward and shared by all layers",
                          (S, S), "bool", block="outside", replicated=True))
    if input_norm:
        rows += norm_rows(norm, 0, dtype, norm_stats, rmsnorm, prefix=f"embedding {norm}", block="outside")
    rows += norm_rows(norm, 0, dtype, norm_stats, rmsnorm, prefix=f"final {norm}", block="outside")
    rows += [Saved("LM head input", "the LM head's weight gradient needs the final norm's output", (B, S, d), dtype,
                   block="outside"),
             Saved("log-softmax output (FP32)", "cross-entropy on FP32 logits keeps log_softmax's output",
                   (B, S, V), "fp32", block="outside", tp_sharded=True),
             Saved("loss", "the scalar loss (FP32)", (), "fp32", block="outside", replicated=True),
             Saved("nll_loss total weight", "nll_loss keeps its total weight (FP32 scalar) for backward", (), "fp32",
                   block="outside", replicated=True)]
    return rows

