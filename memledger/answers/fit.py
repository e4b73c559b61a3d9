"""The largest that fits: an exact integer search over exact evaluations of the step's peak (or the sum).

    fit(Ledger("llama2-7b", zero_stage=3, dp=8), "batch", GPU_MEMORY["a100-80gb"])   # the largest micro-batch

``vary``:

* ``"batch"``, ``"seq"``, ``"layers"`` (the largest model of the shape family:
  the preset's d, H, F, V with more or fewer layers): the largest value that
  fits. Every ledger row and every tensor of the step's programs
  (:mod:`memledger.step.timeline`) is non-decreasing in each, so the judged bytes are
  monotonic and a doubling bracket followed by bisection over integers finds
  the boundary exactly: the answer fits, the answer + 1 does not.
  A model with learned positions (GPT-2's 1,024) cannot run a longer
  sequence: ``"seq"`` answers at most ``n_positions`` (and says so).
* ``"dp"``: the smallest data-parallel degree that fits (non-increasing in
  dp); ``"zero"``: the smallest ZeRO stage that fits.

What a candidate is judged by (:mod:`memledger.answers.verdict`): the **peak of a
training step** where the step timeline models the setup (``Ledger.peak`` is
not None), or, for a ledger that books a nominal parameter count the timeline
does not see (the article's 7x10^9), the larger of that peak and the sum; and
the ledger's GPU total, **the sum of the rows at the end of the forward
pass**, elsewhere (MoE, encoders). A candidate fits when it leaves at least
``margin`` bytes of the GPU free (:data:`memledger.answers.verdict.MARGIN`, about
1 GB, by default: less is no fit; ``margin=0`` finds the bare boundary).
``measure="total"`` asks for the sum where the peak is modelled too,
``measure="peak"`` refuses a setup without a timeline. The timeline models one
micro-batch per optimizer step (``zero_grad(set_to_none=True)``, the reference loop of memledger/pytorch/reference.py);
gradient accumulation keeps the gradients alive through the next micro-batch,
which neither measure counts. Every answer says which measure it used
(``result["measure"]``, a value of :data:`MEASURE`) and explains its binding
constraint at the first value that does not fit: where the peak happens and
the largest tensor live there, or the largest row of the sum.

:func:`fit_many` answers for a row of GPUs at once (a chapter's model x GPU grid): where the peak judges the
largest batch or sequence, one search for all of them over NumPy arrays of candidates
(``sweep(..., measure="peak")``, :mod:`memledger.step.sweep`; a few vectorized rounds, each narrowing every
bracket 64-fold), and each answer then checked like :func:`fit`'s: it fits, one more does not. :func:`fit`
itself, one GPU, stays with exact evaluations one at a time, which the command line runs without SymPy or NumPy.
"""
from dataclasses import replace

from ..core.choices import LIMIT, check_choice, check_count
from ..ledger.ledger import Ledger
from .verdict import (ALLOCATOR, MARGIN, MEASURE, SPECS, allocator_spec, check_measure, is_lora, judge, leaves_margin,
                      uses_peak)

__all__ = ["MEASURE", "VARY", "fit", "fit_many"]

VARY = ("batch", "seq", "layers", "dp", "zero")
_FIELD = {"batch": "batch_size", "seq": "seq_len", "dp": "dp"}
_LABEL = {"batch": "batch", "seq": "sequence length", "layers": "layers", "dp": "dp", "zero": "ZeRO stage"}
_UPPER = 2**40            # no search goes past this (a trillion sequences or tokens)


def _at(template: Ledger, vary: str, value: int) -> Ledger:
    if vary == "layers":
        return replace(template, arch=template.arch.with_changes(n_layers=value))
    if vary == "zero":
        return replace(template, zero_stage=value)
    return replace(template, **{_FIELD[vary]: value})


def _largest(fits, start=1, limit=None):
    """Largest n >= start with fits(n) (fits monotonic, True then False); start - 1 if none. ``limit``: a value
    known not to fit (the search stays below it)."""
    if not fits(start):
        return start - 1
    low, high = start, start * 2
    while high <= _UPPER and (limit is None or high < limit) and fits(high):
        low, high = high, high * 2
    if limit is not None and high >= limit:
        high = limit
    elif high > _UPPER:
        raise ValueError(f"still fits at {low}: no limit found below {_UPPER}")
    while high - low > 1:                      # fits(low), not fits(high)
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return low


