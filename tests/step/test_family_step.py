"""The families the step timeline does not model are refused in one line naming their model_type and why;
T5 (encoder-decoder) is refused by every command that builds a ledger. No traceback for any shipped family."""
import subprocess
import sys

import pytest

from memledger.ledger.ledger import Ledger
from memledger.models.presets import get_preset
from memledger.step.structure import StepStructure
from memledger.activations.backends import get_backend

REFUSED = {
    "pythia-6.9b": ("gpt_neox", "parallel attention and MLP"),
    "phi-2": ("phi", "one norm feeding parallel attention and MLP"),
    "bloom-7b1": ("bloom", "ALiBi score biases"),
    "starcoder": ("gpt_bigcode", "grouped-query attention in a GPT block"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_step_refuses_the_family_by_name(name):
    model_type, why = REFUSED[name]
    ledger = Ledger(get_preset(name), batch_size=1, seq_len=2048)
    with pytest.raises(ValueError, match=f"{why}.*not modelled op by op \\(model_type '{model_type}'\\)"):
        StepStructure.of(ledger, get_backend("cuda"))


def test_t5_refused_by_the_ledger():
    with pytest.raises(ValueError, match="arch: model_type 't5' is an encoder-decoder"):
        Ledger("t5-base", batch_size=1, seq_len=512)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memledger", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("command, name", [("step", n) for n in REFUSED] + [
    (c, "t5-base") for c in ("ledger", "step", "compare", "infer")] + [("fit --vary batch", "t5-base")])
def test_cli_refuses_in_one_line(command, name):
    result = _cli(*command.split(), "--preset", name)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert (REFUSED[name][0] if name in REFUSED else "t5") in result.stderr


@pytest.mark.parametrize("name", REFUSED)
@pytest.mark.parametrize("command", ["ledger", "compare", "fit --vary batch"])
def test_cli_answers_the_decoder_families(command, name):
    result = _cli(*command.split(), "--preset", name)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
