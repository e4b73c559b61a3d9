"""PyTorch's measurements, recorded: one layer every measuring function of the harness goes through.

Each function that runs PyTorch to measure (:func:`memledger.pytorch.measure.memtracker_step`,
:func:`~memledger.pytorch.distributed.fsdp_step`, the saved-tensor censuses, the prefills, ...) is decorated with
:func:`recorded`. A call is known by its canonical text, :func:`call_key`: the function and every argument that
differs from its default, in the signature's order, written as Python (``measure.memtracker_step(c=RefConfig(d=64,
L=2, H=4, F=160, V=1000, style='llama'), loop='bf16-pure-adamw', batch=2, seq=16, blocks=True)``).

The mode (:func:`configure`; the tests' ``--pytorch`` option, tests/conftest.py):

* ``off`` (the library's default, the chapters'): the function runs, nothing is remembered.
* ``live``: the function runs; a call made twice in one process runs once. Where the record holds the call and is
  current, the live result must equal it (:class:`RecordError` otherwise).
* ``recorded``: the result is read from the record (nothing runs), which must be current and hold the call.
* ``record``: the function runs and its result is kept; :func:`save` writes them into the record.

The record (``tests/pytorch_record.jsonl.gz``): gzip'd JSON lines, the first {"torch": the PyTorch version
measured, "harness": the :func:`harness_hash` of the source measured, "command": how to regenerate it, "calls": how
many}, then one [call, result] a line, sorted, a result being the ``repr`` of what the function returned
(``ast.literal_eval`` reads it back: ints, strings, tuples, lists, dicts) or, where it raised, {"raises": the
exception's class, "message": its text}. It is current when its PyTorch version is the installed
one (public version: ``2.13.0+cpu`` is ``2.13.0``) and its harness hash is this source's. Written with sorted keys
and a fixed gzip header, so the same measurements give the same bytes.

The harness hash covers the modules that define recorded functions (:data:`HARNESS`) and every memledger module
they import, found by reading their ``import`` statements (relative ones, at any depth): changing how PyTorch is
run or measured makes the record stale; memledger's own side (the ledger, the step, ``compare.py``) does not.
This module is not hashed and imports no PyTorch.
"""
import ast
import builtins
from dataclasses import MISSING, fields, is_dataclass
import functools
import gzip
import hashlib
from importlib import import_module
import inspect
import json
import os
from pathlib import Path

__all__ = ["HARNESS", "MODES", "RecordError", "call", "call_key", "configure", "harness_hash", "head", "load", "mode",
           "record_status", "recorded", "same", "save", "switch", "torch_version"]

#: The modules (of this package) whose functions are recorded; the harness hash starts from them.
HARNESS = ("measure", "distributed", "ddp", "prefill", "compiled", "libraries", "torchtune_litgpt", "torchtitan_step",
           "litgpt_lora",
           "torchtune_lora")
MODES = ("off", "live", "recorded", "record")
PACKAGE = __name__.rsplit(".", 1)[0]                      # memledger.pytorch
ROOT = Path(__file__).resolve().parents[1]                # memledger/
#: How a stale or incomplete record is regenerated (shown in every message about it).
COMMAND = 'python -m pytest -n 2 -p no:cacheprovider --pytorch=record -m "not book" tests'

_state = {"mode": "off", "path": None, "record": None}
_measured = {}      # key -> stored result (record mode: the new cases; live: this process's results)
_functions = {}     # "module.name" -> the undecorated function


class RecordError(AssertionError):
    """The record is missing, stale or lacks a call, or a live result differs from it."""


def configure(mode: str, path=None):
    """Sets the mode (:data:`MODES`) and the record's path; forgets what was loaded or measured."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    _state.update(mode=mode, path=None if path is None else Path(path), record=None)
    _measured.clear()


def mode() -> str:
    return _state["mode"]


def switch(mode: str) -> str:
    """Sets the mode, keeping the record loaded and what was measured; returns the mode it replaces."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {mode!r}")
    before, _state["mode"] = _state["mode"], mode
    return before


# --- canonical text of a call ---------------------------------------------------------------------------------

