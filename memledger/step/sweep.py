"""The step's peak over NumPy arrays of inputs that keep its structure (B, S, dp, the overhead), exactly.

The peak is ``max_k T_k``, T_k the GPU total after op k: a sum of tensor sizes (:func:`memledger.step.cache.step_record`),
each a polynomial, with ceilings, in the inputs. With every other symbol fixed at a ledger's values, each size is
a sum of terms ``c * phi(x)`` over a few **basis functions** ``phi`` of the swept inputs (``B*S``, ``B*S**2``,
``ceiling(P/N_d)``, 1, ...), so each op's total is one row of rational coefficients over that basis: hundreds of
ops, about ten basis functions. Some basis functions bound others for every input >= 1 (``B*S**2 >= B*S >= 1``,
``ceiling(c/N_d) >= ceiling(c'/N_d)`` for c >= c'); hung in a tree, each under one it bounds, a total is
``sum_c (phi_c - phi_parent(c)) * (the coefficients summed over c's subtree)`` with every difference >= 0. So an op
whose subtree sums are nowhere above another op's can never be the peak and is dropped: exact dominance, no
sampling. A handful of rows remain, and the peak of 10^6 configurations is a few dozen vector operations.

Exactness: totals are computed in int64, scaled by the rows' common denominator and divided back exactly,
when a bound from the inputs' largest values (every intermediate of every basis function and every row
sum) stays below 2^62; otherwise in Python integers (NumPy object arrays: exact, much slower).
"""
from dataclasses import dataclass
from functools import lru_cache
from math import lcm

import numpy as np
import sympy as sp

from .cache import step_record

__all__ = ["SWEEPABLE", "PeakProgram", "peak_program"]

#: Symbols a peak sweep may vary: they change numbers, not the step's programs (B = 1 is handled by the caller).
SWEEPABLE = ("B", "S", "N_d", "O")
SAFE = 2**62


def _terms(expr) -> dict:
    """``expr`` as {basis function: rational coefficient}, the basis being products of symbols and ceilings."""
    out = {}
    for term in sp.Add.make_args(sp.expand(expr)):
        coefficient, rest = term.as_coeff_Mul()
        if not coefficient.is_Rational:
            raise ValueError(f"a non-rational coefficient in a tensor size: {term}")
        out[rest] = out.get(rest, 0) + coefficient
    return {b: c for b, c in out.items() if c != 0}


def _integer_parts(expr):
    numerator, denominator = sp.fraction(sp.together(expr))
    return numerator, denominator


