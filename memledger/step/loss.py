"""Chunked cross-entropy, op by op: the LM head per chunk of the sequence; torchtune's (each chunk upcast to FP32)
and LitGPT's (no upcast).

torchtune (``pytorch/torchtune`` at bd2a0fc7): ``TransformerDecoder.chunked_output``
(``torchtune/modules/transformer.py`` l. 493-512) applies the output projection to each of
``last_hidden_state.tensor_split(num_output_chunks, dim=1)`` and returns the list of BF16 logit chunks
(``unembed``, l. 679-688, instead of ``self.output(h).float()``); ``CEWithChunkedOutputLoss.forward``
(``torchtune/modules/loss/ce_chunked_output_loss.py`` l. 84-102) counts the tokens
(``(labels != ignore_index).sum()``), splits the labels the same way, and sums
``F.cross_entropy(logits_chunk.float(), labels_chunk, reduction="sum")`` (l. 48-50) over the chunks, divided
by the count. The reference decoder runs exactly this (:meth:`memledger.pytorch.reference.Decoder.loss`).

With n chunks of T_k = ceil((S - k)/n) tokens (``tensor_split``: the first S mod n chunks one longer):

* forward: the n BF16 logit chunks (B*T_k*V each, together the B*S*V of the unchunked head) all live until
  the loss returns; per chunk, in turn, its FP32 copy (4*B*T_k*V, freed after its cross-entropy) and its
  FP32 log-softmax (4*B*T_k*V, saved: together the same 4*B*S*V as unchunked), its ``total_weight`` (4 B,
  saved). With B > 1 a chunk of the LM head's input and of the labels is a strided slice: the matmul and
  ``reshape(-1)`` copy it (saved), and the whole LM head input dies when the decoder returns.
* backward (autograd's CPU engine runs the node created last first): every chunk's loss backward, chunk
  n-1 first (an FP32 ``nll_loss`` and ``log_softmax`` gradient, 4*B*T_k*V each, then the chunk's BF16
  logits gradient, which waits for the head), then the head's backward chunk by chunk: each matmul writes
  a whole V x d weight gradient, summed out of place into autograd's input buffer (three V x d tensors
  live while two are added), and each chunk's input gradient waits for ``tensor_split``'s backward, which
  pads each to B*S*d and sums them the same way.

LitGPT's ``chunked_cross_entropy`` (``litgpt/utils.py`` l. 302-337 at 26857050; the head per chunk by
``x.split(lm_head_chunk_size, dim=1)``, ``litgpt/model.py`` l. 177-179, 128 tokens in ``finetune/lora.py``
l. 355) runs ``F.cross_entropy(reduction="none")`` on each chunk's logits in their own dtype: the log-softmax
and both gradients are BF16 (2*B*T*V each), the chunks' losses are concatenated, summed and divided by
``max(count, 1)``; ``split``'s backward joins the input gradients with one ``cat``. Without chunks it is one
mean ``F.cross_entropy`` on the BF16 logits. Modelled with S a multiple of the chunks (``split`` by S/n).

The unchunked loss's peak in the loss phase holds 12*B*S*V bytes (three FP32 B*S*V tensors in its backward);
the chunked loss's 4*B*S*V + 8*B*T*V (its first chunk's two FP32 gradients) plus the 2*B*S*V BF16 logits in
forward or, in backward, its BF16 logits gradients. Read off MemTracker's log of the reference decoder
(PyTorch 2.13, CPU) and checked by ``tests/step/test_loss.py``. Measured at LLaMA-3 8B's shape (B 1, S 8192,
``bf16-adamw``, CPU conventions), 8 chunks lower the step's peak by 5,778,702,296 bytes, 16 by 6,041,370,552.
"""
import sympy as sp

from ..core.symbols import B, S, V, d
from .norms import norm_backward, norm_forward
from .ops import BSd, Ref, Tensor, final_input
from .outer import final_norm_params
from .vocab import Kind, Lifetime, OpRole, Scope

