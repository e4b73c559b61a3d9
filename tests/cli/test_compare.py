"""memledger compare, ledger --convention, ledger --lora-rank/--qlora, --units, roles in the ledger JSON."""
import json

import pytest

from memledger.calculators import get_convention
from memledger.ledger.ledger import Ledger
from memledger.ledger.lora import LoraLedger, qlora
from clicheck import run


@pytest.mark.slow
def test_compare_json_lists_every_convention_with_memledger_first(capsys):
    code, out, _ = run(capsys, "compare", "--preset", "llama2-7b", "--dp", "8", "--zero", "3", "--json")
    data = json.loads(out)["conventions"]
    assert code == 0 and data[0]["name"] == "memledger" and len(data) == 15
    zero3 = next(c for c in data if c["name"] == "deepspeed-zero3")
    expected = get_convention("deepspeed-zero3").estimate(Ledger("llama2-7b", dp=8, zero_stage=3))
    assert zero3["gpu"]["total"] == expected.total("gpu") and zero3["reason"]
    assert zero3["gpu_minus_memledger"] == zero3["gpu"]["total"] - data[0]["gpu"]["total"]


@pytest.mark.slow
def test_compare_text_names_units_and_reasons(capsys):
    code, out, _ = run(capsys, "compare", "--preset", "gpt2", "--units", "MiB")
    assert code == 0 and "MiB" in out and "deepspeed-zero2:" in out and "playbook" in out


def test_convention_json_is_the_python_estimate(capsys):
    code, out, _ = run(capsys, "ledger", "--params", "2851e6", "--largest-layer", "32e6", "--dp", "8",
                       "--zero", "3", "--convention", "deepspeed-zero3", "--json")
    data = json.loads(out)
    assert code == 0 and data["printed"] == "    1.43GB |   6.09GB"      # memory.rst line 96
    assert data["differs"] and data["totals"]["gpu"] == 128_000_000 + 18 * 2851 * 10**6 // 8


def test_convention_text_with_nodes_and_buffer(capsys):
    code, out, _ = run(capsys, "ledger", "--params", "1e9", "--dp", "16", "--nodes", "2", "--buffer-factor", "2",
                       "--convention", "deepspeed-zero2", "--offload-optimizer", "cpu")
    assert code == 0 and f"{10**9 * 64 * 2:,}" in out      # P x max(4 x 16 GPUs, 16) x 2


def test_ledger_json_splits_model_states_by_role(capsys):
    code, out, _ = run(capsys, "ledger", "--preset", "article-7b", "--json")
    data = json.loads(out)
    roles = data["model_states_by_role"]
    assert roles == {"param": 2 * 7 * 10**9, "grad": 2 * 7 * 10**9, "optimizer": 12 * 7 * 10**9}


@pytest.mark.slow
def test_lora_ledger_cli_matches_python(capsys):
    code, out, _ = run(capsys, "ledger", "--preset", "llama2-7b", "--qlora", "--recompute", "full", "--json")
    data = json.loads(out)
    python = LoraLedger("llama2-7b", qlora(), recompute="full").to_dict()
    assert code == 0 and data["totals"] == python["totals"] and data["model_states_by_role"]["grad"] > 0


@pytest.mark.parametrize("units", ["GB", "GiB", "MiB", "TiB"])
def test_units(capsys, units):
    code, out, _ = run(capsys, "ledger", "--preset", "gpt2", "--units", units)
    assert code == 0 and f" {units}" in out


@pytest.mark.parametrize("args, message", [
    (("ledger", "--preset", "gpt2", "--convention", "ds"), "unknown convention 'ds'"),
    (("ledger", "--preset", "gpt2", "--largest-layer", "5"), "--largest-layer is an input of other calculators"),
    (("ledger", "--preset", "gpt2", "--lora-rank", "8", "--dp", "2"), "--dp is not modelled with LoRA"),
    (("ledger", "--preset", "gpt2", "--lora-rank", "0"), "lora_rank must be a positive integer"),
    (("ledger", "--preset", "gpt2", "--lora-rank", "4", "--lora-targets", "gate_proj"), "not projections of a gpt"),
    (("ledger", "--preset", "gpt2", "--lora-rank", "4", "--convention", "playbook"), "cannot be combined"),
    (("ledger", "--preset", "gpt2", "--lora-rank", "4", "--no-double-quant"), "needs --qlora"),
    (("compare", "--preset", "gpt2", "--units", "PB"), "units must be one of GB, GiB, MiB, TiB"),
    (("compare", "--preset", "gpt2", "--buffer-factor", "0.5"),
     "buffer_factor must be a number from 1 to 1000 such as 1.5, got '0.5'"),
    (("compare", "--preset", "gpt2", "--dp", "6", "--nodes", "4"), "must be a multiple of nodes"),
    (("compare", "--preset", "gpt2", "--dp", "8", "--gpus-per-node", "3"), "must equal dp"),
    (("compare", "--preset", "gpt2", "--largest-layer", "-1"), "largest_layer must be a positive integer"),
])
def test_bad_input_one_line_exit_2(capsys, args, message):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and message in err and err.count("\n") == 1


def test_python_ledger_by_role_matches_rows():
    ledger = Ledger("llama2-7b", zero_stage=3, dp=4, offload_optimizer="cpu", offload_params="cpu")
    roles = ledger.by_role()
    assert sum(roles.values()) == ledger.group_total("model_states") and roles["gathered"] > 0
