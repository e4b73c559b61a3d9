"""Inference memory: weights, the GQA-aware KV cache, the working-buffer convention."""
import pytest
import sympy as sp

from memledger.models.architecture import Architecture
from memledger.models.presets import get_preset
from memledger.activations.serving import kv_cache_expr
from memledger.ledger.inference import Inference
from memledger.core.symbols import B, H, H_kv, L, S, d, d_h


def test_kv_cache_formula():
    # the formula 2 * L * B * S * H_kv * d_head * bytes; multi-head (H_kv = H, d_h = d/H): 2LBSd * bytes
    assert sp.expand(kv_cache_expr(2) - 2 * L * B * S * H_kv * d_h * 2) == 0
    assert sp.expand(kv_cache_expr(2).subs({H_kv: H, d_h: d / H}) - 4 * L * B * S * d) == 0


def test_kv_cache_per_token_matches_vllm_paper():
    # Kwon et al. 2023 (vLLM), Sec. 3: OPT-13B needs "800 KB" per token = 2 x 5120 x 40 x 2 bytes
    opt13b = Architecture(5120, 40, 40, vocab_size=50272)
    kv = Inference(opt13b, batch_size=1, seq_len=1).rows.bytes_of("KV cache (bf16)")
    assert kv == 2 * 5120 * 40 * 2 == 800 * 1024


def test_gqa_shrinks_the_cache_by_the_group_size():
    llama3 = get_preset("llama3-8b")
    gqa = Inference(llama3, 4, 8192).rows.bytes_of("KV cache (bf16)")
    mha = Inference(llama3.with_changes(n_kv_heads=None), 4, 8192).rows.bytes_of("KV cache (bf16)")
    assert mha == 4 * gqa                                  # 32 heads, 8 key/value heads


def test_weights_and_total():
    inf = Inference("llama2-7b", batch_size=1, seq_len=4096)
    rows = {r.name: r.bytes for r in inf.rows}
    assert rows["weights (bf16)"] == 2 * 6_738_415_616
    assert inf.total == sum(rows.values()) and inf.to_dict()["totals"]["gpu"] == inf.total
    assert Inference("llama2-7b", tp=2).rows.bytes_of("weights (bf16)") == 6_738_415_616


@pytest.mark.parametrize("kwargs, error", [(dict(batch_size=0), "batch_size"), (dict(weight_dtype="int3"), "dtype"),
                                           (dict(tp=3), "tp"), (dict(arch=42), "arch")])
def test_bad_input(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error):
        Inference(**{"arch": "llama2-7b", **kwargs})
