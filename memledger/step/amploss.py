"""torchtune's chunked cross-entropy under FP16 autocast (recipe ``fp16-amp-adamw`` with ``loss_chunks`` n > 1),
op by op: :mod:`memledger.step.loss` as autocast runs it (:mod:`memledger.step.amp`).

What changes (read off MemTracker's log of the reference decoder, PyTorch 2.13, CPU):

* forward: the final norm's output stays FP32 until the decoder returns; the head's weight is cast to FP16 once
  (autocast's cache, saved by every chunk's matmul); each chunk of the FP32 input is cast to FP16 (a copy at any
  B, saved); the logit chunks are FP16, each upcast to FP32 by ``.float()`` for its cross-entropy.
* backward: the loss seeds through GradScaler's product; chunk by chunk, last first, the head's matmul writes an
  FP16 V x d weight gradient (summed out of place in the weight cast's input buffer) and an FP16 input gradient,
  which the chunk cast's backward converts to FP32 at once; once every chunk has run, one conversion of the
  summed FP16 weight gradient into the FP32 ``.grad``; then ``tensor_split``'s backward pads and sums the FP32
  input gradients as without autocast.

Modelled for torchtune's loss (LitGPT's is refused under autocast); checked by tests/step/test_amp.py.
"""
from ..core.symbols import B, V, d
from .loss import _count, _labels, _saved, _tokens, join_input_gradients
from .norms import norm_backward, norm_forward
from .ops import BSd, Ref, Tensor
from .outer import final_norm_params
from .vocab import Kind, Lifetime, OpRole, Scope

__all__ = ["chunked_backward_start", "chunked_forward_end", "replaced_rows", "saved_names"]

H16 = "fp16"


def replaced_rows(c) -> set:
    """The outside rows the chunked loss keeps as other tensors under autocast: the log-softmax, ``total_weight``
    and the LM head input's FP16 copy (each chunk's copy is kept instead, at any B)."""
    return {"log-softmax output (FP32)", "nll_loss total weight", "LM head input"}


def saved_names(c) -> list:
    """What the chunked loss keeps from forward to backward under autocast: per chunk its log-softmax,
    ``total_weight``, its FP16 copy of the head's input (and with B > 1 its labels), and the token count."""
    n = c.loss_chunks
    if n == 1:
        return []
    per = ["log-softmax output, chunk {}", "nll_loss total weight, chunk {}", "LM head input, chunk {} (FP16)"] + (
        [] if c.single else ["labels, chunk {}"])
    return [name.format(k) for k in range(n) for name in per] + ["tokens counted"]


def chunked_forward_end(p, c):
    """Final norm (FP32), the head's weight cast once, each chunk's input cast and FP16 logits, the loss per chunk
    in FP32 (:func:`memledger.step.loss.chunked_forward_end`'s)."""
    from .amp import EXIT, cached, copy_name
    n = c.loss_chunks
    T = _tokens(c)
    fn = p.new("final norm output (FP32)", BSd, "fp32", "the final norm's output, until the decoder returns")
    norm_forward(p, c, "final", fn)
    p.op("autocast: head.weight to FP16 (cached)", alloc=[copy_name("head")])
    logits = []
    for k in range(n):
        x = _saved(p, f"LM head input, chunk {k} (FP16)", (B, T[k], d), H16, "autocast's FP16 cast of the chunk "
                   "(a copy), saved by its matmul")
        p.op(f"chunk {k}: autocast: LM head input to FP16", alloc=[x])
        logits.append(p.new(f"logits, chunk {k} (FP16)", (B, T[k], V), H16, "the LM head's output on chunk k"))
        p.op(f"LM head, chunk {k} (FP16)", alloc=[logits[-1]])
    p.op("the decoder returns", free=[fn], role=OpRole.DECODER_RETURNS)
    _count(p)
    _labels(p, c, T)
    total = p.new("sum of the chunks' losses", (), "fp32", "total_loss: 0.0 + the first chunk's, then += in place")
    for k in range(n):
        src = p.new(f"logits in FP32, chunk {k}", (B, T[k], V), "fp32", "logits_chunk.float()")
        p.op(f"chunk {k}: .float()", alloc=[src])
        lsm = _saved(p, f"log-softmax output, chunk {k}", (B, T[k], V), "fp32", "FP32, saved for backward")
        p.op(f"chunk {k}: log_softmax", alloc=[lsm])
        loss = p.new(f"loss of chunk {k}", (), "fp32", "nll_loss(reduction='sum')")
        weight = _saved(p, f"nll_loss total weight, chunk {k}", (), "fp32", "nll_loss keeps it for backward")
        p.op(f"chunk {k}: nll_loss", alloc=[loss, weight])
        p.op("FP32 copy released", free=[src])
        p.op("total_loss += loss", alloc=[total] if k == 0 else [])
        p.op("released", free=[loss])
    p.op("total_loss / tokens", alloc=["loss"])
    p.op("released", free=[total] + logits)
    if cached(c):
        p.op(EXIT, free=[], role=OpRole.AUTOCAST_EXIT)


