"""The chunked cross-entropy under LoRA: torchtune's and LitGPT's chunked loss (:mod:`memledger.step.loss`) on a frozen
LM head.

torchtune's LoRA recipes compute the loss with ``CEWithChunkedOutputLoss`` on ``TransformerDecoder.chunked_output``
(``torchtune/modules/transformer.py``: the output projection once per ``tensor_split`` chunk of the final norm's
output); LitGPT's ``finetune/lora.py`` with ``chunked_cross_entropy`` on ``x.split(lm_head_chunk_size)``. The loss
itself (each chunk's logits, FP32 copies, log-softmax, ``nll_loss``, their backward) is the full fine-tune's; what
differs is the frozen head:

* forward: the frozen final norm (no ``x*rstd`` kept), then the head per chunk. A frozen linear keeps no input for a
  weight gradient (``mm`` saves ``self`` only if ``mat2`` requires grad), so neither the LM head input nor, with
  B > 1, the copy ``matmul`` makes of each strided chunk is kept: the copy goes as the chunk's matmul returns, the
  head's input as the decoder returns.
* backward: each chunk's head backward writes its input gradient only (no V x d weight gradient per chunk, nothing
  summed in autograd's buffer), the chunks' input gradients are joined as in the full fine-tune, and the frozen
  final norm's backward keeps no weight gradient.

An adapter on ``lm_head`` with a chunked loss (PEFT's adapter per chunk) is not modelled. Read off MemTracker's log of
:class:`memledger.pytorch.lora.LoraDecoder` with ``RefConfig(loss_chunks=n, loss_impl=...)``; checked by
``tests/step/test_lora_loss.py``.
"""
from ..core.symbols import B, V, d
from .loss import chunked_backward_start, chunked_forward_end, join_input_gradients
from .ops import BSd, Ref, final_input
from .vocab import OpRole, Scope

__all__ = ["lora_chunked_backward_start", "lora_chunked_forward_end"]


def _frozen_head_forward(p, c, T, norm) -> list:
    """The frozen final norm (``norm(p, c, "final", out)``) and the frozen LM head on each chunk; the decoder
    returns (its input goes)."""
    a, n = c.dtype, c.loss_chunks
    head_in = p.new("LM head input", BSd, a, "not kept: the LM head is frozen")
    norm(p, c, "final", head_in)
    logits = []
    for k in range(n):
        copy = None
        if not c.single and n > 1:
            copy = p.new(f"LM head input, chunk {k} (copy)", (B, T[k], d), a, "matmul copies the strided slice; "
                         "not kept: the head is frozen")
            p.op(f"chunk {k}: LM head input copied", alloc=[copy])
        logits.append(p.new(f"logits, chunk {k}", (B, T[k], V), a, "the LM head's output on chunk k"))
        p.op(f"LM head (frozen), chunk {k}" if n > 1 else "LM head (frozen)", alloc=[logits[-1]])
        if copy:
            p.op("released", free=[copy])
    p.op("the decoder returns", free=[head_in] + ([final_input(c)] if c.upcast else []), role=OpRole.DECODER_RETURNS)
    return logits


def _frozen_head_backward(p, c, T, grads, norm):
    """The frozen LM head's backward chunk by chunk (input gradients only), the chunks' gradients joined, the
    frozen final norm's backward (``norm(p, c, "final", g_out, g_in)``) into the last block's ``dX_out``."""
    a, n = c.dtype, c.loss_chunks
    gfn = p.new("gradient of the LM head input", BSd, a, "the LM head's input gradient (the chunks' joined)")
    inputs = [None] * n
    for k in reversed(range(n)):
        inputs[k] = gfn if n == 1 else p.new(f"LM head input gradient, chunk {k}", (B, T[k], d), a,
                                             "waits for the chunks' gradients to be joined")
        p.op(f"LM head backward (input gradient only), chunk {k}", alloc=[inputs[k]])
        p.op("released", free=[grads[k]])
    join_input_gradients(p, c, inputs, gfn)
    norm(p, c, "final", gfn, Ref(Scope.LAST, "dX_out"))


def lora_chunked_forward_end(p, c, norm):
    """The frozen final norm (``norm``: :mod:`memledger.step.lora`'s) and head per chunk, then the chunked loss
    (torchtune's or LitGPT's)."""
    chunked_forward_end(p, c, lambda q, c_, T: _frozen_head_forward(q, c_, T, norm))


def lora_chunked_backward_start(p, c, norm):
    """Back through the chunked loss and the frozen head and final norm (``norm``: its backward); ends with the last
    block's ``dX_out``."""
    chunked_backward_start(p, c, lambda q, c_, T, grads: _frozen_head_backward(q, c_, T, grads, norm))
