"""The static book's calculator: data printed from the library, driven by one static script.

Python emits data only: the controls (:mod:`memledger.views.controls`), each preset's
symbol values, and the ledger's rows part by part -- for every choice of the
controls that decide a part's rows, each row's name, group, device and formula,
taken from :class:`~memledger.ledger.ledger.Ledger` itself and printed from its SymPy
expression by SymPy's JavaScript printer (over BigInt, so bytes stay exact at
any size the CLI accepts). The hand-written script,
``_static/memledger-calculator.js``, only looks rows up, evaluates formulas,
reads inputs with the CLI's rules and renders; it decides nothing about which
rows exist.
"""
from html import escape
from itertools import product
from functools import cache
import json

from ..models.presets import ARTICLE_PRESET
from .controls import BY_FIELD, CONTROLS, GPU_FIELD, defaults, ledger_settings, option_text
from ..core.table import DEVICE_LABELS
from ..ledger.table import HEADER
from ..ledger.hardware import GPU_MEMORY
from ..core.choices import LIMIT
from ..ledger.ledger import FIELD_OF, Ledger
from ..core.units import COUNT_ERROR, UNITS
from .bigint import BigIntPrinter
from .webpeak import step_data

__all__ = ["CSS_CLASS", "PARTS", "SCRIPT", "BigIntPrinter", "Calculator", "calculator_data", "calculator_html"]

#: The class that marks a calculator in a page, and the script that drives it (in the book's ``_static``).
CSS_CLASS = "memledger-calculator"
SCRIPT = "memledger-calculator.js"

#: The ledger's rows part by part (Ledger's order), and the controls that decide which rows a part
#: has; every other control only changes numbers. tests/views/test_webcalc.py checks the split against
#: Ledger over many setups.
PARTS = (
    ("model_states", ("recipe", "zero_stage", "offload_optimizer", "offload_placement")),
    ("activations", ("arch", "flash_attention", "recompute", "recipe")),     # the recipe: the activation dtype
    ("overhead", ()),
)
#: The device of the fits verdict, whose total is always shown; the verdict judges what ``memledger ledger`` judges
#: (:mod:`memledger.answers.verdict`: the step's peak where the timeline models the setup, else the sum).
VERDICT_DEVICE = "gpu"
UNIT = "GB"


def _rows_by_part():
    """For each part: its fields and, by key, the rows ``(name, group, device, formula)``."""
    printer = BigIntPrinter()
    printed = {}            # formula text -> JavaScript: many combinations share a row's formula

    def formula(row):
        if row.formula not in printed:
            printed[row.formula] = printer.formula(row.expr)
        return printed[row.formula]
    parts = []
    for group, fields in PARTS:
        rows = {}
        for combo in product(*(BY_FIELD[f].options for f in fields)):
            ledger = Ledger(**ledger_settings({**defaults(), **dict(zip(fields, combo))}))
            rows["|".join(map(option_text, combo))] = [
                (r.name, r.group, r.device, formula(r)) for r in ledger.rows if r.group == group]
        parts.append((fields, rows))
    return parts


def calculator_data() -> dict:
    """Everything the page's script needs (JSON-able; big integers as decimal strings); a fresh copy."""
    return json.loads(_data_json())


@cache
def _data_json() -> str:
    """The data as JSON, printed once per process (every formula goes through SymPy's printer)."""
    return json.dumps(_data(), separators=(",", ":"))


def _data() -> dict:
    table, index = [], {}

    def number(row):            # each distinct row is sent once; parts list row numbers
        if row not in index:
            index[row] = len(table)
            table.append(row)
        return index[row]
    parts = [{"fields": list(fields), "rows": {key: [number(r) for r in rows] for key, rows in keyed.items()}}
             for fields, keyed in _rows_by_part()]
    return {
        "controls": [{"field": c.field, "label": c.label, "count": c.is_count, "default": option_text(c.default),
                      "options": [[option_text(v), label] for label, v in c.choices()]} for c in CONTROLS],
        "count_error": COUNT_ERROR,
        "limit": str(LIMIT),
        # each model's symbol values (Ledger.values at the defaults); controls replace the ones they set
        "bindings_field": "arch",
        "bindings": {name: {symbol: str(v) for symbol, v in Ledger(**ledger_settings(
            {**defaults(), "arch": name})).values.items()} for name in BY_FIELD["arch"].options},
        "symbols": [[symbol, field] for symbol, field in FIELD_OF.items() if field in BY_FIELD],
        "parts": parts,
        "rows": [list(row) for row in table],
        "devices": [[device, label] for device, label in DEVICE_LABELS.items()],
        "verdict_device": VERDICT_DEVICE,
        "step": step_data(),                   # the verdict judges the step's peak (memledger.views.webpeak)
        "header": list(HEADER),
        "gpu_field": GPU_FIELD,
        "gpus": {name: str(n) for name, n in GPU_MEMORY.items()},
        "unit": [UNIT, str(UNITS[UNIT])],
        "digits": 2,
    }


def _field(control, value) -> str:
    label = escape(control.label)
    if control.is_count:
        return (f'<label>{label} <input name="{control.field}" type="text" inputmode="numeric" '
                f'autocomplete="off" spellcheck="false" value="{escape(option_text(value))}"></label>')
    options = "".join(f'<option value="{escape(option_text(v))}"{" selected" if v == value else ""}>'
                      f"{escape(text)}</option>" for text, v in control.choices())
    return f'<label>{label} <select name="{control.field}">{options}</select></label>'


def calculator_html(preset: str = ARTICLE_PRESET) -> str:
    """The calculator as one HTML fragment: a form, an output area and its data (no code)."""
    values = defaults(preset)
    fields = "\n".join(_field(c, values[c.field]) for c in CONTROLS)
    data = _data_json().replace("<", "\\u003c")
    return (f'<div class="{CSS_CLASS}">\n<p><b>Calculator</b> (runs in your browser; no kernel needed)</p>\n'
            f'<form class="{CSS_CLASS}-form">\n{fields}\n</form>\n'
            f'<div class="{CSS_CLASS}-out" aria-live="polite"><p><i>This calculator runs in the built book, '
            f"whose script <code>_static/{SCRIPT}</code> drives it; in Jupyter, use the explorer.</i></p></div>\n"
            f'<script type="application/json" class="{CSS_CLASS}-data">{data}</script>\n</div>')


class Calculator:
    """Displays as the calculator in the built book (and as its form in Jupyter)."""

    def __init__(self, preset: str = ARTICLE_PRESET):
        self.preset = BY_FIELD["arch"].parse(preset)

    def _repr_html_(self):
        return calculator_html(self.preset)

    def __repr__(self):
        return f"Calculator({self.preset!r}): an HTML form; open the book to use it"
