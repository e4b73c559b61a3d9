"""Bad input, found by fuzzing the CLI and the API (issue 6): one clear error, never a traceback,
never an accepted nonsense value."""
import subprocess
import sys

import pytest

from memledger.models.architecture import Architecture
from memledger.cli.main import main
from memledger.ledger.ledger import Ledger, sweep

SHAPE = ["ledger", "--hidden", "8", "--layers", "1", "--heads", "8"]


def cli(capsys, *args):
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


CLI_BAD = [
    (SHAPE + ["--ffn", "1", "--tp", "8"], "tp (8) must divide d_model, n_heads and d_ff; it does not divide d_ff (1)"),
    (["ledger", "--preset", "gpt2", "--overhead", "1e1000000"], "overhead"),
    (["ledger", "--preset", "gpt2", "--gpu-memory", "1e999999999GB"], "gpu_memory"),
    (["ledger", "--preset", "gpt2", "--overhead", "2.0000000000000000000000000001"], "whole number of bytes"),
    (["ledger", "--preset", "gpt2", "--overhead", "1e-999999999"], "overhead must be"),
    (["ledger", "--preset", "gpt2", "--batch", "1\n2"], "batch_size"),
    (["ledger", "--preset", "gpt2", "--batch", "\u0663"], "batch_size"),          # Arabic-Indic digit three
    (["ledger", "--preset", "gpt2", "--zero", "\u0663"], "zero_stage"),
    (["ledger", "--preset", "gpt2", "--dp", "\u0663"], "dp"),
    (["ledger", "--preset", "gpt2", "--overhead", "\u0663GB"], "overhead"),
    (["ledger", "--preset", "gpt2", "--batch", "1e19"], "up to 10^18"),
    (["ledger", "--preset", "llama2-7b", "--params", "7e9"], "cannot be combined with --preset"),
    (["ledger", "--params", "7e9", "--sp"], "--sp need an architecture"),
    (["ledger", "--params", "7e9", "--no-dropout"], "--no-dropout need an architecture"),
    (["ledger", "--preset", "gpt2", "--offload-optimizer", "cpu", "--link", "nvme-3"], "NVMe drive, not a host link"),
    (["ledger", "--preset", "gpt2", "--gpu-memory", "h100"], "a100-80gb"),
]


@pytest.mark.parametrize("args, message", CLI_BAD, ids=[" ".join(a) for a, _ in CLI_BAD])
def test_cli_refuses_with_one_line(capsys, args, message):
    code, out, err = cli(capsys, *args)
    assert (code, out) == (2, "")
    assert err.count("\n") == 1 and err.startswith("memledger: error: "), err
    assert message in err


def test_an_argument_with_a_newline_gives_one_line(capsys):
    code, _, err = cli(capsys, "ledger", "--preset", "gpt2\nx")
    assert code == 2 and err.count("\n") == 1 and "unknown preset" in err


def test_help_shows_defaults(capsys):
    with pytest.raises(SystemExit):
        main(["ledger", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for default in ("ZeRO stage: 0, 1, 2, 3 (default: 0)", "data-parallel degree (default: 1)",
                    "tensor-parallel degree (default: 1)", "(default: GB)", "(default: a100-80gb)",
                    "(default: pcie4-x16)"):
        assert default in text


def test_params_alone_says_activations_are_not_included(capsys):
    code, out, _ = cli(capsys, "ledger", "--params", "7e9", "--zero", "3", "--dp", "64")
    assert code == 0 and "fits" in out and "no activations" in out


def run_shell(command):
    return subprocess.run(["bash", "-c", command], capture_output=True, text=True)


@pytest.mark.slow
def test_closed_pipe_and_full_disk_end_without_traceback():
    py = f"{sys.executable} -m memledger"
    piped = run_shell(f"set -o pipefail; {py} ledger --preset gpt2 --json | head -c 10 > /dev/null")
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr
    full = run_shell(f"{py} ledger --preset gpt2 --json > /dev/full")
    assert full.returncode == 1 and "Traceback" not in full.stderr
    assert full.stderr.strip() == "memledger: error: cannot write the output: No space left on device"


API_BAD = [
    (dict(arch=123), TypeError, "arch must be an Architecture"),
    (dict(arch="gpt2", zero_stage=True), ValueError, "zero_stage"),
    (dict(arch="gpt2", zero_stage=2.0), ValueError, "zero_stage"),
    (dict(arch="gpt2", overhead_bytes=True), TypeError, "overhead_bytes"),
    (dict(arch="gpt2", dropout="no"), TypeError, "dropout must be True or False or None"),
    (dict(arch="gpt2", flash_attention=1), TypeError, "flash_attention"),
    (dict(arch="gpt2", recipe=["bf16-adamw"]), TypeError, "recipe must be a name"),
    (dict(n_params=10**400), ValueError, "n_params must be a positive integer up to 10^18"),
    (dict(arch="gpt2", batch_size=2.5), ValueError, "batch_size must be a whole number"),
    (dict(arch="gpt2", seq_len="2048"), TypeError, "seq_len must be an integer"),
    (dict(arch=Architecture(8, 1, 8, 1), tp=8), ValueError, "does not divide d_ff (1)"),
]


@pytest.mark.parametrize("kwargs, error, message", API_BAD, ids=[str(k) for k, _, _ in API_BAD])
def test_api_names_the_field(kwargs, error, message):
    with pytest.raises(error) as info:
        Ledger(**kwargs)
    assert message in str(info.value)


def test_validation_does_not_depend_on_history():
    # a cache once let zero_stage=True through after zero_stage=1 had been used
    Ledger("gpt2", zero_stage=1)
    with pytest.raises(ValueError):
        Ledger("gpt2", zero_stage=True)


def test_counts_accept_whole_floats_as_the_cli_does():
    assert Ledger(n_params=7e9).params == 7 * 10**9
    assert Architecture(4096.0, 32, 32).d_model == 4096


@pytest.mark.parametrize("arrays", [dict(batch_size=[0, -1]), dict(seq_len=[1.5]), dict(dp=[float("nan")])])
def test_sweep_refuses_nonsense(arrays):
    with pytest.raises(ValueError, match=next(iter(arrays))):
        sweep(Ledger("gpt2"), **arrays)
