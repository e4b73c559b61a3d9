"""A training step replayed through the caching allocator: what ``max_memory_allocated()`` and
``max_memory_reserved()`` would report.

The step (:mod:`memledger.step.timeline`, compiled by :func:`memledger.step.cache.compiled_step`) says, after each op,
which tensors are live on the GPU, to the byte. :func:`replay` hands every one of them to the port of PyTorch's
caching allocator (:class:`memledger.ledger.caching.CachingAllocator`) op by op, and reads its statistics:

* **allocated**: the blocks of the live tensors (each rounded to 512 bytes, or a whole unsplit block of the large
  pool), what ``torch.cuda.max_memory_allocated()`` reports;
* **reserved**: the segments the allocator holds, free cached blocks included (fragmentation), what
  ``torch.cuda.max_memory_reserved()`` reports and what runs out first.

How the trace is replayed:

* Two steps. In the first, Adam's moments and step counters (PyTorch creates them in the first ``optimizer.step()``,
  ``_init_group``) are allocated when the optimizer starts (where the optimizer steps in backward, when backward
  starts), after the activations of the step have been freed into the cache; the second step runs from the
  allocator's state the first left. The peaks are over both.
* Within one op, the tensors it frees are freed before those it allocates: the step already puts a PyTorch op's
  output before the free of its inputs (an input dies in a later op), and an op that does both replaces one
  bookkeeping lump by another (the gradients still to release, the blocks run as one), which a real run frees and
  allocates one tensor at a time. Of several live copies of one tensor, the last allocated is freed first.
* The ledger's overhead row (the CUDA context and workspaces) is not a tensor of the allocator: it is left out of
  the replay and added to the judged bytes, as nvidia-smi would count it beside the allocator.
* A pool per stream. Each tensor of the step says the CUDA stream its memory is allocated on
  (:class:`memledger.step.vocab.Stream`, a field of the step's tensors): FSDP2's all-gather buffers on its all-gather
  copy-in stream, its reduce-scatter outputs and sharded gradients on its reduce-scatter stream (HSDP's cast on the
  all-reduce stream), everything else, DDP's buckets included, on the default stream (the sources:
  :mod:`memledger.step.fsdp2`, :mod:`memledger.step.ddp`). The allocator reuses a cached block only for the stream
  that allocated it, whichever stream frees it. Neither framework calls ``record_stream`` (FSDP2 makes the streams
  wait on events before it drops a buffer; ProcessGroupNCCL keeps a collective's tensors referenced until it is
  waited on), so no free is delayed; the allocator's ``record_stream()`` is there for the frameworks that would.
  DeepSpeed and Megatron-LM are refused for ``reserved`` (:func:`check_streams`): their side streams' buffers are not
  in the step.
* DDP's buckets, one tensor of the step, are replayed as the reducer allocates them: one block per bucket, the
  gradients in the order backward writes them grouped by ``bucket_cap_mb`` (:func:`memledger.step.ddp.assign_buckets`).
* The step runs blocks 2..L-3 as one lump: a tensor of the lump ("saved tensors of blocks 2..L-3", "... of
  @blocks 1..L-2") is replayed as one block per block of the model (L-4, or L-2, equal parts), not one block for
  all. Other tensors the step books as one (a model's parameters, a block's saved tensors together) are one block
  each: the rounding of their parts, at most 511 bytes each, and the placement of each part are not replayed, so
  the fragmentation ``reserved`` shows is that of the step's tensors. So a replay walks the model block by block:
  up to :data:`memledger.core.choices.LAYERS_ONE_BY_ONE` blocks, past which ``n_layers`` is refused in one line
  before anything is built.
"""
from dataclasses import dataclass, field
import json
import os

from ..core.choices import check_layers_one_by_one
from ..step.vocab import Stream
from .caching import CachingAllocator

__all__ = ["ALLOCATOR_MEASURES", "Replay", "check_streams", "replay", "replay_step", "roles"]

#: The measures a replay gives.
ALLOCATOR_MEASURES = ("allocated", "reserved")
#: What a replay walks (:func:`memledger.core.choices.check_layers_one_by_one` bounds it, before anything is built).
WALK = "the caching allocator's replay (a lumped tensor as one block per model block)"
#: The blocks and segments :func:`run`'s snapshots may walk in all per request or free replayed so far (a snapshot
#: walks a block in about a fifth of the time the allocator serves a request: at most about as long as the replay);
#: see :func:`run`.
SNAPSHOT_BUDGET = 4
#: Frameworks whose collectives allocate on side streams (see the module docstring).
SIDE_STREAMS = {"deepspeed": "DeepSpeed allocates its reduce and gather buckets on side streams",
                "megatron": "Megatron-LM's distributed optimizer communicates on side streams"}


