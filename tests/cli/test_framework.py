"""``--framework`` and each framework's options on the command line (issue 15): read by ledger, step and fit,
refused elsewhere and with another framework, in one line (exit 2)."""
import json

import pytest
from clicheck import refused, run

pytestmark = pytest.mark.slow

SMALL = ["--hidden", "128", "--layers", "2", "--heads", "4", "--ffn", "512", "--vocab", "2000", "--style", "llama",
         "--batch", "2", "--seq", "16"]


def test_step_names_each_bucket(capsys):
    code, out, err = run(capsys, "step", *SMALL, "--framework", "ddp", "--ddp-bucket-mb", "0.25", "--backend", "cpu",
                         "--overhead", "0", "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    buckets = [r for r in data["rows"] if r["name"].startswith("DDP gradient bucket ")]
    assert len(buckets) > 2 and {r["kind"] for r in buckets} == {"grad"}
    assert {r["name"] for r in buckets} <= {x["name"] for x in data["peak"]["live"]}
    assert data["inputs"]["framework"] == "ddp" and data["inputs"]["ddp_bucket_mb"] == 0.25


def test_ledger_books_the_buckets_and_judges_the_frameworks_peak(capsys):
    code, out, err = run(capsys, "ledger", *SMALL, "--framework", "ddp", "--json")
    data = json.loads(out)
    rows = {r["name"]: r["bytes"] for r in data["rows"]}
    assert rows["DDP gradient buckets"] == rows["BF16 gradients"]
    code, out, err = run(capsys, "step", *SMALL, "--framework", "ddp", "--json")
    assert data["peak"] == json.loads(out)["peak"]["gpu"]
    view = ("--framework", "ddp", "--gradient-as-bucket-view")       # the compiled peak (cache) is the step's
    code, out, err = run(capsys, "ledger", *SMALL, *view, "--json")
    peak = json.loads(out)["peak"]
    code, out, err = run(capsys, "step", *SMALL, *view, "--json")
    assert peak == json.loads(out)["peak"]["gpu"]


def test_options_refused(capsys):
    refused(capsys, "step", *SMALL, "--ddp-bucket-mb", "5", message="ddp_bucket_mb is an option of framework ddp")
    refused(capsys, "ledger", *SMALL, "--gradient-as-bucket-view",
            message="gradient_as_bucket_view is an option of framework ddp")
    refused(capsys, "step", *SMALL, "--framework", "ddp", "--ddp-bucket-mb", "-1", message="number of MiB >= 0")
    refused(capsys, "compare", *SMALL, "--framework", "ddp", message="does not read --framework")
    refused(capsys, "ledger", *SMALL, "--framework", "ddp", "--pp", "2", message="does not read --framework")
    refused(capsys, "fit", *SMALL, "--framework", "ddp", "--vary", "zero", message="framework ddp runs its own ZeRO")
    refused(capsys, "step", *SMALL, "--framework", "ddp", "--zero", "1", message="zero_stage must be 0")


def test_deepspeed_and_megatron_from_source(capsys):
    code, out, err = run(capsys, "ledger", *SMALL, "--framework", "deepspeed", "--zero", "3", "--dp", "8",
                         "--deepspeed-reduce-bucket-size", "2e8", "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    rows = {r["name"]: r for r in data["rows"]}
    assert rows["DeepSpeed IPG bucket (reduce_bucket_size, BF16)"]["bytes"] == 4 * 10 ** 8
    assert rows["DeepSpeed IPG bucket (reduce_bucket_size, BF16)"]["formula"].endswith("(from source)")
    assert {b["live"] for b in data["framework_buffers"]} >= {"whole step", "optimizer step"}
    assert data["totals"]["gpu"] == sum(r["bytes"] for r in data["rows"] if r["device"] == "gpu")
    code, out, err = run(capsys, "ledger", *SMALL, "--framework", "megatron", "--recipe", "bf16-adamw-fp32-grads",
                         "--zero", "1", "--dp", "8", "--megatron-no-gradient-accumulation-fusion")
    assert code == 0 and "Megatron weight gradient before main_grad accumulation" in out
    refused(capsys, "step", *SMALL, "--framework", "deepspeed", "--zero", "1",
            message="the step timeline does not run framework deepspeed")
    refused(capsys, "ledger", *SMALL, "--deepspeed-reduce-bucket-size", "5", message="an option of framework deepspeed")
    refused(capsys, "ledger", *SMALL, "--framework", "ddp", "--megatron-no-gradient-accumulation-fusion",
            message="an option of framework megatron, not of ddp")
    refused(capsys, "ledger", *SMALL, "--framework", "deepspeed", "--zero", "1", "--deepspeed-overlap-comm", "maybe",
            message="on or off")


def test_fit_judges_the_frameworks_peak(capsys):
    """fit --vary batch judges DDP's peak: the buckets (P x 2 bytes, beside the BF16 gradients) on top of the plain
    loop's peak, at every batch."""
    shape = ["--hidden", "1024", "--layers", "4", "--heads", "8", "--style", "llama", "--overhead", "0"]
    judged = {}
    for framework in ("plain", "ddp"):
        code, out, err = run(capsys, "fit", *shape, "--framework", framework, "--vary", "batch", "--gpu-memory", "2GB",
                             "--json")
        assert (code, err) == (0, "")
        judged[framework] = json.loads(out)["next"]["judged"]
    code, out, err = run(capsys, "ledger", *shape, "--framework", "ddp", "--json")
    buckets = {r["name"]: r["bytes"] for r in json.loads(out)["rows"]}["DDP gradient buckets"]
    assert judged["ddp"] - judged["plain"] == buckets > 0
