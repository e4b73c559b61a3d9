"""The decoder families' ops outside the blocks: learned positions (GPT-BigCode/StarCoder's ``wpe``), BLOOM's
embedding LayerNorm (``word_embeddings_layernorm``) and BLOOM's ALiBi bias, built once per forward.

As the reference decoder runs them (:class:`memledger.pytorch.reference.Decoder`, read off MemTracker's log,
PyTorch 2.13, CPU):

* positions (``RefConfig.positions`` = n): ``x = embed(ids) + pos(arange(S)[None])``: the (1, S) int64 position ids
  are saved by the position embedding for its backward (S x 8 bytes), its (1, S, d) output and the token
  embedding's B x S x d output die once the sum is made. Backward: the sum's gradient is summed over the batch
  (``sum_to_size``, a (1, S, d) tensor; none where B = 1), ``embedding_dense_backward`` writes the n x d weight
  gradient, and the token embedding's backward follows (autograd runs the later node first).
* the embedding LayerNorm keeps its input (the embedding output) and statistics (outside rows ``embedding
  LayerNorm ...``); its backward writes its input gradient and its weight and bias gradients in one kernel.
* ALiBi (``Decoder._alibi``): the H FP32 slopes, an FP32 arange(S), their (1, H, 1, S) FP32 product, and its copy
  in the activation dtype (under FP32 the product itself), which lives until the decoder returns (after the LM
  head); in each block's eager core ``scores + alibi`` is a B x H x S x S tensor that takes the scaled scores'
  place (they go once it is made, so the core's totals are those without the bias;
  :func:`memledger.step.block.attention_core`), with nothing saved for backward (the bias needs no gradient).
  Under recomputation the bias is an input of every block's checkpoint (``checkpoint(block, x, mask, alibi)``, or
  the core's under selective recomputation): it lives until block 0's checkpoint frame goes, with the causal
  mask.

The parameters follow the blocks and the final norm in ``model.parameters()`` order: the embedding LayerNorm's,
then the position embedding's (the reference registers them last).
"""
from ..activations.inventory import Saved
from ..core.symbols import H, N_pos, S, d
from .norms import norm_backward, norm_forward
from .ops import BSd, Ref, per_rank, residual_names
from .structure import Shape
from .vocab import OpRole, Scope

__all__ = ["ALIBI", "ALIBI_INPUT", "POSITION_IDS", "alibi_released", "embedding_backward", "embedding_forward",
           "extra_params", "outside_rows"]

POSITION_IDS = "position ids"
ALIBI = "ALiBi bias (1, H, 1, S)"
#: The ALiBi bias named by a block: a checkpoint's input (recomputation) until block 0's checkpoint lets it go.
ALIBI_INPUT = Ref(Scope.SHARED, ALIBI)
INPUT_NORM = "embedding LayerNorm input"


def extra_params(c: Shape) -> list:
    """(name, elements) of the families' parameters, after the final norm's in ``model.parameters()`` order."""
    return ([("input norm.weight", d), ("input norm.bias", d)] if c.input_norm else []) + (
        [("position embedding.weight", N_pos * d)] if c.positions else [])


def outside_rows(c: Shape) -> list:
    """What the families keep outside the blocks at the end of the forward pass: learned positions' ids (int64, one
    row of S); under recomputation the ALiBi bias, the blocks' checkpoints' input."""
    return [Saved(POSITION_IDS, "arange(S)[None], int64: the position embedding's backward needs them", (S,), "int64",
                  block="outside", replicated=True)] * c.positions + [
        Saved(ALIBI, "every block's checkpoint keeps it for its recomputation", (H, S), c.dtype, block="outside",
              replicated=True)] * (c.alibi and c.recompute != "none")


def embedding_forward(p, c: Shape):
    """The embedding (plus positions, through the embedding LayerNorm) up to block 0's input; the ALiBi bias."""
    first = Ref(Scope.FIRST, residual_names(c)[0])
    out = INPUT_NORM if c.input_norm else first
    if c.positions:
        a = c.dtype
        tokens = p.new("token embedding output", BSd, a, "embed(ids), until the positions are added")
        pos = p.new("position embedding output", (S, d), a, "pos(arange(S)[None]): (1, S, d)")
        p.op("embedding", alloc=[tokens])
        p.op("position ids: arange(S)", alloc=[POSITION_IDS])
        p.op("position embedding", alloc=[pos])
        p.op("token + position embeddings", alloc=[out])
        p.op("released", free=[tokens, pos])
    else:
        p.op("embedding", alloc=[out], role=OpRole.EMBEDDING)
    if c.input_norm:
        norm_forward(p, c, "embedding", first)
    if c.alibi:
        heads = per_rank(c, (H,))[0]
        slopes = p.new("ALiBi slopes (FP32)", (heads,), "fp32", "torch.tensor of the H slopes")
        positions = p.new("ALiBi key positions (FP32)", (S,), "fp32", "arange(S) in FP32")
        if c.recompute == "none":       # else a row of its own (outside_rows)
            p.new(ALIBI, (heads, S), c.dtype, "the bias every block adds to its scores, until the decoder returns")
        p.op("ALiBi slopes", alloc=[slopes])
        p.op("ALiBi positions", alloc=[positions])
        if c.dtype == "fp32":           # .to(torch.float32) of an FP32 tensor is the tensor itself
            p.op("slopes x positions", alloc=[ALIBI])
            p.op("released", free=[slopes, positions])
            return
        product = p.new("ALiBi slopes x positions (FP32)", (heads, S), "fp32", "(1, H, 1, S) before the downcast")
        p.op("slopes x positions", alloc=[product])
        p.op("ALiBi bias to the activation dtype", alloc=[ALIBI])
        p.op("released", free=[slopes, positions, product])


def alibi_released(p, c: Shape):
    """The decoder returns after its LM head: the ALiBi bias goes (under recomputation every block's checkpoint
    holds it as an input: block 0's backward releases it, :func:`memledger.step.block.block_backward`)."""
    if c.alibi and c.recompute == "none":
        p.op("decoder returns: ALiBi bias released", free=[ALIBI])


def embedding_backward(p, c: Shape) -> str:
    """Backward from block 0's input gradient through the embedding LayerNorm and the position embedding;
    returns the gradient that reaches the token embedding's backward."""
    g = "grad of the embedding output"
    if c.input_norm:
        g_in = p.new("grad of the token embedding output", BSd, c.dtype, "the embedding LayerNorm's input gradient")
        norm_backward(p, c, "embedding", g, g_in, ["grad input norm.weight", "grad input norm.bias"])
        g = g_in
    if c.positions:
        summed = None
        if not c.single:
            summed = p.new("position gradient summed over the batch", (S, d), c.dtype, "add backward: sum_to_size "
                           "(1, S, d)")
            p.op("add backward: summed over the batch", alloc=[summed])
        p.op("position embedding backward", alloc=["grad position embedding.weight"])
        p.op("released", free=[summed, POSITION_IDS])
    return g
