"""GPT-NeoX's and Phi's parallel-residual blocks in the step (memledger/step/parallel.py) against MemTracker's run
of the reference decoder (``RefConfig(parallel=True)``; Phi: ``shared_norm``, an untied LM head with a bias):
landmarks, phase peaks, the peak, each block's peaks and the totals inside each block, op by op, to the byte on a
small shape. What the step does not model with them (tensor parallelism, ZeRO-3, ...) is refused in one
line. The real shapes (pythia-6.9b, phi-2 at B 1, S 2048), selective and full recomputation, more small shapes:
test_parallel_slow.py."""
import subprocess
import sys

import pytest
from stepcheck import against_memtracker, peaks_agree

from memledger.activations.backends import get_backend
from memledger.ledger.ledger import Ledger
from memledger.models.presets import get_preset
from memledger.step.structure import StepStructure

NEOX = dict(parallel=True, untied=True)
PHI = dict(parallel=True, shared_norm=True, untied=True, head_bias=True)


@pytest.mark.slow
@pytest.mark.parametrize("family", [NEOX, PHI], ids=["gpt_neox", "phi"])
def test_small_parallel_block_is_memtrackers(family):
    step, measured = against_memtracker("gpt", 256, "bf16-pure-adamw", 2, 24, 3, 0.1, "none", family=family)
    peaks_agree(step, measured, op_by_op=True)


@pytest.mark.parametrize("name, options, lacking", [
    ("phi-2", dict(zero_stage=3, dp=8), "ZeRO-3"),
    ("pythia-6.9b", dict(framework="ddp", dp=2), "framework ddp"),
    ("pythia-6.9b", dict(tp=2), "tensor parallelism"),
    ("pythia-6.9b", dict(flash_attention=True), "the flash attention kernel"),
    ("phi-2", dict(loss_chunks=4), "a chunked loss"), ("pythia-6.9b", dict(packed=2), "packed documents")])
def test_what_the_parallel_block_lacks_is_refused(name, options, lacking):
    ledger = Ledger(get_preset(name), batch_size=1, seq_len=2048, **options)
    model_type = {"pythia-6.9b": "gpt_neox", "phi-2": "phi"}[name]
    with pytest.raises(ValueError, match=f"parallel attention and MLP \\(model_type '{model_type}'\\).*not with .*"
                                         f"{lacking}"):
        StepStructure.of(ledger, get_backend("cpu"))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memledger", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pythia-6.9b", "phi-2"])
def test_cli_steps_the_parallel_families(name):
    result = _cli("step", "--preset", name, "--batch", "1", "--seq", "2048")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    refused = _cli("step", "--preset", name, "--tp", "2")
    assert refused.returncode == 2 and refused.stdout == "" and len(refused.stderr.strip().splitlines()) == 1
    assert "tensor parallelism" in refused.stderr and "Traceback" not in refused.stderr