def _text(value) -> str:
    """``value`` as Python source that evaluates back to it (dataclasses by their non-default fields)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)
    if is_dataclass(value) and not isinstance(value, type):
        given = [f"{f.name}={_text(getattr(value, f.name))}" for f in fields(value)
                 if f.default is MISSING or _text(getattr(value, f.name)) != _text(f.default)]
        return f"{type(value).__name__}({', '.join(given)})"
    if isinstance(value, tuple):
        inner = ", ".join(map(_text, value))
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list):
        return "[" + ", ".join(map(_text, value)) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_text(k)}: {_text(v)}" for k, v in value.items()) + "}"
    if type(value).__module__ == "torch" and type(value).__name__ == "dtype":
        return repr(value)                                  # torch.bfloat16
    raise TypeError(f"cannot record an argument of type {type(value).__name__}: {value!r}")


def call_key(function, args=(), kwargs=None) -> str:
    """The canonical text of ``function(*args, **kwargs)``: ``module.name(arg=value, ...)``, every argument by
    name in the signature's order, those equal to their default left out."""
    signature = inspect.signature(function)
    bound = signature.bind(*args, **(kwargs or {}))
    given = []
    for name, value in bound.arguments.items():
        default = signature.parameters[name].default
        text = _text(value)
        if default is inspect.Parameter.empty or text != _text(default):
            given.append(f"{name}={text}")
    return f"{function.__module__.rsplit('.', 1)[-1]}.{function.__name__}({', '.join(given)})"


# --- the record -----------------------------------------------------------------------------------------------

@functools.cache
def torch_version() -> str:
    """The installed PyTorch's public version (no local label), read without importing it."""
    from importlib.metadata import version
    return version("torch").split("+")[0]


def _module_file(name: str) -> Path:
    """memledger's source file of the module ``name`` (a package's ``__init__.py``)."""
    path = ROOT.joinpath(*name.split(".")[1:])
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def harness_files() -> list:
    """The source files of :data:`HARNESS` and every memledger module they import (relative imports), sorted."""
    seen, todo = set(), [f"{PACKAGE}.{m}" for m in HARNESS]
    while todo:
        name = todo.pop()
        path = _module_file(name)
        if name in seen or name == __name__ or not path.exists():
            continue
        seen.add(name)
        package = name.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                todo.append(target)
                todo.extend(f"{target}.{a.name}" for a in node.names)       # from . import measure
    return sorted(_module_file(n) for n in seen)


