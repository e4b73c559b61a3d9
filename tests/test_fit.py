"""The largest that fits: exact boundaries (fits at the answer, not one step beyond), and bad input."""
import pytest

from memledger.fitting import MEASURE, fit
from memledger.ledger import Ledger
from memledger.units import GB

A100 = 80 * GB


@pytest.mark.parametrize("vary, field", [("batch", "batch_size"), ("seq", "seq_len")])
def test_largest_batch_and_sequence_are_exact(vary, field):
    template = Ledger("llama2-7b", zero_stage=3, dp=8, flash_attention=True)
    result = fit(template, vary, A100)
    n = result["answer"]
    assert Ledger("llama2-7b", zero_stage=3, dp=8, flash_attention=True, **{field: n}).fits(A100)
    assert not Ledger("llama2-7b", zero_stage=3, dp=8, flash_attention=True, **{field: n + 1}).fits(A100)
    assert result["next"]["value"] == n + 1 and result["next"]["total"] > A100 >= result["total_at_answer"]
    assert "activations" in result["binding"]


def test_every_answer_names_its_measure():
    result = fit(Ledger("llama2-7b", zero_stage=3, dp=8, flash_attention=True), "batch", A100)
    assert result["measure"] == MEASURE
    if MEASURE == "the ledger's GPU total":
        assert result["total_at_answer"] == result["ledger"].totals["gpu"]


def test_largest_model_of_a_shape_family():
    result = fit(Ledger("gpt2"), "layers", 24 * GB)
    n = result["answer"]
    gpt2 = Ledger("gpt2").arch
    assert Ledger(gpt2.with_changes(n_layers=n)).fits(24 * GB)
    assert not Ledger(gpt2.with_changes(n_layers=n + 1)).fits(24 * GB)


def test_smallest_dp_and_zero_stage():
    result = fit(Ledger("llama2-7b", zero_stage=3, flash_attention=True), "dp", A100)
    n = result["answer"]
    assert Ledger("llama2-7b", zero_stage=3, dp=n, flash_attention=True).fits(A100)
    assert not Ledger("llama2-7b", zero_stage=3, dp=n - 1, flash_attention=True).fits(A100)
    stage = fit(Ledger("llama2-7b", dp=8, flash_attention=True), "zero", A100)["answer"]
    assert Ledger("llama2-7b", dp=8, zero_stage=stage, flash_attention=True).fits(A100)
    assert not Ledger("llama2-7b", dp=8, zero_stage=stage - 1, flash_attention=True).fits(A100)


def test_nothing_fits():
    result = fit(Ledger("mixtral-8x7b"), "batch", A100)
    assert result["answer"] is None and "nothing fits" in result["binding"]


@pytest.mark.parametrize("args, error", [
    ((Ledger("gpt2"), "width", A100), "vary must be one of"),
    ((Ledger(n_params=7 * 10**9), "batch", A100), "needs an architecture"),
    ((Ledger("gpt2"), "dp", A100), "ZeRO stage 0"),
    ((Ledger("gpt2"), "batch", 0), "gpu_bytes must be a positive integer"),
])
def test_bad_input(args, error):
    with pytest.raises(ValueError, match=error):
        fit(*args)
