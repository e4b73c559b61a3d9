"""The static calculator under Node: its script, fed the data webcalc prints, must agree with the
Python ledger byte for byte, read counts as the CLI does, and print sizes as format_bytes does."""
from itertools import cycle, product
import json
from pathlib import Path
import random
import shutil
import subprocess

import pytest
import sympy as sp

from memledger.views.controls import BY_FIELD, CONTROLS, defaults, ledger_settings, option_text
from memledger.ledger.ledger import Ledger
from memledger.core.symbols import B, N_d, P, S, t
from memledger.core.units import LIMIT, UNITS, format_bytes, parse_count
from memledger.views.webcalc import CSS_CLASS, PARTS, SCRIPT, BigIntPrinter, Calculator, calculator_data, calculator_html

ROOT = Path(__file__).resolve().parents[2]
node = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js runs the calculator's script")


@pytest.fixture(scope="module")
def data():
    """The page's data, printed once for the module (it prints every formula with SymPy)."""
    return calculator_data()


def setups():
    """Every row-deciding choice of every part at least once, with assorted counts and extremes."""
    rng = random.Random(6)
    keyed = [list(product(*(BY_FIELD[f].options for f in fields))) for _, fields in PARTS]
    longest = max(len(k) for k in keyed)
    out = []
    for i, combos in enumerate(zip(*(cycle(k) for k in keyed))):
        if i == longest:
            break
        values = defaults()
        for (_, fields), combo in zip(PARTS, combos):
            values.update(zip(fields, combo))
        values.update(seq_len=rng.choice(BY_FIELD["seq_len"].options), batch_size=rng.choice([1, 2, 3, 8, 61]),
                      dp=rng.choice([1, 2, 7, 8, 64, 1000]))
        out.append(values)
    extremes = [dict(batch_size=LIMIT), dict(dp=LIMIT, zero_stage=3), dict(batch_size=LIMIT, dp=LIMIT, zero_stage=1),
                dict(arch="megatron-1t", seq_len=32768, batch_size=LIMIT, recompute="full")]
    return out + [{**defaults(), **e} for e in extremes]


def as_page(values):
    """A setup as the page's form holds it: option texts and digits."""
    return {k: (str(v) if BY_FIELD[k].is_count else option_text(v)) for k, v in values.items()}


