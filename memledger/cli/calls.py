"""Commands of the command line called from Python, with their JSON answer as a dict (the book's chapters use
these; so can a script): :func:`checked` is ``memledger check ... --json``."""
from .main import _run

__all__ = ["checked", "rows_table"]


def checked(*files, overrides=(), model=None, gpus=None, gpu_memory=None) -> dict:
    """``memledger check FILE ... --json`` from Python: the rows, the ``memledger step`` command and its JSON (or
    the refusal); bad input raises the command's ``ValueError``."""
    import json
    argv = ["check", *map(str, files), *overrides, "--json"]
    for flag, value in (("--model", model), ("--gpus", gpus), ("--gpu-memory", gpu_memory)):
        argv += [flag, str(value)] if value is not None else []
    return json.loads(_run(argv))


def rows_table(data: dict, outcomes=("option", "default", "refused", "unknown")):
    """The rows of :func:`checked`'s answer whose outcome is one of ``outcomes`` (by default all but "ignored"), as
    a table: file, key, what it became."""
    from ..core.table import Table
    return Table(("file", "key", "became"), [(r["file"], r["key"], r["became"]) for r in data["rows"]
                                             if r["outcome"] in outcomes])