def _smallest_dp(fits, start=1, upper=_UPPER):
    """(smallest dp >= ``start`` that fits, the dp just below it); (None, ``upper``) if none up to ``upper``."""
    if fits(start):
        return start, None
    high = 2 * start
    while high <= upper and not fits(high):
        high *= 2
    if high > upper:
        return None, upper
    low = high // 2                            # not fits(low), fits(high)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high, high - 1


def _dp_range(template: Ledger) -> tuple:
    """The dp a search tries: from 1 (FSDP2: 2, it shards over at least two ranks) up to _UPPER (FSDP2: d, past
    which its dim-0 padding of every norm weight to dp elements makes the unsharded buffers grow with dp)."""
    if template.framework == "fsdp2":
        return 2, template.arch.d_model
    return 1, _UPPER


def fit(template: Ledger, vary: str, gpu_bytes: int, measure: str = "auto", margin: int = MARGIN,
        expandable_segments: bool = False, max_split_size_mb=None, gpu: str = None, cuda_context: int = None,
        load: str = None) -> dict:
    """The boundary of ``vary`` for ``template`` on a GPU of ``gpu_bytes``, leaving ``margin`` bytes free; see the
    module docstring.

    ``measure``: ``"auto"`` (the step's peak where modelled, else the sum), ``"peak"`` or ``"total"``; or
    ``"allocated"``/``"reserved"``, the step replayed through the caching allocator (:mod:`memledger.ledger.replay`,
    with ``expandable_segments`` and ``max_split_size_mb``); ``"nvidia-smi"``, the replay's segments with cuBLAS's
    workspaces and the CUDA context on the GPU named ``gpu`` (:mod:`memledger.ledger.outside`; ``cuda_context``
    bytes where no published figure exists); ``"run"``, the peak over loading the weights by ``load`` and the step
    (:mod:`memledger.ledger.loading`). A replay's segments need not grow with every value: the answer is the
    boundary the bisection finds, where the answer fits and the next value does not.
    Returns {"vary", "answer" (None: nothing fits), "measure" (a value of :data:`MEASURE`), "measure_key",
    "gpu_memory", "margin", "judged_at_answer" (the bytes the measure gives there), "total_at_answer" (the ledger's
    sum), "peak_at_answer" (None without a timeline), "next" (the first value that does not fit:
    {"value", "judged", "total"}), "binding", "ledger"}.
    """
    if not (isinstance(template, Ledger) or is_lora(template)):
        raise TypeError(f"template must be a Ledger or a LoraLedger, got {template!r}")
    check_choice("vary", vary, VARY)
    check_measure(measure)
    spec = allocator_spec(measure, expandable_segments, max_split_size_mb, gpu, cuda_context, load)
    gpu_bytes = check_count("gpu_bytes", gpu_bytes, limit=LIMIT)
    margin = check_count("margin", margin, minimum=0, limit=LIMIT)
    if is_lora(template):
        return _fit_lora(template, vary, gpu_bytes, measure, spec, margin)
    if vary in ("batch", "seq", "layers") and template.arch is None:
        raise ValueError(f"vary={vary!r} needs an architecture (activations); --params alone has none")
    if vary == "layers" and template.n_params is not None:
        raise ValueError("vary='layers' changes the parameter count; drop the n_params override")
    if vary == "dp" and template.zero_stage == 0 and template.framework == "plain":
        raise ValueError("dp does not change per-GPU memory at ZeRO stage 0 (every rank holds all states); "
                         "choose --zero 1, 2 or 3")
    if vary == "seq" and template.loss_chunks > 1:
        raise ValueError(f"vary='seq' cannot search below loss_chunks ({template.loss_chunks}) tokens: vary batch, or "
                         "drop loss_chunks")
    if vary == "dp" and template.dp_replicate > 1:
        raise ValueError("vary='dp' is not searched under HSDP (dp must stay a multiple of dp_replicate)")
    k = template.reshard_after_forward
    if vary == "dp" and isinstance(k, int) and not isinstance(k, bool):
        raise ValueError(f"vary='dp' is not searched with an int reshard_after_forward ({k}): it must divide every dp")
    peak = uses_peak(template, measure)
    if spec is not None:
        peak = spec

    def fits(value):
        return leaves_margin(judge(_at(template, vary, value), peak).bytes, gpu_bytes, margin)
    positions = template.arch.n_positions if vary == "seq" else 0     # learned positions bound the sequence
    if positions and fits(positions):
        answer = positions
    elif vary in ("batch", "seq", "layers"):
        answer = _largest(fits, limit=positions or None) or None
    elif vary == "dp":
        answer, _ = _smallest_dp(fits, *_dp_range(template))
    else:
        answer = next((stage for stage in (0, 1, 2, 3) if fits(stage)), None)
    return _result(template, vary, gpu_bytes, peak, answer, margin)


