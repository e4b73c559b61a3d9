"""The largest batch or sequence that fits, judged by the ledger's sum and by the step's peak side by side.

    answers(Ledger(arch, recompute="full", offload_optimizer="cpu"), "seq", GPU_MEMORY["a100-80gb"])
    # {"sum": ..., "peak": ...}

Two measures of what a GPU must hold (:data:`MEASURES`):

* ``"sum"``: the ledger's GPU total, ``Ledger.fits(gpu)``: what is resident at
  the end of the forward pass with every gradient booked beside it (Part I of
  the book, and :func:`memledger.fitting.fit` until it judges the peak);
* ``"peak"``: ``Ledger.fits(gpu, peak=True)``: the step's peak
  (:mod:`memledger.step`: one micro-batch per step, gradients set to None
  after the optimizer, as the reference loop of ``docs/step.md`` runs), or,
  where the ledger books a nominal parameter count the timeline does not
  see, the larger of the two (:meth:`memledger.ledger.Ledger.judged_bytes`).

Both are non-decreasing in the batch and the sequence length, so the search
of :mod:`memledger.fitting` (a doubling bracket, then bisection) finds the
exact boundary: the answer fits, the answer + 1 does not.
"""
from .choices import LIMIT, check_choice, check_count
from .fitting import _at, _largest
from .ledger import Ledger

MEASURES = ("sum", "peak")
VARY = ("batch", "seq")


def judge(ledger: Ledger, gpu_bytes: int, measure: str) -> bool:
    """Whether ``ledger`` fits in ``gpu_bytes`` by ``measure`` (see the module docstring)."""
    check_choice("measure", measure, MEASURES)
    return ledger.fits(gpu_bytes, peak=measure == "peak")


def largest(template: Ledger, vary: str, gpu_bytes: int, measure: str = "peak") -> int:
    """The largest batch (``vary="batch"``) or sequence length (``"seq"``) of ``template`` that fits in
    ``gpu_bytes`` by ``measure``; 0 if not even 1 fits. ``ValueError`` where the step is not modelled
    (the peak measures need an architecture the timeline supports)."""
    check_choice("vary", vary, VARY)
    check_choice("measure", measure, MEASURES)
    gpu_bytes = check_count("gpu_bytes", gpu_bytes, limit=LIMIT)
    if template.arch is None:
        raise ValueError(f"vary={vary!r} needs an architecture (activations); n_params alone has none")
    if measure == "peak":
        template.step()                       # refuses what the timeline does not model, naming why
    return _largest(lambda n: judge(_at(template, vary, n), gpu_bytes, measure))


def answers(template: Ledger, vary: str, gpu_bytes: int) -> dict:
    """{measure: :func:`largest`} for every measure of :data:`MEASURES`."""
    return {m: largest(template, vary, gpu_bytes, m) for m in MEASURES}
