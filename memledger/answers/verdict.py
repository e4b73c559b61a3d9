"""What a fits verdict judges, and the words that say so: the step's peak where modelled, else the sum.

A run fits or fails at its **peak**, a moment of the training step
(:mod:`memledger.step.timeline`, checked against PyTorch's ``MemTracker``). The ledger's
GPU total is something else: the **sum of the rows at the end of the forward
pass** (every saved activation next to every model state, gradients included).
Neither bounds the other: without recomputation the gradients and the
activations never coexist in one step, so the peak is lower than the sum; with
full recomputation, large logits or the optimizer's FP32 temporaries it is
higher. :func:`judge` decides which one a verdict uses, and :data:`MEASURE`
names each one, so that every verdict (``memledger.fit``, the Jupyter
explorer, the static calculator) says which it printed:

* ``"peak"``: the step's peak, where the timeline models the setup
  (``Ledger.peak`` is not None: the reference decoder's GPT and LLaMA blocks,
  the latter also grouped-query, with QKV biases or a tied head; any head size; no, selective or full
  recomputation);
* ``"nominal"``: for a ledger that books a nominal parameter count (the
  article's 7x10^9) which the timeline, counting tensors, does not see, the
  larger of the peak and the sum (:meth:`memledger.ledger.ledger.Ledger.judged_bytes`);
* ``"total"``: the sum, where the timeline does not model the setup (MoE,
  encoders) or where the sum is asked for;
* ``"allocated"`` and ``"reserved"``: the step replayed twice through a port of PyTorch's caching allocator
  (:mod:`memledger.ledger.replay`): the peak of its blocks (``torch.cuda.max_memory_allocated()``) or of its
  segments, free cached blocks included (``max_memory_reserved()``, what runs out first), with the ledger's
  overhead row beside them. Asked for only (``measure="allocated"``/``"reserved"``), never chosen by ``auto``;
* ``"nvidia-smi"``: the replay's reserved segments with cuBLAS's workspaces booked in them, and the CUDA context
  beside them, each a cited constant per GPU (:mod:`memledger.ledger.outside`), instead of the overhead row; refused in
  one line where a constant is not known (a GPU without a published context and no ``cuda_context``, more than one
  rank: NCCL's buffers);
* ``"run"``: the peak over loading the weights (``load``, :mod:`memledger.ledger.loading`) and the step, live bytes
  and the overhead row as the step's peak; the verdict names the phase of the peak.

Against what a verdict compares: the GPU's total as ``nvidia-smi`` reports it
(:data:`memledger.ledger.hardware.GPU_MEMORY`), the judged bytes including the
ledger's overhead row (the CUDA context, which comes out first: what
``torch.cuda.mem_get_info()`` reports free is the total less the context, and
cuBLAS's and NCCL's workspaces). What is left must be at least :data:`MARGIN`,
about a gigabyte: the caching allocator rounds every block up
(:data:`memledger.ledger.hardware.CUDA_BLOCK_ROUNDING`) and keeps freed blocks of the
wrong size (fragmentation), and libraries allocate beside it, so a plan that
leaves less is no fit (:func:`assess`; :func:`memledger.fit` searches with it).
"""
import sys
from functools import lru_cache
from typing import NamedTuple

from ..core.capacity import MARGIN, leaves_margin, standing
from ..core.units import format_bytes

__all__ = ["ALLOCATOR", "SPECS", "is_lora", "nvidia_smi", "run_peak",
           "ASSESSMENTS", "AllocatorSpec", "CHOICES", "CLAUSES", "Judgement", "MARGIN", "MEASURE",
           "REFUSED", "SENTENCE", "SUM_CLAUSE", "SUM_NOTE", "UNMODELLED_NOTE", "allocator_spec", "assess",
           "check_measure", "describe", "is_nominal", "judge", "leaves_margin", "replayed", "sentence", "standing",
           "unmodelled", "uses_peak"]