@dataclass
class Replay:
    """What the allocator reports over the replayed steps. ``allocated`` and ``reserved`` are the peaks of the
    allocator alone; ``outside`` the ledger's overhead row beside it; ``series`` (step, op, phase, allocated,
    reserved) after every op; ``segments`` the allocator's segments at the reserved peak (``snapshot()``)."""
    allocated: int
    reserved: int
    outside: int
    allocated_at: tuple
    reserved_at: tuple
    segments: list
    series: list = field(repr=False)
    expandable_segments: bool = False
    max_split_size_mb: object = None

    def judged(self, measure: str) -> int:
        """The bytes a verdict by ``measure`` ("allocated" or "reserved") compares with the GPU: the peak and the
        overhead row."""
        return (self.allocated if measure == "allocated" else self.reserved) + self.outside

    def phase_peaks(self) -> dict:
        """{phase: (largest allocated, largest reserved)} over the replayed steps."""
        out = {}
        for _, _, phase, allocated, reserved in self.series:
            a, r = out.get(phase, (0, 0))
            out[phase] = (max(a, allocated), max(r, reserved))
        return out

    def to_dict(self) -> dict:
        return {"allocated": self.allocated, "reserved": self.reserved, "outside_allocator": self.outside,
                "allocated_at": {"step": self.allocated_at[0], "op": self.allocated_at[1],
                                 "phase": self.allocated_at[2]},
                "reserved_at": {"step": self.reserved_at[0], "op": self.reserved_at[1], "phase": self.reserved_at[2]},
                "expandable_segments": self.expandable_segments, "max_split_size_mb": self.max_split_size_mb,
                "segments": [{k: s[k] for k in ("address", "stream", "pool", "expandable", "total_size",
                                                "allocated_size", "free_size")} for s in self.segments],
                "fragmentation": sum(s["free_size"] for s in self.segments)}


def _outside(kinds) -> list:
    """The indices of the tensors outside the allocator: the overhead row."""
    return [j for j, (_, kind) in enumerate(kinds) if kind == "overhead"]


def _lazy(kinds, masters) -> list:
    """The indices of the optimizer states PyTorch creates at the first ``optimizer.step()``: not the master weights
    (``masters``, the step's :attr:`~memledger.step.build.Built.masters`, by the recipe's typed component state),
    which exist from the start."""
    return [j for j, (name, kind) in enumerate(kinds) if kind == "optimizer" and name not in masters]


def check_streams(framework: str, measure: str = "reserved") -> None:
    """``ValueError`` in one line where ``measure`` would need the side streams of ``framework``."""
    if measure == "reserved" and framework in SIDE_STREAMS:
        raise ValueError(f"--measure reserved is not modelled under --framework {framework}: "
                         f"{SIDE_STREAMS[framework]}, a pool of its own that the step does not model (--measure "
                         "allocated does not depend on streams)")


def _roles_path(structure):
    from ..step.cache import record_path
    path = record_path(structure)
    return path.with_name(path.stem + "-roles.json")


def roles(structure) -> dict:
    """{"outside": [tensor indices of the overhead row], "lazy": [indices of the optimizer states PyTorch creates in
    the first step], "lumps": {index: "L-4" or "L-2", the blocks a lumped tensor spans}, "streams": {index: the
    stream of a tensor not allocated on the default one}, "buckets": None or [index of DDP's buckets, [indices of the
    gradients written before the blocks], [... in one block], [... after them]]}, by the step's tensor names, kinds
    and streams; kept beside the compiled step's record (computed once, with SymPy)."""
    path = _roles_path(structure)
    try:
        data = json.loads(path.read_text())
        if isinstance(data, dict) and data.get("structure") == repr(structure):
            return data
    except (OSError, ValueError):
        pass
    from ..step import ddp
    from ..step.build import build
    built = build(structure)
    kinds = [(name, built.tensors[name].kind.value) for name in built.names]
    index = {name: j for j, name in enumerate(built.names)}
    buckets = None
    if ddp.BUCKETS in index:
        buckets = [index[ddp.BUCKETS]] + [[index[name] for _, name in part]
                                          for part in ddp.ready_parts(built.ops, built.tensors)]
    data = {"structure": repr(structure),
            "outside": _outside(kinds), "lazy": _lazy(kinds, built.masters),
            "lumps": {str(j): span for j, (name, _) in enumerate(kinds)
                      for pattern, span in (("2..L-3", "L-4"), ("1..L-2", "L-2")) if pattern in name},
            "streams": {str(j): built.tensors[name].stream.value for j, name in enumerate(built.names)
                        if built.tensors[name].stream is not Stream.DEFAULT},
            "buckets": buckets}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(data))
        os.replace(temporary, path)
    except OSError:
        pass
    return data