@functools.cache
def harness_hash() -> str:
    """sha256 of the harness files' paths (relative to the repository) and contents (read once a process)."""
    digest = hashlib.sha256()
    for path in harness_files():
        digest.update(path.relative_to(ROOT.parent).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def head(path=None) -> dict:
    """The record's first line, {"torch", "harness", "command", "calls"}, read without the cases; {} if there is
    no record."""
    path = Path(path or _state["path"])
    if not path.exists():
        return {}
    with gzip.open(path, "rt") as lines:
        return json.loads(lines.readline())


def load(path=None) -> dict:
    """The record at ``path`` (default: the configured one): its head and "cases"; {} if there is none."""
    path = Path(path or _state["path"])
    if not path.exists():
        return {}
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    return {**json.loads(lines[0]), "cases": dict(json.loads(line) for line in lines[1:])}


def record_status(record: dict) -> str:
    """None where ``record`` is current; otherwise why not, in one sentence."""
    if not record:
        return "there is no record"
    if record.get("torch") != torch_version():
        return f"it was measured with PyTorch {record.get('torch')}, this is {torch_version()}"
    if record.get("harness") != harness_hash():
        return "the harness changed since it was measured (its hash differs)"
    return None


def _loaded() -> dict:
    """The configured record, loaded once a process, and why it is not current (None where it is)."""
    if _state["record"] is None:
        _state["record"] = load()
        _state["status"] = record_status(_state["record"])
    return _state["record"]


def _current() -> dict:
    """The configured record; raises :class:`RecordError` if it is not current."""
    _loaded()
    if _state["status"]:
        raise RecordError(f"the PyTorch record {_state['path']} is stale: {_state['status']}; "
                          f"regenerate it with `{COMMAND}`")
    return _state["record"]


def save(cases: dict, path=None, keep: bool = True) -> dict:
    """Writes ``cases`` ({call: stored result}) as the record, with the existing record's other cases where it is
    current and ``keep``; returns what was written."""
    path = Path(path or _state["path"])
    old = load(path)
    merged = dict(old.get("cases", {})) if keep and record_status(old) is None else {}
    merged.update(cases)
    top = {"torch": torch_version(), "harness": harness_hash(), "command": COMMAND, "calls": len(merged)}
    lines = [json.dumps(top, sort_keys=True)] + [json.dumps([key, merged[key]], sort_keys=True) for key in sorted(merged)]
    part = path.with_name(path.name + ".part")          # written whole, then renamed: a reader never sees half
    part.write_bytes(gzip.compress(("\n".join(lines) + "\n").encode(), mtime=0))
    os.replace(part, path)
    return {**top, "cases": merged}


def measured() -> dict:
    """What this process measured in ``record`` mode ({call: stored result})."""
    return dict(_measured) if _state["mode"] == "record" else {}


# --- the decorator --------------------------------------------------------------------------------------------

def _store(function, args, kwargs):
    """Runs the function; returns its result (or raised exception) as stored text."""
    try:
        result = function(*args, **kwargs)
    except (ValueError, TypeError, NotImplementedError) as error:
        return {"raises": type(error).__name__, "message": str(error)}
    text = repr(result)
    if ast.literal_eval(text) != result:
        raise TypeError(f"{function.__name__}'s result does not read back from its repr")
    return text


def same(stored, other) -> bool:
    """Whether two stored results are equal as values: a dict's order is not compared (``live_after_forward``'s
    follows the storages' addresses), a list's is."""
    if isinstance(stored, dict) or isinstance(other, dict):
        return stored == other
    return ast.literal_eval(stored) == ast.literal_eval(other)


def _replay(stored):
    if isinstance(stored, dict):
        raise getattr(builtins, stored["raises"])(stored["message"])
    return ast.literal_eval(stored)


def recorded(function):
    """Puts ``function`` (one that runs PyTorch to measure) behind the record; see the module's docstring."""
    _functions[f"{function.__module__.rsplit('.', 1)[-1]}.{function.__name__}"] = function

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        mode = _state["mode"]
        if mode == "off":
            return function(*args, **kwargs)
        key = call_key(function, args, kwargs)
        if mode == "recorded":
            cases = _current()["cases"]
            if key not in cases:
                raise RecordError(f"the PyTorch record {_state['path']} lacks {key}; add it with "
                                  f"`{COMMAND.replace(' -n 2', '')} -k <this test>` or regenerate it with `{COMMAND}`")
            return _replay(cases[key])
        if key not in _measured:
            _measured[key] = _store(function, args, kwargs)
            if mode == "live":
                check_against_record(key, _measured[key])
        return _replay(_measured[key])
    return wrapper


def check_against_record(key: str, stored):
    """Live mode: where the record is current and holds ``key``, its result must be ``stored``."""
    cases = _loaded().get("cases", {})
    if _state["status"] is None and key in cases:
        if not same(cases[key], stored):
            raise RecordError(f"PyTorch's live result differs from the record's for {key}: regenerate the record "
                              f"with `{COMMAND}`")


def call(key: str):
    """Runs the call ``key`` (a record's key) live, whatever the mode; returns its stored text (or the raised
    exception's {"raises", "message"})."""
    name = key.split("(", 1)[0]
    import_module(f"{PACKAGE}.{name.split('.')[0]}")                  # registers its functions
    function = _functions[name]
    namespace = {"RefConfig": import_module(f"{PACKAGE}.reference").RefConfig,
                 "LoraRef": import_module(f"{PACKAGE}.lora").LoraRef}
    return _store(function, (), _arguments(key[len(name):], namespace))


def _arguments(text: str, namespace: dict) -> dict:
    """The keyword arguments a key's ``(name=value, ...)`` text names (what :func:`_text` writes), read back as data:
    literals, tuples, lists, dicts, the dataclasses of ``namespace`` called by keyword, ``torch.<dtype>``; nothing
    else is accepted, and nothing in it is run."""
    import ast

    def value(node):
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
            return -node.operand.value
        if isinstance(node, (ast.Tuple, ast.List)):
            items = [value(x) for x in node.elts]
            return tuple(items) if isinstance(node, ast.Tuple) else items
        if isinstance(node, ast.Dict):
            return {value(k): value(v) for k, v in zip(node.keys, node.values)}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in namespace \
                and not node.args:
            return namespace[node.func.id](**{k.arg: value(k.value) for k in node.keywords})
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            import torch
            dtype = getattr(torch, node.attr)
            if isinstance(dtype, torch.dtype):
                return dtype
        raise ValueError(f"a record key holds what the record never writes: {ast.dump(node)[:80]}")
    call = ast.parse(f"f{text}", mode="eval").body
    if not isinstance(call, ast.Call) or call.args:
        raise ValueError(f"a record key's arguments are by name: {text[:80]}")
    return {k.arg: value(k.value) for k in call.keywords}
