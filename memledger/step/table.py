"""Views of a step timeline (:class:`memledger.step.timeline.Step`) as tables: its landmarks and peaks, what is
live at the peak, the ledger's sum beside the peak, and one setup under several backends.

Numbers come from the step; this module only arranges and formats them (as
:mod:`memledger.views.display` does for the ledger).
"""
from fractions import Fraction

from ..core.table import DEVICE_LABELS, Table
from ..core.capacity import standing
from ..core.units import format_bytes

__all__ = ["PHASE_NAMES", "backends_table", "kind_at_peak", "live_table", "states_per_param_at_peak",
           "step_table", "sum_and_peak_table"]

PHASE_NAMES = {"forward": "forward (with the loss)", "backward": "backward", "optimizer": "optimizer step"}


def step_table(step, unit: str = "GB") -> Table:
    """The four landmarks per device, then the largest GPU total of each phase and the peak."""
    devices = [dev for dev in DEVICE_LABELS if dev == "gpu" or any(v[dev] for v in step.landmarks.values())]
    header = ("moment",) + tuple(DEVICE_LABELS[d] for d in devices)
    body = [(name,) + tuple(format_bytes(v[d], unit) for d in devices) for name, v in step.landmarks.items()]
    phases = [(f"largest in the {PHASE_NAMES[p]}", format_bytes(b, unit)) + ("",) * (len(devices) - 1)
              for p, b in step.phase_peaks().items()]
    peak = [(f"peak: {step.peak.detail}", format_bytes(step.peak.bytes, unit)) + ("",) * (len(devices) - 1)]
    return Table(header, body + phases, totals=peak, numeric=range(1, len(header)))


def live_table(step, top: int = 8, unit: str = "GB") -> Table:
    """The GPU tensors live at the peak, largest first; the rest in one row; the total."""
    live = step.live_at_peak()
    rows = [(name.replace("@", ""), format_bytes(b, unit), f"{100 * b / step.peak.bytes:.1f} %")
            for name, b in live[:top]]
    rest = live[top:]
    if rest:
        small = sum(b for _, b in rest)
        rows.append((f"{len(rest)} smaller tensors", format_bytes(small, unit),
                     f"{100 * small / step.peak.bytes:.1f} %"))
    return Table(("live at the peak", unit, "share"), rows,
                 totals=[("peak", format_bytes(step.peak.bytes, unit), "100 %")], numeric=(1, 2))


def kind_at_peak(step) -> dict:
    """GPU bytes at the peak by kind: {"param", "optimizer", "grad", "activation", "transient", "overhead"}."""
    _, by_kind, _ = step.series()
    return {kind: int(series[step.peak.sample]) for kind, series in by_kind.items()}


def states_per_param_at_peak(step) -> Fraction:
    """Bytes per parameter of parameters, gradients and optimizer states live at the peak (the
    mixed-precision recipe's 16 becomes 18 while the optimizer holds FP32 gradient copies)."""
    kinds = kind_at_peak(step)
    return Fraction(kinds["param"] + kinds["grad"] + kinds["optimizer"], step.values["P"])


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
