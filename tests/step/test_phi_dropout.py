"""Phi-2's dropout sites: resid_pdrop 0.1 on the attention and MLP branches, attention_dropout 0.0 and embd_pdrop 0.0
(memledger/models/configs/phi-2.json). transformers' ``PhiAttention`` still calls ``nn.functional.dropout(attn_weights,
p=self.attention_dropout, training=self.training)`` (``models/phi/modeling_phi.py``), and ATen's ``_dropout_impl``
returns its input at p == 0 (``aten/src/ATen/native/Dropout.cpp``: ``if (p == 0 || !train || input.sym_numel() ==
0) return input;``): no mask, no copy. The reference decoder runs that call (``RefConfig(attention_dropout=False)``),
and the step equals MemTracker's run of it to the byte: landmarks, phase peaks, the peak, each block's peaks and the
totals inside each block, op by op. Phi-2's real shape at S 2048: tests/step/test_parallel_slow.py."""
import json
import subprocess
import sys

import pytest
from stepcheck import against_memtracker, peaks_agree

from memledger.models.architecture import Architecture
from memledger.models.hf_config import CONFIG_DIR, load_config
from memledger.models.presets import get_preset

#: Phi's block (memledger/step/parallel.py) with Phi-2's dropout: the residual branches' only.
PHI2 = dict(parallel=True, shared_norm=True, untied=True, head_bias=True, attention_dropout=False)


def _phi(**dropout):
    config = load_config(CONFIG_DIR / "phi-2.json")
    return Architecture.from_hf_config(config | dropout)


def test_phi2_drops_its_residual_branches_only():
    arch = get_preset("phi-2")
    assert arch.dropout and not arch.attention_dropout
    assert _phi(attention_dropout=0.1).attention_dropout                  # a nonzero p: the probabilities too
    assert not _phi(resid_pdrop=0.0).dropout                              # every p 0: no dropout at all


@pytest.mark.slow
@pytest.mark.parametrize("loop, B, S, L, native", [("bf16-pure-adamw", 2, 24, 3, False),
                                                   ("bf16-adamw", 1, 16, 2, True)])
def test_small_phi2_step_is_memtrackers(loop, B, S, L, native):
    step, measured = against_memtracker("gpt", 256, loop, B, S, L, 0.1, "none", family=PHI2, native_dropout=native)
    peaks_agree(step, measured, op_by_op=True)
    assert not any("attention dropout" in r["name"] for r in step.rows)


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_small_phi2_step_recomputed(recompute):
    step, measured = against_memtracker("gpt", 256, "fp32-adamw", 2, 16, 3, 0.1, recompute, family=PHI2, trace=True)
    peaks_agree(step, measured, op_by_op=True)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memledger", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_steps_phi2_without_attention_dropout():
    out = _cli("step", "--preset", "phi-2", "--seq", "2048", "--json")
    assert out.returncode == 0, out.stderr
    names = {r["name"] for r in json.loads(out.stdout)["rows"]}
    assert {"L x attention residual dropout mask", "L x MLP residual dropout mask"} <= names
    assert not any("attention dropout" in n for n in names)
    off = _cli("step", "--preset", "phi-2", "--seq", "2048", "--no-dropout", "--json")
    assert off.returncode == 0, off.stderr
    assert not any("dropout" in r["name"] for r in json.loads(off.stdout)["rows"])
