"""Architectures read from Hugging Face config.json files, checked against published parameter counts.

Sources of the published counts (each a count the model's publisher or its
Hub repository states, digit for digit):

* Gemma: Gemma Team 2024, "Gemma: Open Models Based on Gemini Research and
  Technology" (arXiv:2403.08295), Table 2: embedding 524,550,144 and
  non-embedding 1,981,884,416 parameters (2B); 786,825,216 and 7,751,248,896 (7B).
  The paper's embedding counts use its Table 1 vocabulary, 256128; the
  published config.json has ``vocab_size`` 256000, so the embedding check
  uses the paper's vocabulary and the non-embedding check uses the config as is.
* Llama 3 8B, Mistral 7B, Mixtral 8x7B: the model cards give rounded sizes only
  ("8B", "7B", Mixtral paper arXiv:2401.04088 Sec. 2: "47B" total and "13B"
  active). The exact count is the ``metadata.total_size`` of each repository's
  ``model.safetensors.index.json`` over 2 bytes per BF16 parameter:
  meta-llama/Meta-Llama-3-8B 16,060,522,496 B; mistralai/Mistral-7B-v0.1
  14,483,464,192 B; mistralai/Mixtral-8x7B-v0.1 93,405,585,408 B.
* Qwen2.5 7B and 0.5B: the Hub's safetensors metadata parameter counts of
  Qwen/Qwen2.5-7B (7,615,616,512, shown as "7.62B") and Qwen/Qwen2.5-0.5B
  (494,032,768, shown as "0.49B").
* LLaMA-2 7B: 6,738,415,616, the Hugging Face meta-llama/Llama-2-7b-hf count
  (the paper, Touvron et al. 2023, Table 1, rounds to 7B).
* GPT-2 small: 124,439,808, as counted by ``transformers`` for ``gpt2``
  (Radford et al. 2019 print 117M, a count made before the vocabulary change).
* BERT-base uncased: 109,482,240 = ``BertModel(bert-base-uncased).num_parameters()``
  in ``transformers`` (Devlin et al. 2019, Sec. 3, round this to 110M).
"""
import json

import pytest
import sympy as sp

from memledger.models.presets import PRESETS, all_presets, get_preset
from memledger.models.architecture import Architecture
from memledger.models.hf_config import SUPPORTED, load_config, shipped_configs
from memledger.models.parameters import Features, param_parts, swiglu_width
from memledger.core.symbols import H, H_kv, V, d

BF16 = 2

PUBLISHED = {
    "llama3-8b": 16_060_522_496 // BF16,
    "mistral-7b": 14_483_464_192 // BF16,
    "mixtral-8x7b": 93_405_585_408 // BF16,
    "qwen2.5-7b": 7_615_616_512,
    "qwen2.5-0.5b": 494_032_768,
    "llama2-7b": 6_738_415_616,
    "gpt2": 124_439_808,
    "bert-base-uncased": 109_482_240,
}


@pytest.mark.parametrize("name, published", PUBLISHED.items())
def test_config_counts_match_published(name, published):
    path, _, _ = shipped_configs()[name]
    assert Architecture.from_hf_config(path).computed_params == published


def test_safetensors_totals_are_whole_bf16_counts():
    # the exact sources above are byte totals: they must be even to be 2 bytes per parameter
    assert all(total % BF16 == 0 for total in (16_060_522_496, 14_483_464_192, 93_405_585_408))


@pytest.mark.parametrize("name, embedding, non_embedding", [
    ("gemma-2b", 524_550_144, 1_981_884_416),     # Gemma Team 2024, Table 2
    ("gemma-7b", 786_825_216, 7_751_248_896),
])
def test_gemma_against_paper_table_2(name, embedding, non_embedding):
    arch = get_preset(name)
    parts = arch.parts()
    assert parts["embeddings"] == arch.vocab_size * arch.d_model               # tied: one V x d matrix
    assert arch.computed_params - parts["embeddings"] == non_embedding
    paper_vocab = 256128                                                       # Gemma Team 2024, Table 1
    assert arch.with_changes(vocab_size=paper_vocab).parts()["embeddings"] == embedding


def test_mixtral_rounded_counts_of_the_paper():
    arch = get_preset("mixtral-8x7b")
    assert round(arch.computed_params / 1e9) == 47 and round(arch.active_params / 1e9) == 13


def test_shipped_configs_equal_hand_presets():
    for name in ("llama2-7b", "gpt2"):
        path, _, _ = shipped_configs()[name]
        assert Architecture.from_hf_config(path) == PRESETS[name]


def test_every_shipped_config_is_a_preset_and_reads_its_model_type():
    configs = shipped_configs()
    assert set(configs) <= set(all_presets()) and not set(configs) & set(PRESETS) - {"llama2-7b", "gpt2"}
    types = {json.loads(path.read_text())["model_type"] for path, _, _ in configs.values()}
    assert types == set(SUPPORTED)


def test_llama_swiglu_width_rule():
    # Meta's llama/model.py: 2/3 of 4d, times ffn_dim_multiplier, rounded up to multiple_of;
    # the published intermediate sizes of LLaMA-2 7B, 13B and 70B
    assert swiglu_width(4096) == 11008 and swiglu_width(5120) == 13824
    assert swiglu_width(8192, multiple_of=4096, ffn_dim_multiplier=1.3) == 28672
    assert get_preset("llama2-7b").d_ff == json.loads(shipped_configs()["llama2-7b"][0].read_text())[
        "intermediate_size"]


