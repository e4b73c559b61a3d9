"""The step's peak in the static calculator: each step structure's programs as data the page evaluates.

A verdict judges the peak of a training step (:mod:`memledger.answers.verdict`), which the
page cannot derive: the step's programs are built with SymPy (:mod:`memledger.step.build`).
Its numbers, though, depend on a setting only through each tensor's size, and its programs only
on the discrete choices of a :class:`~memledger.step.structure.StepStructure`
(:func:`memledger.step.cache.step_record`). So a structure is sent as a **record**: every tensor's
size printed as JavaScript over BigInt (:class:`~memledger.views.bigint.BigIntPrinter`: exact
division, ceilings), the change of each GPU tensor's count after every op, and each op's phase and
block. The page adds the sizes up op by op: the largest running total is the peak, to the byte
``Ledger.peak``; the running totals are the timeline it draws.

The controls reach 8,064 distinct structures (models x recipes x ZeRO x offload x recomputation x
FlashAttention x B = 1), each ~0.15 s of SymPy to build: too many to print at every book build. The site
carries the records of the structures around the calculator's starting state (:func:`nearby_states`: every
single change of a structure-deciding control); any other structure is built in the reader's browser by this
very module running in Pyodide (:func:`browser_record`), and evaluated the same way.
"""
from functools import lru_cache
import hashlib
import json
import os

from ..activations.backends import get_backend
from ..answers.verdict import ASSESSMENTS, CLAUSES, MARGIN, MEASURE, SENTENCE, SUM_NOTE, is_nominal, unmodelled
from ..ledger.ledger import Ledger
from ..step.cache import cache_dir, source_hash, step_record
from ..step.structure import StepStructure
from .bigint import BigIntPrinter
from .controls import BY_FIELD, CLI_FLAGS, CONTROLS, IGNORED_WHEN, defaults, ledger_settings, option_text

__all__ = ["FOLDER", "PYODIDE", "PYTHON_ARCHIVE", "STRUCTURE_FIELDS", "browser_record", "nearby_states",
           "record_js", "record_name", "site_records", "step_data", "structure_key", "structure_of"]

#: The controls that decide a step's structure (with B = 1 or not, :class:`StepStructure`); the others
#: (B, S, dp, the GPU) only change numbers. tests/views/test_webpeak.py checks the split.
STRUCTURE_FIELDS = ("arch", "recipe", "recompute", "flash_attention", "zero_stage", "offload_optimizer",
                    "offload_placement")
#: Where the records lie in the built site, next to the calculator's script (``_static/``).
FOLDER = "memledger-steps"
BACKEND = "article"
#: memledger's source for Pyodide, next to the script (written by _ext/memledger_site.py), and what the page loads:
#: Pyodide and SymPy from the site's vendor/ folder (scripts/vendor_js.sh), paths relative to ``_static/``.
PYTHON_ARCHIVE = "memledger-python.zip"
PYODIDE = {
    "script": "../vendor/pyodide/pyodide.js",
    "index": "../vendor/pyodide/",
    "archives": ["../vendor/pyodide/sympy.zip", PYTHON_ARCHIVE],
    "start": "import os, sys\nos.environ['MEMLEDGER_CACHE_DIR'] = '/tmp/memledger'\n"
             "sys.path.insert(0, '/home/pyodide/lib')\nfrom memledger.views.webpeak import browser_record\n",
    "note": "(this step structure is built by memledger itself, in your browser: the first one loads Python and "
            "SymPy, about 18 MB, and can take a minute)",
}


def _values(state: dict) -> dict:
    """Control values from ``state``, whose choices may be given as the page writes them (``"2048"``, ``"true"``)."""
    out = {}
    for c in CONTROLS:
        value = state[c.field]
        if not c.is_count and isinstance(value, str):
            value = next((o for o in c.options if option_text(o) == value), value)
        out[c.field] = c.parse(value)
    return out


def structure_key(state: dict) -> str:
    """The page's name for the structure of ``state``: the structure-deciding controls' texts and B = 1."""
    values = _values(state)
    return "|".join([option_text(values[f]) for f in STRUCTURE_FIELDS] + ["B=1" if values["batch_size"] == 1 else "B>1"])


def structure_of(state: dict):
    """``state``'s :class:`StepStructure`, or, where the step timeline does not model it, the note a verdict by
    the sum gives (:func:`memledger.answers.verdict.unmodelled`, a str)."""
    ledger = Ledger(**ledger_settings(_values(state)))
    try:
        return StepStructure.of(ledger, get_backend(BACKEND))
    except ValueError:
        return unmodelled(ledger)


def record_name(structure: StepStructure) -> str:
    return hashlib.sha256(repr(structure).encode()).hexdigest()[:20]


@lru_cache(maxsize=None)
def _javascript(expr) -> str:
    return BigIntPrinter().formula(expr)