__all__ = ["chunk_tokens", "chunked_backward_start", "chunked_forward_end", "join_input_gradients",
           "litgpt_forward_end", "replaced_rows", "saved_names", "split_by_chunk", "tokens",
           "torchtune_chunk_tokens"]


def chunk_tokens(k: int, n: int):
    """Tokens of chunk ``k`` of ``n`` (``torch.tensor_split``): ceil((S - k)/n)."""
    return sp.ceiling((S - k) / n)


def replaced_rows(c) -> set:
    """Rows of :func:`memledger.activations.outside.outside_inventory` the chosen loss keeps as other tensors:
    the FP32 log-softmax and ``total_weight`` (per chunk, or in the logits' dtype), LitGPT's loss in that dtype,
    and with B > 1 and chunks the LM head input (its chunks' copies are kept instead)."""
    if not (c.loss_chunks > 1 or c.loss_impl == "litgpt"):
        return set()
    return ({"log-softmax output (FP32)", "nll_loss total weight"} | ({"loss"} if c.loss_impl == "litgpt" else set())
            | (set() if c.single or c.loss_chunks == 1 else {"LM head input"}))


def saved_names(c) -> list:
    """The tensors the loss keeps from forward to backward beside the rows it does not replace: per chunk its
    log-softmax and ``total_weight`` (with B > 1 its copies of the LM head input and labels), the token count,
    LitGPT's loss in the logits' dtype (none for the reference's own loss)."""
    n, litgpt = c.loss_chunks, c.loss_impl == "litgpt"
    if n == 1 and not litgpt:
        return []
    per = ["log-softmax output, chunk {}", "nll_loss total weight, chunk {}"] + (
        [] if c.single or n == 1 else ["LM head input, chunk {}", "labels, chunk {}"])
    return [name.format(k) for k in range(n) for name in per] + (["tokens counted"] if n > 1 else []) + (
        ["loss"] if litgpt else [])


def _saved(p, name, shape, dtype, why):
    p.new(name, shape, dtype, why)
    p.tensors[name] = Tensor(name, p.tensors[name].expr, Kind.ACTIVATION, Lifetime.SAVED, why=why)
    return name


def tokens(c) -> list:
    """Each chunk's tokens: LitGPT's ``split`` by S/n, torchtune's ``tensor_split`` (:func:`chunk_tokens`), or
    under ``implementation="torchtune"`` torchtune 0.6.1's ``chunk`` (:func:`torchtune_chunk_tokens`)."""
    return _tokens(c)


def torchtune_chunk_tokens(k: int, n: int):
    """Tokens of chunk ``k`` of ``n`` as torchtune 0.6.1 splits them: ``last_hidden_state.chunk(n, dim=1)``
    (``torchtune/modules/transformer.py`` l. 499-502) and ``labels.chunk(n, dim=1)``
    (``torchtune/modules/loss/ce_chunked_output_loss.py`` l. 69-72): ceil(S/n) each, the last what is left.
    (torchtune's main branch, bd2a0fc7, uses ``tensor_split`` instead: :func:`chunk_tokens`.) ``chunk`` makes fewer
    than n chunks where ceil(S/n) * (n - 1) >= S; :func:`memledger.step.implementations.check_torchtune_chunks`
    refuses that."""
    size = sp.ceiling(S / n)
    return size if k < n - 1 else S - (n - 1) * size


def split_by_chunk(c) -> bool:
    """The chunks are ``split`` views (one ``SplitBackward0``, whose backward is one ``cat``), not
    ``tensor_split``'s slices: LitGPT's, and torchtune 0.6.1's ``chunk``."""
    return c.loss_impl == "litgpt" or _torchtune(c)


def _torchtune(c) -> bool:
    return getattr(c, "implementation", "reference") == "torchtune"


def _tokens(c):
    n = c.loss_chunks
    if c.loss_impl == "litgpt":          # split(S/n): S a multiple of n (Ledger checks)
        return [S / n] * n
    if _torchtune(c):
        return [torchtune_chunk_tokens(k, n) for k in range(n)]
    return [chunk_tokens(k, n) for k in range(n)]


