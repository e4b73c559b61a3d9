"""bitsandbytes' quantized linear weights: what one out x in weight of n = out*in elements stores and
what running it allocates. Sources: bitsandbytes at 95f9af30 (0.50 dev), transformers 5.24.0.

NF4 (``Linear4bit``; ``quantize_4bit``, ``bitsandbytes/functional.py`` l. 884-969):

* packed codes: two 4-bit codes per byte, ceil(n/2) uint8 (``_ops.py`` l. 232-235: ``(n + 1) // 2``);
* absmax: one FP32 per block of 64 (``blocks = -(n // -blocksize)``, l. 233-234; blocksize 64, l. 917-918);
* double quantization (``compress_statistics``, transformers' ``bnb_4bit_use_double_quant``, QLoRA's
  default): the absmax minus their mean quantized to 8 bits by ``quantize_blockwise(..., blocksize=256)``
  (l. 938-951): one uint8 per absmax plus one FP32 per 256 absmax (``_ops.py`` l. 346-349), and the mean,
  a 0-d FP32 ``offset``;
* lookup tables held by each ``QuantState``: the 16-value NF4 code (``get_4bit_type``, l. 936, FP32) and,
  with double quantization, a copy of the 256-value dynamic map (``code.to(A.device, copy=True)``, l. 670).

:func:`nf4_parts` is the storage formula the QLoRA step (:mod:`memledger.step.lora`) and inference
(:mod:`memledger.ledger.inference`) share; the tables and offset are :func:`nf4_table_bytes`.

NF4 at prefill (``MatMul4Bit.forward`` -> ``gemm_4bit``, ``autograd/_functions.py`` l. 304-345; past
``_gemm_4bit_custom_max_m`` = 1536 rows on CUDA, ``backends/cuda/ops.py`` l. 926 and 954-978, always the
``_dequant_linear_fallback``, l. 904-916): the absmax dequantized to FP32 and a second FP32 copy plus the
offset (double quantization only), the whole weight dequantized to the compute dtype, then ``F.linear``:
:func:`nf4_dequant_bytes` is what lives beside the layer's input and output. At M <= 1536 rows with the input
width a multiple of 64 the CUDA dispatch may run the fused ``cgemm_4bit`` kernel instead
(``_gemm_4bit_kernel_impl``, l. 846-901: ``A.contiguous()`` and the output, nothing dequantized); whether it does
for 5 <= M <= 1536 is a per-GPU heuristic (``_gemm_4bit_use_custom_cuda``, l. 583-812; at M <= 4 always):
:func:`nf4_gemm_fallback` takes the fused kernel there.

LLM.int8 (``Linear8bitLt``, ``Int8Params``): the weight as int8 (``CB``, out x in) and one FP32 scale per
output row (``SCB``, ``int8_vectorwise_quant``, ``_ops.py`` l. 95-98). At prefill
(``MatMul8bitLt.forward``, ``autograd/_functions.py`` l. 101-199) the input is cast to FP16 and quantized
row-wise (int8 ``CA`` + FP32 ``SCA``), multiplied into an int32 result and dequantized
(``int8_scaled_mm``, ``backends/default/ops.py`` l. 103-119): :func:`int8_matmul_bytes`. Input columns with
an outlier above ``llm_int8_threshold`` (6.0) also run in FP16 (``int8_mixed_scaled_mm``, l. 64-100): their
number depends on the activations, so it is a named runtime note, not a row.
"""
__all__ = ["BLOCKSIZE", "GEMM_4BIT_CUSTOM_MAX_M", "INT8_OUTLIER_NOTE", "NESTED_BLOCKSIZE", "int8_matmul_bytes",
           "int8_parts", "nf4_dequant_bytes", "nf4_gemm_fallback", "nf4_parts", "nf4_table_bytes"]

BLOCKSIZE = 64                  # quantize_4bit's default blocksize
NESTED_BLOCKSIZE = 256          # double quantization's second-level blocks
GEMM_4BIT_CUSTOM_MAX_M = 1536   # CUDA: past this many rows gemm_4bit always dequantizes (backends/cuda/ops.py l. 926)
INT8_OUTLIER_NOTE = ("LLM.int8 outliers: input columns with a value above llm_int8_threshold (6.0) also run in "
                     "FP16 (the input's columns and the weight's, dequantized: int8_mixed_scaled_mm), as many as "
                     "the activations have; not booked")


def _ceil(n, k):
    """ceil(n / k) for an int or a SymPy expression."""
    if isinstance(n, int):
        return -(-n // k)
    import sympy as sp
    return sp.ceiling(n / sp.Integer(k))


def nf4_parts(n, double_quant: bool = True) -> dict:
    """Bytes of one NF4 weight of ``n`` elements: {"packed": ceil(n/2), "absmax": 8-bit absmax + FP32 per 256
    (double quantization) or FP32 absmax}; ``n`` an int or a SymPy expression."""
    blocks = _ceil(n, BLOCKSIZE)
    absmax = blocks + 4 * _ceil(blocks, NESTED_BLOCKSIZE) if double_quant else 4 * blocks
    return {"packed": _ceil(n, 2), "absmax": absmax}


def nf4_table_bytes(double_quant: bool = True) -> int:
    """Per NF4 weight: the 16-entry FP32 code, and with double quantization the 256-entry FP32 dynamic map
    copy and the 0-d FP32 offset."""
    return 16 * 4 + ((256 * 4 + 4) if double_quant else 0)


def nf4_dequant_bytes(n, compute_bytes: int, double_quant: bool = True):
    """What the dequantize-then-``F.linear`` fallback holds beside the layer's input and output: the weight
    in the compute dtype and, with double quantization, two FP32 absmax arrays (``absmax_dq`` and
    ``absmax_dq + absmax_offset``, both alive until it returns)."""
    return n * compute_bytes + (2 * 4 * _ceil(n, BLOCKSIZE) if double_quant else 0)


def nf4_gemm_fallback(m: int, k: int) -> bool:
    """Whether bitsandbytes' CUDA ``gemm_4bit`` (``MatMul4Bit.forward``) runs ``_dequant_linear_fallback`` for an
    input of ``m`` rows and width ``k``: past :data:`GEMM_4BIT_CUSTOM_MAX_M` rows, or ``k`` not a multiple of the
    blocksize (``backends/cuda/ops.py`` l. 954-978 at 95f9af30); otherwise the fused kernel (taken for every
    M <= 1536, where bitsandbytes consults a per-GPU heuristic)."""
    return m > GEMM_4BIT_CUSTOM_MAX_M or k % BLOCKSIZE != 0


def int8_parts(out: int, inp: int) -> dict:
    """Bytes of one LLM.int8 weight: {"int8": out*in (CB), "scales": 4*out (SCB)}."""
    return {"int8": out * inp, "scales": 4 * out}


def int8_matmul_bytes(tokens: int, inp: int, out: int, compute_dtype: str) -> int:
    """The most ``MatMul8bitLt`` holds beside its input and output, no outliers: while quantizing, the FP16
    copy of the input (``A.to(torch.float16)``: none for an FP16 input), the int8 input ``CA`` (tokens x in)
    and its FP32 row scales ``SCA``; at ``int8_mm_dequant``, ``CA``, ``SCA`` and the int32 product
    (tokens x out)."""
    cast = 2 * tokens * inp if compute_dtype != "fp16" else 0
    return max(cast, 4 * tokens * out) + tokens * inp + 4 * tokens
