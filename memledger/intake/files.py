"""Reading a user's config file as its tool does: JSON, YAML or TOML, bounded, one line for anything malformed.

A file is read only if it is a regular file of at most :data:`MAX_BYTES` of UTF-8 text (a FIFO never hangs
the command), parsed by its suffix (``.json``; ``.yaml``/``.yml`` with PyYAML's safe loader, as torchtune's
OmegaConf and LitGPT's jsonargparse read them; ``.toml`` with :mod:`tomllib`, as torchtitan reads its own), and
must hold a mapping. :func:`flatten` gives its keys as dotted paths (``optimizer.lr``), the form torchtune's
command-line overrides use (``key=value``, :func:`override`).
"""
import json
import os
from pathlib import Path
import stat

__all__ = ["MAX_BYTES", "flatten", "load", "override", "shown"]

#: The largest config file read (a training config is a few kilobytes).
MAX_BYTES = 1_000_000


def shown(path) -> str:
    text = str(path)
    return text if len(text) <= 60 else "..." + text[-57:]


def _bytes(path: Path) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as e:
        raise ValueError(f"{shown(path)}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{shown(path)}: not a regular file")
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{shown(path)}: more than {MAX_BYTES:,} bytes; a training config is a few kilobytes")
    return data


def load(path) -> dict:
    """The mapping a JSON, YAML or TOML file holds; ``ValueError`` in one line otherwise."""
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in (".json", ".yaml", ".yml", ".toml"):
        raise ValueError(f"{shown(path)}: not a .json, .yaml, .yml or .toml file")
    try:
        text = _bytes(path).decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{shown(path)}: not UTF-8 text") from None
    try:
        if suffix == ".json":
            data = json.loads(text)
        elif suffix == ".toml":
            import tomllib
            data = tomllib.loads(text)
        else:
            import yaml
            data = yaml.safe_load(text)
    except RecursionError:
        raise ValueError(f"{shown(path)}: nested too deeply") from None
    except Exception as e:                       # each parser's own error type: JSON, TOML, YAML
        reason = " ".join(str(e).split())[:160]
        raise ValueError(f"{shown(path)}: not valid {suffix[1:].upper()} ({reason})") from None
    if not isinstance(data, dict):
        raise ValueError(f"{shown(path)}: must hold a mapping of keys to values, not {type(data).__name__}")
    return data


def flatten(data: dict, prefix: str = "") -> dict:
    """``{"a": {"b": 1}}`` -> ``{"a.b": 1}``; a ``_component_`` mapping keeps its own keys dotted too."""
    out = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def override(flat: dict, assignment: str) -> dict:
    """One ``key=value`` of torchtune's command line (``tune run ... batch_size=4``), the value read as YAML reads
    it (``4`` an int, ``true`` a bool, ``null`` None); a key ``~key`` removes it, as torchtune's does."""
    import yaml
    if "=" not in assignment:
        if assignment.startswith("~"):
            return {k: v for k, v in flat.items() if k != assignment[1:] and not k.startswith(assignment[1:] + ".")}
        raise ValueError(f"override {assignment!r}: expected key=value (as tune run takes them)")
    key, _, text = assignment.partition("=")
    if not key or any(not part for part in key.split(".")):
        raise ValueError(f"override {assignment!r}: the key must be a dotted name such as batch_size or optimizer.lr")
    try:
        value = yaml.safe_load(text) if text else ""
    except Exception:
        value = text
    return {**flat, key: value}
