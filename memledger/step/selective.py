"""Selective recomputation: the attention core under a checkpoint, forward without saving and recomputed in backward.

The reference decoder's ``recompute="selective"`` (:mod:`memledger.pytorch.reference`, Korthikanti et al. 2022, Sec. 5)
wraps the attention core, ``q, k, v -> softmax(q k^T / sqrt(d/H)) v`` (or the SDPA call), in
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``:

* **Forward.** The core runs without saving: its q/k/v copies, S x S scores, softmax and dropout (its mask
  too) die as soon as their last reference does, as in a fully checkpointed block (:func:`dropped_core`,
  shared with :mod:`memledger.step.recompute`); a flash kernel's log-sum-exp dies at once. What the block
  keeps is the inventory without the core's own tensors (:func:`memledger.activations.inventory.kept_rows`): the
  checkpoint holds its inputs q, k and v, views of the fused QKV projection's output (the Q, K and V rows,
  at any B), and the output projection keeps the core's output (merged heads).
* **Backward.** When autograd first unpacks a tensor the core saved (the ``@ v`` node's, after the output
  projection's backward), the core is re-run with saving on and stops as soon as its last saved tensor is
  packed (``_StopRecomputationError``, ``torch/utils/checkpoint.py``; autograd packs a node's inputs before
  its kernel runs, so ``@ v`` is not recomputed): the copies, probabilities and dropout tensors come back as
  transients (:func:`recompute_core`). The checkpoint's frame, and with it q, k, v (and, in block 0, the
  causal mask it also holds), is released once the core's last saved tensor is: after ``QK^T``'s backward.
  A flash kernel is re-run whole (its output and log-sum-exp come back) and its backward follows.

Read off MemTracker's allocation log of the reference (PyTorch 2.13, CPU) and checked against it by
``tests/step/test_selective.py``.
"""
from .ops import BHSS, CAUSAL_MASK, dropout_ops, widths_of
from ..core.symbols import B, H, S

RECOMPUTED = " (recomputed)"


def dropped_core(p, c):
    """The eager attention core run without saving (inside a checkpoint): q and k (and v) copies for the
    batched matmuls, the S x S scores, softmax, dropout (its mask dropped) and ``@ v``, each freed as soon as
    its last reference dies; returns the name of its (B, H, S, d/H) output, a local until the block returns.
    Its inputs (q, k, v views of the fused projection) are live."""
    a, drop = c.dtype, c.dropout
    BSq, BSkv = widths_of(c)
    raw = p.new("scores QK^T (checkpointed)", BHSS, a, "q @ k^T")
    scaled = p.new("scaled scores (checkpointed)", BHSS, a, "a Python local until the core returns")
    masked = p.new("masked scores (checkpointed)", BHSS, a, "softmax's input")
    probs = p.new("probabilities (checkpointed)", BHSS, a, "softmax's output")
    out4 = p.new("attention output (B, H, S, d/H) (checkpointed)", BSq, a, "a local until the block returns")
    if c.gqa:
        grouped = [p.new(f"{n} copy (checkpointed)", w, a, "the grouped core's copy, a local until it returns") for n, w in (("q", BSq), ("k", BSkv), ("v", BSkv))]
        p.op("q copied, k, v made contiguous", alloc=grouped)
        p.op("QK^T", alloc=[raw])
        p.op("scale", alloc=[scaled])
        p.op("causal masked_fill", free=[raw], alloc=[masked])
        p.op("softmax", alloc=[probs])
        p.op("released", free=[masked])
        p.op("probabilities @ V", alloc=[out4])
        p.op("released", free=grouped + [probs, scaled])
        return out4
    copies = [] if c.single else [p.new(f"{n} copy (checkpointed)", BSq, a, "for the batched matmul")
                                  for n in ("q", "k", "v")]
    if copies:
        p.op("q, k copied", alloc=copies[:2])
    p.op("QK^T", alloc=[raw])
    p.op("scale", free=copies[:2], alloc=[scaled])
    p.op("causal masked_fill", free=[raw], alloc=[masked])
    p.op("softmax", alloc=[probs])
    p.op("released", free=[masked])
    if drop:
        dm = p.new("attention dropout mask (dropped)", BHSS, c.mask_dtype or a, "not kept")
        do = p.new("attention dropout output (checkpointed)", BHSS, a, "@ v's input")
        p.op("attention dropout", alloc=[dm, do])
        p.op("released", free=[dm, probs])
        probs = do
    p.op("probabilities @ V", alloc=copies[2:] + [out4])
    p.op("released", free=copies[2:] + [probs, scaled])
    return out4


