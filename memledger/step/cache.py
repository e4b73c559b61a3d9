"""The step's peak without SymPy: each step structure compiled once to plain Python, kept on disk.

The command line judges a run by its peak (:class:`memledger.step.timeline.Step`), yet must answer about as fast
as Python starts, and SymPy alone takes ~0.3 s to import. A step's numbers depend on a ledger's values
only through the sizes of its tensors, and its programs only on the discrete choices of a
:class:`~memledger.step.structure.StepStructure`. So the first time a structure is met, :func:`compile_step`
builds its programs with SymPy (:func:`memledger.step.build.build`) and prints them as data: every tensor's
size as a Python expression over ``Fraction`` arguments (the printer of :mod:`memledger.core.compiled`) and,
after every op, the change of each GPU tensor's count. That record is written to the user's cache
directory (``platformdirs.user_cache_dir("memledger")``, or ``$MEMLEDGER_CACHE_DIR``), named by a hash
of the structure and of memledger's own source, so an edited library never reads a stale record. Later
runs evaluate the sizes and add them up op by op: the largest running total is the peak, to the byte
the same as ``Step.peak`` (``tests/step/test_cache.py``).
"""
from fractions import Fraction
from functools import lru_cache
import hashlib
import json
import math
import os
from pathlib import Path

from ..activations.backends import get_backend
from ..core.keyed import as_int
from .inputs import inputs_of
from .structure import StepStructure, block_of, step_values

__all__ = ["CompiledStep", "cache_dir", "compile_step", "compiled_step", "record_path", "source_hash", "step_peak",
           "step_record"]

PACKAGE = Path(__file__).parent
FORMAT = 2          # bump when the record's layout changes


@lru_cache(maxsize=1)
def source_hash() -> str:
    """A digest of memledger's Python source: any edit gives new cache names."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
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


def step_record(structure: StepStructure) -> dict:
    """``structure``'s step as data for other evaluators (the static calculator, NumPy sweeps; loads SymPy):
    ``symbols`` (names), ``sizes`` (every tensor's bytes, a SymPy expression), ``deltas[k]`` (the [tensor,
    change] pairs of the GPU counts after op k), ``moments[k]`` (the phase and program layer of op k) and
    ``lumped`` (blocks 2..L-3 run as one lump: a program layer >= 3 is block L-5+layer, :func:`block_of`)."""
    from sympy import sympify
    from .build import build
    built = build(structure)
    gpu = [j for j, on in enumerate(built.gpu) if on]
    deltas, previous = [], [0] * len(built.names)
    for row in built.compiled.counts:
        counts = [int(c) for c in row]
        deltas.append([[j, counts[j] - previous[j]] for j in gpu if counts[j] != previous[j]])
        previous = counts
    moments = [[built.ops[i].phase.value, built.ops[i].layer if isinstance(built.ops[i].layer, int) else None]
               for i in built.compiled.ops]
    return {"symbols": [x.name for x in built.symbols], "sizes": [sympify(built.tensors[n].expr) for n in built.names],
            "deltas": deltas, "moments": moments, "lumped": structure.layers is None}


def compile_step(structure: StepStructure) -> dict:
    """The record of ``structure`` printed as plain Python: :func:`step_record`'s ``symbols``, ``deltas`` and
    ``moments``; ``whole`` and ``exact``, each a pair of tensor indices and a Python list expression of their
    bytes (integer polynomials in plain ints; the others over ``Fraction`` arguments, ``math.ceil`` for
    ceilings)."""
    from ..core.exact import ExactPrinter, is_integral_polynomial
    step = step_record(structure)
    printer, exprs = ExactPrinter(), step["sizes"]
    groups = {"whole": [j for j, e in enumerate(exprs) if is_integral_polynomial(e)]}
    groups["exact"] = [j for j in range(len(exprs)) if j not in set(groups["whole"])]
    record = {"format": FORMAT, "structure": repr(structure), "symbols": step["symbols"], "size_count": len(exprs),
              "deltas": step["deltas"], "moments": step["moments"]}
    for group, indices in groups.items():
        record[group] = [indices, "[" + ", ".join(printer.doprint(exprs[j]) for j in indices) + "]"]
    return record


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
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    ok = isinstance(record, dict) and record.get("format") == FORMAT and record.get("structure") == repr(structure)
    return record if ok else None


class CompiledStep:
    """One structure's step as plain Python: :meth:`peak` at a ledger's values."""

    def __init__(self, record: dict, lumped: bool):
        self.symbols = record["symbols"]
        self.size_count = record["size_count"]
        self.deltas = record["deltas"]
        self.moments = record["moments"]
        self.lumped = lumped
        arguments = ", ".join(self.symbols) or "*_"
        self._groups = [(record[group][0], eval(f"lambda {arguments}: {record[group][1]}",
                                                {"Fraction": Fraction, "math": math}), group == "exact")
                        for group in ("whole", "exact")]
        indices = sorted(j for indices, _, _ in self._groups for j in indices)
        if indices != list(range(self.size_count)) or len(self.moments) != len(self.deltas) or any(
                not 0 <= j < self.size_count for changes in self.deltas for j, _ in changes):
            raise ValueError("a step record whose parts do not match")

    def sizes(self, values: dict) -> list:
        """Every tensor's bytes at ``values`` (symbol name -> int), exactly."""
        whole = [int(values[n]) for n in self.symbols]
        out = [0] * self.size_count
        for indices, function, exact in self._groups:
            results = function(*(map(Fraction, whole) if exact else whole)) if indices else ()
            for j, value in zip(indices, results):
                out[j] = as_int(value) if exact else value
        return out

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
    path, lumped = record_path(structure), structure.layers is None
    record = _read(path, structure)
    if record is not None:
        try:
            return CompiledStep(record, lumped)
        except (KeyError, IndexError, TypeError, ValueError, SyntaxError, NameError):
            pass                                            # damaged inside: compiled again below
    record = compile_step(structure)
    _write(path, record)
    return CompiledStep(record, lumped)


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