#: Each measure a verdict can use, as prose prints it (``result["measure"]`` of :func:`memledger.fit`).
MEASURE = {
    "peak": "the peak of a training step",
    "nominal": "the peak of a training step or, where larger, the sum of the rows with the nominal parameter count",
    "total": "the sum of the rows at the end of the forward pass",
    "allocated": "the peak of the caching allocator's blocks over two training steps (max_memory_allocated) and "
                 "the overhead row",
    "reserved": "the peak of the caching allocator's segments over two training steps (max_memory_reserved, "
                "fragmentation included) and the overhead row",
    "nvidia-smi": "what nvidia-smi would show: the caching allocator's segments over two training steps, cuBLAS's "
                  "workspaces among them, and the CUDA context",
    "run": "the peak of the whole run, loading the weights and the training step",
}
#: The measures a replay through the caching allocator gives (:mod:`memledger.ledger.replay`).
ALLOCATOR = ("allocated", "reserved")
#: Measures named by the issue that are not modelled yet, and why (each refused in one line); none left.
REFUSED = {}
#: The measures judged beside the step's own (:class:`AllocatorSpec`): the allocator's two, nvidia-smi and the run.
SPECS = ALLOCATOR + ("nvidia-smi", "run")
#: Why a verdict by the sum is not the peak: the static calculator's note, and the explorer's without a timeline.
SUM_NOTE = "the peak of a step can be higher; see the chapter on the peak"
UNMODELLED_NOTE = "the step timeline does not model this setup"
#: The clause after a verdict by the sum where the peak was not asked for (the static calculator prints it too).
SUM_CLAUSE = f", {MEASURE['total']} ({SUM_NOTE})"
#: ``measure`` choices of :func:`judge` and :func:`memledger.fit`: the peak where modelled, or one of the two.
CHOICES = ("auto", "peak", "total") + SPECS


class AllocatorSpec(NamedTuple):
    """A verdict by the caching allocator's replay: ``measure`` ("allocated", "reserved" or "nvidia-smi") and the
    ``PYTORCH_CUDA_ALLOC_CONF`` options it replays with; for "nvidia-smi" the ``gpu``'s name and the
    ``cuda_context`` given (bytes, or None: the published constant); for "run" the ``load`` path."""
    measure: str
    expandable_segments: bool = False
    max_split_size_mb: object = None
    gpu: object = None
    cuda_context: object = None
    load: object = None


def check_measure(measure: str) -> str:
    """``measure`` if it is one of :data:`CHOICES` and modelled; one line naming why otherwise."""
    if measure not in CHOICES:
        raise ValueError(f"measure must be one of {', '.join(CHOICES)}, got {measure!r}")
    if measure in REFUSED:
        raise ValueError(f"measure {measure} is refused: {REFUSED[measure]}")
    return measure


def allocator_spec(measure: str, expandable_segments: bool = False, max_split_size_mb=None, gpu=None,
                   cuda_context=None, load=None):
    """An :class:`AllocatorSpec` for ``measure`` "allocated", "reserved", "nvidia-smi" or "run", else None; an option
    of another measure is refused in one line."""
    from ..ledger.loading import LOADS
    if measure != "nvidia-smi" and cuda_context is not None:
        raise ValueError("cuda_context is a part of what nvidia-smi shows: measure nvidia-smi")
    if measure != "run" and load is not None and load not in LOADS[2:]:
        raise ValueError(f"load says how a run loads its weights: measure run (with allocated, reserved or "
                         f"nvidia-smi a library's loading trace: {', '.join(LOADS[2:])})")
    if measure in ALLOCATOR + ("nvidia-smi",):
        return AllocatorSpec(measure, bool(expandable_segments), max_split_size_mb, gpu, cuda_context, load)
    if expandable_segments or max_split_size_mb is not None:
        raise ValueError("expandable_segments and max_split_size_mb configure the caching allocator's replay: "
                         "measure allocated, reserved or nvidia-smi")
    if measure == "run":
        return AllocatorSpec(measure, load=LOADS[0] if load is None else load)
    return None


class Judgement(NamedTuple):
    """What a verdict compares with the GPU: ``bytes``, judged by ``key`` (a key of :data:`MEASURE`)."""
    bytes: int
    key: str

    @property
    def measure(self) -> str:
        return MEASURE[self.key]


def is_nominal(ledger) -> bool:
    """Whether the ledger books a parameter count that is not the architecture's tensors' (the article's 7x10^9)."""
    return ledger.n_params is not None or (ledger.arch is not None and ledger.arch.n_params is not None)


def uses_peak(ledger, measure: str = "auto") -> bool:
    """Whether a verdict on ``ledger`` judges the step's peak: not if ``measure="total"`` or if the timeline
    does not model the setup (``measure="peak"`` then raises the timeline's own ``ValueError``)."""
    check_measure(measure)
    if measure == "total":
        return False
    if ledger.peak is None:
        if measure != "auto":
            ledger.step()                      # raises the timeline's reason
        return False
    return True


def judge(ledger, peak) -> Judgement:
    """The bytes ``ledger`` is judged by: the sum, or (``peak``) the step's peak, the larger of the two
    for a nominal parameter count (:meth:`memledger.ledger.ledger.Ledger.judged_bytes`); or, ``peak`` an
    :class:`AllocatorSpec`, the caching allocator's replay of the step (:func:`replayed`)."""
    if is_lora(ledger):
        return _judge_lora(ledger, peak)
    if isinstance(peak, AllocatorSpec):
        if peak.measure == "nvidia-smi":
            return Judgement(nvidia_smi(ledger, peak).judged, peak.measure)
        if peak.measure == "run":
            return Judgement(run_peak(ledger, peak).judged, peak.measure)
        return Judgement(replayed(ledger, peak).judged(peak.measure), peak.measure)
    if not peak:
        return Judgement(ledger.totals["gpu"], "total")
    if ledger.peak is None:
        raise ValueError(f"{UNMODELLED_NOTE}: it cannot be judged by {MEASURE['peak']}")
    if is_nominal(ledger):
        return Judgement(max(ledger.peak, ledger.totals["gpu"]), "nominal")
    return Judgement(ledger.peak, "peak")