def _head_forward(p, c, T) -> list:
    """The final norm and the LM head on each chunk (one call without chunks); the decoder returns."""
    a, n = c.dtype, c.loss_chunks
    norm_forward(p, c, "final", "LM head input")
    logits = []
    for k in range(n):
        if not c.single and n > 1:
            x = _saved(p, f"LM head input, chunk {k}", (B, T[k], d), a, "a strided slice of the LM head input: "
                       "the matmul copies it and saves the copy")
            p.op(f"chunk {k}: LM head input copied", alloc=[x])
        logits.append(p.new(f"logits, chunk {k}", (B, T[k], V), a, "the LM head's output on chunk k"))
        p.op(f"LM head, chunk {k}" if n > 1 else "LM head", alloc=[logits[-1]],
             role=None if n > 1 else OpRole.LM_HEAD)
    released = ([final_input(c)] if c.upcast else []) + ([] if c.single or n == 1 else ["LM head input"])
    p.op("the decoder returns", free=released, role=OpRole.DECODER_RETURNS)
    return logits


def _labels(p, c, T) -> list:
    """Each chunk's labels: ``reshape(-1)`` of a strided slice copies it with B > 1 (saved by nll_loss)."""
    labels = [None] * c.loss_chunks
    if not c.single and c.loss_chunks > 1:
        for k in range(c.loss_chunks):
            labels[k] = _saved(p, f"labels, chunk {k}", (B, T[k]), "int64", "reshape(-1) of a strided slice: a "
                               "copy, saved by nll_loss")
            p.op(f"labels chunk {k}: reshape(-1)", alloc=[labels[k]])
    return labels


def _count(p):
    mask = p.new("labels != ignore_index", (B, S), "bool", "the tokens counted")
    p.op("labels != ignore_index", alloc=[mask], role=OpRole.LOSS_STARTS)
    p.op("count: .sum()", alloc=[_saved(p, "tokens counted", (), "int64", "the divisor, saved by the division")])
    p.op("released", free=[mask])


def chunked_forward_end(p, c, head=None):
    """Final norm, the LM head chunk by chunk, the loss: torchtune's ``CEWithChunkedOutputLoss.forward``, or
    LitGPT's ``chunked_cross_entropy`` (:func:`litgpt_forward_end`). ``head(p, c, T)``: the final norm and the
    head's chunks, returning the logits' names (default: a trained head; :mod:`memledger.step.lora_loss` a frozen
    one)."""
    if c.loss_impl == "litgpt":
        return litgpt_forward_end(p, c, head)
    a, n = c.dtype, c.loss_chunks
    T = _tokens(c)
    logits = (head or _head_forward)(p, c, T)
    _count(p)
    _labels(p, c, T)
    total = p.new("sum of the chunks' losses", (), "fp32", "total_loss: 0.0 + the first chunk's, then += in place")
    for k in range(n):
        src = logits[k]
        if a != "fp32":
            src = p.new(f"logits in FP32, chunk {k}", (B, T[k], V), "fp32", "logits_chunk.float()")
            p.op(f"chunk {k}: .float()", alloc=[src])
        lsm = _saved(p, f"log-softmax output, chunk {k}", (B, T[k], V), "fp32", "FP32, saved for backward")
        p.op(f"chunk {k}: log_softmax", alloc=[lsm])
        loss = p.new(f"loss of chunk {k}", (), "fp32", "nll_loss(reduction='sum')")
        weight = _saved(p, f"nll_loss total weight, chunk {k}", (), "fp32", "nll_loss keeps it for backward")
        p.op(f"chunk {k}: nll_loss", alloc=[loss, weight])
        if src != logits[k]:
            p.op("FP32 copy released", free=[src])
        p.op("total_loss += loss", alloc=[total] if k == 0 else [])
        p.op("released", free=[loss])
    p.op("total_loss / tokens", alloc=["loss"])
    p.op("released", free=[total] + logits)


