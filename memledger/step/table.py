"""Views of a step timeline (:class:`memledger.step.timeline.Step`) as tables: its landmarks and peaks, what is
live at the peak (the ledger's sum beside the peak, and one ledger under several backends:
:mod:`memledger.ledger.table`).

Numbers come from the step; this module only arranges and formats them (as
:mod:`memledger.views.display` does for the ledger).
"""
from fractions import Fraction

from ..core.table import DEVICE_LABELS, Table
from ..core.units import format_bytes

__all__ = ["PHASE_NAMES", "kind_at_peak", "live_table", "states_per_param_at_peak",
           "step_table"]

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
