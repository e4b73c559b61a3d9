"""The families in the step: a GPT block with multi-query (grouped-query) attention, GPT-BigCode's, is the one-block
program with K and V at H_kv heads, equal to MemTracker's run of the reference decoder to the byte (more shapes
and StarCoder's width in test_family_step_memtracker.py). What the step does not model is refused in one line
naming the model_type and why; T5 (encoder-decoder) by every command that builds a ledger. No traceback for any
shipped family."""
import subprocess
import sys

import pytest
from stepcheck import against_memtracker, peaks_agree

from memledger.ledger.ledger import Ledger
from memledger.models.presets import get_preset
from memledger.step.structure import StepStructure
from memledger.activations.backends import get_backend

REFUSED = {       # GPT-NeoX and Phi run in the step: test_parallel.py
    "bloom-7b1": ("bloom", "ALiBi score biases"),
    "starcoder": ("gpt_bigcode", "learned positions"),
}


@pytest.mark.slow
def test_multi_query_gpt_block_is_memtrackers():
    step, measured = against_memtracker("gpt", 256, "bf16-pure-adamw", 2, 16, 2, 0.1, "none", kv=1)
    peaks_agree(step, measured, op_by_op=True)
    multi_head, _ = against_memtracker("gpt", 256, "bf16-pure-adamw", 2, 16, 2, 0.1, "none")
    assert multi_head.peak.bytes > step.peak.bytes          # the comparison sees the K/V width


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


@pytest.mark.slow
@pytest.mark.sample(3)
@pytest.mark.parametrize("command, name", [("step", n) for n in REFUSED] + [
    (c, "t5-base") for c in ("ledger", "step", "compare", "infer")] + [("fit --vary batch", "t5-base")])
def test_cli_refuses_in_one_line(command, name):
    result = _cli(*command.split(), "--preset", name)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert (REFUSED[name][0] if name in REFUSED else "t5") in result.stderr


@pytest.mark.slow
@pytest.mark.sample(2)
@pytest.mark.parametrize("name", REFUSED)
@pytest.mark.parametrize("command", ["ledger", "compare", "fit --vary batch"])
def test_cli_answers_the_decoder_families(command, name):
    result = _cli(*command.split(), "--preset", name)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
