"""The prefill's transient peak under eager attention: the moment the B x H x S x S scores are softmaxed.

Eager attention materializes the scores as transformers' ``eager_attention_forward`` computes them
(``models/llama/modeling_llama.py`` l. 180-202, transformers 5.24.0): ``q @ k^T * scaling`` plus the additive
causal mask (``masking_utils.eager_mask``, l. 552-618: B x 1 x S x S in the compute dtype c, built once before
the blocks), then ``softmax(..., dtype=torch.float32).to(query.dtype)`` (l. 197): the masked scores (c bytes
each) stay alive while the FP32 probabilities and their cast back are made. At long S this moment is the
prefill's peak. Live then, beside the weights and the token ids:

* the block's input x (B S d c; the loop over blocks holds it) and the mask (B S S c);
* the QKV projection's output, of which q, k, v are views (B S (H + 2 H_kv) d_h c), and under grouped-query
  attention ``repeat_kv``'s copies of K and V at H heads (2 B H S d_h c);
* the scores: ATen's ``softmax(input, dim, dtype)`` (``aten/src/ATen/native/SoftMax.cpp``) runs the
  half-to-float kernel only for an FP16 input on CUDA (``_softmax(input, dim, half_to_float=True)``: the masked
  FP16 scores, the FP32 probabilities, then their cast back: B H S S x (2c + 4)); any other 16-bit input, BF16
  on CUDA included, is first copied to FP32 (``input_.toType(dtype)``) and softmaxed into a second FP32 tensor:
  B H S S x (c + 4 + 4), more than the cast back that follows (measured on the CPU); an FP32 model keeps
  B H S S x 8 (no copy, no cast).

:func:`eager_softmax_bytes` is that sum, equal to MemTracker's prefill peak of the reference decoder with
transformers' eager core (:func:`memledger.pytorch.prefill.memtracker_prefill`, ``softmax_fp32=True``) less
what is live before it, wherever the scores moment is the largest (``tests/ledger/test_prefill.py``).
The whole prefill, op by op (rotary, the KV cache written, the LM head), is :mod:`memledger.step.prefill`;
:attr:`memledger.ledger.inference.Inference.prefill` reads it where it models the setup.
"""
from ..core.dtypes import nbytes

__all__ = ["BACKENDS", "eager_softmax_bytes", "scores_bytes_per_element"]

BACKENDS = ("cuda", "cpu")


def scores_bytes_per_element(dtype: str, backend: str = "cuda") -> int:
    """Bytes per score element at the softmax moment (the module docstring): 8 for FP32, 2c + 4 for FP16 on
    CUDA, c + 8 otherwise."""
    c = nbytes(dtype)
    if dtype == "fp32":
        return 8
    return 2 * c + 4 if (dtype == "fp16" and backend == "cuda") else c + 8


def eager_softmax_bytes(arch, batch_size: int, seq_len: int, dtype: str = "bf16", backend: str = "cuda") -> int:
    """The live bytes at eager attention's softmax (module docstring), weights and token ids excluded."""
    B, S, c = batch_size, seq_len, nbytes(dtype)
    H, kv, hd = arch.n_heads, arch.kv_heads, arch.head_dim
    tensors = {"block input": B * S * arch.d_model * c, "additive mask": B * S * S * c,
               "QKV output": B * S * (H + 2 * kv) * hd * c,
               "repeat_kv copies": 2 * B * H * S * hd * c if kv != H else 0,
               "scores": B * H * S * S * scores_bytes_per_element(dtype, backend)}
    return sum(tensors.values())
