"""What each convention books per parameter and as an activation rule, against the sources' own numbers."""
from fractions import Fraction

import sympy as sp

import pytest

from memledger.models.presets import get_preset
from memledger.calculators import CONVENTIONS, get_convention
from memledger.ledger.ledger import Ledger
from memledger.calculators.base import p_pp
from memledger.calculators.explain import activation_rule, bytes_per_param, comparison_table, spread
from memledger.calculators.megatron import shard_params
from memledger.core.symbols import B, H, L, S, d, t

ARTICLE = get_preset("article-7b")
SETUP = Ledger(ARTICLE, overhead_bytes=0)
P = 7 * 10**9
ACT = 32 * 2048 * 4096 * 114


def per_param(name, setup=SETUP):
    return bytes_per_param(get_convention(name).estimate(setup), setup.params)


@pytest.mark.slow
def test_bytes_per_param_on_one_gpu():
    # sources.md's table: 16 (ZeRO, Transformer Math, Playbook), 18 (HF anatomy, Bekman, Transformer Math's
    # default), 20 (Playbook with FP32 accumulation, DeepSpeed ZeRO-2), accelerate 8 (the optimizer phase)
    expected = {"zero-paper": 16, "playbook": 16, "eleuther-fp16-grads": 16, "hf-anatomy": 18, "bekman": 18,
                "eleuther": 18, "playbook-fp32-accum": 20, "deepspeed-zero2": 20, "deepspeed-zero2-docs": 20,
                "accelerate": 8}
    assert {name: per_param(name) for name in expected} == expected
    # ZeRO-3: 18 sharded + 4 bytes of the largest module (the 32000 x 4096 embedding)
    assert per_param("deepspeed-zero3") == 18 + Fraction(4 * 32000 * 4096, P)


@pytest.mark.slow
def test_megatron_distributed_optimizer_on_eight_gpus():
    # dist_optimizer.md lines 16-20: 18 bytes per parameter, 6 + 12/d with the distributed optimizer
    eight = Ledger(ARTICLE, dp=8)
    shard = ARTICLE.evaluate(shard_params(ARTICLE.features).subs({t: 1, p_pp: 1}))
    for name, per in (("megatron", 18), ("megatron-distopt", 6 + Fraction(12, 8))):
        states = get_convention(name).estimate(eight).total("gpu", "model_states")
        assert abs(Fraction(states, shard) - per) < Fraction(1, 10**9), name


def test_activation_rules():
    assert sp.expand(activation_rule("eleuther", SETUP) - L * S * B * d * (34 + 5 * H * S / d)) == 0  # Eq. 1
    assert activation_rule("zero-paper", SETUP) == 24 * B * S * d * L                                 # ZeRO 3.2
    assert activation_rule("deepspeed-zero2", SETUP) == 0 and activation_rule("hf-anatomy", SETUP) == 0


@pytest.mark.slow
def test_comparison_table_and_spread():
    table = comparison_table(SETUP)
    # 16P + ACT + what the model keeps outside its blocks: token and target ids, the causal mask, the final
    # norm's and the LM head's inputs, the FP32 log-softmax (4BSV) and two FP32 scalars
    outside = 2 * 8 * 2048 + 2048**2 + 2 * 2 * 2048 * 4096 + 4 * 2048 * 32000 + 8
    assert table.rows[0][:5] == ("memledger", "112.00 GB", "16.00", f"{(ACT + outside) / 1e9:.2f} GB",
                                 f"{(16 * P + ACT + outside) / 1e9:.2f} GB")
    assert len(table.rows) == len(CONVENTIONS) + 1
    (low, low_bytes), (high, high_bytes) = spread(SETUP)
    assert (low, low_bytes) == ("accelerate", 8 * P)
    assert (high, high_bytes) == ("playbook-fp32-accum", 20 * P + ACT)


def test_megatron_counts_the_article_shape_without_biases():
    from memledger.calculators.explain import megatron_params
    # L(4d^2 + 2dF + 4d) + Vd + 2d: four d x d and two d x F matrices, two LayerNorms' weights and biases
    # per layer, a tied embedding and the final LayerNorm (theoretical_memory_usage.py lines 82-103)
    assert megatron_params(ARTICLE) == 32 * (4 * 4096**2 + 2 * 4096 * 16384 + 4 * 4096) + 32000 * 4096 + 2 * 4096


def test_states_table_rows_and_per_parameter_bytes():
    from memledger.calculators.explain import states_table
    table = states_table(SETUP, ("hf-anatomy", "deepspeed-zero2"))
    assert [(r[0], r[3]) for r in table.rows] == [("hf-anatomy", "6.00"), ("hf-anatomy", "8.00"),
                                                    ("hf-anatomy", "4.00"), ("deepspeed-zero2", "2.00"),
                                                    ("deepspeed-zero2", "18.00")]
    assert table.rows[-1][2] == "floor(18·P/(G·M))"


def test_sharded_table_on_eight_gpus():
    from memledger.calculators.explain import sharded_table
    table = sharded_table(ARTICLE, gpus=(8,), names=("playbook", "deepspeed-zero2"))
    # ZeRO-1 (Playbook line 878): 2P + 2P + 12P/8; DeepSpeed ZeRO-2: 2P + 18P/8
    assert table.rows == [("8", "38.50 GB", "38.50 GB", "29.75 GB")]


@pytest.mark.slow
def test_printed_lists_each_tools_own_text():
    from memledger.calculators.explain import printed
    text = printed(SETUP, ("deepspeed-zero2", "accelerate", "hf-anatomy"))
    lines = text.splitlines()
    # DeepSpeed prints x / 2^30 as "GB": 20P / 2^30 on one GPU; accelerate 8P / 2^30 (base-1024 "GB")
    assert lines[0].startswith("deepspeed-zero2") and lines[0].endswith(f"{20 * P / 2**30:.2f}GB")
    assert lines[1] == "accelerate       " + f"{8 * P / 2**30:.2f} GB"
    assert len(lines) == 2                           # the HF page prints nothing
    assert max(len(line) for line in printed(SETUP).splitlines()) <= 78