def replay(ledger, backend="article", expandable_segments: bool = False, max_split_size_mb=None, steps: int = 2,
           resident=(), **changes) -> Replay:
    """``ledger``'s step (under ``backend``'s conventions, changed as in
    :func:`memledger.activations.backends.get_backend`) replayed ``steps`` times through the caching allocator; see
    the module docstring. ``ValueError`` where the timeline does not model the setup."""
    from ..activations.backends import get_backend
    from ..step.cache import compiled_step
    from ..step.structure import StepStructure, step_values
    if ledger.arch is None:
        raise ValueError("the allocator replays the step, and without an architecture there is no step")
    check_layers_one_by_one(ledger.arch.n_layers, WALK)
    if max_split_size_mb is not None and (isinstance(max_split_size_mb, bool) or not isinstance(max_split_size_mb, int)
                                          or max_split_size_mb <= 20):
        raise ValueError(f"max_split_size_mb must be an integer above 20 (PyTorch's minimum), got {max_split_size_mb!r}")
    structure = StepStructure.of(ledger, get_backend(backend, **changes))
    step = compiled_step(structure)
    sizes = step.sizes(step_values(ledger))
    part = roles(structure)
    n_layers = step_values(ledger)["L"]
    pieces = {int(j): n_layers - (4 if span == "L-4" else 2) for j, span in part["lumps"].items()}
    if part.get("buckets"):
        from ..step.ddp import assign_buckets, bucket_limits
        from ..step.inputs import inputs_of
        j, before, block, after = part["buckets"]
        order = [sizes[i] for i in before + block * n_layers + after]
        buckets = [sum(order[i] for i in members)
                   for members in assign_buckets(order, bucket_limits(inputs_of(ledger).ddp.bucket_mb))]
        if sum(buckets) != sizes[j]:
            raise AssertionError(f"DDP's buckets add up to {sum(buckets):,} bytes, the step's row to {sizes[j]:,}")
        pieces[j] = buckets
    streams = {int(j): Stream(s) for j, s in part.get("streams", {}).items()}
    return run(step.deltas, step.moments, sizes, part["outside"], part["lazy"], expandable_segments,
               max_split_size_mb, steps, pieces, streams, resident)


def replay_step(step, expandable_segments: bool = False, max_split_size_mb=None, steps: int = 2, resident=(),
                load=None) -> Replay:
    """A built step timeline (:class:`memledger.step.timeline.Step`, or the LoRA step of
    :meth:`memledger.ledger.lora.LoraLedger.step`) replayed as :func:`replay` replays a ledger's, read from its ops
    rather than from the compiled step's record: the same trace (``deltas``, ``moments``), the same roles (the
    overhead row outside the allocator, the optimizer's states but FP32 masters created in the first step, the lumped
    blocks as one block per model block), the same replay. Only tensors on the GPU take part (a paged optimizer's
    states and offloaded copies are on the host). ``resident``: as :func:`run`'s (cuBLAS's workspaces). ``load``
    ("torchtune" or "litgpt", a LoRA step's): loading the model as that library does
    (:func:`memledger.ledger.library_loading.load_trace`) is replayed first, and the step takes the parameters it
    left as already allocated: the peaks are then those of the whole run."""
    if max_split_size_mb is not None and (isinstance(max_split_size_mb, bool) or not isinstance(max_split_size_mb, int)
                                          or max_split_size_mb <= 20):
        raise ValueError(f"max_split_size_mb must be an integer above 20 (PyTorch's minimum), got {max_split_size_mb!r}")
    check_layers_one_by_one(step.values["L"], WALK)
    from ..step.cache import trace
    built = step.built
    deltas, moments = trace(built)
    kinds = [(name, built.tensors[name].kind.value) for name in built.names]
    outside, lazy = _outside(kinds), _lazy(kinds, built.masters)
    n_layers = step.values["L"]
    pieces = {j: n_layers - (4 if "2..L-3" in name else 2) for j, (name, _) in enumerate(kinds)
              if "2..L-3" in name or "1..L-2" in name}
    prelude, preloaded = (), ()
    if load is not None:
        from .library_loading import STEP_TENSORS, TORCHAO_STEP_TENSORS, load_trace
        prelude, kept = load_trace(step.ledger, load)
        adapters = next((name for name in built.names if name.startswith("LoRA adapters:")
                         and name.endswith("parameters")), STEP_TENSORS["adapters"])
        table = TORCHAO_STEP_TENSORS | {k: v for k, v in STEP_TENSORS.items() if v in built.names} \
            if TORCHAO_STEP_TENSORS["packed"] in built.names else STEP_TENSORS
        names = {adapters if tag == "adapters" else table[tag] for tag, _ in kept}
        missing = names - set(built.names)
        if missing:
            raise AssertionError(f"the load trace keeps tensors the step does not book: {sorted(missing)}")
        preloaded = [j for j, name in enumerate(built.names) if name in names]
    return run(deltas, moments, [int(x) for x in step.sizes], outside, lazy, expandable_segments, max_split_size_mb,
               steps, pieces, resident=resident, prelude=prelude, preloaded=preloaded)


