"""bitsandbytes' NF4 ``gemm_4bit`` forward as ops: the dequantize-then-``F.linear`` fallback or the fused kernel.

``MatMul4Bit.forward`` calls ``torch.ops.bitsandbytes.gemm_4bit`` (``bitsandbytes/autograd/_functions.py``
l. 300-345 at 95f9af30); its CUDA kernel (``backends/cuda/ops.py`` l. 943-983) runs
``_dequant_linear_fallback`` (l. 904-914) past 1536 rows or for an input width not a multiple of 64
(:func:`memledger.states.bnb.nf4_gemm_fallback`): ``absmax_dq`` (FP32, ceil(out*in/64)), ``absmax_dq +
absmax_offset`` (a second FP32 array), the weight in the compute dtype, ``F.linear``; the three are released as it
returns (:func:`memledger.states.bnb.nf4_dequant_bytes`). Otherwise the fused ``cgemm_4bit`` kernel
(``_gemm_4bit_kernel_impl``, l. 846-901) allocates the output only. The reference:
:func:`memledger.pytorch.lora.gemm_4bit`.
"""
from ..states.bnb import BLOCKSIZE

__all__ = ["nf4_forward_ops"]


def nf4_forward_ops(p, dtype: str, label: str, out, shape, fallback: bool = True, matmul: str = None, role=None):
    """Ops of one NF4 projection of ``shape`` (out, in) writing ``out`` (a name or a list: views of one output) in
    ``dtype``; ``fallback``: ``_dequant_linear_fallback``, else the fused kernel; ``matmul``: the label of the op
    that writes the output (``label (NF4)``), ``role`` its role (an OpRole)."""
    out = [out] if isinstance(out, str) else list(out)
    matmul = matmul or f"{label} (NF4)"
    if not fallback:
        p.op(matmul, alloc=out, role=role)
        return
    n = shape[0] * shape[1]
    if isinstance(n, int):                   # the prefill's whole numbers: no SymPy (memledger infer)
        blocks = -(-n // BLOCKSIZE)
    else:
        import sympy as sp
        blocks = sp.ceiling(n / BLOCKSIZE)
    scales = p.new(f"{label}: absmax dequantized", (blocks,), "fp32", "absmax_dq: the 8-bit absmax to FP32")
    shifted = p.new(f"{label}: absmax + offset", (blocks,), "fp32", "absmax_dq + absmax_offset")
    weight = p.new(f"{label}: weight dequantized", shape, dtype, "the NF4 weight in the compute dtype")
    p.op(f"{label}: dequantize absmax", alloc=[scales])
    p.op(f"{label}: absmax + offset", alloc=[shifted])
    p.op(f"{label}: dequantize weight", alloc=[weight])
    p.op(matmul, alloc=out, role=role)
    p.op("released", free=[scales, shifted, weight])
