"""The step's peak without SymPy: each step structure compiled once into data, kept on disk.

The command line judges a run by its peak (:class:`memledger.step.timeline.Step`), yet must answer about as fast
as Python starts, and SymPy alone takes ~0.3 s to import. A step's numbers depend on a ledger's values
only through the sizes of its tensors, and its programs only on the discrete choices of a
:class:`~memledger.step.structure.StepStructure`. So the first time a structure is met, :func:`compile_step`
builds its programs with SymPy (:func:`memledger.step.build.build`) and records them as data: every tensor's
size as a tape of operations over the symbols (:mod:`memledger.core.tape`) and, after every op, the change of
each GPU tensor's count. That record is written to the user's cache directory
(``platformdirs.user_cache_dir("memledger")``, or ``$MEMLEDGER_CACHE_DIR``), named by a hash of the structure
and of every file of the memledger package, so an edited or upgraded library never reads a stale record.
Later runs evaluate the tape (no ``eval``: a cache folder may be shared, and a record is never run) and add
the sizes up op by op: the largest running total is the peak, to the byte the same as ``Step.peak``
(``tests/step/test_cache.py``). A damaged or foreign record is reported in one line and compiled again.
"""
from functools import lru_cache
import hashlib
import json
import os
from pathlib import Path
import sys

from ..activations.backends import get_backend
from ..core.keyed import as_int
from ..core.tape import Tape
from .inputs import inputs_of
from .structure import StepStructure, block_of, split_refusal, step_values

__all__ = ["CompiledStep", "cache_dir", "compile_step", "compiled_step", "record_path", "source_hash", "step_peak",
           "step_record"]

PACKAGE = Path(__file__).resolve().parents[1]      # memledger/, the whole package
FORMAT = 4          # bump when the record's layout changes (4: sizes as a tape, data only, with tensor names)


