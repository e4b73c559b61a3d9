"""Bytes (or, below a byte, bits) per element of each storage type (the only place these sizes are written),
and BF16 rounding, which is why mixed precision keeps an FP32 master copy."""
from fractions import Fraction

from .choices import lookup

__all__ = ["BF16_FRACTION_BITS", "BYTES_PER_ELEMENT", "SUB_BYTE_BITS", "bf16_spacing", "nbits", "nbytes", "round_to_bf16"]

BYTES_PER_ELEMENT = {
    "fp32": 4,
    "bf16": 2,
    "fp16": 2,
    "fp8": 1,
    "int8": 1,
    "bool": 1,   # PyTorch stores a bool (e.g. a dropout mask on CUDA) in one byte
    "int64": 8,  # token ids and top-k expert indices (torch.long)
}


#: Storage types narrower than a byte, in bits per element (packed two to a byte).
SUB_BYTE_BITS = {
    "nf4": 4,    # 4-bit NormalFloat (Dettmers et al. 2023, QLoRA)
    "int4": 4,
    "fp4": 4,
}


def nbits(dtype: str) -> int:
    """Bits per element: 8 x :func:`nbytes`, or 4 for ``"nf4"``, ``"int4"``, ``"fp4"``."""
    if dtype in SUB_BYTE_BITS:
        return SUB_BYTE_BITS[dtype]
    return 8 * nbytes(dtype)


def nbytes(dtype: str) -> int:
    """Bytes per element of ``dtype`` (``"bf16"`` -> 2); ``ValueError`` if unknown."""
    if dtype in SUB_BYTE_BITS:
        raise ValueError(f"{dtype} packs two elements per byte: use nbits({dtype!r}) / 8")
    return lookup(BYTES_PER_ELEMENT, dtype, "dtype")


#: Explicit fraction (mantissa) bits of BF16: 1 sign, 8 exponent, 7 fraction bits.
BF16_FRACTION_BITS = 7


def bf16_spacing(x) -> Fraction:
    """Gap between adjacent BF16 values around ``x`` != 0: 2^(e - 7) for 2^e <= |x| < 2^(e+1)."""
    x = abs(Fraction(x))
    exponent = x.numerator.bit_length() - x.denominator.bit_length()
    if x < Fraction(2) ** exponent:
        exponent -= 1
    return Fraction(2) ** (exponent - BF16_FRACTION_BITS)


def round_to_bf16(x) -> Fraction:
    """``x`` rounded to the nearest BF16 value, ties to even (normal range).

    ``round_to_bf16(Fraction(5, 4) - Fraction(1, 1000)) == Fraction(5, 4)``:
    near 1.25 the spacing is 2^-7 = 0.0078125, so an update of -0.001 is lost.
    """
    x = Fraction(x)
    if x == 0:
        return x
    spacing = bf16_spacing(x)
    return round(x / spacing) * spacing       # round() of a Fraction ties to even
