import numpy as np
import pytest
import sympy as sp

from memledger.core.exact import exact_function, integer_function, is_integral_polynomial, vectorized_function
from memledger.core.symbols import B, L, N_d, P, S, V, d


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


@pytest.mark.slow
def test_integer_polynomials_evaluate_as_subs_does():
    """Integral polynomials (by structure or only once expanded, as (4S + 2B) B / 2), repeated ones and constants: the
    compiled function gives what SymPy's own substitution gives, beyond float precision too."""
    halved = sp.Mul(sp.Rational(1, 2), 4 * S + 2 * B, B, evaluate=False)
    exprs = [34 * B * S * d, halved, 2 * (L - 2) * (3 * d**2 + d) + 2 * V * d, 34 * B * S * d,
             sp.Integer(7), -B * S + 3 * S**2 * B]
    assert all(is_integral_polynomial(e) for e in exprs)
    f = integer_function((B, S, d, L, V), exprs)
    for values in [(1, 2048, 4096, 32, 32000), (3, 7, 5, 2, 11), (2**40 + 1, 2**20 + 3, 2**13, 96, 128256)]:
        got = f(*values)
        want = [int(e.subs(dict(zip((B, S, d, L, V), values)))) for e in exprs]
        assert list(got) == want and all(type(x) is int for x in got)
