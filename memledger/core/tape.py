"""SymPy expressions as data: a tape of operations, evaluated exactly without SymPy, ``eval`` or ``exec``.

A tape is plain JSON-ready data: the argument names, the constants (rationals as ``[p, q]``), and a list of
operations, each ``[op, operand, ...]`` over earlier slots (the arguments come first, then the constants, then
each operation's result, so a subexpression shared by many expressions is stored and computed once). Its
``outputs`` are the slots of the expressions asked for. :func:`record` writes one from SymPy expressions (it
needs SymPy); :class:`Tape` reads it back and evaluates it in plain ``int`` arithmetic, a ``Fraction`` only
where a rational appears, so a byte count comes back as an exact ``int``. The step's compiled records
(:mod:`memledger.step.cache`) are tapes: a cache holds data, never code.
"""
from fractions import Fraction
import math

__all__ = ["Tape", "record"]

#: The operations a tape knows; :func:`record` refuses an expression that needs another. ``piecewise`` takes
#: (value, condition) slot pairs, as SymPy orders them, and gives the first value whose condition holds (SymPy's
#: ``Piecewise``, as bitsandbytes' size thresholds are written); the comparisons and ``and``/``or``/``not`` give
#: its conditions.
COMPARISONS = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
               "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}
OPERATIONS = ("add", "mul", "pow", "ceil", "floor", "max", "min", "piecewise", "and", "or", "not", *COMPARISONS)


#: SymPy's relational operators -> the tape's comparisons.
RELATIONS = {"<": "lt", "<=": "le", ">": "gt", ">=": "ge", "==": "eq", "!=": "ne"}


def record(args, exprs) -> dict:
    """The tape of SymPy ``exprs`` over the symbols ``args`` (in that order), as JSON-ready data."""
    import sympy as sp
    slots = {a: i for i, a in enumerate(args)}
    constants, ops = [], []
    const_slot = {}

    def constant(value):
        if value not in const_slot:
            const_slot[value] = len(constants)
            constants.append([int(value.p), int(value.q)])
        return ("c", const_slot[value])

    def visit(e):
        if e in slots:
            return slots[e]
        if e.is_Rational:
            return constant(e)
        if e.is_Symbol:
            raise ValueError(f"a tape over {', '.join(map(str, args))} has no argument {e}")
        if e.is_Add or e.is_Mul:
            op = "add" if e.is_Add else "mul"
            operands = [visit(a) for a in e.args]
        elif e.is_Pow:
            if not (e.exp.is_Integer):
                raise ValueError(f"a tape holds whole powers only, not {e}")
            op, operands = "pow", [visit(e.base), int(e.exp)]
        elif isinstance(e, (sp.ceiling, sp.floor)):
            op, operands = ("ceil" if isinstance(e, sp.ceiling) else "floor"), [visit(e.args[0])]
        elif isinstance(e, (sp.Max, sp.Min)):
            op, operands = ("max" if isinstance(e, sp.Max) else "min"), [visit(a) for a in e.args]
        elif isinstance(e, sp.Piecewise):
            op, operands = "piecewise", [visit(x) for pair in e.args for x in pair]
        elif e is sp.true or e is sp.false:
            return constant(sp.Integer(1 if e is sp.true else 0))
        elif isinstance(e, sp.core.relational.Relational) and e.rel_op in RELATIONS:
            op, operands = RELATIONS[e.rel_op], [visit(e.lhs), visit(e.rhs)]
        elif isinstance(e, (sp.And, sp.Or, sp.Not)):
            op, operands = type(e).__name__.lower(), [visit(a) for a in e.args]
        else:
            raise ValueError(f"a tape cannot hold {type(e).__name__} ({e})")
        ops.append([op, *operands])
        slots[e] = ("o", len(ops) - 1)
        return slots[e]

    outputs = [visit(sp.sympify(e)) for e in exprs]
    n_args = len(args)

    def where(slot):                      # arguments, then constants, then operation results
        if isinstance(slot, int):
            return slot
        return n_args + slot[1] if slot[0] == "c" else n_args + len(constants) + slot[1]
    code = [[op[0], *[where(x) for x in op[1:]]] if op[0] != "pow" else ["pow", where(op[1]), op[2]] for op in ops]
    return {"args": [str(a) for a in args], "constants": constants, "ops": code,
            "outputs": [where(s) for s in outputs]}


def _number(pair):
    p, q = pair
    if not (isinstance(p, int) and isinstance(q, int) and q > 0):
        raise ValueError(f"a tape constant must be two integers [p, q > 0], got {pair!r}")
    return p if q == 1 else Fraction(p, q)


class Tape:
    """A tape read back (checked, then evaluated without SymPy): :meth:`__call__` gives each output at the
    arguments' integer values."""

    def __init__(self, data: dict):
        if not isinstance(data, dict):
            raise ValueError("a tape must be an object")
        self.args = list(data["args"])
        self.constants = [_number(c) for c in data["constants"]]
        slots = len(self.args) + len(self.constants)
        self.ops = []
        for op in data["ops"]:
            name, operands = op[0], op[1:]
            if name not in OPERATIONS or not operands:
                raise ValueError(f"a tape operation must be one of {', '.join(OPERATIONS)}, got {op!r}")
            refs = operands[:1] if name == "pow" else operands
            if name == "pow" and (len(operands) != 2 or not isinstance(operands[1], int)):
                raise ValueError(f"a tape power needs a slot and a whole exponent, got {op!r}")
            if (name == "piecewise" and len(operands) % 2) or (name in COMPARISONS and len(operands) != 2):
                raise ValueError(f"a tape operation with the wrong number of operands: {op!r}")
            if not all(isinstance(i, int) and 0 <= i < slots for i in refs):
                raise ValueError(f"a tape operation reads a slot not yet computed: {op!r}")
            self.ops.append((name, tuple(operands)))
            slots += 1
        self.outputs = list(data["outputs"])
        if not all(isinstance(i, int) and 0 <= i < slots for i in self.outputs):
            raise ValueError("a tape output names a slot it does not have")

    def __call__(self, *values) -> list:
        """Every output at ``values`` (one per argument), exactly: ints, or Fractions where not whole."""
        v = [*values, *self.constants]
        get, push = v.__getitem__, v.append
        for name, operands in self.ops:
            if name == "mul":
                push(math.prod(map(get, operands)))
            elif name == "add":
                push(sum(map(get, operands)))
            elif name == "pow":
                base, exponent = v[operands[0]], operands[1]
                push(base ** exponent if exponent >= 0 else Fraction(1) / Fraction(base) ** -exponent)
            elif name == "ceil":
                push(math.ceil(v[operands[0]]))
            elif name == "floor":
                push(math.floor(v[operands[0]]))
            elif name in ("max", "min"):
                push((max if name == "max" else min)(map(get, operands)))
            elif name == "piecewise":
                push(next((v[x] for x, c in zip(operands[::2], operands[1::2]) if v[c]), None))
            elif name in COMPARISONS:
                push(int(COMPARISONS[name](v[operands[0]], v[operands[1]])))
            elif name == "not":
                push(int(not v[operands[0]]))
            else:
                push(int((all if name == "and" else any)(map(get, operands))))
        return [v[i] for i in self.outputs]
