"""The static calculator's JavaScript, run by Node, must agree with the Python ledger byte for byte."""
from itertools import product
import json
import shutil
import subprocess

import pytest

from memledger.ledger import Ledger
from memledger.webcalc import Calculator, calculator_html, script

CONFIGS = [
    dict(preset=p, batch=b, seq=s, recipe=r, recompute=rc, flash=fl, zero=z, dp=dp, offload=o, placement=pl)
    for p, b, s, r, rc, fl, z, dp, o, pl in product(
        ["article-7b", "llama2-7b", "gpt2"], [1, 3], [2048, 4096], ["bf16-adamw", "bf16-adamw-fp32-grads"],
        ["none", "selective", "full"], [False, True], [0, 2, 3], [1, 8], ["none", "cpu", "nvme"],
        ["article", "zero-offload"])
][::7]


def python_ledger(c):
    return Ledger(c["preset"], batch_size=c["batch"], seq_len=c["seq"], recipe=c["recipe"], recompute=c["recompute"],
                  flash_attention=c["flash"], zero_stage=c["zero"], dp=c["dp"], offload_optimizer=c["offload"],
                  offload_placement=c["placement"])


@pytest.mark.skipif(shutil.which("node") is None, reason="Node.js runs the generated JavaScript")
def test_javascript_agrees_with_python(tmp_path):
    harness = tmp_path / "run.js"
    harness.write_text(script() + f"\nconsole.log(JSON.stringify({json.dumps(CONFIGS)}.map(memledgerLedger)));")
    results = json.loads(subprocess.run(["node", str(harness)], capture_output=True, text=True, check=True).stdout)
    assert len(results) == len(CONFIGS) > 100
    for config, js in zip(CONFIGS, results):
        ledger = python_ledger(config)
        assert js["totals"] == ledger.totals, config
        assert [r[3] for r in js["rows"]] == [r.bytes for r in ledger.rows], config


def test_page_fragment():
    html = calculator_html()
    assert html.count("<select") == 9 and html.count('type="number"') == 2
    assert "<script>" in html and "http" not in html          # nothing loaded from the network
    assert "no kernel needed" in Calculator()._repr_html_()
