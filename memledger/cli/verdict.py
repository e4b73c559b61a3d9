"""The verdict line of ``memledger ledger`` and ``memledger fit``: :func:`memledger.answers.verdict.sentence`, the
words the explorer and the static calculator print for the same setup."""
from ..answers.verdict import describe, judge, sentence, uses_peak

__all__ = ["judged_by", "verdict_line"]


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
    return f"{sentence(judged.bytes, memory, clause, units)}."
