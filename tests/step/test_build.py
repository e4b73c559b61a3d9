"""The step's tensors carry where they live, and one block program serves every save policy
(memledger/step/build.py, memledger/step/block.py)."""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.models.architecture import Architecture
from memledger.step.vocab import Action, Phase

pytestmark = pytest.mark.slow

SMALL_GPT = Architecture(256, 6, 4, 1024, 1000, "gpt")


@pytest.mark.parametrize("offload", [
    dict(offload_optimizer="cpu"), dict(offload_optimizer="nvme", zero_stage=2, dp=4),
    dict(offload_optimizer="cpu", offload_placement="zero-offload"),
    dict(offload_optimizer="cpu", offload_params="cpu", zero_stage=3, dp=8)])
@pytest.mark.parametrize("recipe", ["bf16-adamw", "bf16-pure-adamw"])
def test_the_optimizer_step_runs_where_the_ledger_keeps_its_states(offload, recipe):
    """ZeRO-Offload (Ren et al. 2021) runs the optimizer step where the optimizer states live: AdamW's
    temporaries and the FP32 gradient copies are on the device the ledger books Adam's moments on, none on the
    GPU; the gradient backward writes is where the ledger books the gradients (the GPU under the article's
    placement, the host under ZeRO-Offload's)."""
    ledger = Ledger("llama2-7b", recipe=recipe, **offload)
    device = {r.name: r.device for r in ledger.rows}
    step = ledger.step("cpu")
    optimizer = [r for r in step.rows if r["phase"] == "optimizer"]
    assert optimizer and {r["device"] for r in optimizer} == {device[next(n for n in device if "second moment" in n)]}
    assert {r["device"] for r in step.rows if r["kind"] == "grad"} == {device["BF16 gradients"]}
    assert step.phase_peaks()["optimizer"] <= step.landmarks["after backward"]["gpu"]


def _block_ops(step, phase, block):
    return [(op.label, op.allocs) for op in step.built.ops
            if op.phase == phase and op.layer == block and op.action is Action.RUN]


@pytest.mark.parametrize("backend", ["article", "cpu"])
@pytest.mark.parametrize("dropout", [False, True])
def test_full_recomputation_reruns_the_blocks_forward(backend, dropout):
    """``checkpoint(block, x)`` re-runs the block's own forward before its backward: under full recomputation
    the first ops of a block's backward are, op for op, the ops the same block runs forward without
    recomputation (the tensors it saves included), up to where recomputation stops."""
    plain, full = (Ledger(SMALL_GPT, batch_size=2, seq_len=64, dropout=dropout, recompute=r).step(backend)
                   for r in ("none", "full"))
    forward, backward = _block_ops(plain, Phase.FORWARD, 1), _block_ops(full, Phase.BACKWARD, 1)
    rerun = backward[:next(i for i, (label, _) in enumerate(backward) if label == "recomputation stops")]
    assert len(rerun) > 10 and rerun == forward[:len(rerun)]
