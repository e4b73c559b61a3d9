"""Our derivations against formulas printed in the literature (cited per test)."""
import pytest
import sympy as sp

from memledger.activations.inventory import inventory, per_layer_bytes
from memledger.activations.flops import training_flops
from memledger.states.placement import zero_formula
from memledger.states.recipes import get_recipe
from memledger.core.symbols import B, F, H, L, N_d, P, S, V, d, t

s, b, h, a = S, B, d, H          # Korthikanti's letters


@pytest.mark.parametrize("setting, kwargs, published", [
    # Korthikanti et al. 2022, Table 2 (bytes per layer)
    ("no parallelism", dict(), s * b * h * (34 + 5 * a * s / h)),
    ("tensor parallel", dict(tp=True), s * b * h * (10 + 24 / t + 5 * a * s / (h * t))),
    ("tensor + sequence parallel", dict(tp=True, sequence_parallel=True), s * b * h * (34 / t + 5 * a * s / (h * t))),
    ("tensor parallel + selective", dict(tp=True, recompute="selective"), s * b * h * (10 + 24 / t)),
    ("tensor + sequence parallel + selective", dict(tp=True, sequence_parallel=True, recompute="selective"),
     s * b * h * 34 / t),
    ("full recompute", dict(recompute="full"), 2 * s * b * h),
])
def test_korthikanti_table_2(setting, kwargs, published):
    ours = per_layer_bytes(inventory(), **kwargs).subs(F, 4 * d)
    assert sp.expand(ours - published) == 0, setting


@pytest.mark.parametrize("stage, published", [
    # Rajbhandari et al. 2020 (ZeRO), Sec. 5 / Figure 1, K = 12
    (0, (2 + 2 + 12) * P), (1, 2 * P + 2 * P + 12 * P / N_d), (2, 2 * P + (2 + 12) * P / N_d),
    (3, (2 + 2 + 12) * P / N_d)])
def test_zero_stages(stage, published):
    assert sp.expand(zero_formula(get_recipe("bf16-adamw"), stage) - published) == 0


def test_zero_paper_7_5b_example():
    # ZeRO Figure 1: 7.5B parameters, N_d = 64: 120 GB baseline, 31.4 GB, 16.6 GB, 1.9 GB
    recipe = get_recipe("bf16-adamw")
    values = [zero_formula(recipe, k).subs({P: 7.5e9, N_d: 64}) / 1e9 for k in range(4)]
    assert [round(float(v), 1) for v in values] == [120.0, 31.4, 16.6, 1.9]


def test_model_flops_korthikanti():
    # Korthikanti et al. 2022, Sec. 6: 72 B L s h^2 (1 + s/(6h) + v/(12hL)); selective: s/(3h)
    assert sp.simplify(training_flops("none") - 72 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))) == 0
    assert sp.simplify(training_flops("selective") - 72 * B * L * s * h**2 * (1 + s / (3 * h) + V / (12 * h * L))) == 0