@lru_cache(maxsize=1)
def source_hash() -> str:
    """A digest of every file of the memledger package (its source and data, bytecode caches aside): an edit
    anywhere, or another version, gives new cache names."""
    digest = hashlib.sha256()
    files = (p for p in PACKAGE.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")
    for path in sorted(files):
        digest.update(path.relative_to(PACKAGE).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def cache_dir() -> Path:
    """Where compiled steps are kept: ``$MEMLEDGER_CACHE_DIR`` if set, else the platform's user cache."""
    if os.environ.get("MEMLEDGER_CACHE_DIR"):
        return Path(os.environ["MEMLEDGER_CACHE_DIR"])
    from platformdirs import user_cache_dir
    return Path(user_cache_dir("memledger"))


def record_path(structure: StepStructure) -> Path:
    key = hashlib.sha256(f"{FORMAT}\0{source_hash()}\0{structure!r}".encode()).hexdigest()[:32]
    return cache_dir() / f"step-{key}.json"


def trace(built) -> tuple:
    """A built step's trace: ``deltas[k]``, the [tensor, change] pairs of the GPU counts after op k, and
    ``moments[k]``, the phase and program layer of op k."""
    gpu = [j for j, on in enumerate(built.gpu) if on]
    deltas, previous = [], [0] * len(built.names)
    for row in built.compiled.counts:
        counts = [int(c) for c in row]
        deltas.append([[j, counts[j] - previous[j]] for j in gpu if counts[j] != previous[j]])
        previous = counts
    moments = [[built.ops[i].phase.value, built.ops[i].layer if isinstance(built.ops[i].layer, int) else None]
               for i in built.compiled.ops]
    return deltas, moments


def step_record(structure: StepStructure) -> dict:
    """``structure``'s step as data for other evaluators (the static calculator, NumPy sweeps; loads SymPy):
    ``symbols`` (names), ``sizes`` (every tensor's bytes, a SymPy expression), ``deltas[k]`` (the [tensor,
    change] pairs of the GPU counts after op k), ``moments[k]`` (the phase and program layer of op k) and
    ``lumped`` (blocks 2..L-3 run as one lump: a program layer >= 3 is block L-5+layer, :func:`block_of`)."""
    from sympy import sympify
    from .build import build
    built = build(structure)
    deltas, moments = trace(built)
    return {"symbols": [x.name for x in built.symbols], "names": list(built.names),
            "sizes": [sympify(built.tensors[n].expr) for n in built.names],
            "deltas": deltas, "moments": moments, "lumped": structure.layers is None}


def compile_step(structure: StepStructure) -> dict:
    """The record of ``structure`` as data: :func:`step_record`'s ``symbols``, ``deltas`` and ``moments``, and
    ``sizes``, every tensor's bytes as a tape (:func:`memledger.core.tape.record`: operations over the symbols,
    read back and evaluated without SymPy and without running any code from the file)."""
    from ..core.tape import record as tape
    step = step_record(structure)
    by_name = {x.name: x for e in step["sizes"] for x in e.free_symbols}
    return {"format": FORMAT, "structure": repr(structure), "symbols": step["symbols"], "names": step["names"],
            "sizes": tape([by_name[n] for n in step["symbols"]], step["sizes"]),
            "deltas": step["deltas"], "moments": step["moments"]}


def _write(path: Path, record: dict) -> None:
    """Write atomically (a temporary file renamed into place); a cache that cannot be written is skipped."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(record, separators=(",", ":")))
        os.replace(temporary, path)
    except OSError:
        pass


def _read(path: Path, structure: StepStructure):
    """The record at ``path`` if it is ``structure``'s, else None; a damaged or foreign record is reported in one
    line on stderr and ignored (it is data: nothing in it is ever run)."""
    try:
        text = path.read_text()
    except OSError:
        return None                                     # not cached yet (or unreadable): compiled below
    try:
        record = json.loads(text)
        if not (isinstance(record, dict) and record.get("format") == FORMAT):
            raise ValueError(f"format {record.get('format') if isinstance(record, dict) else None!r}, not {FORMAT}")
        if record.get("structure") != repr(structure):
            raise ValueError("it records another step structure")
        return CompiledStep(record, structure.layers is None)
    except (KeyError, IndexError, TypeError, ValueError) as error:
        print(f"memledger: ignoring the step cache record {path} ({error}); compiling the step again",
              file=sys.stderr)
        return None


class CompiledStep:
    """One structure's step read from its record: :meth:`peak` at a ledger's values, without SymPy."""

    def __init__(self, record: dict, lumped: bool):
        self.symbols = list(record["symbols"])
        self.tape = Tape(record["sizes"])
        self.names = list(record["names"])
        self.deltas = record["deltas"]
        self.moments = record["moments"]
        self.lumped = lumped
        self.size_count = len(self.tape.outputs)
        if self.tape.args != self.symbols or len(self.names) != self.size_count or len(self.moments) != len(
                self.deltas) or any(not (isinstance(j, int) and 0 <= j < self.size_count and isinstance(change, int))
                                    for changes in self.deltas for j, change in changes):
            raise ValueError("a step record whose parts do not match")

    def sizes(self, values: dict) -> list:
        """Every tensor's bytes at ``values`` (symbol name -> int), exactly."""
        sizes = self.tape(*(int(values[n]) for n in self.symbols))
        try:
            return [as_int(x) for x in sizes]
        except ArithmeticError:          # a split that is not whole bytes: named, one line
            raise split_refusal(self.names, lambda j: as_int(sizes[j]), values) from None

    def peak(self, values: dict) -> tuple:
        """(bytes, phase, block) of the largest GPU total after any op; block is None outside the blocks."""
        sizes = self.sizes(values)
        total, best, sample = 0, -1, 0
        for k, changes in enumerate(self.deltas):
            for j, change in changes:
                total += change * sizes[j]
            if total > best:
                best, sample = total, k
        phase, layer = self.moments[sample]
        return best, phase, block_of(layer, self.lumped, values["L"])


@lru_cache(maxsize=64)
def compiled_step(structure: StepStructure) -> CompiledStep:
    """``structure``'s compiled step: from the cache, else compiled (with SymPy) and cached."""
    path = record_path(structure)
    step = _read(path, structure)
    if step is None:
        record = compile_step(structure)
        _write(path, record)
        step = CompiledStep(record, structure.layers is None)
    return step


def step_peak(ledger, backend="article", **changes):
    """(bytes, phase, block) of ``ledger``'s step peak under ``backend``'s conventions (changed as in
    :func:`memledger.activations.backends.get_backend`), or None where the timeline does not model the setup (the
    reasons of :meth:`StepStructure.of`)."""
    conv = get_backend(backend, **changes)
    setup = inputs_of(ledger)
    if setup.arch is None:
        return None
    try:
        step = compiled_step(StepStructure.of(setup, conv))
    except ValueError:
        return None
    return step.peak(step_values(setup))