def litgpt_forward_end(p, c, head=None):
    """LitGPT's ``chunked_cross_entropy`` (``litgpt/utils.py`` l. 302-337 at 26857050): cross-entropy on the
    logits in their own dtype (no upcast), per chunk with ``reduction="none"``, the chunks' losses concatenated,
    summed and divided by ``max(count, 1)``; one mean cross-entropy without chunks."""
    a, n = c.dtype, c.loss_chunks
    T = _tokens(c)
    logits = (head or _head_forward)(p, c, T)
    _labels(p, c, T)
    losses = []
    for k in range(n):
        p.op(f"chunk {k}: log_softmax", alloc=[_saved(p, f"log-softmax output, chunk {k}", (B, T[k], V), a,
                                                      "in the logits' dtype, saved for backward")])
        loss = p.new(f"loss of chunk {k}", (B, T[k]), a, "reduction='none': one loss per token") if n > 1 \
            else _saved(p, "loss", (), a, "the mean loss, in the logits' dtype")
        losses.append(loss)
        p.op(f"chunk {k}: nll_loss", alloc=[loss, _saved(p, f"nll_loss total weight, chunk {k}", (), a,
                                                        "nll_loss keeps it for backward")])
    if n == 1:
        p.op("released", free=logits)
        return
    mask = p.new("labels != ignore_index", (B, S), "bool", "the tokens counted")
    count = p.new("non_masked_elems", (), "int64", "(targets != ignore_index).sum()")
    p.op("labels != ignore_index", alloc=[mask])
    p.op("count: .sum()", alloc=[count])
    cat = p.new("torch.cat(loss_chunks)", (B, S), a, "the chunks' losses in one tensor")
    p.op("torch.cat", alloc=[cat], free=[mask])
    total = p.new("sum of the chunks' losses", (), a, ".sum()")
    p.op(".sum()", alloc=[total])
    one = p.new("ones_like(non_masked_elems)", (), "int64", "max(count, 1) without a host sync")
    p.op("ones_like", alloc=[one], free=[cat])
    p.op("maximum", alloc=[_saved(p, "tokens counted", (), "int64", "the divisor, saved by the division")])
    p.op("division", alloc=[_saved(p, "loss", (), a, "the loss, in the logits' dtype")], free=[one])
    p.op("released", free=[total, count] + losses + logits)


def chunked_backward_start(p, c, head=None):
    """Backward through the chunked loss, the LM head chunk by chunk and the final norm; ends with the last
    block's ``dX_out``. ``head(p, c, T, grads)``: the head's and the final norm's backward from the chunks' logits
    gradients (default: a trained head's)."""
    a, n, litgpt = c.dtype, c.loss_chunks, c.loss_impl == "litgpt"
    T = _tokens(c)
    seed = "fp32" if not litgpt else a
    p.op("loss.backward()", alloc=[p.new("gradient of the loss", (), seed, "loss.backward() seeds a 1")],
         role=OpRole.LOSS_BACKWARD)
    total = None
    if n > 1:
        total = p.new("gradient of the chunks' sum", (), seed, "the division's backward")
        p.op("division backward", alloc=[total])
        p.op("released", free=["tokens counted"])
    grads = [None] * n
    for k in reversed(range(n)):        # the node created last runs first
        dtype = a if litgpt else "fp32"
        g1 = p.new(f"nll_loss gradient, chunk {k}", (B, T[k], V), dtype, "nll_loss backward")
        p.op(f"chunk {k}: nll_loss backward", alloc=[g1])
        p.op("released", free=[f"nll_loss total weight, chunk {k}"]
             + ([] if c.single or n == 1 else [f"labels, chunk {k}"]) + ([total] if k == 0 and total else []),
             role=OpRole.LABELS_RELEASED)
        g2 = p.new(f"log_softmax gradient, chunk {k}", (B, T[k], V), dtype, "log_softmax backward")
        p.op(f"chunk {k}: log_softmax backward", alloc=[g2])
        p.op("released", free=[g1, f"log-softmax output, chunk {k}"])
        grads[k] = g2
        if dtype != a:
            grads[k] = p.new(f"logits gradient, chunk {k}", (B, T[k], V), a, "downcast: waits for the LM head")
            p.op(f"chunk {k}: .float() backward", alloc=[grads[k]])
            p.op("released", free=[g2])
    (head or _head_backward)(p, c, T, grads)


