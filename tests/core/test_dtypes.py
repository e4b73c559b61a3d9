from fractions import Fraction
import struct

from hypothesis import given, strategies as st
import pytest

from memledger.core.dtypes import bf16_spacing, nbytes, round_to_bf16


def test_sizes():
    assert [nbytes(t) for t in ("fp32", "bf16", "fp16", "fp8", "int8", "bool")] == [4, 2, 2, 1, 1, 1]


def test_unknown_dtype():
    with pytest.raises(ValueError, match="unknown dtype"):
        nbytes("fp7")


def test_article_master_weight_example():
    # sources.md: near w = 1.25 the spacing is 2^-7, so an update of -0.001 is lost
    assert bf16_spacing(Fraction(5, 4)) == Fraction(1, 2**7)
    assert round_to_bf16(Fraction(5, 4) - Fraction(1, 1000)) == Fraction(5, 4)


def _bf16_from_float32_bits(x):
    """Reference: round-to-nearest-even on the top 16 bits of an IEEE float32."""
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    upper, lower = bits >> 16, bits & 0xFFFF
    if lower > 0x8000 or (lower == 0x8000 and upper & 1):
        upper += 1
    return struct.unpack("<f", struct.pack("<I", upper << 16))[0]


@pytest.mark.slow
@given(st.floats(min_value=2.0**-100, max_value=2.0**100, width=32))
def test_round_to_bf16_matches_bit_rounding(x):
    assert float(round_to_bf16(Fraction(x))) == _bf16_from_float32_bits(x)
