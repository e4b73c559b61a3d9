"""Fine-tuning recipes, parameter tensors and quantized components, against their sources and PyTorch."""
from fractions import Fraction

import pytest

from memledger.models.features import Features
import sympy as sp

from memledger.models.architecture import Architecture
from memledger.models.presets import get_preset
from memledger.models.parameters import param_count_expr
from memledger.calculators.papers import PLAYBOOK_FP8
from memledger.core.dtypes import nbits
from memledger.ledger.ledger import Ledger
from memledger.states.placement import state_specs
from memledger.states.recipes import ALL_RECIPES, RECIPES, get_recipe
from memledger.states.recipe import Component
from memledger.core.symbols import F, L, N_d, P, V, d, t
from memledger.models.tensors import (
    factored_elements_expr,
    largest_module_params,
    parameter_tensors,
    total_params_expr,
)


@pytest.mark.parametrize("features", [Features("gpt"), Features("gpt", positions=True), Features("llama"),
                                      Features("llama", gqa=True, qkv_bias=True, tied=True)])
def test_tensors_add_up_to_the_parameter_count(features):
    assert sp.expand(total_params_expr(features) - param_count_expr(features)) == 0


def test_largest_module_is_one_module_not_a_block():
    # DeepSpeed stage3.py model_to_params: parameters(recurse=False) of each module
    assert largest_module_params(get_preset("llama2-7b")) == 32000 * 4096
    small_vocab = Architecture(4096, 2, 32, 11008, 100, "llama")
    assert largest_module_params(small_vocab) == 4096 * 11008


def test_bnb_8bit_adam_bytes():
    # bitsandbytes optimizer.py lines 518-529: uint8 state + fp32 absmax per 256-element block, for m and v
    r = get_recipe("bf16-adam8bit-bnb")
    assert r.bytes_per_param == 2 + 2 + 4 + 2 * Fraction(1 + Fraction(4, 256))
    m = r.components[3]
    n = 4096 * 11008 + 7                                        # a tensor that does not fill its last block
    assert m.bytes_for(n) == n + 4 * (n // 256 + bool(n % 256))
    assert get_recipe("bf16-adam8bit-bnb-nomaster").bytes_per_param == 2 + 2 + Fraction(65, 32)


def test_the_articles_table_stays_apart():
    # the chapters iterate over RECIPES; the fine-tuning recipes are in ALL_RECIPES only
    assert "adafactor" not in RECIPES and set(RECIPES) < set(ALL_RECIPES)


def test_transformer_math_8bit_convention_is_unchanged():
    # Transformer Math 101 (sources.md): 8-bit Adam 6 bytes of state, no block constants counted
    assert get_recipe("bf16-adam-8bit").role_bytes("optimizer") == 6


@pytest.mark.parametrize("name", list(PLAYBOOK_FP8)[2:])
def test_fp8_recipes_are_the_playbook_rows(name):
    recipe = {"Transformer engine": "fp8-transformer-engine", "FP8-LM's O3 level": "fp8-lm-o3",
              "DeepSeek-V3": "fp8-deepseek-v3", "Nanotron's FP8": "fp8-nanotron"}[name]
    parts, total = PLAYBOOK_FP8[name]
    comps = get_recipe(recipe).components
    assert sorted(int(c.bytes_per_param) for c in comps) == sorted(parts)
    assert sum(int(c.bytes_per_param) for c in comps) == total


def test_deepseek_v3_keeps_one_scale_per_128x128_block():
    fp8 = next(c for c in get_recipe("fp8-deepseek-v3").components if c.dtype == "fp8")
    assert fp8.bytes_per_param == 1 + Fraction(4, 128 * 128)


def test_adafactor_factored_elements_llama():
    # rows + columns per matrix: q, k, v, o (2d each), gate/up (F + d), down (d + F); norms whole; 2 embeddings
    assert sp.expand(factored_elements_expr("llama") - (L * (3 * F + 13 * d) + 2 * V + 3 * d)) == 0


def test_adafactor_needs_an_architecture():
    with pytest.raises(ValueError, match="give an architecture"):
        Ledger(n_params=10**9, recipe="adafactor")
    assert Ledger("llama2-7b", recipe="adafactor").group_total("model_states") > 8 * get_preset("llama2-7b").params


def test_sub_byte_component_rounds_to_whole_bytes():
    nf4 = Component("NF4", "nf4", "param", "4-bit", constants=((64, "int8"), (64 * 256, "fp32")))
    assert nbits("nf4") == 4
    assert nf4.bytes_for(65) == 33 + 2 + 4
    assert nf4.bytes_per_param == Fraction(1, 2) + Fraction(1, 64) + Fraction(4, 16384)


@pytest.mark.slow
def test_every_recipe_row_is_whole_bytes():
    arch = get_preset("gpt2")
    for name in ALL_RECIPES:
        ledger = Ledger(arch, recipe=name, zero_stage=3, dp=3)
        assert all(isinstance(r.bytes, int) for r in ledger.rows), name


def _torch_model(style):
    import torch
    values = {d: 64, F: 96, V: 50, L: 2}
    params = []
    for tensor in parameter_tensors(style):
        shape = tuple(int(sp.sympify(s).subs(values)) for s in tensor.shape)
        for _ in range(values[L] if tensor.per_layer else 1):
            params.append(torch.nn.Parameter(torch.randn(shape)))
    return params, values


def _state_bytes(optimizer, exclude=("step",)):
    return sum(v.numel() * v.element_size() for s in optimizer.state.values() for k, v in s.items()
               if hasattr(v, "numel") and k not in exclude)


@pytest.mark.slow
@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_adafactor_state_matches_torch(style):
    import torch
    params, values = _torch_model(style)
    for p in params:
        p.grad = torch.randn_like(p)
    opt = torch.optim.Adafactor(params)
    opt.step()
    ours = 4 * factored_elements_expr(style).subs(values)
    assert _state_bytes(opt) == ours                 # row_var + col_var per matrix, variance per vector
    assert all(s["step"].numel() == 1 for s in opt.state.values())   # plus one scalar step per tensor


@pytest.mark.slow
@pytest.mark.parametrize("recipe, make", [
    ("fp32-sgd-momentum", lambda p: __import__("torch").optim.SGD(p, lr=0.1, momentum=0.9)),
    ("fp32-sgd", lambda p: __import__("torch").optim.SGD(p, lr=0.1)),
    ("fp32-adamw", lambda p: __import__("torch").optim.AdamW(p))])
def test_optimizer_states_match_torch(recipe, make):
    import torch
    params, _ = _torch_model("llama")
    for p in params:
        p.grad = torch.randn_like(p)
    opt = make(params)
    opt.step()
    n = sum(p.numel() for p in params)
    rows = state_specs(get_recipe(recipe))
    ours = sp.sympify(sum(r.expr() for r in rows if r.role == "optimizer")).subs({P: n, t: 1, N_d: 1})
    assert _state_bytes(opt) == ours


@pytest.mark.slow
def test_tensors_add_up_for_every_preset():
    from memledger.models.presets import all_presets
    for name, arch in all_presets().items():
        assert arch.evaluate(total_params_expr(arch.features)) == arch.computed_params, name
