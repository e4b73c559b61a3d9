import pytest
import sympy as sp

from memledger.models.architecture import Architecture
from memledger.models.presets import PRESETS, get_preset
from memledger.models.parameters import block_params_expr, param_count_expr
from memledger.core.symbols import F, L, V, d


def test_gpt_block_is_12d2_plus_13d_at_4d():
    assert sp.expand(block_params_expr("gpt").subs(F, 4 * d) - (12 * d**2 + 13 * d)) == 0


def test_llama_formula_from_sources():
    assert sp.expand(param_count_expr("llama") - (L * (4 * d**2 + 3 * d * F + 2 * d) + 2 * V * d + d)) == 0


def test_article_spec_blocks_give_about_6_4b():
    # sources.md: "d_ff = 4d gives ~6.4B in the blocks plus the embeddings"
    blocks = get_preset("article-7b").n_layers * int(block_params_expr("gpt").subs({d: 4096, F: 16384}))
    assert round(blocks / 1e9, 1) == 6.4


@pytest.mark.parametrize("name, published", [
    ("llama2-7b", 6_738_415_616),      # Hugging Face meta-llama/Llama-2-7b-hf parameter count
    ("llama2-13b", 13_015_864_320),    # meta-llama/Llama-2-13b-hf
    ("gpt2", 124_439_808),             # GPT-2 small, as counted by Hugging Face transformers
])
def test_computed_counts_match_published(name, published):
    assert get_preset(name).computed_params == published


def test_article_preset_is_nominal_7e9():
    p = get_preset("article-7b")
    assert p.params == 7 * 10**9 and p.computed_params != p.params
    assert (p.d_model, p.n_layers, p.n_heads, p.d_ff, p.head_dim) == (4096, 32, 32, 4 * 4096, 128)


def test_changing_shape_drops_nominal_count():
    p = get_preset("article-7b").with_changes(n_layers=16)
    assert p.n_params is None and p.params == p.computed_params


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=100, n_layers=2, n_heads=3), "divisible"),
    (dict(d_model=0, n_layers=2, n_heads=1), "d_model must be a positive integer"),
    (dict(d_model=64, n_layers=-2, n_heads=1), "n_layers must be a positive integer"),
    (dict(d_model=64, n_layers=2, n_heads=1, style="bert"), "style"),
])
def test_bad_architecture(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Architecture(**kwargs)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown preset"):
        get_preset("gpt5")


def test_presets_have_descriptions():
    assert {"article-7b", "llama2-7b"} <= set(PRESETS)
    assert all(p.description for p in PRESETS.values())
