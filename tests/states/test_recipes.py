import pytest

from memledger.states.recipes import RECIPES, get_recipe
from memledger.states.recipe import ROLES


def test_article_recipe_is_sum_of_components():
    r = get_recipe("bf16-adamw")
    assert [c.bytes_per_param for c in r.components] == [2, 2, 4, 4, 4]   # the article's table
    assert r.bytes_per_param == 16
    assert str(r.bytes_per_param_sum()) == "2 + 2 + 4 + 4 + 4"


@pytest.mark.parametrize("name, total", [("bf16-adamw-fp32-grads", 18), ("bf16-adamw-fp32-accum", 20),
                                         ("fp32-adamw", 16), ("bf16-sgd-momentum", 12), ("bf16-adam-8bit", 10)])
def test_published_conventions(name, total):
    # sources.md, "Model-state conventions of common calculators" and Transformer Math 101
    assert get_recipe(name).bytes_per_param == total


def test_zero_k_is_12_for_adam():
    assert get_recipe("bf16-adamw").role_bytes("optimizer") == 12   # ZeRO's K


def test_optimizer_state_sizes_from_transformer_math_101():
    assert get_recipe("bf16-sgd-momentum").role_bytes("optimizer") == 8
    assert get_recipe("bf16-adam-8bit").role_bytes("optimizer") == 6


def test_every_component_has_a_zero_role_and_source():
    for r in RECIPES.values():
        assert r.source
        assert all(c.role in ROLES for c in r.components)
        assert sum(c.role == "param" for c in r.components) == 1


def test_unknown_recipe():
    with pytest.raises(ValueError, match="unknown recipe 'adam'; known: bf16-adamw"):
        get_recipe("adam")
