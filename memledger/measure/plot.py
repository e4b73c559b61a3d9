"""Predicted against measured through the step, as a PNG (matplotlib's Agg canvas: no display, no pyplot state).

The predicted curve is the step timeline's total after every op (:meth:`memledger.step.timeline.Step.series`,
x in block units: forward blocks 0..L-1, the loss, backward L-1..0, the optimizer). What a run can measure is
drawn where it belongs: the four landmarks as points, each phase's peak as a bar across its phase (the phase's
largest total, not where in the phase it happened), and on CUDA the reserved peak as a dashed line.
"""
from pathlib import Path

from .report import LANDMARKS, PHASES

__all__ = ["plot_report"]


def _unit(peak: int):
    for name, size in (("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if peak >= size:
            return name, size
    return "B", 1


def plot_report(step, report: dict, path) -> Path:
    """Draw ``report`` (:func:`memledger.measure.report.build_report`) over ``step``'s curve into ``path``."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    x, by_kind, marks = step.series()
    total = sum(by_kind.values())
    measured, predicted = report["measured"], report["predicted"]
    tops = [predicted["peak"]] + [v for v in (measured.get("peak"), measured.get("peak_reserved")) if v]
    unit, size = _unit(max(tops))

    fig = Figure(figsize=(9, 5), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.plot(x, total / size, color="tab:blue", lw=1.2, label="predicted (memledger step)")
    ax.plot([marks[k] for k in LANDMARKS], [predicted["landmarks"][k] / size for k in LANDMARKS], "o",
            mfc="none", mec="tab:blue", ms=8, label="predicted landmarks")
    sample = predicted.get("peak_sample")
    if sample is not None:
        ax.plot([x[sample]], [predicted["peak"] / size], "*", color="tab:blue", ms=12, label="predicted peak")
    got = {k: v for k, v in (measured.get("landmarks") or {}).items() if k in marks}
    if got:
        ax.plot([marks[k] for k in got], [v / size for v in got.values()], "x", color="tab:red", ms=9, mew=2,
                label="measured landmarks")
    first = True
    for phase, (start, end) in PHASES.items():
        value = (measured.get("phase_peaks") or {}).get(phase)
        if value is not None:
            ax.hlines(value / size, marks[start], marks[end], color="tab:red", lw=2.5,
                      label="measured peak of each phase" if first else None)
            first = False
    if measured.get("peak_reserved") is not None:
        ax.axhline(measured["peak_reserved"] / size, color="tab:orange", ls="--", lw=1.2,
                   label="measured reserved peak (max_memory_reserved)")
    for name, at in marks.items():
        ax.axvline(at, color="0.8", lw=0.8, zorder=0)
        ax.annotate(name, (at, 0), xycoords=ax.get_xaxis_transform(), xytext=(2, 3), textcoords="offset points",
                    fontsize=7, color="0.4", rotation=90)
    ax.set_xlabel("through the step (block units: forward blocks, the loss, backward blocks, the optimizer)")
    ax.set_ylabel(f"memory ({unit}, {measured.get('what', 'measured')})")
    ax.set_title(_title(report), fontsize=9)
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _title(report: dict) -> str:
    line = report["line"].removeprefix("memledger: ")
    head, _, tail = line.partition("; largest")
    return head + ("\nlargest" + tail if tail else "")
