"""The report of a measured run: memledger's prediction for the run's own setup beside what was measured.

Plain Python (no PyTorch): :mod:`memledger.measure.recorder` measures, this module compares and words it.

The difference (measured minus predicted, bytes) is split into parts that each say where the two part ways,
read off the step's four landmarks and three phase peaks (:class:`memledger.step.timeline.Step`):

* ``held before forward``: what is held when the step starts (parameters, optimizer states, the batch, and
  anything the previous step left, such as gradients not yet freed);
* ``added by forward``: after forward minus before forward (the saved activations and the loss, less what the
  forward phase freed);
* ``added by backward``: after backward minus after forward (the gradients, less the activations freed);
* ``added by the optimizer step``: after step minus after backward (the optimizer's new state, less the gradients
  freed);
* ``forward transients``, ``backward transients``, ``optimizer transients``: each phase's peak above the larger of
  the landmarks around it (what the phase allocates and frees within itself).

The landmark parts add up: a difference at one landmark shows in the part of the phase that made it, not in every
later one. The largest part by size is the largest unexplained part: where to look first.
"""
import json
from pathlib import Path

__all__ = ["LANDMARKS", "PARTS", "PHASES", "build_report", "difference_parts", "human", "summary_line",
           "write_report"]

LANDMARKS = ("before forward", "after forward", "after backward", "after step")
#: Each phase and the landmarks it runs between (Step.phase_peaks: forward includes the loss).
PHASES = {"forward": ("before forward", "after forward"), "backward": ("after forward", "after backward"),
          "optimizer": ("after backward", "after step")}
PARTS = ("held before forward", "added by forward", "added by backward", "added by the optimizer step",
         "forward transients", "backward transients", "optimizer transients")


def human(nbytes: int, signed: bool = False) -> str:
    """Bytes in the largest decimal unit that keeps a digit before the point: ``human(4_147_276) == "4.15 MB"``;
    below 1 kB the exact count (``"512 B"``); ``signed``: a leading + for positive values."""
    sign = "-" if nbytes < 0 else ("+" if signed else "")
    n = abs(int(nbytes))
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if n >= size:
            return f"{sign}{n / size:,.2f} {unit}"
    return f"{sign}{n} B"


def _values(side: dict) -> dict:
    """{part: bytes} of one side (predicted or measured) where its landmarks and phase peaks allow."""
    marks, peaks = side.get("landmarks", {}), side.get("phase_peaks", {})
    out = {}
    if "before forward" in marks:
        out["held before forward"] = marks["before forward"]
    for part, (first, last) in (("added by forward", ("before forward", "after forward")),
                                ("added by backward", ("after forward", "after backward")),
                                ("added by the optimizer step", ("after backward", "after step"))):
        if first in marks and last in marks:
            out[part] = marks[last] - marks[first]
    for phase, (first, last) in PHASES.items():
        if phase in peaks and first in marks and last in marks:
            out[f"{phase} transients"] = peaks[phase] - max(marks[first], marks[last])
    return out


def difference_parts(predicted: dict, measured: dict) -> list:
    """[{"part", "predicted", "measured", "bytes"}] for every part both sides have (bytes: measured minus
    predicted), in the order of :data:`PARTS`."""
    ours, theirs = _values(predicted), _values(measured)
    return [{"part": p, "predicted": ours[p], "measured": theirs[p], "bytes": theirs[p] - ours[p]}
            for p in PARTS if p in ours and p in theirs]


def build_report(setup: dict, predicted: dict, measured: dict, environment: dict, observed: dict,
                 notes=()) -> dict:
    """The report's JSON object. ``predicted``: {"landmarks", "phase_peaks", "peak", ...} or None (the setup
    could not be predicted; ``notes`` says why); ``measured``: {"steps": [...], "compared_step", "landmarks",
    "phase_peaks", "peak", "peak_reserved", "what"}."""
    report = {"setup": setup, "predicted": predicted, "measured": measured, "environment": environment,
              "observed": observed, "notes": list(notes)}
    if predicted is not None and measured.get("peak") is not None:
        diff = measured["peak"] - predicted["peak"]
        parts = difference_parts(predicted, measured)
        largest = max((p for p in parts if p["bytes"]), key=lambda p: abs(p["bytes"]), default=None)
        report["difference"] = {"bytes": diff,
                                "percent": round(100 * diff / predicted["peak"], 4) if predicted["peak"] else None,
                                "parts": parts, "largest_unexplained": largest}
    else:
        report["difference"] = None
    report["line"] = summary_line(report)
    return report


def summary_line(report: dict) -> str:
    """One line: predicted, measured, difference (bytes and %) and its largest unexplained part."""
    measured, predicted = report["measured"], report["predicted"]
    what = measured.get("what", "measured")
    step = measured.get("compared_step")
    where = f"step {step} peak" if step is not None else "peak"
    if measured.get("peak") is None:
        return f"memledger: no complete training step was measured ({what})"
    shown = human(measured["peak"])
    if measured.get("peak_reserved") is not None:
        shown += f" ({human(measured['peak_reserved'])} reserved)"
    if predicted is None:
        why = report["notes"][0] if report["notes"] else "no prediction"
        return f"memledger: {where} measured {shown} ({what}); not predicted: {why}"
    d = report["difference"]
    pct = f"{d['percent']:+.2f}%" if d["percent"] is not None else "n/a"
    largest = d["largest_unexplained"]
    part = "none, every part agrees to the byte" if largest is None else \
        f"{largest['part']} {human(largest['bytes'], signed=True)}"
    return (f"memledger: {where} predicted {human(predicted['peak'])}, measured {shown} ({what}); "
            f"difference {human(d['bytes'], signed=True)} ({pct}); largest unexplained part: {part}")


def write_report(report: dict, path) -> Path:
    """Write the report as JSON (exact integer bytes, two-space indent); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2, default=_jsonable) + "\n")
    return path


def _jsonable(value):
    """What json cannot write by itself: NumPy integers (exact), sets, other objects as their text."""
    if hasattr(value, "item") and callable(value.item):
        return value.item()
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    return str(value)