def run(deltas, moments, sizes, outside=(), lazy=(), expandable_segments=False, max_split_size_mb=None,
        steps: int = 2, pieces=None, streams=None, resident=(), prelude=(), preloaded=()) -> Replay:
    """Replay a trace: ``deltas[k]`` the [tensor, change of its count] pairs of op k, ``moments[k]`` its [phase,
    layer], ``sizes[j]`` tensor j's bytes; ``outside`` tensors are not the allocator's, ``lazy`` ones are created
    in the first step only when the optimizer starts; ``pieces[j]``: tensor j is that many equal blocks, or (a list)
    blocks of those bytes; ``streams[j]``: the stream tensor j is allocated on (a :class:`Stream`; else the default
    one), each stream a pool of its own; ``resident``: (phase, bytes) allocations made with the first op of that phase
    in the first step and never freed (cuBLAS's workspaces, :mod:`memledger.ledger.outside`); ``prelude``: a
    loading trace of ("alloc", key, bytes) and ("free", key) events replayed before the first step (step 0, phase
    "load"), whose surviving blocks stand for the ``preloaded`` tensors (the step does not allocate those).

    The segments at the reserved peak (``snapshot()``, which walks every block) are taken as the peak rises, but not
    at every rise: the peak rises with every new segment while loading and in the first forward pass, and a
    snapshot at each would cost the number of segments squared. A rise is snapshotted where the allocator's requests
    and frees since the last snapshot are at least the blocks (and segments) that snapshot walked, or where the
    blocks walked in all snapshots would stay within :data:`SNAPSHOT_BUDGET` per request or free so far (for the
    last rises of a burst). Where the last rise was not snapshotted, the trace is walked again on a fresh allocator
    (the replay is deterministic) to that point, and the snapshot taken there."""
    if not deltas:
        raise ValueError("an empty trace")
    trace = _Trace(deltas, moments, sizes, outside, lazy, steps, pieces, streams, resident, prelude, preloaded)
    allocator = CachingAllocator(expandable_segments, max_split_size_mb)
    series, best_allocated, best_reserved, peak_point = [], (-1, None), (-1, None), None
    segments, taken, since, cost, spent = [], None, 0, 0, 0
    for point, at in enumerate(trace.walk(allocator)):
        series.append(at + (allocator.allocated, allocator.reserved))
        if allocator.max_allocated > best_allocated[0]:
            best_allocated = (allocator.max_allocated, at)
        if allocator.max_reserved > best_reserved[0]:
            best_reserved, peak_point = (allocator.max_reserved, at), point
            if taken is None or trace.calls - since >= cost or spent + cost <= SNAPSHOT_BUDGET * trace.calls:
                segments, taken, since = allocator.snapshot(), point, trace.calls
                cost = len(segments) + sum(len(s["blocks"]) for s in segments)
                spent += cost
    if taken != peak_point:
        segments = _snapshot_at(trace, peak_point, expandable_segments, max_split_size_mb)
    names = {k: s.value for k, s in enumerate(Stream)}
    return Replay(allocator.max_allocated, allocator.max_reserved, trace.over, best_allocated[1], best_reserved[1],
                  [dict(s, stream=names[s["stream"]]) for s in segments], series, bool(expandable_segments),
                  max_split_size_mb)