def test_gqa_attention_matches_megatron():
    # Megatron-LM theoretical_memory_usage.py: self_attn_term = 2 h^2 (1 + groups/heads) (no biases)
    attention = param_parts(Features("llama", gqa=True))["attention"]
    from memledger.core.symbols import L
    assert sp.simplify(attention / L - 2 * d**2 * (1 + H_kv / H)) == 0


def test_gqa_mqa_tied_and_positions_change_the_count():
    base = get_preset("mistral-7b")
    mha = base.with_changes(n_kv_heads=None)
    assert mha.computed_params - base.computed_params == base.n_layers * 2 * base.d_model * (4096 - 1024)
    mqa = base.with_changes(n_kv_heads=1)
    assert base.computed_params - mqa.computed_params == base.n_layers * 2 * base.d_model * (1024 - 128)
    tied = base.with_changes(tied_embeddings=True)
    assert base.computed_params - tied.computed_params == base.vocab_size * base.d_model
    gpt2 = get_preset("gpt2")
    assert gpt2.computed_params - gpt2.with_changes(n_positions=0).computed_params == 1024 * 768


def test_bert_parts():
    bert = get_preset("bert-base-uncased")
    parts = bert.parts()
    assert parts["pooler"] == 768**2 + 768
    assert parts["embeddings"] == (30522 + 512 + 2) * 768
    assert not bert.causal and bert.n_token_types == 2


def test_qwen2_biases():
    arch = get_preset("qwen2.5-7b")
    biases = arch.d_model + 2 * arch.kv_heads * arch.head_dim          # Q, K, V biases; O has none
    assert arch.computed_params - arch.with_changes(qkv_bias=False).computed_params == arch.n_layers * biases


def test_moe_parts():
    arch = get_preset("mixtral-8x7b")
    parts = arch.parts()
    assert parts["router"] == arch.n_layers * arch.d_model * 8
    assert parts["MLP"] == arch.n_layers * 8 * 3 * arch.d_model * arch.d_ff
    # a token passes through 2 of the 8 experts; the router is used whole
    assert arch.computed_params - arch.active_params == arch.n_layers * (8 - 2) * 3 * arch.d_model * arch.d_ff


def test_tied_gpt_formula_unchanged():
    assert sp.expand(sum(param_parts("gpt").values()) - sum(param_parts(Features("gpt")).values())) == 0
    assert param_parts("gpt")["embeddings"] == V * d


@pytest.mark.parametrize("config, message", [
    ({"model_type": "falcon"},
     "supported: bert, bloom, gemma, gpt2, gpt_bigcode, gpt_neox, llama, mistral, mixtral, phi, qwen2, t5"),
    ({"model_type": "llama", "hidden_size": 64}, "needs 'num_hidden_layers'"),
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
      "intermediate_size": 128, "vocab_size": 100, "num_key_value_heads": 3}, "divisible by n_kv_heads"),
    ({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
      "intermediate_size": 128, "vocab_size": 100, "attention_bias": True}, "attention_bias"),
    ({"model_type": "llama", "hidden_size": "64", "num_hidden_layers": 2, "num_attention_heads": 8,
      "intermediate_size": 128, "vocab_size": 100}, "config: hidden_size must be a positive integer, got \"64\""),
])
def test_bad_configs(config, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Architecture.from_hf_config(config)


def test_bad_paths(tmp_path):
    with pytest.raises(ValueError, match="cannot read"):
        load_config(tmp_path / "missing.json")
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_config(tmp_path)                      # a directory means its config.json
    with pytest.raises(TypeError, match="config must be"):
        load_config(42)


def test_tp_must_divide_kv_heads():
    with pytest.raises(ValueError, match=r"n_kv_heads \(8\)"):
        get_preset("mistral-7b").check_tp(16)
    get_preset("mistral-7b").check_tp(8)


@pytest.mark.slow
def test_ledger_books_gqa_and_moe_activations():
    from memledger.activations.inventory import activation_bytes, inventory
    from memledger.ledger.ledger import Ledger
    for name, kwargs in (("mistral-7b", dict(gqa=True)), ("mixtral-8x7b", dict(gqa=True, moe=True)),
                         ("gemma-7b", dict(head_dim=True)), ("llama2-7b", {})):
        ledger = Ledger(name, batch_size=2, seq_len=1024, scope="layers")
        expected = ledger.evaluate(activation_bytes(inventory("swiglu", "RMSNorm", False, **kwargs)))
        assert ledger.group_total("activations") == expected
    mha = Ledger(get_preset("mistral-7b").with_changes(n_kv_heads=None))
    assert mha.group_total("activations") > Ledger("mistral-7b").group_total("activations")


def test_repr_of_the_article_models_is_unchanged():
    assert "n_kv_heads" not in repr(get_preset("article-7b")) and "head_size=256" in repr(get_preset("gemma-7b"))


def test_encoder_only_saves_the_gpt_block_inventory():
    from memledger.activations.inventory import activation_bytes, inventory
    from memledger.ledger.ledger import Ledger
    from memledger.answers.pipeline import embedding_rows, output_rows
    bert = Ledger("bert-base-uncased", batch_size=8, seq_len=512)
    assert bert.group_total("activations") == bert.evaluate(activation_bytes(inventory()))
    names = [r.name for r in embedding_rows(get_preset("bert-base-uncased").features)]
    assert "embedding LayerNorm input" in names
    assert [r.name for r in output_rows(get_preset("bert-base-uncased").features)][0].startswith("pooler")
