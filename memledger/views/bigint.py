"""SymPy expressions printed as JavaScript over BigInt, for the static calculator (:mod:`memledger.views.webcalc`,
:mod:`memledger.views.webpeak`): byte counts stay exact at any size the CLI accepts."""
import sympy as sp
from sympy.printing.jscode import JavascriptCodePrinter

__all__ = ["BigIntPrinter"]


class BigIntPrinter(JavascriptCodePrinter):
    """SymPy's JavaScript printer over BigInt: ``2n*ml.ceilDiv(v.P, v.N_d*v.t)``.

    Symbols are read from ``v``; integer literals get the ``n`` suffix; a
    quotient is exact (``ml.exactDiv``, which throws on a remainder, like
    :func:`memledger.core.exact.exact_function`) or rounded by
    ``ceiling``/``floor`` (``ml.ceilDiv``/``ml.floorDiv``).
    """

    def _print_Symbol(self, expr):
        return f"v.{expr.name}"

    def _print_Integer(self, expr):
        return f"{expr.p}n"

    def _print_Rational(self, expr):
        raise ValueError(f"a rational outside a quotient cannot be printed over BigInt: {expr}")

    def _print_Float(self, expr):
        raise ValueError(f"a float in a byte formula: {expr}")

    def _print_Pow(self, expr):
        if not (expr.exp.is_Integer and expr.exp > 0):
            raise ValueError(f"only positive integer powers print over BigInt: {expr}")
        return f"{self.parenthesize(expr.base, 100)} ** {expr.exp.p}n"

    def _quotient(self, expr, function):
        numerator, denominator = sp.fraction(sp.together(expr))
        if denominator == 1:
            return self._print(numerator)
        return f"ml.{function}({self._print(numerator)}, {self._print(denominator)})"

    def _print_ceiling(self, expr):
        return self._quotient(expr.args[0], "ceilDiv")

    def _print_floor(self, expr):
        return self._quotient(expr.args[0], "floorDiv")

    def _print_Max(self, expr):
        return f"ml.max({', '.join(self._print(a) for a in expr.args)})"

    def _print_Min(self, expr):
        return f"ml.min({', '.join(self._print(a) for a in expr.args)})"

    def formula(self, expr) -> str:
        """``expr`` as one JavaScript BigInt expression."""
        return self._quotient(expr, "exactDiv")
