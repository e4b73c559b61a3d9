"""What each convention books, in the shapes a chapter shows: bytes per parameter, the activation rule
as a formula, and one comparison as a table.

:func:`memledger.calculators.compare.compare` gives one row per convention;
this module turns an estimate into the two numbers that explain most of the
spread (model-state bytes per parameter, and the activation rule's formula)
and lays the comparison out for the book.
"""
from fractions import Fraction

import sympy as sp

from ..core.table import Table
from ..core.symbols import t
from ..core.units import format_bytes
from . import CONVENTIONS
from ..ledger.ledger import Ledger
from .base import ConventionInputs, p_pp
from .compare import compare

__all__ = ["SHARDING", "activation_rule", "bytes_per_param", "comparison_table", "megatron_params", "printed",
           "sharded_table", "spread", "states_table"]

NONE = ConventionInputs()


def bytes_per_param(estimate, n_params: int, device: str = "gpu") -> Fraction:
    """Model-state bytes on ``device`` per parameter of the model, exactly (``n_params``: P as given)."""
    return Fraction(estimate.total(device, "model_states"), n_params)


def activation_rule(name: str, ledger: Ledger, inputs: ConventionInputs = NONE) -> sp.Expr:
    """The convention's activation bytes as one formula of its symbols (B, S, d, L, H, F, V, t ...), with the
    ceilings that make its rows whole bytes removed, at the ledger's tensor-parallel degree t and one pipeline
    stage; 0 for a convention that books no activations."""
    items = [i for i in CONVENTIONS[name].items(ledger, inputs) if i.group == "activations"]
    expr = sum((i.expr.replace(sp.ceiling, lambda x: x) for i in items), sp.Integer(0))
    return sp.factor(expr.subs({t: ledger.tp, p_pp: 1}))


def comparison_table(ledger: Ledger, unit: str = "GB", names=None, inputs: ConventionInputs = NONE) -> Table:
    """memledger's exact ledger, then every convention (or ``names``): model states, their bytes per
    parameter, activations and GPU total in ``unit`` (what each tool prints: :func:`printed`)."""
    rows = []
    for r in compare(ledger, inputs, names):
        if r.error:
            rows.append((r.name, "n/a", "", "", r.error))
            continue
        per = Fraction(r.states, ledger.params)
        rows.append((r.name, format_bytes(r.states, unit), f"{float(per):.2f}", format_bytes(r.activations, unit),
                     format_bytes(r.gpu, unit)))
    return Table(("convention", "model states", "B/param", "activations", "GPU total"), rows, numeric=(1, 2, 3, 4))


def printed(ledger: Ledger, names=None, width: int = 78, inputs: ConventionInputs = NONE) -> str:
    """The text each tool prints for ``ledger``'s setup (those that print one), one convention per entry, lines
    wrapped at ``width`` characters under the convention's name."""
    import textwrap
    entries = [(r.name, r.printed.strip()) for r in compare(ledger, inputs, names)[1:] if r.printed and not r.error]
    pad = max(len(name) for name, _ in entries) + 2
    return "\n".join(textwrap.fill(text, width, initial_indent=name.ljust(pad), subsequent_indent=" " * pad)
                     for name, text in entries)


def spread(ledger: Ledger, names=None, inputs: ConventionInputs = NONE) -> tuple:
    """(smallest, largest) GPU total among the conventions that can estimate ``ledger``'s setup, as
    (name, bytes)."""
    rows = [(r.name, r.gpu) for r in compare(ledger, inputs, names)[1:] if not r.error]
    return min(rows, key=lambda r: r[1]), max(rows, key=lambda r: r[1])


def states_table(ledger: Ledger, names, inputs: ConventionInputs = NONE) -> Table:
    """Each named convention's model-state rows on the GPU: the row, its formula (P parameters, N = G x M
    GPUs, P_max the largest layer) and its bytes per parameter at ``ledger``'s setup."""
    rows = []
    for name in names:
        for r in CONVENTIONS[name].estimate(ledger, inputs).rows:
            if r.device == "gpu" and r.group == "model_states":
                rows.append((name, r.name, sp.sympify(r.formula), f"{float(Fraction(r.bytes, ledger.params)):.2f}"))
    return Table(("convention", "row", "formula", "B/param"), rows, numeric=(3,))


SHARDING = ("deepspeed-zero2", "deepspeed-zero3", "eleuther", "playbook", "megatron", "megatron-distopt")


def sharded_table(arch, gpus=(1, 8, 64), names=SHARDING, unit: str = "GB") -> Table:
    """Model states per GPU on N GPUs of one node: memledger's ledger at ZeRO stage 1, and each convention
    as it shards (stage 1 where it reads a stage; DeepSpeed's estimators are stages 2 and 3 by name)."""
    rows = []
    for n in gpus:
        ours = compare(Ledger(arch, zero_stage=1, dp=n, overhead_bytes=0), NONE, names)
        rows.append((str(n),) + tuple(format_bytes(r.states, unit) for r in ours))
    return Table(("GPUs", "memledger (ZeRO-1)") + tuple(names), rows, numeric=range(len(names) + 2))


def megatron_params(arch, tp: int = 1) -> int:
    """The parameters Megatron-LM's ``theoretical_memory_usage.py`` counts for ``arch`` on one tensor-parallel
    shard of the first pipeline stage (:func:`memledger.calculators.megatron.shard_params`: no biases)."""
    from .megatron import shard_params
    return arch.evaluate(sp.ceiling(shard_params(arch.features).subs({t: tp, p_pp: 1})))
