import json
from pathlib import Path
import subprocess
import sys

import pytest

from memledger.ledger.hardware import GPU_MEMORY
from memledger.ledger.ledger import Ledger
from memledger.core.units import GB
from clicheck import run


def ledger_json(capsys, *args):
    code, out, err = run(capsys, "ledger", *args, "--json")
    assert code == 0 and err == ""
    return json.loads(out)


def group_bytes(data, group, device=None):
    return sum(r["bytes"] for r in data["rows"] if r["group"] == group and device in (None, r["device"]))


def test_article_7b(capsys):
    data = ledger_json(capsys, "--preset", "article-7b", "--scope", "layers")     # the blocks, as the article books them
    assert group_bytes(data, "model_states") == 112 * GB           # the article: 112 GB
    assert round(group_bytes(data, "activations") / GB, 1) == 30.6   # the article: 30.6 GB
    assert data["totals"]["gpu"] == sum(r["bytes"] for r in data["rows"])
    assert data["fits"] is False
    code, out, _ = run(capsys, "ledger", "--preset", "article-7b", "--scope", "layers")
    assert "30.60 GB" in out                                       # the article's 30.6 GB
    assert "does not fit: " in out


def test_batch_and_sequence(capsys):
    data = ledger_json(capsys, "--preset", "article-7b", "--batch", "4", "--seq", "4096", "--scope", "layers")
    assert round(group_bytes(data, "activations") / GB) == 417      # the article's table: 417 GB


def test_full_recompute(capsys):
    data = ledger_json(capsys, "--preset", "article-7b", "--recompute", "full", "--scope", "layers")
    assert round(group_bytes(data, "activations") / GB, 2) == 0.54  # L*B*S*d*2 (the article: ~0.5 GB)


def test_offload_split(capsys):
    data = ledger_json(capsys, "--preset", "article-7b", "--recompute", "full", "--offload-optimizer", "cpu",
                       "--scope", "layers")
    assert data["totals"]["cpu"] == 84 * GB                         # the article: 84 GB on the CPU
    assert round(data["totals"]["gpu"] / GB, 1) == 30.5             # the article: ~30.5 GB
    assert data["traffic"]["gpu_to_cpu"] == data["traffic"]["cpu_to_gpu"] == 14 * GB
    assert data["fits"] is True


def test_json_matches_api(capsys):
    data = ledger_json(capsys, "--preset", "llama2-7b", "--zero", "2", "--dp", "8", "--batch", "2")
    api = Ledger("llama2-7b", zero_stage=2, dp=8, batch_size=2)
    assert [r["bytes"] for r in data["rows"]] == [r.bytes for r in api.rows]
    assert data["inputs"]["n_params"] == 6_738_415_616


def test_gpu_by_name_or_size(capsys):
    assert ledger_json(capsys, "--preset", "gpt2", "--gpu-memory", "rtx-4090")["gpu_memory"] == 24564 * 2**20
    assert ledger_json(capsys, "--preset", "gpt2", "--gpu-memory", "40GB")["gpu_memory"] == 40 * GB


def test_scope_model_adds_the_tensors_outside_the_blocks(capsys):
    layers = ledger_json(capsys, "--preset", "article-7b", "--scope", "layers")
    model = ledger_json(capsys, "--preset", "article-7b")
    extra = {r["name"]: r["bytes"] for r in model["rows"]} .keys() - {r["name"] for r in layers["rows"]}
    assert {"input ids", "target ids", "log-softmax output (FP32)", "LM head input"} <= extra
    logsoftmax = next(r["bytes"] for r in model["rows"] if r["name"] == "log-softmax output (FP32)")
    assert logsoftmax == 1 * 2048 * 32000 * 4                        # B*S*V in FP32
    assert model["totals"]["gpu"] - layers["totals"]["gpu"] == sum(r["bytes"] for r in model["rows"]
                                                                   if r["name"] in extra)


@pytest.mark.slow
def test_step_command(capsys):
    args = ("step", "--hidden", "4096", "--layers", "32", "--heads", "32", "--ffn", "16384", "--vocab", "32000",
            "--overhead", "0", "--backend", "cpu", "--no-dropout", "--recipe", "bf16-pure-adamw")
    code, out, _ = run(capsys, *args, "--json")
    data = json.loads(out)
    assert code == 0 and set(data["landmarks"]) == {"before forward", "after forward", "after backward", "after step"}
    assert data["peak"]["phase"] in ("forward", "loss", "backward", "optimizer")
    assert data["peak"]["gpu"] >= max(v["gpu"] for v in data["landmarks"].values())
    code, out, _ = run(capsys, *args)
    assert "peak" in out and "live at the peak" in out
    code, _, err = run(capsys, "step", "--preset", "llama2-7b", "--backend", "tpu")
    assert code == 2 and err.count("\n") == 1 and "backend" in err


