import pytest
import sympy as sp

from memledger.states.placement import device_of, elements_per_device, state_specs
from memledger.states.recipes import get_recipe
from memledger.core.symbols import N_d, P, t

ADAMW = get_recipe("bf16-adamw")


def test_baseline_rows_sum_to_16p():
    rows = state_specs(ADAMW)
    assert sp.expand(sum(r.expr() for r in rows).subs(t, 1) - 16 * P) == 0
    assert {r.device for r in rows} == {"gpu"}


def test_shards_are_rounded_up():
    assert elements_per_device(True).subs({P: 7, N_d: 2, t: 1}) == 4
    assert elements_per_device(False, exact=False) == P / t


def test_article_placement_keeps_grads_on_gpu():
    rows = state_specs(ADAMW, offload_optimizer="cpu")
    assert [r.device for r in rows] == ["gpu", "gpu", "cpu", "cpu", "cpu"]


def test_zero_offload_placement_keeps_only_params():
    rows = state_specs(ADAMW, offload_optimizer="cpu", placement="zero-offload")
    gpu = sum(r.expr() for r in rows if r.device == "gpu").subs(t, 1)
    assert gpu == 2 * P     # Ren et al. 2021: 16P -> 2P on the GPU


def test_nvme_optimizer_grads_to_host_memory():
    assert device_of("grad", "nvme", "none", "zero-offload") == "cpu"
    assert device_of("optimizer", "nvme", "none", "zero-offload") == "nvme"


@pytest.mark.parametrize("kwargs, message", [
    (dict(zero_stage=4), "zero_stage must be one of 0, 1, 2, 3"),
    (dict(zero_stage=True), "zero_stage"),
    (dict(offload_optimizer="gpu"), "offload_optimizer must be one of none, cpu, nvme"),
    (dict(offload_params="cpu", zero_stage=2), "offload_params needs zero_stage 3"),
    (dict(placement="somewhere"), "offload_placement"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        state_specs(ADAMW, **kwargs)
