"""``--framework fsdp2`` and its options on the command line (memledger/cli/options.py, paths.py): read by step
and fit, refused in one line (exit 2) by the sums and wherever the framework is not fsdp2."""
import json

import pytest

from memledger.cli.main import main
from memledger.ledger.ledger import Ledger
from memledger.models.architecture import Architecture
from clicheck import refused

pytestmark = pytest.mark.slow

SMALL = ["--hidden", "64", "--layers", "2", "--heads", "4", "--style", "llama", "--vocab", "128"]
FSDP2 = ["--framework", "fsdp2", "--dp", "8"]


def answered(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert (code, err) == (0, ""), err
    return out


def test_step_honours_every_fsdp2_option(capsys):
    data = json.loads(answered(capsys, "step", *SMALL, *FSDP2, "--fsdp-param-dtype", "none", "--fsdp-reduce-dtype",
                               "bf16", "--no-reshard-after-forward", "--backend", "cpu", "--json"))
    want = Ledger(Architecture(64, 2, 4, style="llama", vocab_size=128), recipe="fp32-adamw", framework="fsdp2",
                  dp=8, fsdp_param_dtype=None, fsdp_reduce_dtype="bf16", reshard_after_forward=False).step("cpu")
    assert data["peak"]["gpu"] == want.peak.bytes
    assert data["inputs"]["framework"] == "fsdp2" and data["inputs"]["recipe"] == "fp32-adamw"
    assert any(r["name"].startswith("FSDP2 unsharded parameters (FP32)") for r in data["rows"])
    text = answered(capsys, "step", *SMALL, *FSDP2)
    assert text.startswith("framework fsdp2: fully_shard per block and the root over 8 ranks")
    hsdp = json.loads(answered(capsys, "step", *SMALL, "--framework", "fsdp2", "--dp", "16", "--dp-replicate", "4",
                               "--json"))
    shard = json.loads(answered(capsys, "step", *SMALL, "--framework", "fsdp2", "--dp", "4", "--json"))
    assert hsdp["peak"]["gpu"] == shard["peak"]["gpu"]        # reduce fp32 = the shards': as FSDP2 over 4


def test_step_reads_the_loss_in_the_root(capsys):
    """``--fsdp-loss-in-root`` reproduces issue 15's 39.37 GB (LLaMA-2 7B, world 8, B 1, S 4096, CPU backend)."""
    args = ["step", "--preset", "llama2-7b", "--batch", "1", "--seq", "4096", *FSDP2, "--backend", "cpu", "--overhead", "0",
            "--json"]
    inside = json.loads(answered(capsys, *args, "--fsdp-loss-in-root"))
    outside = json.loads(answered(capsys, *args))
    assert round(inside["peak"]["gpu"] / 1e9, 2) == 39.37 and round(outside["peak"]["gpu"] / 1e9, 2) < 39.37
    text = answered(capsys, *args[:-1], "--fsdp-loss-in-root")
    assert "the loss inside the root's forward" in text.splitlines()[0]


def test_step_reads_an_int_reshard(capsys):
    data = json.loads(answered(capsys, "step", *SMALL, *FSDP2, "--reshard-after-forward", "2", "--backend", "cpu",
                               "--json"))
    want = Ledger(Architecture(64, 2, 4, style="llama", vocab_size=128), recipe="fp32-adamw", framework="fsdp2",
                  dp=8, reshard_after_forward=2).step("cpu")
    assert data["peak"]["gpu"] == want.peak.bytes
    assert any(r["name"].startswith("FSDP2 post-forward slices (BF16)") for r in data["rows"])
    refused(capsys, "step", *SMALL, *FSDP2, "--reshard-after-forward", "3", message="reshard_after_forward (3) must")
    refused(capsys, "step", *SMALL, *FSDP2, "--reshard-after-forward", "2", "--no-reshard-after-forward",
            message="give one of them")
    refused(capsys, "step", *SMALL, "--reshard-after-forward", "2", message="an option of --framework fsdp2")


def test_step_reads_the_cpu_offload(capsys):
    args = ["step", *SMALL, *FSDP2, "--fsdp-cpu-offload", "--backend", "cpu", "--json"]
    data = json.loads(answered(capsys, *args))
    pageable = json.loads(answered(capsys, *args, "--fsdp-offload-no-pin"))
    want = Ledger(Architecture(64, 2, 4, style="llama", vocab_size=128), recipe="fp32-adamw", framework="fsdp2",
                  dp=8, fsdp_cpu_offload=True).step("cpu")
    assert data["peak"]["gpu"] == pageable["peak"]["gpu"] == want.peak.bytes
    rows = {r["name"]: r["device"] for r in data["rows"]}
    assert rows["FSDP2 sharded parameters (FP32, pinned host memory)"] == "cpu"
    assert "FSDP2 sharded parameters (FP32, host memory)" in {r["name"] for r in pageable["rows"]}
    assert "CPUOffloadPolicy(pin_memory=True)" in answered(capsys, *args[:-1]).splitlines()[0]
    refused(capsys, "step", *SMALL, *FSDP2, "--fsdp-offload-no-pin", message="fsdp_offload_pin_memory is an option")
    refused(capsys, "step", *SMALL, "--fsdp-cpu-offload", message="an option of --framework fsdp2")
    refused(capsys, "step", *SMALL, *FSDP2, "--fsdp-cpu-offload", "--offload-optimizer", "cpu",
            message="CPUOffloadPolicy")


def test_fit_judges_the_fsdp2_peak(capsys):
    data = json.loads(answered(capsys, "fit", *SMALL, *FSDP2, "--vary", "batch", "--json"))
    assert data["measure_key"] == "peak" and data["total_at_answer"] is None
    data = json.loads(answered(capsys, "fit", *SMALL, "--framework", "fsdp2", "--vary", "dp", "--json"))
    assert data["answer"] == 2
    for extra in ([], ["--reshard-after-forward", "2"], ["--fsdp-cpu-offload"], ["--fsdp-loss-in-root"]):
        text = answered(capsys, "fit", *SMALL, *FSDP2, *extra, "--vary", "batch")     # no sum to compare with
        assert "the peak of a training step" in text
    refused(capsys, "fit", *SMALL, "--framework", "fsdp2", "--reshard-after-forward", "2", "--vary", "dp",
            message="int reshard_after_forward (2)")


def test_refused_in_one_line(capsys):
    refused(capsys, "step", *SMALL, "--no-reshard-after-forward", message="--no-reshard-after-forward: an option "
            "of --framework fsdp2")
    refused(capsys, "step", *SMALL, "--fsdp-param-dtype", "bf16", message="--framework fsdp2")
    refused(capsys, "step", *SMALL, *FSDP2, "--fsdp-reduce-dtype", "int8", message="fsdp_reduce_dtype must be")
    refused(capsys, "step", *SMALL, *FSDP2, "--zero", "3", message="zero_stage must be 0")
    refused(capsys, "step", *SMALL, "--framework", "fsdp2", message="dp must be at least 2")
    refused(capsys, "step", *SMALL, *FSDP2, "--recipe", "bf16-adamw", message="recipe must be one of")
    refused(capsys, "step", *SMALL, "--framework", "ddp3", message="framework must be one of")
    refused(capsys, "step", *SMALL, "--dp-replicate", "2", message="--dp-replicate: an option of --framework fsdp2")
    refused(capsys, "step", *SMALL, *FSDP2, "--dp-replicate", "3", message="dp_replicate (3) must divide dp (8)")
    refused(capsys, "step", *SMALL, *FSDP2, "--dp-replicate", "8", message="dp must be at least 2 x dp_replicate")
    refused(capsys, "step", *SMALL, "--fsdp-loss-in-root", message="--fsdp-loss-in-root: an option of --framework fsdp2")
    refused(capsys, "ledger", *SMALL, *FSDP2, message="only the step books")
    refused(capsys, "compare", *SMALL, *FSDP2, message="booked by memledger step only")