def _head_backward(p, c, T, grads):
    """The LM head's backward chunk by chunk (weight gradients summed in autograd's buffer), the chunks' input
    gradients joined (``tensor_split``: padded and summed; ``split``: one ``cat``), the final norm's backward."""
    a, n = c.dtype, c.loss_chunks
    head = "LM head's contribution to the tied embedding gradient" if c.is_tied else "grad head.weight"
    if c.is_tied:
        p.tensors[head] = Tensor(head, p.tensors["grad embedding.weight"].expr, Kind.TRANSIENT, Lifetime.TEMPORARY,
                                 p.placement.gradients, "waits in autograd's buffer for the embedding's contribution")
    weight = p.tensors[head].expr
    gfn = p.new("gradient of the LM head input", BSd, a, "the LM head's input gradient (the chunks' joined)")
    inputs, buffer = [None] * n, None
    for k in reversed(range(n)):
        w = head if n == 1 else f"head weight gradient, chunk {k}"
        if n > 1:
            p.tensors[w] = Tensor(w, weight, Kind.TRANSIENT, Lifetime.TEMPORARY, p.placement.gradients,
                                  "one chunk's matmul writes a whole V x d weight gradient")
        inputs[k] = gfn if n == 1 else p.new(f"LM head input gradient, chunk {k}", (B, T[k], d), a,
                                             "waits for the chunks' gradients to be joined")
        p.op(f"LM head backward, chunk {k}" if n > 1 else "LM head backward", alloc=[w, inputs[k]],
             role=None if n > 1 else OpRole.LM_HEAD_BACKWARD)
        p.op("released", free=[grads[k], (f"LM head input, chunk {k}" if not c.single and n > 1 else
                                         "LM head input" if k == 0 else None)])
        if buffer is None:
            buffer = w
            continue
        summed = head if k == 0 else f"head weight gradients summed, chunks {k}..{n - 1}"
        if k:
            p.tensors[summed] = Tensor(summed, weight, Kind.TRANSIENT, Lifetime.TEMPORARY, p.placement.gradients,
                                       "autograd's input buffer, summed out of place")
        p.op("weight gradients summed", alloc=[summed])
        p.op("released", free=[buffer, w])
        buffer = summed
    join_input_gradients(p, c, inputs, gfn)
    norm_backward(p, c, "final", gfn, Ref(Scope.LAST, "dX_out"),
                  [f"grad {name}" for name, _ in final_norm_params(c)])


def join_input_gradients(p, c, inputs, gfn):
    """The chunks' LM head input gradients ``inputs`` (live) joined into ``gfn``: ``split``'s backward one ``cat``,
    ``tensor_split``'s a ``slice_backward`` per chunk (padded to B*S*d), summed out of place."""
    a, n = c.dtype, c.loss_chunks
    if n > 1 and split_by_chunk(c):             # split's backward: one cat of the chunks' gradients
        p.op("split backward: cat", alloc=[gfn], free=inputs)
    elif n > 1:                                 # tensor_split: a slice_backward per chunk, summed out of place
        buffer = None
        for k in reversed(range(n)):
            padded = p.new(f"LM head input gradient of chunk {k}, padded", BSd, a, "slice_backward: zeros but the "
                           "chunk")
            p.op(f"tensor_split backward, chunk {k}", alloc=[padded])
            p.op("released", free=[inputs[k]])
            if buffer is None:
                buffer = padded
                continue
            summed = gfn if k == 0 else p.new(f"LM head input gradients summed, chunks {k}..{n - 1}", BSd, a,
                                              "autograd's input buffer, summed out of place")
            p.op("input gradients summed", alloc=[summed])
            p.op("released", free=[buffer, padded])
            buffer = summed
