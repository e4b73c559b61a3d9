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

__all__ = ["ExactPrinter", "evaluate_expr", "exact_function", "integer_function", "is_integral_polynomial",
           "vectorized_function"]

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


def integer_function(args, exprs):
    """``f(*ints) -> tuple of ints``: polynomials with integer coefficients (:func:`is_integral_polynomial`)
    evaluated in plain int arithmetic. Each distinct expression is printed once, without SymPy's term
    ordering (unordered ``str`` printing is several times faster than ``lambdify``'s printer and exact for
    such polynomials), into one compiled Python function."""
    args = tuple(args)
    names = {a: sp.Symbol(f"_a{i}", integer=True) for i, a in enumerate(args)}
    printer = sp.printing.str.StrPrinter({"order": "none"})
    distinct, slot = {}, []
    for e in exprs:
        e = sp.sympify(e)
        slot.append(distinct.setdefault(e, len(distinct)))
    lines = []
    for e, j in distinct.items():
        poly = e if _integral_by_structure(e) else sp.Poly(e, *e.free_symbols).as_expr()
        lines.append(f"    _e{j} = {printer.doprint(poly.xreplace(names)) if poly.free_symbols else int(poly)}")
    source = (f"def _f({', '.join(str(n) for n in names.values())}):\n" + "\n".join(lines) +
              f"\n    return ({''.join(f'_e{j}, ' for j in slot)})\n")
    scope = {}
    exec(compile(source, "<memledger integer_function>", "exec"), scope)
    return scope["_f"]


@lru_cache(maxsize=512)
def vectorized_function(args, exprs):
    """``f(*arrays) -> [ndarray, ...]``: NumPy float64 evaluation, broadcasting over arrays."""
    return sp.lambdify(tuple(args), list(exprs), modules="numpy", cse=True)


def _integral_by_structure(expr) -> bool:
    """True if ``expr`` is built from integers and integer symbols by +, x and whole powers (no expansion needed)."""
    if expr.is_Integer or (expr.is_Symbol and expr.is_integer):
        return True
    if expr.is_Add or expr.is_Mul:
        return all(_integral_by_structure(a) for a in expr.args)
    if expr.is_Pow:
        return expr.exp.is_Integer and expr.exp >= 0 and _integral_by_structure(expr.base)
    return False


def is_integral_polynomial(expr) -> bool:
    """True if ``expr`` is a polynomial with integer coefficients (exact in plain int arithmetic, no Fraction needed).
    Most expressions are such by their structure; the rest are expanded into a polynomial to see."""
    if _integral_by_structure(expr):
        return True
    try:
        poly = sp.Poly(expr, *expr.free_symbols) if expr.free_symbols else None
    except sp.PolynomialError:
        return False
    if poly is None:
        return expr.is_Integer
    return all(c.is_Integer for c in poly.coeffs())


def evaluate_expr(expression, values: dict) -> int:
    """Any SymPy ``expression`` at ``values`` (symbol name -> int), exactly (lambdify, cached)."""
    expression = sp.sympify(expression)
    symbols = tuple(sorted(expression.free_symbols, key=lambda s: s.name))
    missing = [s.name for s in symbols if s.name not in values]
    if missing:
        raise ValueError(f"no value for {', '.join(missing)}; known: {', '.join(values)}")
    return exact_function(symbols, (expression,))(*(values[s.name] for s in symbols))[0]
