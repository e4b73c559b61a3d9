"""The largest that fits: exact boundaries (fits at the answer, not one step beyond) on the step's peak where
the timeline models the setup and on the ledger's sum elsewhere, the measure each answer names, bad input."""
from dataclasses import replace

import pytest

from memledger.answers.fit import MEASURE, fit
from memledger.ledger.hardware import GPU_MEMORY
from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step
from memledger.core.units import GB

A100 = GPU_MEMORY["a100-80gb"]          # 81,920 MiB, as nvidia-smi reports it
MARGIN = 10**9                          # a fit leaves about 1 GB free (issue 17): less is no fit
ROOM = A100 - MARGIN


def step_peak(ledger):
    """The peak through a path of its own: a Step built directly, not Ledger.peak or the fit's judge."""
    return Step(ledger, "article").peak.bytes


@pytest.mark.slow
@pytest.mark.parametrize("vary, field", [("batch", "batch_size"), ("seq", "seq_len")])
def test_fits_at_the_answer_not_one_beyond_on_the_peak(vary, field):
    template = Ledger("llama2-7b", zero_stage=3, dp=8, flash_attention=True)
    result = fit(template, vary, A100)
    n = result["answer"]
    assert result["measure"] == MEASURE["peak"]
    assert step_peak(replace(template, **{field: n})) <= ROOM < step_peak(replace(template, **{field: n + 1}))
    assert result["judged_at_answer"] == result["peak_at_answer"] <= ROOM
    assert result["next"]["value"] == n + 1 and result["next"]["judged"] > ROOM
    assert "the peak comes in" in result["binding"] and "largest live tensor" in result["binding"]


def test_the_sum_where_the_timeline_does_not_model_the_setup():
    template = Ledger("mixtral-8x7b", zero_stage=3, dp=32, flash_attention=True)     # mixture of experts
    assert template.peak is None
    result = fit(template, "batch", A100)
    n = result["answer"]
    assert result["measure"] == MEASURE["total"] and result["peak_at_answer"] is None
    assert replace(template, batch_size=n).totals["gpu"] <= ROOM < replace(template, batch_size=n + 1).totals["gpu"]
    assert result["judged_at_answer"] == result["total_at_answer"] == result["ledger"].totals["gpu"]
    assert "activations" in result["binding"]


@pytest.mark.slow
def test_the_sum_when_asked_and_the_peak_refused_without_a_timeline():
    template = Ledger("llama2-7b", recompute="full", offload_optimizer="cpu")
    by_sum = fit(template, "batch", A100, measure="total")
    n = by_sum["answer"]
    assert by_sum["measure"] == MEASURE["total"]
    assert replace(template, batch_size=n).totals["gpu"] <= ROOM < replace(template, batch_size=n + 1).totals["gpu"]
    by_peak = fit(template, "batch", A100)
    assert by_peak["measure"] == MEASURE["peak"] and by_peak["answer"] < n       # recomputation raises the peak
    with pytest.raises(ValueError, match="mixture of experts"):
        fit(Ledger("mixtral-8x7b"), "batch", A100, measure="peak")


@pytest.mark.slow
def test_a_nominal_parameter_count_is_judged_by_the_larger_of_peak_and_sum():
    template = Ledger("article-7b", offload_optimizer="cpu")                     # the article's 7x10^9
    result = fit(template, "batch", A100)
    n = result["answer"]
    assert result["measure"] == MEASURE["nominal"]

    def judged(b):
        at = replace(template, batch_size=b)
        return max(step_peak(at), at.totals["gpu"])
    assert judged(n) <= ROOM < judged(n + 1)


@pytest.mark.slow
def test_largest_model_of_a_shape_family():
    result = fit(Ledger("gpt2"), "layers", 24 * GB)                             # learned positions: the sum
    n = result["answer"]
    gpt2 = Ledger("gpt2").arch
    assert result["measure"] == MEASURE["total"]
    assert Ledger(gpt2.with_changes(n_layers=n)).fits(24 * GB)                  # with the margin free
    assert not Ledger(gpt2.with_changes(n_layers=n + 1)).within(24 * GB - MARGIN)
    deep = fit(Ledger("llama2-7b", flash_attention=True, zero_stage=3, dp=8), "layers", A100)
    arch, n = Ledger("llama2-7b").arch, deep["answer"]
    assert deep["measure"] == MEASURE["peak"]
    at = Ledger(arch.with_changes(n_layers=n), flash_attention=True, zero_stage=3, dp=8)
    assert step_peak(at) <= ROOM < step_peak(replace(at, arch=arch.with_changes(n_layers=n + 1)))


@pytest.mark.slow
def test_smallest_dp_and_zero_stage_on_the_peak():
    template = Ledger("llama2-7b", zero_stage=3, flash_attention=True)
    result = fit(template, "dp", A100)
    n = result["answer"]
    assert result["measure"] == MEASURE["peak"]
    assert step_peak(replace(template, dp=n)) <= ROOM < step_peak(replace(template, dp=n - 1))
    stage = fit(Ledger("llama2-7b", dp=8, flash_attention=True), "zero", A100)["answer"]
    assert step_peak(Ledger("llama2-7b", dp=8, zero_stage=stage, flash_attention=True)) <= ROOM
    assert step_peak(Ledger("llama2-7b", dp=8, zero_stage=stage - 1, flash_attention=True)) > ROOM


@pytest.mark.slow
def test_tensor_and_sequence_parallel_peaks_are_whole_bytes():
    """The loss is one scalar on every rank: sequence parallelism does not split it (it once gave half a byte)."""
    template = Ledger("article-7b", tp=8, sequence_parallel=True, scope="layers")
    assert isinstance(template.peak, int)
    result = fit(template, "batch", A100)
    n = result["answer"]

    def judged(b):
        at = replace(template, batch_size=b)
        return max(step_peak(at), at.totals["gpu"])
    assert judged(n) <= ROOM < judged(n + 1)


def test_nothing_fits():
    result = fit(Ledger("mixtral-8x7b"), "batch", A100)
    assert result["answer"] is None and "nothing fits" in result["binding"]


@pytest.mark.parametrize("args, kwargs, error", [
    ((Ledger("gpt2"), "width", A100), {}, "vary must be one of"),
    ((Ledger(n_params=7 * 10**9), "batch", A100), {}, "needs an architecture"),
    ((Ledger("gpt2"), "dp", A100), {}, "ZeRO stage 0"),
    ((Ledger("gpt2"), "batch", 0), {}, "gpu_bytes must be a positive integer"),
    ((Ledger("gpt2"), "batch", A100), {"measure": "mean"}, "measure must be one of"),
])
def test_bad_input(args, kwargs, error):
    with pytest.raises(ValueError, match=error):
        fit(*args, **kwargs)
