"""Tapes (memledger/core/tape.py): SymPy expressions as data, evaluated exactly without SymPy or eval."""
import json

import pytest
import sympy as sp

from memledger.core.symbols import B, L, N_d, P, S, V, d, t
from memledger.core.tape import Tape, record

pytestmark = pytest.mark.slow          # SymPy


def _tape(args, exprs):
    return Tape(json.loads(json.dumps(record(args, exprs))))          # through JSON, as the cache keeps it


def test_a_tape_gives_what_sympy_substitution_gives():
    """Integer polynomials (by structure or once expanded), shared and repeated subexpressions, constants,
    rationals, ceilings, floors, Max, Min and negative powers, beyond float precision too."""
    halved = sp.Mul(sp.Rational(1, 2), 4 * S + 2 * B, B, evaluate=False)
    exprs = [34 * B * S * d, halved, 2 * (L - 2) * (3 * d**2 + d) + 2 * V * d, 34 * B * S * d, sp.Integer(7),
             -B * S + 3 * S**2 * B, sp.ceiling(P / (N_d * t)), sp.floor(P / 3), sp.Max(B * S, V * d) * 2,
             sp.Min(d, S), sp.Rational(5, 2) * d, P / t**2, sp.ceiling(sp.Max(L * d**2, V * d) / t),
             # bitsandbytes' thresholds (memledger/step/bnb.py): a Piecewise over comparisons
             2 * sp.Piecewise((4 * d, d < 4096), (d, True)), sp.Piecewise((0, sp.And(B < 2, S >= 7)), (B * S, True)),
             sp.Piecewise((L, sp.Or(sp.Eq(V, 11), sp.Ne(t, 1))), (sp.ceiling(P / 256), sp.Not(d > 5000)), (0, True))]
    args = (B, S, d, L, V, P, N_d, t)
    tape = _tape(args, exprs)
    for values in [(1, 2048, 4096, 32, 32000, 7 * 10**9, 8, 2), (3, 7, 5, 2, 11, 13, 3, 1),
                   (2**40 + 1, 2**20 + 3, 2**13, 96, 128256, 10**18 + 7, 1024, 4)]:
        got = tape(*values)
        want = [sp.nsimplify(e.subs(dict(zip(args, values)))) for e in exprs]
        assert [sp.Rational(x.numerator, x.denominator) if not isinstance(x, int) else x for x in got] == want
        assert all(type(x) is int for x, e in zip(got, exprs)                # plain ints where no rational is
                   if all(a.is_Integer for a in e.atoms(sp.Rational))
                   and all(p.exp >= 0 for p in e.atoms(sp.Pow)))


def test_shared_subexpressions_are_stored_once():
    inner = sp.ceiling(P / (N_d * t))
    data = record((P, N_d, t), [inner, 2 * inner, inner + 1])
    assert sum(op[0] == "ceil" for op in data["ops"]) == 1


@pytest.mark.parametrize("expr", [sp.sqrt(d), sp.sin(d), d**sp.Rational(1, 2), sp.Mod(d, 3)])
def test_what_a_tape_cannot_hold_is_refused(expr):
    with pytest.raises(ValueError, match="tape"):
        record((d,), [expr])


def test_a_symbol_outside_the_arguments_is_refused():
    with pytest.raises(ValueError, match="no argument S"):
        record((d,), [d * S])


@pytest.mark.parametrize("damage", [
    lambda g: {**g, "ops": [["system", 0]]},                      # an operation it does not know
    lambda g: {**g, "ops": [["add", 99]]},                        # a slot not computed yet
    lambda g: {**g, "ops": [["pow", 0, "2"]]},                    # an exponent that is not whole
    lambda g: {**g, "constants": [[1, 0]]},                       # a zero denominator
    lambda g: {**g, "constants": [["__import__('os')", 1]]},
    lambda g: {**g, "outputs": [42]},
    lambda g: "not a tape"])
def test_a_damaged_tape_is_refused_before_it_runs(damage):
    good = record((d, S), [d * S + 3])
    Tape(good)
    with pytest.raises((ValueError, KeyError, TypeError)):
        Tape(damage(good))