def is_lora(ledger) -> bool:
    """Whether ``ledger`` is a :class:`memledger.ledger.lora.LoraLedger`, without importing that module (it loads
    SymPy): a LoRA ledger exists only once its module is loaded."""
    lora = sys.modules.get("memledger.ledger.lora")
    return lora is not None and isinstance(ledger, lora.LoraLedger)


def _judge_lora(lora, peak) -> Judgement:
    """:func:`judge` for a LoRA/QLoRA ledger (:class:`memledger.ledger.lora.LoraLedger`): its step under CUDA's
    conventions (its ``peak``), replayed through the caching allocator (:func:`memledger.ledger.replay.replay_step`,
    loading first where ``spec.load`` names a library's trace), with cuBLAS's workspaces and the CUDA context under
    nvidia-smi, or the run's phases (:func:`memledger.ledger.loading.lora_run_phases`)."""
    if not isinstance(peak, AllocatorSpec):
        if not peak:
            return Judgement(lora.totals["gpu"], "total")
        if lora.peak is None:
            raise ValueError(f"{UNMODELLED_NOTE}: it cannot be judged by {MEASURE['peak']}")
        return Judgement(lora.peak, "peak")
    step = lora.step("cuda")
    if peak.measure == "run":
        from ..ledger.loading import LOADS, lora_run_phases
        return Judgement(lora_run_phases(lora, step.peak.bytes, peak.load or LOADS[0]).judged, "run")
    from ..ledger.outside import cuda_context, workspaces
    from ..ledger.replay import replay_step
    resident, context = (), 0
    if peak.measure == "nvidia-smi":
        context, _ = cuda_context(peak.gpu, peak.cuda_context)
        biased = lora.arch.style == "gpt" or bool(lora.arch.qkv_bias)
        resident = tuple((phase, size) for phase, _, size in workspaces(peak.gpu, biased=biased))
    replay = replay_step(step, peak.expandable_segments, peak.max_split_size_mb, resident=resident, load=peak.load)
    if peak.measure == "nvidia-smi":
        return Judgement(replay.reserved + context, "nvidia-smi")
    return Judgement(replay.judged(peak.measure), peak.measure)


def replayed(ledger, spec: AllocatorSpec, backend: str = "article", **changes):
    """``ledger``'s step replayed through the caching allocator (:func:`memledger.ledger.replay.replay`) as
    ``spec`` asks; DeepSpeed and Megatron-LM (side streams the step does not model) are refused for "reserved" in
    one line. Under "nvidia-smi" cuBLAS's workspaces are booked in the replay
    (:func:`memledger.ledger.outside.workspaces`)."""
    from ..ledger.replay import check_streams
    if spec.load is not None:
        raise ValueError(f"load {spec.load} replays that library's LoRA/QLoRA loading: give a LoRA step "
                         "(memledger step --lora-rank or --qlora)")
    resident = ()
    if spec.measure == "nvidia-smi":
        from ..ledger.outside import check_ranks
        check_ranks(ledger)
        resident = tuple((phase, size) for phase, _, size in _workspaces(ledger, spec.gpu))
    check_streams(ledger.framework, "reserved" if spec.measure == "nvidia-smi" else spec.measure)
    return _replayed(ledger, spec.expandable_segments, spec.max_split_size_mb, backend, tuple(sorted(changes.items())),
                     resident)


def _workspaces(ledger, gpu):
    from ..ledger.outside import workspaces
    arch = ledger.arch
    return workspaces(gpu, biased=arch is not None and (arch.style == "gpt" or bool(arch.qkv_bias)))


@lru_cache(maxsize=256)
def _replayed(ledger, expandable, max_split, backend, changes, resident=()):
    from ..ledger.replay import replay
    return replay(ledger, backend, expandable, max_split, resident=resident, **dict(changes))


def nvidia_smi(ledger, spec: AllocatorSpec, backend: str = "article", **changes):
    """What nvidia-smi would show for ``ledger``'s step (:class:`memledger.ledger.outside.Outside`): the replay's
    reserved peak (cuBLAS's workspaces in it) and the CUDA context; refused in one line where a constant is not
    known. The context is looked up first, so that a refusal costs no replay."""
    from ..ledger.outside import Outside, check_ranks, cuda_context
    check_ranks(ledger)
    context, source = cuda_context(spec.gpu, spec.cuda_context)
    rows = _workspaces(ledger, spec.gpu)
    replay = replayed(ledger, spec, backend, **changes)
    return Outside(replay.reserved, rows, context, source, spec.gpu)