def _snapshot_at(trace, stop: int, expandable_segments, max_split_size_mb) -> list:
    """The allocator's ``snapshot()`` at point ``stop`` of ``trace``'s series, walked again on a fresh allocator."""
    allocator = CachingAllocator(expandable_segments, max_split_size_mb)
    for point, _ in enumerate(trace.walk(allocator)):
        if point == stop:
            break
    return allocator.snapshot()


class _Trace:
    """The requests and frees of :func:`run`'s replay, walked through an allocator (:meth:`walk`)."""

    def __init__(self, deltas, moments, sizes, outside, lazy, steps, pieces, streams, resident, prelude, preloaded):
        self.deltas, self.sizes, self.steps, self.resident, self.prelude = deltas, sizes, steps, resident, prelude
        # the allocator's stream ids: 0 the default stream, then the others in the order of Stream
        ids = {s: k for k, s in enumerate(Stream)}
        self.stream_of = {j: ids[Stream(s)] for j, s in (streams or {}).items()}
        self.outside, self.lazy = set(outside) | set(preloaded), set(lazy)
        self.target = {j: c for j, c in deltas[0]}          # the counts the step starts from
        self.phases = [m[0] for m in moments]
        start = next((k for k, p in enumerate(self.phases) if p == "optimizer"), None)
        if start is None:
            start = next((k for k, p in enumerate(self.phases) if p == "backward"), 0)
        self.start = start
        self.pieces, self._parts = pieces or {}, {}
        # each op's changes of tensors in the allocator, frees first (op 0's are those of the live tensors)
        self.ops = [[(j, c) for j, c in changes if j not in self.outside and c] for changes in deltas]
        self.ops = [[(j, c) for j, c in op if c < 0] + [(j, c) for j, c in op if c > 0] for op in self.ops]
        self.over = sum(sizes[j] * c for j, c in deltas[0] if j in self.outside and j not in set(preloaded))

    def parts(self, j):
        if j not in self._parts:
            n = self.pieces.get(j, 1)
            if not isinstance(n, list):
                n, size = max(1, n), self.sizes[j]
                n = [size // n] * (n - 1) + [size - (n - 1) * (size // n)]
            self._parts[j] = n
        return self._parts[j]

    def walk(self, allocator):
        """Replay through ``allocator``, yielding (step, op, phase) after each event of the prelude and each op;
        :attr:`calls` counts the requests and frees made."""
        live = {}                                     # tensor -> its blocks, last allocated last
        self.calls = 0                                # the allocator's requests and frees so far

        def change(j, count):
            copies = live.setdefault(j, [])
            stream = self.stream_of.get(j, 0)
            for _ in range(count):
                copies.append([allocator.malloc(part, stream) for part in self.parts(j)])
                self.calls += len(copies[-1])
            for _ in range(-count):
                blocks = copies.pop()
                self.calls += len(blocks)
                for block in reversed(blocks):
                    allocator.free(block)
        loaded = {}
        for event in self.prelude:                    # loading, before the first step
            if event[0] == "alloc":
                loaded[event[1]] = allocator.malloc(event[2])
            else:
                allocator.free(loaded.pop(event[1]))
            self.calls += 1
            yield (0, 0, "load")
        booked, phases, lazy, target = set(), self.phases, self.lazy, self.target
        for n in range(1, self.steps + 1):
            for k, changes in enumerate(self.ops):
                if k == 0:                            # bring the live tensors to the step's start
                    changes = [(j, target[j] - len(live.get(j, ()))) for j, _ in self.deltas[0]]
                    if n == 1:
                        changes = [(j, c) for j, c in changes if j not in lazy]
                    changes = [(j, c) for j, c in changes if j not in self.outside and c]
                    changes = [(j, c) for j, c in changes if c < 0] + [(j, c) for j, c in changes if c > 0]
                if n == 1 and k == self.start:
                    for j in sorted(lazy & set(target)):
                        change(j, target[j])
                for j, c in changes:
                    change(j, c)
                if n == 1 and phases[k] not in booked:
                    for phase, size in self.resident:
                        if phase == phases[k]:
                            allocator.malloc(size)
                            self.calls += 1
                    booked.add(phases[k])
                yield (n, k, phases[k])
