"""Checking what a caller passes: names looked up in tables, choices, counts and flags.

One helper per kind of input, so that every field of every API (Ledger, the
CLI, the widgets, the static calculator's data) refuses bad input with the
same kind of message, naming the field and what is allowed:

    lookup(RECIPES, "bf16-adam", "recipe")  -> ValueError: unknown recipe 'bf16-adam'; known: ...
    check_choice("zero_stage", True, (0, 1, 2, 3))  -> ValueError (a bool is not a stage)
    check_count("batch_size", 7e9)  -> 7000000000 (a whole-number float is a count)

Plain Python only: the command line imports this without SymPy.
"""
import operator

__all__ = ["FRAMEWORKS", "FSDP_DTYPES", "LAYERS_ONE_BY_ONE", "LIMIT", "RECOMPUTE", "check_choice", "check_count",
           "check_flag", "check_layers_one_by_one", "lookup"]

#: The largest count or size accepted (an exabyte): the same limit everywhere (CLI, API, calculator).
LIMIT = 10**18

#: The most blocks a computation walks one by one (the step itself runs blocks 2..L-3 as one lump, any L): the
#: caching allocator's replay (one block of each lumped tensor per model block, :mod:`memledger.ledger.replay`), DDP's
#: buckets (assigned gradient by gradient, :mod:`memledger.step.ddp`), a library's loading trace (module by module,
#: :mod:`memledger.ledger.library_loading`). Their time and memory grow with L, and past about 10^5 blocks a single
#: answer takes minutes and gigabytes; 1,024 is eight times the deepest preset (megatron-1t, 128 layers), answered
#: in seconds.
LAYERS_ONE_BY_ONE = 1024

#: Recomputation modes of the activation inventory (Korthikanti et al. 2022).
RECOMPUTE = ("none", "selective", "full")

#: How a training step runs across GPUs (issue 15): ``plain`` (one loop, ZeRO's arithmetic on top), PyTorch's
#: DistributedDataParallel, PyTorch's ``fully_shard`` (FSDP2, docs/fsdp2.md), DeepSpeed's ZeRO engine,
#: Megatron-LM's distributed optimizer. The one list every input check reads.
FRAMEWORKS = ("plain", "ddp", "fsdp2", "deepspeed", "megatron")
#: FSDP2's ``MixedPrecisionPolicy`` dtypes by name; None: no cast (``MixedPrecisionPolicy()``'s default).
FSDP_DTYPES = ("bf16", "fp16", "fp32", None)


def lookup(table, name, field: str):
    """``table[name]``, or ``ValueError`` naming ``field`` and listing the known names."""
    if not isinstance(name, str):
        raise TypeError(f"{field} must be a name (a string), got {name!r}")
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {field} {name!r}; known: {', '.join(table)}") from None


def check_choice(field: str, value, options):
    """``value`` if it is one of ``options`` (and of the same type: ``True`` is not ``1``)."""
    if not any(type(value) is type(option) and value == option for option in options):
        raise ValueError(f"{field} must be one of {', '.join(map(str, options))}, got {value!r}")
    return value


def check_flag(field: str, value, allow_none: bool = False):
    """A bool (``None`` too if ``allow_none``); strings such as ``"no"`` are refused."""
    if isinstance(value, bool) or (allow_none and value is None):
        return value
    raise TypeError(f"{field} must be True or False{' or None' if allow_none else ''}, got {value!r}")


def check_count(field: str, value, minimum: int = 1, limit: int = LIMIT) -> int:
    """An int in [minimum, limit]: ints, and floats that are whole numbers (``7e9``); never bools."""
    if isinstance(value, bool):
        raise TypeError(f"{field} must be an integer, got {value!r}")
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{field} must be a whole number, got {value!r}")
        value = int(value)
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{field} must be an integer, got {value!r}") from None
    if not minimum <= number <= limit:
        kind = "a positive" if minimum == 1 else "a non-negative" if minimum == 0 else f"an integer >= {minimum},"
        raise ValueError(f"{field} must be {kind} integer up to {_readable(limit)}, got {number!r}")
    return number


def check_layers_one_by_one(n_layers: int, what: str) -> int:
    """``n_layers``, or ``ValueError`` naming ``n_layers`` where ``what`` (a computation that walks every block one
    by one) would walk more than :data:`LAYERS_ONE_BY_ONE` blocks; checked before anything is built."""
    if n_layers > LAYERS_ONE_BY_ONE:
        raise ValueError(f"n_layers {n_layers:,}: {what} walks the blocks one by one, up to {LAYERS_ONE_BY_ONE:,} "
                         f"of them (eight times the deepest preset's 128)")
    return n_layers


def _readable(n: int) -> str:
    """10**18 -> "10^18"; other numbers with thousands separators."""
    exponent = len(str(n)) - 1
    return f"10^{exponent}" if n == 10**exponent and exponent > 3 else f"{n:,}"
