"""The verdict line of ``memledger ledger`` and ``memledger fit``: :func:`memledger.answers.verdict.sentence`, the
words the explorer and the static calculator print for the same setup."""
from ..answers.verdict import describe, judge, run_peak, sentence, uses_peak

__all__ = ["judged_by", "measure_data", "measure_lines", "verdict_line"]


def judged_by(ledger, measure: str, spec=None):
    """What the verdict compares with the GPU (:mod:`memledger.answers.verdict`); the sum without an architecture;
    ``spec`` (an :class:`~memledger.answers.verdict.AllocatorSpec`): the caching allocator's replay."""
    if spec is not None:
        uses_peak(ledger, measure)          # the timeline's reason where it does not model the setup
        return judge(ledger, spec)
    return judge(ledger, ledger.arch is not None and uses_peak(ledger, measure))


def verdict_line(ledger, memory: int, measure: str, units: str, spec=None) -> str:
    """The verdict sentence, in the explorer's words (:func:`memledger.answers.verdict.sentence`): the step's peak
    where the timeline models the setup (``--measure auto``), else the sum of the rows at the end of the forward
    pass, and the other one for comparison; a fit leaves the margin free."""
    judged = judged_by(ledger, measure, spec)
    if not ledger.arch:
        clause = ", the model states (without an architecture no activations are booked)"
    else:
        note = None
        if measure == "total":              # the sum was asked for: the step is not evaluated
            note = "as asked; a run fits or fails by its peak: --measure auto, or see memledger step"
        clause = describe(ledger, judged, units, note)
        if spec is not None and spec.measure == "run":
            clause += f"; the run's peak is in phase {run_peak(ledger, spec).phase!r}"
    return f"{sentence(judged.bytes, memory, clause, units)}."


def measure_data(ledger, spec, backend: str = "article", step_peak: int = None, **changes) -> dict:
    """``--json``'s keys for ``spec``: "allocator" (the replay), and "nvidia_smi" (its rows) or "run" (its phases)."""
    from ..answers.verdict import nvidia_smi, replayed
    if spec is None:
        return {}
    if spec.measure == "run":
        return {"run": run_peak(ledger, spec, step_peak).to_dict()}
    data = {}
    if spec.measure == "nvidia-smi":
        data["nvidia_smi"] = nvidia_smi(ledger, spec, backend, **changes).to_dict()
    data["allocator"] = replayed(ledger, spec, backend, **changes).to_dict()
    return data


def measure_lines(ledger, spec, units: str, backend: str = "article", step_peak: int = None, **changes) -> list:
    """The rows ``--measure nvidia-smi`` or ``run`` adds to the text: one per part or phase, with its source."""
    from ..answers.verdict import nvidia_smi
    from ..core.units import format_bytes
    if spec is None or spec.measure not in ("nvidia-smi", "run"):
        return []
    if spec.measure == "run":
        run = run_peak(ledger, spec, step_peak)
        lines = ["", f"the run, loading by {run.load} (the overhead row in each phase):"]
        lines += [f"  {p:<16} {format_bytes(b, units):>12}  {w}" for p, b, w in run.phases]
        return lines + [f"  peak: {format_bytes(run.judged, units)} in phase {run.phase!r}"]
    smi = nvidia_smi(ledger, spec, backend, **changes)
    lines = ["", f"what nvidia-smi would show on {smi.gpu} (the overhead row left out):"]
    lines += [f"  {r['name']:<62} {format_bytes(r['bytes'], units):>12}  ({r['source']})" for r in smi.rows()]
    return lines + [f"  nvidia-smi: {format_bytes(smi.judged, units)}"]
