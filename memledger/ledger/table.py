"""A ledger's rows and per-device totals as a :class:`~memledger.core.table.Table`; its sum beside its step's peak,
and its step under several backends."""
from ..core.capacity import standing
from ..core.table import DEVICE_LABELS, Table
from ..core.units import format_bytes

__all__ = ["HEADER", "backends_table", "ledger_table", "sum_and_peak_table"]

HEADER = ("component", "group", "device", "bytes", "size")


def ledger_table(ledger, unit: str = "GB") -> "Table":
    """The ledger's rows, then one total per device in use (the GPU's always)."""
    body = [(r.name, r.group, DEVICE_LABELS[r.device], f"{r.bytes:,}", format_bytes(r.bytes, unit))
            for r in ledger.rows]
    totals = [(f"total on {DEVICE_LABELS[dev]}", "", DEVICE_LABELS[dev], f"{n:,}", format_bytes(n, unit))
              for dev, n in ledger.totals.items() if n or dev == "gpu"]
    return Table(HEADER, body, totals=totals, numeric=(3, 4), css="memledger")


def sum_and_peak_table(ledgers: dict, gpu_bytes: int, unit: str = "GB") -> Table:
    """One row per setup: the ledger's GPU sum, the step's peak and its phase, and each verdict against
    ``gpu_bytes`` (a fit leaves the margin free, :mod:`memledger.core.capacity`)."""
    def verdict(judged):
        return {"fits": "fits", "tight": "no fit (margin)", "over": "does not fit"}[standing(judged, gpu_bytes)]
    rows = []
    for name, ledger in ledgers.items():
        step = ledger.step()
        rows.append((name, format_bytes(ledger.totals["gpu"], unit), format_bytes(step.peak.bytes, unit),
                     step.peak.phase, verdict(ledger.judged_bytes()), verdict(step.peak.bytes)))
    return Table(("setup", "ledger sum", "step peak", "peak in", "by the sum", "by the peak"), rows, numeric=(1, 2))


def backends_table(ledger, backends=("cpu", "cuda"), unit: str = "GB") -> Table:
    """One setup under several backends' conventions: the GPU at each landmark and the peak."""
    steps = {b: ledger.step(b) for b in backends}
    first = next(iter(steps.values()))
    body = [(name,) + tuple(format_bytes(s.landmarks[name]["gpu"], unit) for s in steps.values())
            for name in first.landmarks]
    body.append(("host (Adam's step counters), before forward",)
                + tuple(format_bytes(s.landmarks["before forward"]["cpu"], "B", 0) for s in steps.values()))
    return Table(("moment",) + tuple(backends), body,
                 totals=[("peak",) + tuple(format_bytes(s.peak.bytes, unit) for s in steps.values())],
                 numeric=range(1, len(backends) + 1))