def _evaluator(expr, names):
    """(f(arrays) -> values, bound(maxima) -> the largest magnitude of any intermediate) for an integer-valued
    ``expr`` whose rationals sit inside ceilings or floors (exact integer arithmetic, any integer dtype)."""
    if expr.is_Integer:
        value = int(expr)
        return (lambda a: value), (lambda m: abs(value))
    if expr.is_Symbol:
        i = names.index(expr.name)
        return (lambda a: a[i]), (lambda m: m[i])
    if isinstance(expr, (sp.ceiling, sp.floor)):
        n, d = (_evaluator(e, names) for e in _integer_parts(expr.args[0]))
        ceil = isinstance(expr, sp.ceiling)

        def quotient(a):
            top, bottom = n[0](a), d[0](a)
            return -((-top) // bottom) if ceil else top // bottom
        return quotient, (lambda m: max(n[1](m), d[1](m)))
    if expr.is_Pow and expr.exp.is_Integer and expr.exp > 0:
        base, k = _evaluator(expr.base, names), int(expr.exp)
        return (lambda a: base[0](a) ** k), (lambda m: base[1](m) ** k)
    if expr.is_Mul or expr.is_Add:
        parts = [_evaluator(e, names) for e in expr.args]
        if expr.is_Mul:
            def product(a):
                out = parts[0][0](a)
                for f, _ in parts[1:]:
                    out = out * f(a)
                return out
            return product, (lambda m: _product(b(m) for _, b in parts))
        return (lambda a: sum(f(a) for f, _ in parts)), (lambda m: sum(b(m) for _, b in parts))
    if isinstance(expr, (sp.Max, sp.Min)):
        parts = [_evaluator(e, names) for e in expr.args]
        reduce = np.maximum if isinstance(expr, sp.Max) else np.minimum

        def extreme(a):
            out = parts[0][0](a)
            for f, _ in parts[1:]:
                out = reduce(out, f(a))
            return out
        return extreme, (lambda m: max(b(m) for _, b in parts))
    raise ValueError(f"cannot evaluate {expr} over integer arrays")


def _product(values):
    out = 1
    for v in values:
        out *= v
    return out


@dataclass
class PeakProgram:
    """A step's ops over basis functions of the swept symbols ``names``: ``steps``, the (basis index, scaled
    coefficient) changes of the total from one op that can be the peak to the next (and whether it can: all do
    here); ``rows``, every op's total."""
    names: tuple
    basis: list             # (evaluate, bound) per basis function
    steps: list             # ([(basis index, change)], candidate) per op
    rows: list              # every op's integer coefficients (times ``scale``), for the overflow bound
    scale: int              # the rows' common denominator
    CHUNK = 16384           # configurations per pass: a chunk's arrays stay in the CPU's cache

    @property
    def candidates(self) -> int:
        return sum(candidate for _, candidate in self.steps)

    def peak(self, arrays: list):
        """The exact peak at the swept values ``arrays`` (integer arrays of one shape, one per name)."""
        shape = np.shape(arrays[0])
        maxima = [int(np.max(a)) for a in arrays] if arrays[0].size else [1] * len(arrays)
        bounds = [b(maxima) for _, b in self.basis]
        worst = max((sum(abs(c) * b for c, b in zip(row, bounds)) for row in self.rows), default=0)
        dtype = object if max(bounds + [worst]) >= SAFE else np.int64
        flat = [np.ravel(a).astype(dtype) for a in arrays]
        out = np.empty(len(flat[0]), dtype=dtype)
        for start in range(0, len(out), self.CHUNK):
            values = [a[start:start + self.CHUNK] for a in flat]
            n = len(values[0])
            phis = [np.broadcast_to(np.asarray(f(values), dtype=dtype), (n,)) for f, _ in self.basis]
            total, best, terms = np.zeros(n, dtype=dtype), None, {}
            for changes, candidate in self.steps:
                for b, c in changes:
                    if (b, c) not in terms:               # the same tensor sizes come and go block after block
                        terms[b, c] = phis[b] * c
                    np.add(total, terms[b, c], out=total)
                if candidate:
                    best = total.copy() if best is None else np.maximum(best, total, out=best)
            out[start:start + n] = best
        if self.scale != 1:
            out //= self.scale                # exact: every op's total is a whole number of bytes
        return out.reshape(shape)


@lru_cache(maxsize=128)
def peak_program(structure, fixed: tuple, names: tuple) -> PeakProgram:
    """The :class:`PeakProgram` of ``structure`` with symbols ``fixed`` ((name, value) pairs) and ``names`` swept."""
    record = step_record(structure)
    values = dict(fixed)
    swept = set(names)
    sizes = [_terms(e.xreplace({s: values[s.name] for s in e.free_symbols if s.name not in swept}))
             for e in record["sizes"]]
    basis_index, changes, rows, current = {}, [], [], {}
    for deltas in record["deltas"]:
        change = {}
        for j, count in deltas:
            for b, c in sizes[j].items():
                change[b] = change.get(b, 0) + count * c
                current[b] = current.get(b, 0) + count * c
        changes.append({b: c for b, c in change.items() if c != 0})
        rows.append(dict(current))
    for row in rows:
        for b in row:
            basis_index.setdefault(b, len(basis_index))
    basis = list(basis_index)
    unknown = {s.name for b in basis for s in b.free_symbols} - swept
    if unknown:
        raise ValueError(f"no value for {', '.join(sorted(unknown))}")
    scale = lcm(*(int(sp.Rational(c).q) for row in rows for c in row.values())) if rows else 1
    matrix = [[int(row.get(b, 0) * scale) for b in basis] for row in rows]
    if all(_nonnegative(b) for b in basis):
        parents = _tree(basis)
        candidates = set(_undominated([_subtree_sums(r, parents) for r in matrix]))
    else:
        candidates = set(range(len(matrix)))
    steps, pending = [], {}
    for k, change in enumerate(changes):          # only the totals at candidate ops are needed
        for b, c in change.items():
            pending[b] = pending.get(b, 0) + c
        if k in candidates:
            steps.append(([(basis_index[b], int(c * scale)) for b, c in pending.items() if c != 0], True))
            pending = {}
    return PeakProgram(tuple(names), [_evaluator(b, list(names)) for b in basis], steps, matrix, scale)


def _nonnegative(expr) -> bool:
    """Whether ``expr`` is >= 0 for positive symbols: built of them, non-negative numbers, sums, products,
    positive powers, ceilings, floors, Max and Min."""
    if expr.is_Number:
        return expr >= 0
    if expr.is_Symbol:
        return bool(expr.is_positive)
    if expr.is_Pow:
        return expr.exp.is_Integer and (expr.exp > 0 and _nonnegative(expr.base) or bool(expr.base.is_positive))
    if isinstance(expr, (sp.ceiling, sp.floor)) and expr.args[0].is_nonnegative:
        return True
    if expr.is_Add or expr.is_Mul or isinstance(expr, (sp.Max, sp.Min)):
        return all(_nonnegative(a) for a in expr.args)
    return False


def _monomial(expr) -> dict:
    """{symbol: exponent} of a product of positive symbols' powers, else None."""
    powers = {}
    for factor in sp.Mul.make_args(expr):
        base, exponent = factor.as_base_exp()
        if not (base.is_Symbol and base.is_positive and exponent.is_Integer and exponent > 0):
            return None
        powers[base] = powers.get(base, 0) + int(exponent)
    return powers


def _bounds(big, small) -> bool:
    """Whether ``big >= small`` for every input >= 1 (both >= 1 there), by the few rules this module needs."""
    if small == 1:
        return _at_least_one(big)
    m, n = _monomial(big), _monomial(small)
    if m is not None and n is not None:
        return all(m.get(s, 0) >= k for s, k in n.items())
    if isinstance(big, sp.ceiling) and isinstance(small, sp.ceiling):
        (p, q), (r, s_) = (_integer_parts(big.args[0]), _integer_parts(small.args[0]))
        return q == s_ and p.is_Integer and r.is_Integer and p >= r
    return False


def _at_least_one(expr) -> bool:
    if expr.is_Integer:
        return expr >= 1
    if expr.is_Symbol:
        return bool(expr.is_positive and expr.is_integer)
    if expr.is_Pow:
        return expr.exp.is_Integer and expr.exp > 0 and _at_least_one(expr.base)
    if expr.is_Mul:
        return all(_at_least_one(a) for a in expr.args)
    if isinstance(expr, sp.ceiling):
        return bool(expr.args[0].is_positive)
    return False


def _tree(basis) -> list:
    """parent[i]: the index of a basis function that basis[i] bounds (the largest such), or None (a root)."""
    parents = []
    for i, b in enumerate(basis):
        below = [j for j, a in enumerate(basis) if j != i and a != b and _bounds(b, a)]
        top = [j for j in below if all(j == k or _bounds(basis[j], basis[k]) for k in below)]
        parents.append(top[0] if top else (below[0] if below else None))
    return parents


def _subtree_sums(row, parents) -> tuple:
    """Each coefficient summed over its basis function's subtree (the coordinates in which dominance is exact)."""
    out = list(row)
    for i, value in enumerate(row):
        j = parents[i]
        seen = {i}
        while j is not None and j not in seen:
            out[j] += value
            seen.add(j)
            j = parents[j]
    return tuple(out)


def _undominated(matrix) -> list:
    """Indices of rows, one per distinct row, that no other row is >= everywhere: the rows that can be the max."""
    first = {}
    for i, r in enumerate(matrix):
        first.setdefault(tuple(r), i)
    rows = list(first)
    if len(rows) <= 1 or max(abs(c) for r in rows for c in r) >= SAFE:
        return list(first.values())
    a = np.array(rows, dtype=np.int64)
    kept = []
    for i in range(len(a)):
        above = np.all(a >= a[i], axis=1)
        above[i] = False                          # distinct rows: >= everywhere means > somewhere
        if not above.any():
            kept.append(first[rows[i]])
    return kept