@lru_cache(maxsize=256)
def record_js(structure: StepStructure) -> dict:
    """The page's record of ``structure``: ``sizes`` (JavaScript over BigInt, reading ``v``), ``deltas``,
    ``moments`` and ``lumped`` of :func:`memledger.step.cache.step_record`. Kept in the step cache
    (:func:`memledger.step.cache.cache_dir`, named by the structure and memledger's source) like the
    command line's records, so that a rebuilt book prints only what changed."""
    key = hashlib.sha256(f"web\0{source_hash()}\0{structure!r}".encode()).hexdigest()[:32]
    path = cache_dir() / f"web-{key}.json"
    try:
        cached = json.loads(path.read_text())
        if len(cached["sizes"]) and len(cached["moments"]) == len(cached["deltas"]) and "lumped" in cached:
            return cached
    except (OSError, ValueError, KeyError, TypeError):
        pass                                        # missing or damaged: printed again below
    record = step_record(structure)
    out = {"sizes": [_javascript(e) for e in record["sizes"]], "deltas": record["deltas"],
           "moments": record["moments"], "lumped": record["lumped"]}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{os.getpid()}")
        temporary.write_text(json.dumps(out, separators=(",", ":")))
        os.replace(temporary, path)
    except OSError:
        pass                                        # a cache that cannot be written is skipped
    return out


def browser_record(state_json: str) -> str:
    """What the page asks Pyodide for a structure it does not carry: the record of the structure of ``state``
    (JSON: control field -> text) as JSON, or ``{"unmodelled": reason}``."""
    structure = structure_of(json.loads(state_json))
    return json.dumps({"unmodelled": structure} if isinstance(structure, str) else record_js(structure))


def nearby_states(start: dict = None) -> list:
    """``start`` (the calculator's starting state) and every state one structure-deciding change away from it
    (each option of each field, and B = 1 or not): the structures a reader meets first."""
    start = dict(start or defaults())
    states = [start, {**start, "batch_size": 2 if BY_FIELD["batch_size"].parse(start["batch_size"]) == 1 else 1}]
    for base in list(states):
        for field in STRUCTURE_FIELDS:
            states += [{**base, field: option} for option in BY_FIELD[field].options if option != base[field]]
    return states


@lru_cache(maxsize=1)
def site_records() -> tuple:
    """(index, records): the page's key -> record name (or ``{"unmodelled": note}``) for :func:`nearby_states`,
    and the records by name (written into the site as ``FOLDER/<name>.json``)."""
    index, records = {}, {}
    for state in nearby_states():
        structure = structure_of(state)
        if isinstance(structure, str):
            index[structure_key(state)] = {"unmodelled": structure}
            continue
        name = record_name(structure)
        records.setdefault(name, record_js(structure))
        index[structure_key(state)] = name
    return index, records


def _unmodelled() -> dict:
    """arch -> FlashAttention text -> recipe -> the note of a verdict by the sum where the timeline refuses that
    combination at the calculator's defaults, or None. A refusal that also depends on other controls (a model
    family's block under ZeRO, tensor parallelism or offloading: :meth:`StepStructure.of`) is not here: the page
    looks the structure up, and the library in the browser answers it (:func:`browser_record`);
    tests/views/test_webpeak.py checks both over random states."""
    out = {}
    for arch in BY_FIELD["arch"].options:
        for flash in BY_FIELD["flash_attention"].options:
            for recipe in BY_FIELD["recipe"].options:
                reason = structure_of({**defaults(), "arch": arch, "flash_attention": flash, "recipe": recipe})
                out.setdefault(arch, {}).setdefault(option_text(flash), {})[recipe] = \
                    reason if isinstance(reason, str) else None
    return out


def step_data() -> dict:
    """The part of the calculator's data that judges the peak (JSON-able, big integers as decimal strings)."""
    index, _ = site_records()
    presets = {name: Ledger(**ledger_settings({**defaults(), "arch": name})) for name in BY_FIELD["arch"].options}
    return {
        "fields": list(STRUCTURE_FIELDS),
        "folder": FOLDER,
        "index": index,
        "unmodelled": _unmodelled(),
        # the step books the architecture's tensors: P is the counted parameters, not a nominal count
        "params": {name: str(ledger.arch.computed_params) for name, ledger in presets.items()},
        "nominal": {name: is_nominal(ledger) for name, ledger in presets.items()},
        "measures": MEASURE,
        "clauses": CLAUSES,
        # the verdict sentence (memledger.answers.verdict.sentence): a fit leaves the margin free
        "assessments": ASSESSMENTS,
        "sentence": SENTENCE,
        "margin": str(MARGIN),
        "notes": {"sum": SUM_NOTE},
        "cli": [[c.field, CLI_FLAGS[c.field], isinstance(c.default, bool),
                 [IGNORED_WHEN[c.field][0], option_text(IGNORED_WHEN[c.field][1])] if c.field in IGNORED_WHEN else None]
                for c in CONTROLS],
        "pyodide": PYODIDE,
    }