def test_params_only(capsys):
    data = ledger_json(capsys, "--params", "7e9")
    assert {r["group"] for r in data["rows"]} == {"model_states", "overhead"}


def test_custom_architecture_and_units(capsys):
    code, out, _ = run(capsys, "ledger", "--hidden", "1024", "--layers", "4", "--heads", "16", "--units", "GiB")
    assert code == 0 and "GiB" in out and "GB " not in out


@pytest.mark.slow
def test_presets_recipes_claims(capsys):
    code, out, _ = run(capsys, "presets", "--json")
    assert code == 0 and json.loads(out)["llama2-7b"]["n_params"] == 6_738_415_616
    code, out, _ = run(capsys, "recipes")
    assert code == 0 and "16 B/param" in out
    code, out, _ = run(capsys, "claims", "--json")
    claims = json.loads(out)
    assert code == 0 and len(claims) >= 60 and all(c["status"] for c in claims)


BAD = [
    (["ledger", "--preset", "article-7b", "--batch", "-1"], "batch_size must be a positive integer up to 10^18, got '-1'"),
    (["ledger", "--preset", "article-7b", "--batch", "0"], "batch_size"),
    (["ledger", "--preset", "article-7b", "--seq", "two"], "seq_len"),
    (["ledger", "--preset", "article-7b", "--batch", "1.5"], "batch_size"),
    (["ledger", "--preset", "unknown"], "unknown preset"),
    (["ledger", "--preset", "article-7b", "--recipe", "lion"], "unknown recipe"),
    (["ledger", "--preset", "article-7b", "--zero", "4"], "zero_stage must be one of 0, 1, 2, 3, got '4'"),
    (["ledger", "--preset", "article-7b", "--zero", "x"], "zero_stage"),
    (["ledger", "--preset", "article-7b", "--zero", "2", "--dp", "0"], "dp must be a positive integer"),
    (["ledger", "--hidden", "4096", "--layers", "32", "--heads", "31"], "divisible by n_heads"),
    (["ledger", "--hidden", "4096", "--layers", "32"], "missing --heads"),
    (["ledger", "--hidden", "-8", "--layers", "32", "--heads", "4"], "d_model"),
    (["ledger", "--params", "0"], "n_params"),
    (["ledger", "--params", "abc"], "n_params"),
    (["ledger", "--params", "7e9", "--batch", "4"], "need an architecture"),
    (["ledger"], "give a model"),
    (["ledger", "--preset", "article-7b", "--recompute", "some"], "recompute"),
    (["ledger", "--preset", "article-7b", "--tp", "3"], "tp (3) must divide"),
    (["ledger", "--preset", "article-7b", "--sp"], "sequence_parallel"),
    (["ledger", "--preset", "article-7b", "--offload-optimizer", "disk"], "offload_optimizer"),
    (["ledger", "--preset", "article-7b", "--offload-params", "cpu"], "needs zero_stage 3"),
    (["ledger", "--preset", "article-7b", "--offload-placement", "x", "--offload-optimizer", "cpu"], "placement"),
    (["ledger", "--preset", "article-7b", "--overhead", "-2GB"], "overhead"),
    (["ledger", "--preset", "article-7b", "--units", "MB"], "units must be one of GB, GiB"),
    (["ledger", "--preset", "article-7b", "--gpu-memory", "lots"], "gpu_memory"),
    (["ledger", "--preset", "article-7b", "--offload-optimizer", "cpu", "--link", "usb"], "unknown link"),
    (["ledger", "--preset", "article-7b", "--style", "bert", "--layers", "2"], "style"),
    (["ledger", "--nonsense"], "unrecognized arguments"),
    (["frobnicate"], "invalid choice"),
    ([], "choose a command"),
]


@pytest.mark.parametrize("args, message", BAD, ids=[" ".join(a) or "nothing" for a, _ in BAD])
def test_bad_input_one_line_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("memledger: error: ")
    assert message in err


