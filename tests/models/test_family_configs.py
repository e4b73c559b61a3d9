"""The model families of issue 16, read from their published config.json, checked against published counts.

Sources of the published counts (digit for digit):

* Pythia 6.9B (gpt_neox): the EleutherAI/pythia-6.9b model card and the EleutherAI/pythia README, table
  "Naming convention and parameter count": 6,857,302,016 total, 6,444,163,072 non-embedding parameters.
* Phi-2 (phi): the Hub's safetensors metadata of microsoft/phi-2, ``{"F16": 2779683840}`` (the model card
  rounds to "2.7 billion").
* BLOOM 7B1 (bloom): the bigscience/bloom-7b1 model card, "7,069,016,064 parameters".
* StarCoder (gpt_bigcode): Li et al. 2023, "StarCoder: may the source be with you!" (arXiv:2305.06161), Sec. 1:
  "15.5B parameter models"; rounded only, so checked to the published digits.
* T5-base (t5): ``T5ForConditionalGeneration.from_pretrained("t5-base").num_parameters()`` = 222,903,552, as
  KerasHub's preset table records it (``keras_hub/src/models/t5/t5_presets.py``, "t5_base": "params"); T5 1.1
  base (gated-GeLU, untied head) 247,577,856 (the same table, "t5_1.1_base"). Raffel et al. 2020 round to 220M.
"""
import pytest

from memledger.models.architecture import Architecture
from memledger.models.hf_config import load_config, shipped_configs
from memledger.models.presets import get_preset

PUBLISHED = {
    "pythia-6.9b": 6_857_302_016,
    "phi-2": 2_779_683_840,
    "bloom-7b1": 7_069_016_064,
    "t5-base": 222_903_552,
}


@pytest.mark.parametrize("name, published", PUBLISHED.items())
def test_family_counts_match_published(name, published):
    path, _, _ = shipped_configs()[name]
    assert Architecture.from_hf_config(path).computed_params == published


def test_pythia_non_embedding_count():
    arch = get_preset("pythia-6.9b")        # the card's non-embedding count keeps the final LayerNorm
    assert arch.computed_params - arch.parts()["embeddings"] == 6_444_163_072


def test_starcoder_to_the_published_digits():
    assert round(get_preset("starcoder").computed_params / 1e9, 1) == 15.5


def test_t5_v1_1_gated_and_untied():
    config = load_config(shipped_configs()["t5-base"][0])
    v1_1 = dict(config, d_ff=2048, feed_forward_proj="gated-gelu", tie_word_embeddings=False)
    assert Architecture.from_hf_config(v1_1).computed_params == 247_577_856


@pytest.mark.parametrize("name, features", [
    ("pythia-6.9b", dict(parallel=True, shared_norm=False, tied=False, alibi=False)),
    ("phi-2", dict(parallel=True, shared_norm=True, head_bias=True, tied=False)),
    ("bloom-7b1", dict(alibi=True, input_norm=True, positions=False, parallel=False)),
    ("starcoder", dict(gqa=True, positions=True, parallel=False)),
    ("t5-base", dict(encoder_decoder=True, relative_bias=True, gated=False, tied=True)),
])
def test_family_features(name, features):
    f = get_preset(name).features
    assert {key: getattr(f, key) for key in features} == features


def test_family_structure_read_from_config():
    assert get_preset("pythia-6.9b").rotary_fraction == 0.25 and get_preset("phi-2").rotary_fraction == 0.4
    assert get_preset("starcoder").kv_heads == 1
    assert get_preset("bloom-7b1").d_ff == 4 * 4096
    assert not get_preset("pythia-6.9b").dropout and not get_preset("bloom-7b1").dropout
    assert get_preset("phi-2").dropout                     # resid_pdrop 0.1
    assert get_preset("t5-base").n_decoder_layers == 12


def test_older_keys_unchanged():
    # the families' fields enter a formula key only where set: the older presets keep their keys
    assert get_preset("llama2-7b").features.key == tuple(get_preset("llama2-7b").features)[:10]


@pytest.mark.parametrize("config, message", [
    ({"model_type": "phi", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 256, "vocab_size": 100, "qk_layernorm": True}, "qk_layernorm"),
    ({"model_type": "gpt_neox", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
      "intermediate_size": 256, "vocab_size": 100, "rotary_pct": 2}, "rotary_pct"),
    ({"model_type": "t5", "d_model": 64, "num_layers": 2, "num_heads": 4, "d_kv": 16, "d_ff": 256,
      "vocab_size": 100, "feed_forward_proj": "swish"}, "feed_forward_proj"),
    ({"model_type": "bloom", "hidden_size": 64, "n_layer": 2, "n_head": 4, "vocab_size": 100,
      "hidden_dropout": "0.1"}, "hidden_dropout"),
])
def test_bad_family_fields_refused(config, message):
    with pytest.raises(ValueError, match=message):
        Architecture.from_hf_config(config)


@pytest.mark.parametrize("name", list(PUBLISHED) + ["starcoder"])
def test_family_tensors_sum_to_the_count(name):
    # the tensor-by-tensor list (LoRA, Adafactor, ZeRO-3's largest module) holds exactly the counted parameters
    from memledger.models.tensors import module_params_exprs, total_params_expr
    arch = get_preset(name)
    assert arch.evaluate(total_params_expr(arch.features)) == arch.computed_params
    modules = module_params_exprs(arch.features)
    assert ("norm2" in modules) == (name != "phi-2") and ("lm_head" in modules) == (name in ("pythia-6.9b", "phi-2"))
