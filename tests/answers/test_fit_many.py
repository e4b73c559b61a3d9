"""fit_many: one vectorized search (the step's peak over arrays) gives what fit gives GPU by GPU."""
import pytest

from memledger.answers.fit import fit, fit_many
from memledger.ledger.hardware import GPU_MEMORY
from memledger.ledger.ledger import Ledger

pytestmark = pytest.mark.slow

MEMORIES = sorted(GPU_MEMORY.values()) + [10**9, 140 * 10**9, 3 * 10**12, 10**15]


@pytest.mark.parametrize("template, vary", [
    (Ledger("llama3-8b", seq_len=4096, zero_stage=3, dp=8, flash_attention=True), "batch"),
    (Ledger("article-7b", recompute="full", offload_optimizer="cpu"), "batch"),           # nominal: max(peak, sum)
    (Ledger("article-7b"), "batch"),                          # nominal, the sum larger than the peak at small B
    (Ledger("gemma-2b", batch_size=1, zero_stage=2, dp=8, flash_attention=True), "seq"),
    (Ledger("qwen2.5-0.5b", recompute="selective"), "batch"),
])
def test_the_same_answers_as_fit(template, vary):
    many = fit_many(template, vary, MEMORIES)
    one = [fit(template, vary, m) for m in MEMORIES]
    keys = ("answer", "measure", "judged_at_answer", "next", "binding")
    assert [{k: r[k] for k in keys} for r in many] == [{k: r[k] for k in keys} for r in one]
    assert any(r["answer"] is None for r in many) and any(r["answer"] and r["answer"] > 100 for r in many)


def test_without_the_peak_it_is_fit():
    template = Ledger("mixtral-8x7b", zero_stage=3, dp=64)
    assert fit_many(template, "batch", [GPU_MEMORY["h200"]])[0]["answer"] == fit(template, "batch",
                                                                              GPU_MEMORY["h200"])["answer"]
    assert fit_many(Ledger("llama2-7b", zero_stage=3), "dp", [GPU_MEMORY["a100-40gb"]])[0]["answer"] == fit(
        Ledger("llama2-7b", zero_stage=3), "dp", GPU_MEMORY["a100-40gb"])["answer"]
