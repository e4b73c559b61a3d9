"""One model under every convention, next to memledger's exact ledger, and why each differs.

``compare(ledger, inputs)`` returns one :class:`Comparison` per convention
(and a first one for memledger itself): GPU bytes of model states and of
activations, other GPU bytes, CPU bytes, the difference from memledger's
ledger, and the convention's reason. memledger's row is the
:class:`memledger.ledger.ledger.Ledger` given, every option of it honoured
(recipe, ZeRO stage, data-parallel degree, offload, recomputation, scope,
overhead ...); the conventions read what each reads of it
(:attr:`~memledger.calculators.base.Convention.reads`) plus the
:class:`~memledger.calculators.base.ConventionInputs` it lacks. Conventions
book no runtime overhead: a ledger built with ``overhead_bytes=0`` (the
command line's default for ``compare``) compares like with like.
"""
from dataclasses import dataclass

from ..ledger.ledger import Ledger
from ..states.recipes import get_recipe
from . import CONVENTIONS
from .base import ConventionInputs

__all__ = ["Comparison", "compare", "compare_table", "ledger_title"]


@dataclass(frozen=True)
class Comparison:
    name: str
    title: str
    states: int
    activations: int
    other: int
    cpu: int
    printed: str
    reason: str
    error: str = ""

    @property
    def gpu(self) -> int:
        return self.states + self.activations + self.other

    def to_dict(self, reference: "Comparison" = None) -> dict:
        data = {"name": self.name, "title": self.title, "gpu": {"model_states": self.states,
                "activations": self.activations, "other": self.other, "total": self.gpu}, "cpu": self.cpu,
                "printed": self.printed, "reason": self.reason}
        if reference is not None and not self.error:
            data["gpu_minus_memledger"] = self.gpu - reference.gpu
        if self.error:
            data["error"] = self.error
        return data


def ledger_title(ledger: Ledger) -> str:
    """memledger's row title: "memledger's exact ledger (bf16-adamw, 16 B/param)"."""
    recipe = get_recipe(ledger.recipe)
    factored = " + factored states" if any(c.factored for c in recipe.components) else ""
    return f"memledger's exact ledger ({recipe.name}, {recipe.bytes_per_param} B/param{factored})"


def compare(ledger: Ledger, inputs: ConventionInputs = None, names=None, stated_zero=None) -> list:
    """memledger's row (``ledger`` itself), then one :class:`Comparison` per convention (``names``: all);
    ``inputs``: what the conventions read beyond the ledger (None: :class:`ConventionInputs`' defaults);
    ``stated_zero``: the ZeRO stage the user stated (the command line's ``--zero``), which a convention named
    after another stage gets as its error row (:meth:`~memledger.calculators.base.Convention.stage_conflict`,
    the refusal of ``ledger --convention``), not a number."""
    inputs = ConventionInputs() if inputs is None else inputs
    if not isinstance(ledger, Ledger):
        raise TypeError(f"ledger must be a Ledger, got {ledger!r}")
    if not isinstance(inputs, ConventionInputs):
        raise TypeError(f"inputs must be ConventionInputs, got {inputs!r}")
    inputs.per_node(ledger)                         # G x M = dp x tp, checked once for every convention
    rows = [Comparison("memledger", ledger_title(ledger),
                       ledger.group_total("model_states", "gpu"), ledger.group_total("activations", "gpu"),
                       ledger.group_total("overhead", "gpu"), ledger.totals["cpu"], "",
                       "itemized components; every saved tensor of the block's inventory; exact per-rank shards")]
    for name in names or CONVENTIONS:
        convention = CONVENTIONS[name]
        try:
            conflict = convention.stage_conflict(stated_zero)
            if conflict:
                raise ValueError(conflict)
            e = convention.estimate(ledger, inputs)
        except ValueError as error:
            rows.append(Comparison(name, convention.title, 0, 0, 0, 0, "", convention.differs, str(error)))
            continue
        states = e.total("gpu", "model_states")
        act = e.total("gpu", "activations")
        rows.append(Comparison(name, convention.title, states, act, e.total("gpu") - states - act,
                               e.total("cpu"), e.printed, convention.differs))
    return rows


def compare_table(rows, unit: str = "GB") -> str:
    """A plain-text table of :func:`compare`'s rows in ``unit`` (GB = 10^9 B, GiB = 2^30 B ...)."""
    from ..core.units import format_bytes
    head = f"{'convention':<21} {'states':>11} {'activations':>12} {'other':>9} {'GPU total':>11} {'CPU':>11}"
    lines = [head, "-" * len(head)]
    for r in rows:
        if r.error:
            lines.append(f"{r.name:<21} n/a: {r.error}")
            continue
        cells = [format_bytes(x, unit) for x in (r.states, r.activations, r.other, r.gpu, r.cpu)]
        lines.append(f"{r.name:<21} {cells[0]:>11} {cells[1]:>12} {cells[2]:>9} {cells[3]:>11} {cells[4]:>11}")
    lines.append("")
    lines += [f"{r.name}: {r.reason}" for r in rows]
    return "\n".join(lines)