def _fit_lora(template, vary, gpu_bytes, measure, spec, margin) -> dict:
    """:func:`fit` of a LoRA/QLoRA ledger: the largest batch or sequence length by its step (``measure`` "auto" and
    "peak": the step's peak under CUDA's conventions; an allocator measure, nvidia-smi or run: ``spec``)."""
    if vary not in ("batch", "seq"):
        raise ValueError(f"vary={vary!r} is not searched for a LoRA ledger (one GPU): vary batch or seq")
    if template.loss_chunks > 1 and vary == "seq":
        raise ValueError(f"vary='seq' cannot search below loss_chunks ({template.loss_chunks}) tokens: vary batch, or "
                         "drop loss_chunks")
    peak = spec if spec is not None else measure != "total"

    def fits(value):
        return leaves_margin(judge(_at(template, vary, value), peak).bytes, gpu_bytes, margin)
    positions = template.arch.n_positions if vary == "seq" else 0
    if positions and fits(positions):
        answer = positions
    else:
        answer = _largest(fits, limit=positions or None) or None
    return _result(template, vary, gpu_bytes, peak, answer, margin)


def _result(template, vary, gpu_bytes, peak, answer, margin) -> dict:
    """:func:`fit`'s answer dictionary for ``answer`` (None: nothing fits), judged exactly there and one step beyond."""
    positions = template.arch.n_positions if vary == "seq" else 0
    if vary in ("batch", "seq", "layers"):
        beyond = None if positions and answer == positions else (1 if answer is None else answer + 1)
    elif vary == "dp":
        first = 2 if template.framework == "fsdp2" else 1
        beyond = _dp_range(template)[1] if answer is None else (None if answer == first else answer - 1)
    else:
        beyond = 3 if answer is None else (None if answer == 0 else answer - 1)
    at = _at(template, vary, answer) if answer is not None else None
    over = _at(template, vary, beyond) if beyond is not None else None
    key = judge(at or over, peak).key

    def total(ledger):          # a framework's step has no ledger sum (the sum books the plain loop)
        return ledger.totals["gpu"] if getattr(ledger, "framework", "plain") == "plain" else None
    return {"vary": vary, "answer": answer, "measure": MEASURE[key], "measure_key": key, "gpu_memory": gpu_bytes,
            "margin": margin,
            "judged_at_answer": judge(at, peak).bytes if at else None,
            "total_at_answer": total(at) if at else None,
            "peak_at_answer": at.peak if at and peak else None,
            "next": None if over is None else {"value": beyond, "judged": judge(over, peak).bytes,
                                                "total": total(over)},
            "binding": (f"the model has {positions:,} learned positions: no longer sequence can run"
                        if positions and beyond is None
                        else _binding(vary, answer, beyond, over, peak, gpu_bytes, margin)),
            "ledger": at}


