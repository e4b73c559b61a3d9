"""Units of memory, decided in one place.

Bytes are exact Python ints everywhere in memledger; this module is the only
place they become "GB" or "MiB". Decimal units are powers of ten (GB = 10^9 B),
binary units powers of two (GiB = 2^30 B), and every label says which.

The source article mixes the two: its per-tensor sizes ("16 MB") are binary
MiB (2^24 B = 16 MiB), its totals ("14 GB", "0.96 GB") decimal GB.
"""
from decimal import Decimal
from fractions import Fraction
import math
import re

from .choices import LIMIT, lookup

__all__ = ["ARTICLE_TENSOR_UNIT", "ARTICLE_TOTAL_UNIT", "COUNT_ERROR", "GB", "GiB", "MAX_TEXT", "MB", "MiB", "UNITS",
           "format_bytes", "format_quantity", "in_unit", "parse_bytes", "parse_count", "parse_number", "shown",
           "unit_size"]

UNITS = {
    "B": 1,
    "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
    "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40,
}
GB, GiB, MB, MiB = UNITS["GB"], UNITS["GiB"], UNITS["MB"], UNITS["MiB"]

_QUANTITY = re.compile(r"(?P<number>[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?)\s*(?P<unit>[A-Za-z]*)",
                       re.ASCII)
_UNIT_BY_LOWER = {u.lower(): u for u in UNITS}


#: :func:`parse_count`'s message (``name``: the field, ``raw``: the text as given); the static calculator
#: (``_static/memledger-calculator.js``) fills in the same template.
COUNT_ERROR = "{name} must be a positive integer up to 10^18, got {raw!r}"

#: How the article prints sizes: per-tensor "MB" are MiB, totals "GB" are GB.
ARTICLE_TENSOR_UNIT = "MiB"
ARTICLE_TOTAL_UNIT = "GB"


def unit_size(unit: str) -> int:
    """Bytes in one ``unit`` (``"GiB"`` -> 2**30); ``ValueError`` if unknown."""
    return lookup(UNITS, unit, "unit")


def in_unit(nbytes, unit: str) -> Fraction:
    """``nbytes`` expressed exactly in ``unit``: in_unit(16 * 2**20, "MiB") == 16."""
    return Fraction(nbytes) / unit_size(unit)


def format_bytes(nbytes, unit: str = "GB", digits: int = 2) -> str:
    """``format_bytes(30_601_641_984) == "30.60 GB"``; the unit is always printed."""
    return f"{float(in_unit(nbytes, unit)):,.{digits}f} {unit}"


#: The longest text read as a number: longer input is refused before any parsing.
MAX_TEXT = 100


def shown(raw: str) -> str:
    """``raw`` as an error message quotes it: at most 60 characters."""
    return raw if len(raw) <= 60 else raw[:57] + "..."


def _exact_number(text: str):
    """(exact Fraction, unit text) of an ASCII number with an optional unit, or None.

    The decimal is read exactly (no 28-digit rounding: "2.0000000000000000000000000001"
    is not 2), and exponents far outside a byte count, or text longer than
    :data:`MAX_TEXT`, are refused before any arithmetic (so "1e999999999" neither
    overflows nor hangs)."""
    if len(text) > MAX_TEXT:
        return None
    match = _QUANTITY.fullmatch(text)
    if not match:
        return None
    number = Decimal(match["number"])
    if number and not -40 <= number.adjusted() <= 40:
        return None
    return Fraction(number), match["unit"]


def parse_bytes(text, name: str = "size") -> int:
    """An exact byte count from ``"2000000000"``, ``"2e9"``, ``"2GB"`` or ``"1.5 GiB"``.

    Raises ``ValueError`` naming ``name`` unless the text is a non-negative
    whole number of bytes up to :data:`LIMIT`.
    """
    raw = str(text).strip()
    parsed = _exact_number(raw)
    unit = parsed and _UNIT_BY_LOWER.get(parsed[1].lower() or "b")
    if not unit:
        raise ValueError(f"{name} must be a number of bytes such as 2000000000, 2e9 or 2GB, got {shown(raw)!r}")
    value = parsed[0] * UNITS[unit]
    if value.denominator != 1 or not 0 <= value <= LIMIT:
        raise ValueError(f"{name} must be a whole number of bytes from 0 to 10^18, got {shown(raw)!r}")
    return int(value)


def parse_count(text, name: str) -> int:
    """A positive integer up to :data:`LIMIT` from ``"7000000000"`` or ``"7e9"``; ``ValueError`` otherwise."""
    raw = str(text).strip()
    parsed = _exact_number(raw)
    if parsed is None or parsed[1] or parsed[0].denominator != 1 or not 1 <= parsed[0] <= LIMIT:
        raise ValueError(COUNT_ERROR.format(name=name, raw=shown(raw)))
    return int(parsed[0])


def parse_number(value, name: str, minimum, maximum, example: str = "1.5") -> Fraction:
    """An exact number in [``minimum``, ``maximum``] from an int, a Fraction, a finite float (read as its
    shortest decimal: 1.1 is 11/10) or ASCII text such as ``"1.5"`` or ``"15e-1"``; ``ValueError`` naming
    ``name`` otherwise (``TypeError`` for a bool or a non-number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, Fraction, Decimal, str)):
        raise TypeError(f"{name} must be a number such as {example}, got {value!r}")
    if isinstance(value, str):
        raw = value.strip()
        parsed = _exact_number(raw)
        number = parsed[0] if parsed is not None and not parsed[1] else None
        quoted = repr(shown(raw))
    else:
        number = None
        if isinstance(value, float):
            number = Fraction(repr(value)) if math.isfinite(value) else None
        elif not isinstance(value, Decimal) or value.is_finite():
            number = Fraction(value)
        quoted = str(value)
    if number is None or not minimum <= number <= maximum:
        raise ValueError(f"{name} must be a number from {minimum} to {maximum} such as {example}, got {quoted}")
    return number


def format_quantity(value, unit: str = "", digits: int = 0) -> str:
    """A number already in ``unit``, for prose: ``"30.6 GB"``, ``"70.2%"``, ``"3.40×"``, ``"4,096"``."""
    number = f"{float(value):,.{digits}f}"
    if unit == "%":
        return number + "%"
    if unit == "x":
        return number + "×"
    return f"{number} {unit}".strip()