def test_api_raises_the_same_message(capsys):
    _, _, err = run(capsys, "ledger", "--preset", "article-7b", "--tp", "3")
    with pytest.raises(ValueError) as info:
        Ledger("article-7b", tp=3)
    assert err.strip() == f"memledger: error: {info.value}"


@pytest.mark.slow
def test_python_m_and_console_script_no_traceback():
    script = str(Path(sys.executable).with_name("memledger"))       # the console script beside python
    for cmd in ([sys.executable, "-m", "memledger"], [script]):
        ok = subprocess.run(cmd + ["ledger", "--preset", "llama2-7b"], capture_output=True, text=True)
        assert ok.returncode == 0 and "activations" in ok.stdout
        bad = subprocess.run(cmd + ["ledger", "--preset", "llama2-7b", "--batch", "-3"],
                             capture_output=True, text=True)
        assert bad.returncode == 2 and bad.stdout == "" and "Traceback" not in bad.stderr
        assert bad.stderr.strip() == "memledger: error: batch_size must be a positive integer up to 10^18, got '-3'"


@pytest.mark.slow
def test_verdict_by_the_steps_peak_or_by_the_sum(capsys):
    ledger = Ledger("llama2-7b")
    peak, total = ledger.step().peak.bytes, ledger.totals["gpu"]
    code, out, _ = run(capsys, "ledger", "--preset", "llama2-7b")
    assert code == 0 and out.splitlines()[-1] == (
        f"does not fit: {(peak - GPU_MEMORY['a100-80gb']) / GB:,.2f} GB over; {peak / GB:,.2f} GB per GPU against "
        f"{GPU_MEMORY['a100-80gb'] / GB:,.2f} GB, the peak of a "
        f"training step (the sum of the rows at the end of the forward pass: {total / GB:,.2f} GB).")
    code, out, _ = run(capsys, "ledger", "--preset", "llama2-7b", "--measure", "total")
    a100 = GPU_MEMORY["a100-80gb"] / GB
    assert code == 0 and out.splitlines()[-1].endswith(
        f"{total / GB:,.2f} GB per GPU against {a100:,.2f} GB, the sum of the rows at the end of the forward pass "
        "(as asked; a run fits or fails by its peak: --measure auto, or see memledger step).")
    code, out, _ = run(capsys, "ledger", "--preset", "mixtral-8x7b")   # mixture of experts: not modelled
    assert code == 0 and "the sum of the rows at the end of the forward pass (the step timeline does not model" in out
    data = ledger_json(capsys, "--preset", "llama2-7b", "--gpu-memory", "200GB")
    assert data["peak"] == data["judged_bytes"] == peak and data["fits"] is True and data["measure"] == "peak"
    data = ledger_json(capsys, "--preset", "llama2-7b", "--gpu-memory", f"{peak - 1}B")
    assert data["fits"] is False
    margin = 10**9                      # a fit leaves about a gigabyte free (issue 17): less is no fit
    data = ledger_json(capsys, "--preset", "llama2-7b", "--gpu-memory", f"{peak + margin - 1}B")
    assert data["fits"] is False and data["margin"] == margin
    code, out, _ = run(capsys, "ledger", "--preset", "llama2-7b", "--gpu-memory", f"{peak + margin - 1}B")
    assert out.splitlines()[-1].startswith("no fit: 1.00 GB to spare, under the 1.00 GB margin; ")
    data = ledger_json(capsys, "--preset", "llama2-7b", "--gpu-memory", f"{peak + margin}B")
    assert data["fits"] is True
    data = ledger_json(capsys, "--preset", "llama2-7b", "--measure", "total", "--gpu-memory", f"{peak}B")
    assert data["judged_bytes"] == total and data["fits"] is (total + margin <= peak) and data["peak"] is None


def test_measure_peak_refuses_what_the_timeline_does_not_model(capsys):
    code, _, err = run(capsys, "ledger", "--preset", "mixtral-8x7b", "--measure", "peak")
    assert code == 2 and err.strip().startswith("memledger: error: the step timeline models") and \
        "mixture of experts is not modelled" in err
    code, _, err = run(capsys, "ledger", "--preset", "llama2-7b", "--measure", "sum")
    assert code == 2 and err.strip() == ("memledger: error: measure must be one of auto, peak, total, allocated, "
                                         "reserved, nvidia-smi, run, got 'sum'")