def fit_many(template: Ledger, vary: str, gpu_memories, measure: str = "auto", margin: int = MARGIN) -> list:
    """:func:`fit` for each of ``gpu_memories``, as a list of its answer dictionaries; the largest batch or sequence
    judged by the step's peak is searched for all of them at once over NumPy arrays (the module docstring)."""
    check_choice("vary", vary, VARY)
    check_measure(measure)
    memories = [check_count("gpu_bytes", m, limit=LIMIT) for m in gpu_memories]
    margin = check_count("margin", margin, minimum=0, limit=LIMIT)
    if (vary not in ("batch", "seq") or template.arch is None or measure in SPECS or not uses_peak(template, measure)
            or (vary == "seq" and template.arch.n_positions)):
        return [fit(template, vary, m, measure, margin) for m in memories]
    from ..ledger.ledger import sweep
    field = _FIELD[vary]
    nominal = judge(template, True).key == "nominal"

    def judged(values):
        peaks = sweep(template, measure="peak", **{field: values})["gpu"]
        if nominal:                           # the larger of the peak and the exact sum
            return [max(int(p), _at(template, vary, int(v)).totals["gpu"]) for p, v in zip(peaks, values)]
        return [int(p) for p in peaks]
    answers = _largest_many(judged, [memory - margin for memory in memories])     # the room a fit may fill
    results = []
    for memory, answer in zip(memories, answers):
        result = _result(template, vary, memory, True, answer, margin)
        over, room = result["next"], memory - margin
        if (answer is not None and result["judged_at_answer"] > room) or (over and over["judged"] <= room):
            raise RuntimeError(f"the vectorized search disagrees with the exact judgement at {vary} {answer}")
        results.append(result)
    return results


def _largest_many(judged, memories) -> list:
    """For each memory, the largest n >= 1 with judged(n) <= memory (judged non-decreasing), None if none:
    powers of two bracket every answer, then each round evaluates up to 64 points inside every open bracket."""
    import numpy as np
    powers = [2**k for k in range(41)]
    values = judged(np.array(powers, dtype=np.int64))
    brackets = []
    for memory in memories:
        fitting = [p for p, v in zip(powers, values) if v <= memory]
        if not fitting:
            brackets.append(None)
        elif fitting[-1] == powers[-1]:
            raise ValueError(f"still fits at {powers[-1]}: no limit found below {_UPPER}")
        else:
            brackets.append([fitting[-1], 2 * fitting[-1]])       # fits at low, not at high
    while True:
        open_ = [b for b in brackets if b is not None and b[1] - b[0] > 1]
        if not open_:
            return [None if b is None else b[0] for b in brackets]
        points = sorted({b[0] + (b[1] - b[0]) * k // 65 for b in open_ for k in range(1, 65)} - {b[0] for b in open_})
        result = dict(zip(points, judged(np.array(points, dtype=np.int64))))
        for b, memory in zip(brackets, memories):
            if b is None or b[1] - b[0] <= 1:
                continue
            inside = [p for p in points if b[0] < p < b[1]]
            b[0] = max([p for p in inside if result[p] <= memory], default=b[0])
            b[1] = min([p for p in inside if result[p] > memory], default=b[1])


def _binding(vary, answer, beyond, over, peak, gpu_bytes, margin) -> str:

    """What decides the boundary: the measure at the first value that does not fit, and its largest part."""
    if over is None:
        return "fits at the smallest value already"
    judged = judge(over, peak)
    usable = gpu_bytes - margin
    verb = "needs" if judged.bytes > usable else "has"
    limit = f"{usable:,} B" + (f" ({gpu_bytes:,} B less the {margin:,} B margin)" if margin else "")
    head = f"at {_LABEL[vary]} {beyond} {judged.measure} {verb} {judged.bytes:,} B > {limit}"
    if answer is None and vary in ("batch", "seq", "layers"):
        head = f"nothing fits: even at {_LABEL[vary]} 1 {judged.measure} needs {judged.bytes:,} B > {limit}"
    if judged.key in ("nvidia-smi", "run"):
        return f"{head}; the step's peak there is {over.peak:,} B"
    if judged.key in ALLOCATOR:
        return (f"{head}; the step's peak there is {over.peak:,} B, the allocator's rounding and cached blocks add "
                f"{judged.bytes - over.peak:,} B")
    if peak and judged.bytes == over.peak:
        step = over.step("cuda") if not isinstance(over, Ledger) else over.step()
        name, size = step.live_at_peak()[0]
        return (f"{head}; the peak comes in {step.peak.detail}, where the largest live tensor is {name}, "
                f"{size:,} B ({100 * size / judged.bytes:.0f}%)")
    top = max((r for r in over.rows if r.device == "gpu"), key=lambda r: r.bytes)
    share = 100 * top.bytes / over.totals["gpu"]
    return f"{head}; the largest row is {top.name} ({top.group}), {top.bytes:,} B ({share:.0f}%)"
