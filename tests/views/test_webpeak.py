"""The static calculator's peak under Node: the page's script, fed the records memledger.views.webpeak prints,
judges each setup as `memledger ledger --json` does (judged_bytes, measure) and finds the step's peak where
memledger.step.cache finds it; the structure-deciding controls are the ones StepStructure reads."""
from contextlib import redirect_stdout
import io
import json
import os
from pathlib import Path
from html import unescape
import random
import re
import shutil
import subprocess
import sys

import pytest

from memledger.answers.verdict import judge, unmodelled, uses_peak
from memledger.cli.main import main
from memledger.core.units import LIMIT
from memledger.ledger.ledger import Ledger
from memledger.step.cache import step_peak
from memledger.views.controls import BY_FIELD, CONTROLS, cli_command, defaults, ledger_settings, option_text
from memledger.views.webcalc import SCRIPT, calculator_data
from memledger.views.widgets import render
from memledger.views.webpeak import (STRUCTURE_FIELDS, browser_record, nearby_states, record_js, record_name,
                                     site_records, structure_key, structure_of)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
node = pytest.mark.skipif(shutil.which("node") is None, reason="Node.js runs the calculator's script")


@pytest.fixture(scope="module")
def data():
    return calculator_data()


def random_states(count, seed):
    rng = random.Random(seed)
    for _ in range(count):
        yield {c.field: rng.choice([1, 1, 2, 3, 8, 61, 4096, LIMIT]) if c.is_count else rng.choice(c.options)
               for c in CONTROLS}


def as_page(state):
    return {c.field: option_text(c.parse(state[c.field])) for c in CONTROLS}


def cli_json(state):
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(cli_command(state).split()[1:] + ["--json"]) == 0
    return json.loads(out.getvalue())


def cli_verdict(state):
    """The verdict line ``memledger ledger`` prints for ``state`` (its last line that is a verdict)."""
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(cli_command(state).split()[1:]) == 0
    return next(t for t in out.getvalue().splitlines() if t.startswith(("fits, ", "no fit: ", "does not fit: ")))


