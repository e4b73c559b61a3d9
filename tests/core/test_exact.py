import numpy as np
import pytest
import sympy as sp

from memledger.core.exact import exact_function, vectorized_function
from memledger.core.symbols import B, N_d, P, S, d


def test_exact_beyond_float_precision():
    big = 2**60 + 1
    f = exact_function((B, S, d), (34 * B * S * d,))
    assert f(big, 1, 1) == [34 * big]
    assert int(float(34 * big)) != 34 * big      # a float path would have lost the last bits


def test_ceiling_and_rationals_are_exact():
    f = exact_function((P, N_d), (sp.ceiling(P / N_d), sp.Rational(3, 2) * P))
    assert f(8, 3) == [3, 12]
    assert f(10**18 + 2, 10**18) == [2, 3 * (10**18 + 2) // 2]


def test_fractional_bytes_are_refused():
    with pytest.raises(ArithmeticError, match="whole number"):
        exact_function((P,), (P / 2,))(3)


@pytest.mark.slow
def test_vectorized_broadcasts():
    f = vectorized_function((B, S, d), (34 * B * S * d,))
    out = f(np.array([1, 2, 4]), 2048, 4096)[0]
    assert out.tolist() == [34 * 2048 * 4096 * k for k in (1, 2, 4)]


