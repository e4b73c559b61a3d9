"""Parallel-residual blocks in the step against MemTracker's run of the reference decoder: more small shapes (B 1 and
2, BF16, FP32 and FP32 masters, dropout as CPU's F.dropout and as the fused kernel's 1-byte masks, op by op), selective and
full recomputation, an untied GPT head with and without a bias on a sequential block, and pythia-6.9b's and phi-2's
block and vocabulary at B 1, S 2048 on fake tensors (two blocks: any L gives the same program past four; the
presets' step structures are those of the reference shapes checked)."""
import pytest
from stepcheck import against_memtracker, peaks_agree

from memledger.activations.backends import get_backend
from memledger.ledger.ledger import Ledger
from memledger.models.presets import get_preset
from memledger.step.structure import StepStructure

pytestmark = pytest.mark.slow

NEOX = dict(parallel=True, untied=True)
PHI = dict(parallel=True, shared_norm=True, untied=True, head_bias=True)
#: (F, d, H, V) of pythia-6.9b's and phi-2's config.json (memledger/models/configs/)
#: phi-2: resid_pdrop 0.1, attention_dropout 0.0 (the probabilities' dropout at p = 0 keeps nothing)
REAL = {"pythia-6.9b": ((16384, 4096, 32, 50432), NEOX, 0.0),
        "phi-2": ((10240, 2560, 32, 51200), dict(PHI, attention_dropout=False), 0.1)}


@pytest.mark.sample(6)
@pytest.mark.parametrize("family", [NEOX, PHI], ids=["gpt_neox", "phi"])
@pytest.mark.parametrize("loop, B, S, L, dropout, native", [
    ("bf16-pure-adamw", 2, 24, 3, 0.0, False), ("bf16-pure-adamw", 1, 16, 2, 0.1, False),
    ("fp32-adamw", 1, 24, 3, 0.1, False), ("bf16-adamw", 2, 16, 3, 0.1, True), ("fp32-adamw", 2, 16, 2, 0.0, False)])
def test_small_parallel_steps(family, loop, B, S, L, dropout, native):
    step, measured = against_memtracker("gpt", 256, loop, B, S, L, dropout, "none", family=family,
                                        native_dropout=native)
    peaks_agree(step, measured, op_by_op=True)


@pytest.mark.sample(6)
@pytest.mark.parametrize("recompute", ["selective", "full"])
@pytest.mark.parametrize("family", [NEOX, PHI], ids=["gpt_neox", "phi"])
@pytest.mark.parametrize("loop, B, S, L, dropout, native", [
    ("bf16-pure-adamw", 2, 24, 3, 0.0, False), ("fp32-adamw", 1, 24, 3, 0.1, False),
    ("bf16-adamw", 2, 16, 3, 0.1, True), ("bf16-pure-adamw", 2, 16, 2, 0.1, False)])
def test_small_parallel_steps_recomputed(recompute, family, loop, B, S, L, dropout, native):
    """Selective (the attention core under ``checkpoint``) and full recomputation (the block under it): landmarks,
    phase peaks, the peak, each block's peaks and (on these shapes) the totals inside each block."""
    step, measured = against_memtracker("gpt", 256, loop, B, S, L, dropout, recompute, family=family,
                                        native_dropout=native, trace=True)
    peaks_agree(step, measured, op_by_op=True)


@pytest.mark.parametrize("family", [dict(untied=True), dict(untied=True, head_bias=True)], ids=["untied", "bias"])
def test_untied_gpt_head(family):
    step, measured = against_memtracker("gpt", 256, "bf16-pure-adamw", 2, 24, 3, 0.1, "none", family=family)
    peaks_agree(step, measured, op_by_op=True)


@pytest.mark.parametrize("name, recompute", [("pythia-6.9b", "none"), ("phi-2", "none"), ("pythia-6.9b", "full"),
                                             ("phi-2", "selective"), ("phi-2", "full")])
def test_real_shape_step(name, recompute):
    (F_, d_, H, V_), family, dropout = REAL[name]
    step, measured = against_memtracker("gpt", F_, "bf16-adamw", 1, 2048, 2, dropout, recompute, d_=d_, H=H, V_=V_,
                                        family=family)
    peaks_agree(step, measured)
    preset = Ledger(get_preset(name), batch_size=1, seq_len=2048, recipe="bf16-adamw", overhead_bytes=0,
                    recompute=recompute)
    assert StepStructure.of(preset, get_backend("cpu")).shape == step.structure.shape
