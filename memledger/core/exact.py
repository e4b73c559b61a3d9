"""Fast numeric evaluation of SymPy expressions, exact or vectorized.

Both paths ``lambdify`` the very expressions the library derives (never a
hand-copied formula):

* :func:`exact_function`: Python code over :class:`fractions.Fraction`, so a
  byte count comes back as an exact ``int`` (rationals print as ``Fraction``,
  ``ceiling`` as ``math.ceil``). Microseconds per call, versus milliseconds for
  ``expr.subs``.
* :func:`vectorized_function`: NumPy float64 over arrays, for sweeps and widgets
  (exact for integers below 2^53, i.e. up to ~9 PB).
"""
from fractions import Fraction
from functools import lru_cache
import math

import sympy as sp
from sympy.printing.pycode import PythonCodePrinter

from .keyed import whole

__all__ = ["ExactPrinter", "evaluate_expr", "exact_function", "vectorized_function"]

class ExactPrinter(PythonCodePrinter):
    """Python code in which rationals are ``Fraction``s, so that evaluation stays exact."""
    def _print_Rational(self, expr):
        return f"Fraction({expr.p}, {expr.q})"

    def _print_Half(self, expr):
        return self._print_Rational(expr)


@lru_cache(maxsize=512)
def _exact(args, exprs):
    return sp.lambdify(args, list(exprs), modules=[{"Fraction": Fraction, "math": math}, "math"],
                       printer=ExactPrinter, cse=True)


def exact_function(args, exprs):
    """``f(*values) -> [int, ...]``: each expression evaluated exactly at integer ``values`` (a ``Tuple`` of
    expressions: a tuple of ints)."""
    fn = _exact(tuple(args), tuple(exprs))

    def evaluate(*values):
        return [whole(v) for v in fn(*(Fraction(x) for x in values))]
    return evaluate


@lru_cache(maxsize=512)
def vectorized_function(args, exprs):
    """``f(*arrays) -> [ndarray, ...]``: NumPy float64 evaluation, broadcasting over arrays."""
    return sp.lambdify(tuple(args), list(exprs), modules="numpy", cse=True)


def evaluate_expr(expression, values: dict) -> int:
    """Any SymPy ``expression`` at ``values`` (symbol name -> int), exactly (lambdify, cached)."""
    expression = sp.sympify(expression)
    symbols = tuple(sorted(expression.free_symbols, key=lambda s: s.name))
    missing = [s.name for s in symbols if s.name not in values]
    if missing:
        raise ValueError(f"no value for {', '.join(missing)}; known: {', '.join(values)}")
    return exact_function(symbols, (expression,))(*(values[s.name] for s in symbols))[0]
