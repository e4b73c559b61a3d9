"""sweep(template, measure="peak"): the step's peak over arrays, equal to Ledger.peak at every configuration."""
from dataclasses import replace

import numpy as np
import pytest

from memledger.ledger.ledger import Ledger, sweep
from memledger.step.sweep import peak_program

TEMPLATES = [
    Ledger("llama2-7b", zero_stage=2, dp=8, offload_optimizer="cpu"),
    Ledger("article-7b", recompute="full"),
    Ledger("llama3-8b", zero_stage=3, recipe="fp32-adamw", flash_attention=True),
    Ledger("gemma-7b", recompute="selective", zero_stage=1, offload_optimizer="nvme", offload_placement="zero-offload"),
    Ledger("qwen2.5-0.5b", recipe="bf16-pure-adamw", batch_size=1),
]


def exact(template, **values):
    return replace(template, **{k: int(v) for k, v in values.items()}).peak


@pytest.mark.slow
@pytest.mark.parametrize("template", TEMPLATES, ids=lambda t: f"{t.recipe}-zero{t.zero_stage}-{t.recompute}")
def test_the_peak_of_every_configuration(template):
    rng = np.random.default_rng(18)
    n = 400
    arrays = dict(batch_size=rng.choice([1, 1, 2, 3, 17, 64, 1000], n), seq_len=rng.integers(1, 40000, n),
                  dp=rng.choice([1, 2, 3, 7, 8, 1024, 10**6], n), overhead_bytes=rng.integers(0, 10**10, n))
    peaks = sweep(template, measure="peak", **arrays)["gpu"]
    assert peaks.dtype == np.int64 and peaks.shape == (n,)
    for i in range(n):
        assert peaks[i] == exact(template, **{k: v[i] for k, v in arrays.items()}), i


@pytest.mark.slow
def test_beyond_int64_it_stays_exact():
    template = Ledger("llama2-7b", zero_stage=3)
    batch = np.array([1, 2, 10**12, 10**18], dtype=np.int64)
    peaks = sweep(template, measure="peak", batch_size=batch, seq_len=np.array([2048, 32768, 32768, 32768]))["gpu"]
    assert peaks.dtype == object
    assert list(peaks) == [exact(template, batch_size=b, seq_len=s) for b, s in zip(batch, [2048, 32768, 32768, 32768])]
    assert peaks[-1] > 2**80


@pytest.mark.slow
def test_broadcasting_and_a_grid():
    template = Ledger("mistral-7b", zero_stage=2)
    b, s = np.meshgrid(np.arange(1, 9), np.array([512, 4096]), indexing="ij")
    peaks = sweep(template, measure="peak", batch_size=b, seq_len=s, dp=8)["gpu"]
    assert peaks.shape == (8, 2)
    assert peaks[7, 1] == exact(template, batch_size=8, seq_len=4096, dp=8)


@pytest.mark.slow
def test_few_ops_can_be_the_peak():
    """The exact dominance test leaves a fraction of the ops to evaluate (the speed of the sweep)."""
    from memledger.activations.backends import get_backend
    from memledger.step.structure import StepStructure, step_values
    ledger = Ledger("llama2-7b", recompute="full", batch_size=2)
    fixed = tuple(sorted((k, v) for k, v in step_values(ledger).items() if k not in ("B", "S")))
    program = peak_program(StepStructure.of(ledger, get_backend("article")), fixed, ("B", "S"))
    assert program.candidates < len(program.rows) / 4


def test_refusals_name_the_reason():
    with pytest.raises(ValueError, match="keep the step's structure: batch_size, seq_len, dp, overhead_bytes"):
        sweep(Ledger("llama2-7b"), measure="peak", d_model=np.array([4096]))
    with pytest.raises(ValueError, match="mixture of experts"):
        sweep(Ledger("mixtral-8x7b"), measure="peak", batch_size=np.array([1, 2]))
    with pytest.raises(ValueError, match="batch_size must hold whole numbers >= 1"):
        sweep(Ledger("llama2-7b"), measure="peak", batch_size=np.array([0, 2]))
    with pytest.raises(ValueError, match="measure must be one of total, peak"):
        sweep(Ledger("llama2-7b"), measure="sum", batch_size=np.array([1]))


@pytest.mark.slow
@pytest.mark.parametrize("template", [Ledger("llama2-7b", zero_stage=2, dp=8, offload_optimizer="cpu"),
                                      Ledger("gemma-2b", zero_stage=3, recompute="full")], ids=["zero2", "zero3"])
def test_wide_ranges_where_every_kind_of_op_peaks(template):
    """Log-uniform B, S and dp over many decades: gradients, activations, logits and the optimizer each peak
    somewhere, so every op the dominance test drops is put to the test."""
    rng = np.random.default_rng(20)
    n = 1500
    arrays = dict(batch_size=np.exp(rng.uniform(0, np.log(10**6), n)).astype(np.int64) + 1,
                  seq_len=np.exp(rng.uniform(0, np.log(10**5), n)).astype(np.int64) + 1,
                  dp=np.exp(rng.uniform(0, np.log(10**7), n)).astype(np.int64) + 1)
    peaks = sweep(template, measure="peak", **arrays)["gpu"]
    phases = set()
    for i in range(n):
        ledger = replace(template, **{k: int(v[i]) for k, v in arrays.items()})
        assert peaks[i] == ledger.peak, i
        if i % 10 == 0:
            from memledger.step.cache import step_peak
            phases.add(step_peak(ledger)[1])
    assert len(phases) >= 2, phases
