"""``--foreach``/``--no-foreach``/``--fused`` on ``step`` and ``--optimizer-in-backward`` on ``ledger``, ``fit`` and
``step``: each path reads them (the step's peak changes as the timeline says) or refuses them in one line, exit 2."""
import json

import pytest

from memledger.ledger.ledger import Ledger
from memledger.states.recipes import ALL_RECIPES
from memledger.step.structure import MODELLED_RECIPES
from clicheck import run

MODEL = ("--preset", "llama2-7b", "--seq", "4096", "--overhead", "0")


def peak(capsys, *args):
    code, out, err = run(capsys, "step", *MODEL, *args, "--json")
    assert code == 0 and err == "", err
    return json.loads(out)["peak"]["gpu"]


@pytest.mark.slow
def test_implementations_on_the_command_line(capsys):
    """cuda's default is foreach; --no-foreach the for-loop, --fused the kernel: each the Python step's peak."""
    ledger = Ledger("llama2-7b", seq_len=4096, overhead_bytes=0)
    assert peak(capsys, "--backend", "cuda") == ledger.step("cuda").peak.bytes
    assert peak(capsys, "--backend", "cuda", "--no-foreach") == ledger.step("cuda", foreach=False).peak.bytes
    assert peak(capsys, "--backend", "cuda", "--fused") == ledger.step("cuda", foreach=False, fused=True).peak.bytes
    assert peak(capsys, "--foreach") == ledger.step(foreach=True).peak.bytes


@pytest.mark.slow
def test_in_backward_on_step_ledger_and_fit(capsys):
    on = Ledger("llama2-7b", recipe="bf16-pure-adamw", seq_len=4096, overhead_bytes=0, optimizer_in_backward=True)
    assert peak(capsys, "--recipe", "bf16-pure-adamw", "--optimizer-in-backward") == on.step().peak.bytes
    code, out, _ = run(capsys, "ledger", *MODEL, "--recipe", "bf16-pure-adamw", "--optimizer-in-backward", "--json")
    assert code == 0 and json.loads(out)["judged_bytes"] == on.peak
    code, out, err = run(capsys, "fit", "--vary", "seq", "--preset", "llama2-7b", "--recipe", "bf16-pure-adamw",
                         "--optimizer-in-backward", "--json")
    assert code == 0, err


@pytest.mark.parametrize("args, words", [
    (("step", *MODEL, "--fused", "--foreach"), "give one of"),
    (("step", *MODEL, "--optimizer-in-backward"), "FP32 master weights"),
    (("step", *MODEL, "--recipe", "adafactor", "--foreach"), "Adafactor"),
    (("step", *MODEL, "--recipe", "adafactor", "--fused"), "no fused"),
    (("ledger", *MODEL, "--recipe", "bf16-pure-adamw", "--optimizer-in-backward", "--measure", "total"),
     "--optimizer-in-backward"),
    (("compare", *MODEL, "--recipe", "bf16-pure-adamw", "--optimizer-in-backward"), "--optimizer-in-backward"),
    (("ledger", "--params", "7e9", "--recipe", "bf16-pure-adamw", "--optimizer-in-backward"), "architecture"),
])
def test_refused_in_one_line(capsys, args, words):
    code, _, err = run(capsys, *args)
    assert code == 2 and err.count("\n") == 1 and words in err, err


@pytest.mark.parametrize("recipe", sorted(set(ALL_RECIPES) - set(MODELLED_RECIPES)))
def test_unmodelled_recipes_are_refused_by_step_in_one_line(capsys, recipe):
    code, _, err = run(capsys, "step", *MODEL, "--recipe", recipe)
    assert code == 2 and err.count("\n") == 1 and recipe in err, err