def run_node(tmp_path, data, cases):
    """Each case: (page setup, record or None): the script's judgement, peak and command."""
    harness = tmp_path / "peak.js"
    harness.write_text(f"""
const calc = require({json.dumps(str(ROOT / "_static" / SCRIPT))});
const request = JSON.parse(require("fs").readFileSync(0, "utf8")), data = request.data, out = [];
for (const [setup, record, reason] of request.cases) {{
  const totals = calc.ledger(data, setup).totals, source = calc.recordSource(data, setup);
  const step = record && !record.unmodelled ? calc.evaluateStep(record, data, setup) : null;
  const judged = calc.judge(data, setup, totals, step);
  const said = calc.sentence(data, judged.bytes, BigInt(data.gpus[setup[data.gpu_field]]),
                             calc.clause(data, judged, totals, step, reason || undefined));
  out.push({{key: calc.structureKey(data, setup), source: source, judged: judged.bytes.toString(), measure: judged.key,
            peak: step && [step.peak.toString(), step.phase, step.block], ops: step && step.totals.length,
            cli: calc.cliCommand(data, setup), verdict: said.text, standing: said.standing}});
}}
process.stdout.write(JSON.stringify(out));
""")
    done = subprocess.run(["node", str(harness)], input=json.dumps({"data": data, "cases": cases}),
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def check(tmp_path, data, states, against_cli=()):
    cases = []
    for state in states:
        structure = structure_of(state)
        unmodelled_here = isinstance(structure, str)      # the page's note, as it finds it (or Pyodide says it)
        cases.append([as_page(state), None if unmodelled_here else record_js(structure),
                      structure if unmodelled_here else None])
    results = run_node(tmp_path, data, cases)
    for state, result in zip(states, results):
        ledger = Ledger(**ledger_settings(state))
        expected = judge(ledger, uses_peak(ledger))
        assert (result["judged"], result["measure"]) == (str(expected.bytes), expected.key), state
        peak = step_peak(ledger)
        assert result["peak"] == (None if peak is None else [str(peak[0]), peak[1], peak[2]]), state
        assert result["cli"] == cli_command(state) and result["key"] == structure_key(state)
        # the same verdict sentence as the explorer's (memledger.answers.verdict.sentence; issue 17's margin)
        paragraph = re.search(r'class="memledger-verdict"[^>]*><p>(.*?)</p>', render(state))[1]
        assert result["verdict"] == unescape(re.sub(r"<[^>]+>", "", paragraph)), state
    for i in against_cli:
        printed = cli_json(states[i])
        assert (results[i]["judged"], results[i]["measure"]) == (str(printed["judged_bytes"]), printed["measure"])
        assert results[i]["verdict"] + "." == cli_verdict(states[i]), states[i]
    return results


@node
def test_the_site_records_judge_as_the_cli(tmp_path, data):
    states = nearby_states()
    results = check(tmp_path, data, states, against_cli=range(0, len(states), 5))
    index, records = site_records()
    assert all("name" in r["source"] or "unmodelled" in r["source"] for r in results)      # all carried
    assert {r["measure"] for r in results} == {"peak", "nominal", "total"}
    assert len(records) > 25 and {v for v in index.values() if isinstance(v, str)} == set(records)


@node
def test_random_states_judge_as_the_cli(tmp_path, data):
    states = list(random_states(40, seed=1))
    results = check(tmp_path, data, states, against_cli=range(0, 40, 4))
    assert sum("key" in r["source"] for r in results) > 10          # structures the site leaves to Pyodide
    assert any(r["peak"] and int(r["peak"][0]) > 2**64 for r in results)    # beyond any float, still exact


def test_structure_fields_decide_the_structure():
    """Two states with the same key have the same StepStructure; each field changes it somewhere."""
    states = list(random_states(60, seed=2))
    for state in states:
        other = {**next(random_states(1, seed=hash(structure_key(state)) % 1000)),
                 **{f: state[f] for f in STRUCTURE_FIELDS}}
        other["batch_size"] = 1 if BY_FIELD["batch_size"].parse(state["batch_size"]) == 1 else 5
        assert structure_of(other) == structure_of(state)
    base = {**defaults(), "recompute": "full", "offload_optimizer": "cpu"}
    changed = {f for f in STRUCTURE_FIELDS for o in BY_FIELD[f].options
               if structure_of({**base, f: o}) != structure_of(base)}
    assert changed == set(STRUCTURE_FIELDS)


def test_the_browser_builds_what_the_site_carries():
    index, records = site_records()
    state = defaults()
    assert json.loads(browser_record(json.dumps(as_page(state)))) == records[index[structure_key(state)]]
    assert record_name(structure_of(state)) == index[structure_key(state)]
    moe = {**state, "arch": "mixtral-8x7b"}
    assert json.loads(browser_record(json.dumps(as_page(moe)))) == {
        "unmodelled": unmodelled(Ledger(**ledger_settings(moe)))}


def test_the_refusals_the_page_knows(data):
    """The page's table of refused (model, FlashAttention, recipe) gives the note the CLI's verdict prints, and
    never refuses what the step models; a refusal that also depends on other controls (a model family's block
    under ZeRO, tensor parallelism or offloading) is the record the library builds in the browser."""
    refused_later = 0
    for state in random_states(80, seed=3):
        page, structure = as_page(state), structure_of(state)
        note = data["step"]["unmodelled"][page["arch"]][page["flash_attention"]][page["recipe"]]
        if note:
            assert note == structure == unmodelled(Ledger(**ledger_settings(state))), state
        elif isinstance(structure, str):
            refused_later += 1
            assert json.loads(browser_record(json.dumps(page))) == {"unmodelled": structure}, state
    assert refused_later        # the seed meets such a state (a family's block with ZeRO, TP or offloading)


def test_the_browser_build_needs_no_more_numpy_than_its_stand_in(tmp_path):
    """What Pyodide runs: memledger's step build with _ext/pyodide_numpy.py as NumPy gives the same records."""
    shutil.copy(ROOT / "_ext" / "pyodide_numpy.py", tmp_path / "numpy.py")
    states = [defaults(), {**defaults(), "arch": "gemma-7b", "zero_stage": 3, "recompute": "full", "batch_size": 1},
              {**defaults(), "arch": "qwen2.5-7b", "recipe": "fp32-adamw", "offload_optimizer": "cpu",
               "recompute": "selective", "flash_attention": True}]
    script = ("import json, sys, numpy\nassert numpy.__file__.startswith(sys.argv[1])\n"
              "from memledger.views.webpeak import browser_record\n"
              "print(json.dumps([json.loads(browser_record(json.dumps(s))) for s in json.load(sys.stdin)]))")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{ROOT}", "MEMLEDGER_CACHE_DIR": str(tmp_path / "c")}
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], input=json.dumps([as_page(s) for s in states]),
                          capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == [record_js(structure_of(s)) for s in states]


@node
def test_the_pages_verdict_sentence_is_pythons_at_the_margin(tmp_path, data):
    """Over, under the margin (no fit), at the margin (fits): the script's words are memledger.answers.verdict's."""
    from memledger.answers.verdict import MARGIN, sentence
    gpu = 85_899_345_920
    cases = [gpu + 1, gpu, gpu - MARGIN + 1, gpu - MARGIN, 1]
    harness = tmp_path / "sentence.js"
    harness.write_text(f"""
const calc = require({json.dumps(str(ROOT / "_static" / SCRIPT))});
const request = JSON.parse(require("fs").readFileSync(0, "utf8"));
process.stdout.write(JSON.stringify(request.cases.map(
  n => calc.sentence(request.data, BigInt(n), BigInt(request.gpu), ", a clause").text)));
""")
    done = subprocess.run(["node", str(harness)], capture_output=True, text=True,
                          input=json.dumps({"data": data, "cases": [str(n) for n in cases], "gpu": str(gpu)}))
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said == [sentence(n, gpu, ", a clause") for n in cases]
    assert [s.split(";")[0].split(":")[0].split(",")[0] for s in said] == [
        "does not fit", "no fit", "no fit", "fits", "fits"]