def _seed(p) -> str:
    """``scaler.scale(loss).backward()``: the seed back through the scale's product and the division by the token
    count; returns the gradient of the chunks' sum."""
    scaled = p.new("scaled loss", (), "fp32", "scaler.scale(loss): loss * scale")
    p.op("scaler.scale(loss)", alloc=[scaled])
    p.op("loss.backward()", alloc=[p.new("gradient of the loss", (), "fp32", "loss.backward() seeds a 1")],
         role=OpRole.LOSS_BACKWARD)
    dl2 = p.new("gradient of the unscaled loss", (), "fp32", "the product's backward: seed * scale")
    p.op("scale backward", alloc=[dl2])
    total = p.new("gradient of the chunks' sum", (), "fp32", "the division's backward")
    p.op("division backward", alloc=[total])
    p.op("released", free=["tokens counted", dl2])
    return total


def _logit_gradients(p, c, total) -> list:
    """Each chunk's loss backward, the last chunk first: nll_loss, log_softmax (FP32), ``.float()``'s backward into
    FP16 (waiting for the LM head); returns the chunks' FP16 logit gradients (``total`` goes with chunk 0's)."""
    n, T = c.loss_chunks, _tokens(c)
    grads = [None] * n
    for k in reversed(range(n)):
        g1 = p.new(f"nll_loss gradient, chunk {k}", (B, T[k], V), "fp32", "nll_loss backward")
        p.op(f"chunk {k}: nll_loss backward", alloc=[g1])
        p.op("released", free=[f"nll_loss total weight, chunk {k}"] + ([] if c.single else [f"labels, chunk {k}"])
             + ([total] if k == 0 else []))
        g2 = p.new(f"log_softmax gradient, chunk {k}", (B, T[k], V), "fp32", "log_softmax backward")
        p.op(f"chunk {k}: log_softmax backward", alloc=[g2])
        p.op("released", free=[g1, f"log-softmax output, chunk {k}"])
        grads[k] = p.new(f"logits gradient, chunk {k} (FP16)", (B, T[k], V), H16, "downcast: waits for the LM head")
        p.op(f"chunk {k}: .float() backward", alloc=[grads[k]])
        p.op("released", free=[g2])
    return grads


def _head_gradient(p, c) -> str:
    """The FP32 gradient the head's weight gradient is converted into: ``grad head.weight``, or with a tied head a
    transient waiting in autograd's buffer for the embedding's contribution."""
    if not c.is_tied:
        return "grad head.weight"
    head = "LM head's contribution to the tied embedding gradient"
    p.tensors[head] = Tensor(head, p.tensors["grad embedding.weight"].expr, Kind.TRANSIENT, Lifetime.TEMPORARY,
                             p.placement.gradients, "the head's gradient of the tied weight in FP32, waiting in "
                             "autograd's buffer for the embedding's contribution")
    return head


def _head_backward(p, c, grads) -> tuple:
    """The head's FP16 matmul backward chunk by chunk, the last first: each writes a whole V x d FP16 weight
    gradient (summed out of place in the weight cast's input buffer) and an FP16 input gradient, converted to FP32
    at once by the chunk cast's backward; the head's FP16 weight copy goes with chunk 0. Returns (the chunks' FP32
    input gradients, the summed FP16 weight gradient)."""
    from .amp import copy_name
    n, T = c.loss_chunks, _tokens(c)
    inputs, buffer = [None] * n, None
    for k in reversed(range(n)):
        w = p.new(f"FP16 head weight gradient, chunk {k}", (V, d), H16, "one chunk's matmul writes a whole V x d "
                  "weight gradient")
        g16 = p.new(f"FP16 LM head input gradient, chunk {k}", (B, T[k], d), H16, "the chunk's input gradient")
        p.op(f"LM head backward, chunk {k}", alloc=[w, g16])
        p.op("released", free=[grads[k], f"LM head input, chunk {k} (FP16)"] + ([copy_name("head")] if k == 0 else []))
        if buffer is not None:
            summed = p.new(f"FP16 head weight gradients summed, chunks {k}..{n - 1}", (V, d), H16,
                           "the weight cast's input buffer, summed out of place")
            p.op("weight gradients summed", alloc=[summed])
            p.op("released", free=[buffer, w])
            w = summed
        buffer = w
        inputs[k] = p.new(f"LM head input gradient, chunk {k}", (B, T[k], d), "fp32", "the chunk cast's backward: "
                          "FP32, waits for the chunks' gradients to be joined")
        p.op(f"chunk {k}: input gradient to FP32", alloc=[inputs[k]])
        p.op("released", free=[g16])
    return inputs, buffer


def chunked_backward_start(p, c):
    """``scaler.scale(loss).backward()`` through the chunked loss, the head chunk by chunk and the final norm; ends
    with the last block's ``dX_out``."""
    grads = _logit_gradients(p, c, _seed(p))
    head = _head_gradient(p, c)
    inputs, weight16 = _head_backward(p, c, grads)
    p.op("head.weight gradient to FP32", alloc=[head])
    p.op("released", free=[weight16])
    gfn = p.new("gradient of the LM head input", BSd, "fp32", "the chunks' input gradients joined")
    join_input_gradients(p, c, inputs, gfn)     # tensor_split's backward, in the FP32 model's dtype (c.dtype)
    norm_backward(p, c, "final", gfn, Ref(Scope.LAST, "dX_out"), [f"grad {name}" for name, _ in final_norm_params(c)])
