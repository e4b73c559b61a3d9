"""FSDP2 x TP on a 2-D (dp, tp) mesh (memledger/step/fsdp2_tp.py) against PyTorch's own: ``parallelize_module``
over the "tp" sub-mesh, ``fully_shard`` per block and the root over the "dp" sub-mesh, FSDPMemTracker on rank 0
of a fake world of dp x tp ranks (memledger/pytorch/distributed.py ``fsdp_step(..., tp=t)``). One small case
here (the rest, and LLaMA-2 7B, in test_fsdp2_tp_slow.py), and the setups FSDP2 x TP refuses."""
import pytest

from memledger.ledger.ledger import Ledger
from stepcheck import LLAMA7B, against_fsdp2_tp, landmarks_are_sums_of_rows

#: Small, TP-local dims 0 not multiples of the 2 dp ranks (vocabulary 102/2 = 51 rows, QKV 51, d 34 on dp x tp).
TINY = dict(d=34, L=2, H=2, F=72, V=102, style="llama")


@pytest.mark.slow
def test_small_fsdp2_x_tp_is_fsdp_mem_trackers():
    """dp 2 x tp 2, with sequence parallelism: landmarks, phase peaks and peak to the byte."""
    against_fsdp2_tp(TINY, 1, 8, 2, 2, sequence_parallel=True)


@pytest.mark.slow
def test_units_hold_the_tp_local_shards():
    """No PyTorch: at tp 2 each rank's FP32 shards are about half of those at tp 1 (the norms whole), and the
    step names FSDP2's buffers."""
    one = Ledger(LLAMA7B, batch_size=1, seq_len=4096, framework="fsdp2", dp=4, recipe="fp32-adamw").step("cpu")
    two = Ledger(LLAMA7B, batch_size=1, seq_len=4096, framework="fsdp2", dp=4, tp=2,
                 recipe="fp32-adamw").step("cpu")
    landmarks_are_sums_of_rows(two)
    rows = {r["name"]: r["bytes"] for r in two.rows}
    shards = {r["name"]: r["bytes"] for r in one.rows}["FSDP2 sharded parameters (FP32)"]
    norms = 4 * (2 * 32 + 1) * 4096 // 4            # FP32, on the 4 dp ranks: whole under TP
    assert rows["FSDP2 sharded parameters (FP32)"] == (shards - norms) // 2 + norms
    assert {"FSDP2 all-gather output (BF16)", "FSDP2 reduce-scatter input (FP32)",
            "FSDP2 all-gather output (BF16), root"} <= set(rows)


@pytest.mark.parametrize("options, match", [
    (dict(reshard_after_forward=2), "smaller mesh"),
    (dict(dp_replicate=2), "HSDP x tensor parallelism"),
    (dict(fsdp_cpu_offload=True), "fsdp_cpu_offload with tensor parallelism"),
])
def test_what_fsdp2_x_tp_refuses(options, match):
    with pytest.raises(ValueError, match=match):
        Ledger(LLAMA7B, framework="fsdp2", dp=8, tp=2, recipe="fp32-adamw", **options)


@pytest.mark.slow
def test_the_cli_runs_fsdp2_x_tp(capsys):
    """``memledger step --framework fsdp2 --tp 2`` names the (dp, tp) mesh; an int reshard with --tp is refused
    in one line."""
    from clicheck import refused, run
    code, out, _ = run(capsys, "step", "--preset", "llama2-7b", "--framework", "fsdp2", "--dp", 4, "--tp", 2, "--sp",
                       "--recipe", "fp32-adamw")
    assert code == 0 and "parallelize_module over the tp sub-mesh of a (4, 2) (dp, tp) mesh, sequence parallel" in out
    refused(capsys, "step", "--preset", "llama2-7b", "--framework", "fsdp2", "--dp", 8, "--tp", 2,
            "--reshard-after-forward", 2, message="smaller mesh")
