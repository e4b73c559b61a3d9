"""One model under every convention, next to memledger's exact ledger, and why each differs.

``compare(setup)`` returns one :class:`Comparison` per convention (and a first
one for memledger itself): GPU bytes of model states and of activations,
other GPU bytes, CPU bytes, the difference from memledger's ledger, and the
convention's reason. memledger's row is :class:`memledger.ledger.ledger.Ledger`
with the article's 16 B/param recipe under the same ZeRO stage, data-parallel
degree (all GPUs), offload and recomputation, without its runtime overhead
(conventions that book none would otherwise differ by it alone).
"""
from dataclasses import dataclass

from ..ledger.ledger import Ledger
from . import CONVENTIONS
from .base import Setup


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


def reference_ledger(setup: Setup, recipe: str = "bf16-adamw") -> Ledger:
    """memledger's own ledger for ``setup`` (16 B/param unless ``recipe`` says otherwise)."""
    offload = "cpu" if setup.offload_optimizer else "none"
    params = "cpu" if setup.offload_params and setup.zero_stage == 3 else "none"
    return Ledger(setup.arch, n_params=setup.n_params if setup.arch is None else None,
                  batch_size=setup.batch_size, seq_len=setup.seq_len, recipe=recipe, recompute=setup.recompute,
                  tp=setup.tp, zero_stage=setup.zero_stage, dp=setup.gpus, offload_optimizer=offload,
                  offload_params=params, overhead_bytes=0, flash_attention=setup.flash_attention,
                  dropout=setup.dropout)


def compare(setup: Setup, names=None) -> list:
    """memledger's row, then one :class:`Comparison` per convention (``names``: all of them)."""
    ledger = reference_ledger(setup)
    rows = [Comparison("memledger", "memledger's exact ledger (bf16-adamw, 16 B/param)",
                       ledger.group_total("model_states", "gpu"), ledger.group_total("activations", "gpu"),
                       ledger.group_total("overhead", "gpu"), ledger.totals["cpu"], "",
                       "itemized components; every saved tensor of the block's inventory; exact per-rank shards")]
    for name in names or CONVENTIONS:
        convention = CONVENTIONS[name]
        try:
            e = convention.estimate(setup)
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
