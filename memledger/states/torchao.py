"""torchao's ``NF4Tensor`` (torchtune's QLoRA base): what one out x in weight of n = out*in elements stores and what
dequantizing it allocates. Source: torchao 0.14.1, ``torchao/dtypes/nf4tensor.py``.

Storage (``to_nf4(weight)``: ``block_size`` 64, ``scaler_block_size`` 256; ``from_tensor`` l. 633-700,
``double_quantize_scalers`` l. 705-762), per tensor:

* ``quantized_data``: two 4-bit codes a byte, n/2 uint8;
* ``quantized_scalers``: one int8 scaler per block of 64, n/64;
* ``quantization_factor``: one BF16 (the weight's dtype) per 256 scalers, n/64/256;
* ``scaler_mean``: a BF16 scalar; ``nf4``: the 16-value BF16 lookup table, one per tensor.

``to_nf4`` asserts the block counts divide (l. 735-737): n a multiple of 64 x 256, so every division is exact.
Unlike bitsandbytes (:mod:`memledger.states.bnb`: FP32 constants per 256 absmax, an FP32 code and a dynamic map per
tensor) the constants are BF16. torchtune quantizes q, k and v separately (``FrozenNF4Linear`` or ``LoRALinear(...,
quantize_base=True)`` each, ``torchtune/models/llama2/_component_builders.py`` l. 360-414), the LM head not
(l. 263).

Dequantization (``linear_nf4``: ``LinearNF4.forward`` and ``backward``, l. 1037-1048, each ``weight.to(dtype)``, which
runs ``get_original_weight``, l. 829-855): ``first_elements`` and ``second_elements`` as int64 (n/2 each: 8n bytes),
``dequantized_first``/``_second`` (BF16, n/2 each: 2n), the scalers dequantized (BF16, n/64: n/32 bytes),
``scaled_first``/``_second`` (BF16, 2n; the flattened expand each multiplies by dies at once), all alive when
``torch.stack`` writes the BF16 weight (2n): :func:`nf4_dequant_locals` beside the weight, at the function's peak,
gone as it returns; the weight then lives until ``F.linear`` (or the backward's ``grad_output @ w``) has run.
"""
__all__ = ["BLOCK", "SCALER_BLOCK", "nf4_bytes", "nf4_dequant_locals", "nf4_dequant_peak"]

BLOCK = 64              # to_nf4's block_size
SCALER_BLOCK = 256      # to_nf4's scaler_block_size
#: ``scaler_mean`` (a BF16 scalar) and the 16-entry BF16 ``nf4`` table
_PER_TENSOR = 2 + 16 * 2


def nf4_bytes(n):
    """Bytes of one ``NF4Tensor`` of ``n`` BF16 weights: n/2 + n/64 + 2 n/(64*256) + 2 + 32 (n an int or SymPy)."""
    if isinstance(n, int):
        return n // 2 + n // BLOCK + 2 * (n // (BLOCK * SCALER_BLOCK)) + _PER_TENSOR
    return n / 2 + n / BLOCK + 2 * n / (BLOCK * SCALER_BLOCK) + _PER_TENSOR


def nf4_dequant_locals(n):
    """``get_original_weight``'s locals at its peak, beside the BF16 weight it returns: 8n (int64 codes) + 2n
    (looked-up values) + 2n (scaled) + n/32 (the scalers)."""
    return 12 * n + (n // 32 if isinstance(n, int) else n / 32)


def nf4_dequant_peak(n):
    """The peak of one dequantization above what was live before it: the locals and the BF16 weight (2n)."""
    return nf4_dequant_locals(n) + 2 * n