def run_peak(ledger, spec: AllocatorSpec, step_peak: int = None):
    """The peak of ``ledger``'s whole run (:func:`memledger.ledger.loading.run_phases`), loading by ``spec.load``."""
    from ..ledger.loading import run_phases
    return run_phases(ledger, spec.load, step_peak)


#: The verdict's clause after the bytes, by which of the two it judged (:func:`describe` fills it; the static
#: calculator too): the sum (with a note why), the peak (the sum for comparison), or the sum where a nominal
#: parameter count makes it larger than the peak.
CLAUSES = {
    "total": ", {total_measure} ({note})",
    "peak": ", {peak_measure} ({total_measure}: {total})",
    "nominal": ", {total_measure}, larger here than {peak_measure} ({peak}), which counts the model's tensors, "
               "not the nominal parameter count",
    "allocator": ", {measure} ({peak_measure}: {peak})",
}


def unmodelled(ledger) -> str:
    """Why the step timeline has no peak for ``ledger``: :data:`UNMODELLED_NOTE`, or the recipe it does not model."""
    from ..step.structure import check_recipe
    try:
        check_recipe(ledger.recipe)
    except ValueError as e:
        return str(e).split(";")[0]        # "the step timeline does not model recipe fp32-sgd (SGD) yet"
    return UNMODELLED_NOTE


def describe(ledger, judgement: Judgement, unit: str = "GB", note: str = None) -> str:
    """The verdict's clause after the bytes: which measure, and the other one for comparison. A sum is
    followed by ``note``, by default why it is not the peak (:data:`UNMODELLED_NOTE` or :data:`SUM_NOTE`)."""
    if judgement.key in SPECS:
        return CLAUSES["allocator"].format(measure=MEASURE[judgement.key], peak_measure=MEASURE["peak"],
                                           peak=format_bytes(ledger.peak, unit))
    if ledger.framework == "fsdp2":         # FSDP2 books no sum: its step's peak alone
        return f", {MEASURE['peak']}"
    total = ledger.totals["gpu"]
    if judgement.key == "total":
        clause = "total"
        if note is None:
            note = unmodelled(ledger) if ledger.peak is None else SUM_NOTE
    else:
        clause = "peak" if judgement.bytes == ledger.peak else "nominal"
    return CLAUSES[clause].format(total_measure=MEASURE["total"], peak_measure=MEASURE["peak"], note=note,
                                  total=format_bytes(total, unit),
                                  peak=None if ledger.peak is None else format_bytes(ledger.peak, unit))


#: The verdict in words, by :func:`standing` (:func:`assess` fills it; the static calculator too): over the GPU,
#: in it with less than the margin to spare (no fit), or in it with the margin to spare.
ASSESSMENTS = {
    "over": "does not fit: {over} over",
    "tight": "no fit: {room} to spare, under the {margin} margin",
    "fits": "fits, {room} to spare",
}
#: One verdict sentence, the same in ``memledger ledger``/``step``/``fit``, the explorer and the static calculator:
#: the assessment, then the bytes judged against the GPU and the measure's clause (:data:`CLAUSES`).
SENTENCE = "{assessment}; {judged} per GPU against {gpu}{clause}"


def assess(judged_bytes: int, gpu_bytes: int, unit: str = "GB", margin: int = MARGIN) -> str:
    """The verdict in words: ``"fits, 3.20 GB to spare"``; ``"no fit: 0.05 GB to spare, under the 1.00 GB
    margin"``; ``"does not fit: 2.10 GB over"``."""
    room = gpu_bytes - judged_bytes
    return ASSESSMENTS[standing(judged_bytes, gpu_bytes, margin)].format(
        over=format_bytes(-room, unit), room=format_bytes(room, unit), margin=format_bytes(margin, unit))


def sentence(judged_bytes: int, gpu_bytes: int, clause: str, unit: str = "GB", margin: int = MARGIN) -> str:
    """:data:`SENTENCE` for ``judged_bytes`` on a GPU of ``gpu_bytes``, ``clause`` after it (:func:`describe`):
    ``"does not fit: 45.58 GB over; 125.48 GB per GPU against 79.90 GB, the peak of a training step (...)"``."""
    return SENTENCE.format(assessment=assess(judged_bytes, gpu_bytes, unit, margin),
                           judged=format_bytes(judged_bytes, unit), gpu=format_bytes(gpu_bytes, unit), clause=clause)
