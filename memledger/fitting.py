"""The largest that fits: an exact integer search over exact ledger evaluations.

    fit(Ledger("llama2-7b", zero_stage=3, dp=8), "batch", 80 * GB)   # the largest micro-batch

``vary``:

* ``"batch"``, ``"seq"``, ``"layers"`` (the largest model of the shape family:
  the preset's d, H, F, V with more or fewer layers): the largest value whose
  GPU total fits. Every ledger row is non-decreasing in each, so the totals
  are monotonic and a doubling bracket followed by bisection over integers
  finds the boundary exactly: the answer fits, the answer + 1 does not.
* ``"dp"``: the smallest data-parallel degree that fits (totals are
  non-increasing in dp); ``"zero"``: the smallest ZeRO stage that fits.

Fitting is judged on the ledger's GPU total (what is resident at the end of
the forward pass plus model states and overhead), since this library has no
step timeline yet; :data:`MEASURE` names the measure, and every answer
carries it (``result["measure"]``), so that prose and tools can say which one
they used without assuming it. The answer explains its binding constraint:
the rows at the first value that does not fit, and the largest of them.
"""
from dataclasses import replace

from .choices import LIMIT, check_choice, check_count
from .ledger import Ledger

#: What a candidate is judged by (the value of ``result["measure"]``).
MEASURE = "the ledger's GPU total"
VARY = ("batch", "seq", "layers", "dp", "zero")
_FIELD = {"batch": "batch_size", "seq": "seq_len", "dp": "dp"}
_UPPER = 2**40            # no search goes past this (a trillion sequences or tokens)


def _at(template: Ledger, vary: str, value: int) -> Ledger:
    if vary == "layers":
        return replace(template, arch=template.arch.with_changes(n_layers=value))
    if vary == "zero":
        return replace(template, zero_stage=value)
    return replace(template, **{_FIELD[vary]: value})


def _largest(fits, start=1):
    """Largest n >= start with fits(n) (fits monotonic, True then False); start - 1 if none."""
    if not fits(start):
        return start - 1
    low, high = start, start * 2
    while high <= _UPPER and fits(high):
        low, high = high, high * 2
    if high > _UPPER:
        raise ValueError(f"still fits at {low}: no limit found below {_UPPER}")
    while high - low > 1:                      # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _smallest(fits, values):
    for value in values:
        if fits(value):
            return value
    return None


def fit(template: Ledger, vary: str, gpu_bytes: int) -> dict:
    """The boundary of ``vary`` for ``template`` on a GPU of ``gpu_bytes``; see the module docstring.

    Returns {"vary", "answer" (None: nothing fits), "measure" (:data:`MEASURE`), "gpu_memory",
    "total_at_answer", "next" (the first value that does not fit, its total), "binding", "ledger"}.
    """
    check_choice("vary", vary, VARY)
    gpu_bytes = check_count("gpu_bytes", gpu_bytes, limit=LIMIT)
    if vary in ("batch", "seq", "layers") and template.arch is None:
        raise ValueError(f"vary={vary!r} needs an architecture (activations); --params alone has none")
    if vary == "layers" and template.n_params is not None:
        raise ValueError("vary='layers' changes the parameter count; drop the n_params override")
    fits = lambda value: _at(template, vary, value).fits(gpu_bytes)    # noqa: E731
    if vary in ("batch", "seq", "layers"):
        answer = _largest(fits)
        answer = None if answer == 0 else answer
        beyond = 1 if answer is None else answer + 1
    elif vary == "dp":
        if template.zero_stage == 0:
            raise ValueError("dp does not change per-GPU memory at ZeRO stage 0 (every rank holds all states); "
                             "choose --zero 1, 2 or 3")
        if fits(1):
            answer, beyond = 1, None
        else:
            high = 2
            while high <= _UPPER and not fits(high):
                high *= 2
            if high > _UPPER:
                answer = None
                beyond = _UPPER
            else:
                low = high // 2                # not fits(low), fits(high)
                while high - low > 1:
                    mid = (low + high) // 2
                    low, high = (low, mid) if fits(mid) else (mid, high)
                answer, beyond = high, high - 1
    else:
        answer = _smallest(fits, (0, 1, 2, 3))
        beyond = None if answer in (None, 0) else answer - 1
        if answer is None:
            beyond = 3
    at = _at(template, vary, answer) if answer is not None else None
    over = _at(template, vary, beyond) if beyond is not None else None
    return {"vary": vary, "answer": answer, "measure": MEASURE, "gpu_memory": gpu_bytes,
            "total_at_answer": at.totals["gpu"] if at else None,
            "next": None if over is None else {"value": beyond, "total": over.totals["gpu"]},
            "binding": _binding(vary, answer, over, gpu_bytes),
            "ledger": at}


def _binding(vary, answer, over, gpu_bytes) -> str:
    if over is None:
        return "fits at the smallest value already"
    rows = sorted((r for r in over.rows if r.device == "gpu"), key=lambda r: -r.bytes)
    top = rows[0]
    share = 100 * top.bytes / over.totals["gpu"]
    verb = "needs" if over.totals["gpu"] > gpu_bytes else "has"
    label = {"batch": "batch", "seq": "sequence length", "layers": "layers", "dp": "dp", "zero": "ZeRO stage"}[vary]
    head = f"at {label} {over_value(over, vary)} the GPU {verb} {over.totals['gpu']:,} B > {gpu_bytes:,} B"
    if answer is None and vary in ("batch", "seq", "layers"):
        head = f"nothing fits: even at {label} 1 the GPU needs {over.totals['gpu']:,} B > {gpu_bytes:,} B"
    return f"{head}; the largest row is {top.name} ({top.group}), {top.bytes:,} B ({share:.0f}%)"


def over_value(ledger, vary):
    return {"batch": ledger.batch_size, "seq": ledger.seq_len, "dp": ledger.dp, "zero": ledger.zero_stage,
            "layers": ledger.arch.n_layers if ledger.arch else None}[vary]