def run_node(tmp_path, request):
    harness = tmp_path / "run.js"
    harness.write_text(f"""
const calc = require({json.dumps(str(ROOT / "_static" / SCRIPT))});
const request = JSON.parse(require("fs").readFileSync(0, "utf8"));
const data = request.data, out = {{ledgers: [], counts: [], sizes: []}};
for (const setup of request.setups) {{
  const l = calc.ledger(data, setup);
  out.ledgers.push({{rows: l.rows.map(r => [r.name, r.group, r.device, r.bytes.toString()]),
                    totals: Object.fromEntries(Object.entries(l.totals).map(([k, v]) => [k, v.toString()]))}});
}}
for (const [text, field] of request.counts) {{
  try {{ out.counts.push(["ok", calc.parseCount(text, field, data).toString()]); }}
  catch (e) {{ out.counts.push(["error", e.message]); }}
}}
for (const [n, unit, digits] of request.sizes) out.sizes.push(calc.formatUnit(BigInt(n), BigInt(unit), digits));
process.stdout.write(JSON.stringify(out));
""")
    done = subprocess.run(["node", str(harness)], input=json.dumps(request), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
@node
def test_every_row_agrees_with_the_python_ledger(tmp_path, data):
    cases = setups()
    result = run_node(tmp_path, {"data": data, "setups": [as_page(v) for v in cases], "counts": [],
                                 "sizes": []})
    assert len(result["ledgers"]) == len(cases) > 140
    for values, js in zip(cases, result["ledgers"]):
        ledger = Ledger(**ledger_settings(values))
        assert js["rows"] == [[r.name, r.group, r.device, str(r.bytes)] for r in ledger.rows], values
        assert js["totals"] == {k: str(v) for k, v in ledger.totals.items()}, values


#: Inputs of the count fields, ASCII: the calculator must accept and refuse exactly what the CLI does.
COUNT_TEXTS = ["1", "7", " 64 ", "+3", "2.0", "7e9", "1E3", ".5e1", "10.", "1e18", "1000000000000000000",
               "1000000000000000001", "1e19", "1e30", "1e999999999", "0", "-1", "-0", "1.5", "1e-3", "0.0", "",
               "abc", "1 2", "1,000", "0x10", "Infinity", "NaN", "1e", "e9", "4 GB", "1_000", "+-1", "0001", "5e-0",
               "1e-50", "0e999", "2.0000000000000000000000000001", "\x1f5", "\x855", "\ufeff5", "\u200b3", "5\u3000",
               "it's", "a\\b", "\"q\"", "\U0001f600"]


@pytest.mark.slow
@node
def test_counts_are_read_as_the_cli_reads_them(tmp_path, data):
    counts = [(text, field) for text in COUNT_TEXTS for field in ("batch_size", "dp")]
    result = run_node(tmp_path, {"data": data, "setups": [], "counts": counts, "sizes": []})
    for (text, field), (status, value) in zip(counts, result["counts"]):
        try:
            expected = ("ok", str(parse_count(text, field)))
        except ValueError as error:
            expected = ("error", str(error))
        assert (status, value) == expected, text
    refused = [v for s, v in result["counts"] if s == "error"]
    assert len(refused) > 30 and all(v.startswith(("batch_size ", "dp ")) for v in refused)


@pytest.mark.slow
@node
def test_non_ascii_digits_are_refused(tmp_path, data):
    counts = [("٣", "batch_size"), ("１２", "dp"), ("3\u200b", "batch_size")]
    result = run_node(tmp_path, {"data": data, "setups": [], "counts": counts, "sizes": []})
    assert result["counts"] == [["error", f"{field} must be a positive integer up to 10^18, got {text!r}"]
                                for text, field in counts]


@pytest.mark.slow
@node
def test_sizes_print_as_format_bytes(tmp_path, data):
    rng = random.Random(10)
    numbers = [0, 1, 5 * 10**6, 125 * 10**6, 135 * 10**6, 145 * 10**6, 165 * 10**6, 10**9 - 1, 144_601_641_984,
               2**53 - 1, 2**53 + 1, 2**60 + 3, 10**27 + 5 * 10**6, 9 * 10**30 + 1]
    numbers += [rng.randrange(10**k) for k in range(1, 35) for _ in range(8)]
    sizes = [(str(n), str(UNITS[unit]), digits) for n in numbers for unit in ("GB", "GiB", "MiB") for digits in (0, 2)]
    result = run_node(tmp_path, {"data": data, "setups": [], "counts": [], "sizes": sizes})
    for (n, unit, digits), shown in zip(sizes, result["sizes"]):
        name = next(k for k, v in UNITS.items() if str(v) == unit)
        assert f"{shown} {name}" == format_bytes(int(n), name, digits), (n, name, digits)
        assert "e" not in shown.lower()


def test_formulas_print_over_bigint():
    printer = BigIntPrinter()
    assert printer.formula(2 * sp.ceiling(P / (N_d * t))) == "2n*ml.ceilDiv(v.P, v.N_d*v.t)"
    assert printer.formula(B * S**2 / t) == "ml.exactDiv(v.B*v.S ** 2n, v.t)"
    with pytest.raises(ValueError):
        printer.formula(sp.Float(0.5) * B)


@pytest.mark.slow
def test_data_leaves_rows_to_python(data):
    assert [p["fields"] for p in data["parts"]] == [list(fields) for _, fields in PARTS]
    assert all(isinstance(v, str) for b in data["bindings"].values() for v in b.values())   # exact, as text
    assert {c["field"] for c in data["controls"]} == {c.field for c in CONTROLS}


@pytest.mark.slow
def test_page_fragment_is_data_and_markup_only():
    html = calculator_html()
    assert html.count("<select") == sum(not c.is_count for c in CONTROLS)
    assert html.count('type="text"') == sum(c.is_count for c in CONTROLS)
    assert "<script>" not in html and "function" not in html.replace(".ceilDiv", "")   # no code but formulas
    assert 'type="application/json"' in html and f'class="{CSS_CLASS}"' in html and "http" not in html
    assert "no kernel needed" in Calculator()._repr_html_()
    with pytest.raises(ValueError, match="arch must be one of"):
        Calculator("no-such-model")