def selective_forward_core(p, c) -> list:
    """The fused QKV projection and the checkpointed core of a block's forward under selective recomputation;
    allocates the saved Q, K, V (views of the projection's output, kept by the checkpoint) and the output
    projection's input; returns the locals freed when the block returns."""
    p.op("QKV projection (q, k, v: views the checkpoint keeps)", alloc=["Q", "K", "V"])
    if c.attention == "flash":
        lse = p.new("log-sum-exp (dropped)", (B, H, S), "fp32", "not kept: the checkpointed call recomputes it")
        p.op("flash attention (checkpointed; its output laid out as the merged heads)",
             alloc=["output projection input", lse])
        p.op("log-sum-exp dropped", free=[lse])
        return []
    out4 = dropped_core(p, c)
    p.op("heads merged (a copy)", alloc=["output projection input"])
    return [out4]


def recompute_flash(p, c) -> list:
    """The checkpointed flash call re-run before its backward: its output and log-sum-exp come back."""
    out = p.new("flash output" + RECOMPUTED, widths_of(c)[0], c.dtype, "the re-run kernel's output (its backward reads it)")
    lse = p.new("softmax log-sum-exp" + RECOMPUTED, (B, H, S), "fp32", "the re-run kernel's statistics")
    p.op("flash attention recomputed", alloc=[out, lse])
    return [out, lse]


def recompute_core(p, c) -> dict:
    """The eager core re-run with saving, up to its last saved tensor (``@ v``'s inputs); returns the names
    its backward reads and frees: "q", "k", "v" (the copies; None where the views are used), "probs",
    "mask" and "dropped" (dropout's; None without), and "frame": what the checkpoint releases after
    ``QK^T``'s backward (q, k, v and the causal mask it holds)."""
    a, drop = c.dtype, c.dropout
    why = "recomputed for the core's backward"
    single = c.single and not c.gqa
    BSq, BSkv = widths_of(c)
    widths = {"q": BSq, "k": BSkv, "v": BSkv}
    copy = {n: None if single else p.new(f"{n} copy" + RECOMPUTED, w, a, why + ": a contiguous copy") for n, w in widths.items()}
    raw = p.new("scores QK^T" + RECOMPUTED, BHSS, a, why)
    scaled = p.new("scaled scores" + RECOMPUTED, BHSS, a, "a local of the core, dropped when recomputation stops")
    masked = p.new("masked scores" + RECOMPUTED, BHSS, a, "softmax's input")
    probs = p.new("softmax output" + RECOMPUTED, BHSS, a, why + ": softmax backward needs it")
    if c.gqa:
        p.op("q copied, k, v made contiguous (recomputation)", alloc=[copy["q"], copy["k"], copy["v"]])
    elif not single:
        p.op("q, k copied (recomputation)", alloc=[copy["q"], copy["k"]])
    p.op("QK^T (recomputed)", alloc=[raw])
    p.op("scale (recomputed)", alloc=[scaled])
    p.op("causal masked_fill (recomputed)", free=[raw], alloc=[masked])
    p.op("softmax (recomputed)", alloc=[probs])
    p.op("released", free=[masked])
    mask = dropped = None
    if drop:
        mask = p.new("attention dropout mask" + RECOMPUTED, BHSS, c.mask_dtype or a, why)
        dropped = p.new("attention dropout output" + RECOMPUTED, BHSS, a, why + ": @ v's backward needs it")
        dropout_ops(p, c, "attention (recomputed)", mask, dropped)
    if not c.gqa and not single:
        p.op("v copied (recomputation)", alloc=[copy["v"]])
    p.op("recomputation stops (@ v's inputs packed)", free=[scaled])
    return {"q": copy["q"], "k": copy["k"], "v": copy["v"], "probs": probs, "mask": mask, "dropped": dropped,
            "frame": ["Q", "K", "V", CAUSAL_MASK]}
