"""EleutherAI's "Transformer Math 101" (Anthony, Biderman, Schoelkopf; blog.eleuther.ai/transformer-math, last
updated 2024-10-08): every number its memory sections publish, computed by memledger.

The post publishes rules and bytes per parameter, no worked GB example. No stored copy of the English page
reaches the memory sections, so each number here was read from a translation: the complete Chinese translation
stored as file id 51846161625 (原文链接 blog.eleuther.ai/transformer-math, 原文最后更新 2024-10-08), checked against
the English summary of the memory bullets (44351774649) and two other Chinese transcriptions (53766551515,
59193786935). Section names are the post's. The post's own numbers are written out here; memledger's side comes
from its dtype table, recipes, activation inventory and ledger.
"""
from dataclasses import replace
from fractions import Fraction
from math import ceil

import pytest
import sympy as sp

from memledger.activations.inventory import activation_bytes, inventory
from memledger.models.presets import get_preset
from memledger.calculators import ERRATA, get_convention
from memledger.ledger.ledger import Ledger
from memledger.calculators import transformer_math as tm
from memledger.calculators.base import p_pp
from memledger.core.dtypes import nbytes
from memledger.ledger.inference import Inference
from memledger.states.placement import state_specs
from memledger.answers.parallelism import gather_buffer_bytes
from memledger.answers.pipeline import stage_params
from memledger.states.recipes import get_recipe
from memledger.core.symbols import B, F, H, L, N_d, P, S, d, t

M, O, A, G, N = tm.Model, tm.Optimizer, tm.Activation, tm.Gradient, tm.N

# "Activations and Batch Size" (51846161625, a translation; the same three formulas in 53766551515 and
# 59193786935): sbhL(10 + 24/t + 5as/(ht)), sbhL(10 + 24/t) with selective, 2·sbhL bytes with full recomputation;
# "we assume no sequence parallelism", "activations stored in fp16". s = S, b = B, h = d, a = H.
POST_ACTIVATIONS = {"none": S * B * d * L * (10 + 24 / t + 5 * H * S / (d * t)),
                    "selective": S * B * d * L * (10 + 24 / t), "full": 2 * S * B * d * L}


# --- Inference

@pytest.mark.parametrize("dtype, published", [("int8", 1), ("fp16", 2), ("bf16", 2), ("fp32", 4)])
def test_inference_model_weights_bytes_per_param(dtype, published):
    # "Inference / Model Weights": int8 memory_model = (1 byte/param)·(No. params), fp16 and bf16 2, fp32 4
    # (51846161625, a translation; 44351774649: "int8: 1 byte per param, fp16 and bf16: 2 bytes per param, fp32:
    # 4 bytes per param")
    serving = Inference("llama2-7b", weight_dtype=dtype)
    assert nbytes(dtype) == published
    assert serving.weights == published * serving.arch.params


@pytest.mark.parametrize("dtype", ["int8", "bf16", "fp32"])
def test_inference_total_is_1_2_times_the_weights(dtype):
    # "Total Inference Memory": "Total Memory_Inference ≈ 1.2 × Model Memory" (51846161625, a translation;
    # 44351774649 quotes the formula in English)
    serving = Inference("llama2-7b", weight_dtype=dtype)
    assert tm.INFERENCE_FACTOR == Fraction("1.2")
    assert tm.inference_bytes(serving) == ceil(Fraction("1.2") * serving.weights)


def test_the_inference_heuristic_against_memledgers_rows():
    # The post: the overhead beyond the weights is "typically no more than 20%". memledger's rows (weights, the KV
    # cache, one layer's prefill buffer; no CUDA context) stay under 1.2 x the weights for one 2048-token sequence
    # of LLaMA-2 7B, not for 8 sequences of 8192 tokens, whose KV cache alone is larger than the weights.
    short = Inference("llama2-7b", batch_size=1, seq_len=2048, overhead_bytes=0)
    long = Inference("llama2-7b", batch_size=8, seq_len=8192, overhead_bytes=0)
    assert short.total <= tm.inference_bytes(short)
    assert long.total > tm.inference_bytes(long)
    assert long.rows.bytes_of("KV cache (bf16)") == 2 * 32 * 8 * 8192 * 4096 * 2 > long.weights


# --- Training: bytes per parameter by role

def test_training_model_parameters():
    # "Training / Model Parameters": "pure fp32: (4 bytes/param)", "pure fp16: (2 bytes/param)"; mixed precision
    # (fp16/bf16 and fp32): "(2 bytes/param)", plus a "(4 bytes/param)·(No. params)" copy of the model counted in
    # the optimizer states (51846161625, a translation; 53766551515 the same)
    assert get_recipe("fp32-adamw").role_bytes("param") == 4
    assert nbytes("fp16") == 2 and get_recipe("bf16-pure-adamw").role_bytes("param") == 2    # BF16: fp16's width
    mixed = get_recipe("bf16-adamw")
    assert mixed.role_bytes("param") == 2
    copy = [c.bytes_per_param for c in mixed.components if c.role == "optimizer" and "master" in c.name]
    assert copy == [4]


@pytest.mark.parametrize("recipe, published, parts", [
    ("bf16-adamw", 12, [4, 4, 4]),           # AdamW: fp32 copy 4, momentum 4, variance 4
    ("bf16-adam-8bit", 6, [4, 1, 1]),        # 8-bit optimizers (bitsandbytes): fp32 copy 4, momentum 1, variance 1
    ("bf16-sgd-momentum", 8, [4, 4]),        # SGD-like optimizers with momentum: fp32 copy 4, momentum 4
])
def test_optimizer_states(recipe, published, parts):
    # "Optimizer States" (51846161625, a translation; 44351774649: "AdamW, 12 bytes per param", "8-bit optimizers,
    # 6 bytes per param", "SGD-like optimizer with momentum, 8 bytes per param")
    r = get_recipe(recipe)
    assert [c.bytes_per_param for c in r.components if c.role == "optimizer"] == parts
    assert r.role_bytes("optimizer") == published == sum(parts)


def test_8bit_six_bytes_leave_out_bitsandbytes_block_constants():
    # The post's 6 = 4 + 1 + 1 is memledger's bitsandbytes recipe without its block constants: one fp32 absmax per
    # 256 values of m and of v adds 2 x 4/256 = 1/32 byte per parameter (6.03125), and a tensor of fewer than 4096
    # elements keeps fp32 m and v (4 bytes each, not 1).
    bnb = get_recipe("bf16-adam8bit-bnb")
    assert bnb.role_bytes("optimizer") - 6 == 2 * Fraction(4, 256) == Fraction(1, 32)
    assert bnb.role_bytes("optimizer") - get_recipe("bf16-adam-8bit").role_bytes("optimizer") == Fraction(1, 32)
    m = next(c for c in bnb.components if c.name.startswith("Adam m"))
    assert m.bytes_for(4095) == 4 * 4095 and m.bytes_for(4096) == 4096 + 4 * (4096 // 256)


def test_pure_fp32_adamw_has_no_separate_copy():
    # The post books AdamW's 12 with a 4-byte fp32 copy, which mixed precision needs; in pure fp32 the weights are
    # that copy: memledger keeps 4 + 4 + (12 - 4) = 16 bytes, where the post's parts added up give 4 + 4 + 12 = 20.
    r = get_recipe("fp32-adamw")
    assert r.role_bytes("optimizer") == 12 - 4 and r.bytes_per_param == 4 + 4 + 12 - 4


def test_gradients():
    # "Gradients": "fp32: (4 bytes/param)", "fp16: (2 bytes/param)" (51846161625, a translation; 44351774649:
    # "typically is the model dtype, so 2 or 4 bytes per param")
    assert get_recipe("bf16-adamw-fp32-grads").role_bytes("grad") == get_recipe("fp32-adamw").role_bytes("grad") == 4
    assert get_recipe("bf16-adamw").role_bytes("grad") == nbytes("fp16") == 2


# --- Activations

@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_activation_rules_are_the_inventorys_sum(recompute):
    # The GPT block with dropout at F = 4d (Korthikanti's), fp16 activations, tensor parallel, no sequence
    # parallelism: memledger's itemized inventory sums to the post's rule for every t.
    ours = activation_bytes(inventory(dtype="fp16"), recompute, tp=True).subs(F, 4 * d)
    assert sp.simplify(ours - POST_ACTIVATIONS[recompute]) == 0
    assert sp.simplify(tm.activation_rule(recompute) - POST_ACTIVATIONS[recompute]) == 0
    no_tp = activation_bytes(inventory(), recompute).subs(F, 4 * d)         # BF16, t = 1: 10 + 24 = 34
    assert sp.expand(no_tp - POST_ACTIVATIONS[recompute].subs(t, 1)) == 0


def test_the_t_dependence_is_the_inventorys_split():
    # 10 sbh per layer stays whole on every tensor-parallel rank (norm inputs, dropout masks and the inputs of
    # the column-parallel projections), 24 sbh and the 5as/h scores are split t ways
    rows = inventory(dtype="fp16")
    whole = sum(r.bytes for r in rows if not r.tp_sharded)
    split = sum(r.bytes for r in rows if r.tp_sharded)
    assert sp.expand(whole.subs(F, 4 * d) - 10 * S * B * d) == 0
    assert sp.expand(split.subs(F, 4 * d) - (24 * S * B * d + 5 * H * S**2 * B)) == 0
    with pytest.raises(ValueError, match="recompute"):
        tm.activation_rule("half")


@pytest.mark.parametrize("tp", [1, 2, 8])
def test_the_ledger_books_the_post_activations(tp):
    ledger = Ledger("article-7b", tp=tp, scope="layers")
    assert ledger.group_total("activations") == ledger.evaluate(POST_ACTIVATIONS["none"])


def test_total_training_memory_is_the_ledgers_sum():
    # "Total Training Memory" = Model Memory + Optimizer Memory + Activation Memory + Gradient Memory
    assert tm.RULES["total"] == M + O + A + G
    ledger = Ledger("article-7b", scope="layers", overhead_bytes=0)
    roles = ledger.by_role()
    assert ledger.totals["gpu"] == tm.RULES["total"].subs(
        {M: roles["param"], O: roles["optimizer"], G: roles["grad"], A: ledger.group_total("activations")})
    # the post's bytes: mixed precision 2, AdamW 12, fp16 gradients 2, and its activation rule at t = 1
    assert ledger.totals["gpu"] == (2 + 12 + 2) * 7 * 10**9 + ledger.evaluate(POST_ACTIVATIONS["none"].subs(t, 1))


# --- Sharded optimizers (ZeRO)

# "Sharded Optimizers", mixed precision and Adam (51846161625, a translation; the same in 53766551515 and
# 59193786935): ZeRO-1 Model + Optimizer/No. GPUs + Activation + Gradient; ZeRO-2 Model + Activation +
# (Optimizer + Gradient)/No. GPUs; ZeRO-3 Activation + (Model + Optimizer + Gradient)/No. GPUs + (ZeRO-3 Live
# Params); No. GPUs is the DP degree without pipeline or tensor parallelism. ZeRO-0: "ZeRO disabled".
POST_ZERO = {0: M + O + A + G, 1: M + O / N + A + G, 2: M + A + (O + G) / N, 3: A + (M + O + G) / N + tm.Live}


def _states(recipe, stage):
    """memledger's model states per GPU, symbolic: P parameters on N_d data-parallel ranks, t = 1."""
    return sum(s.expr(exact=False) for s in state_specs(get_recipe(recipe), stage, "none", "none", "article")).subs(t, 1)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("recipe, grad_bytes", [("bf16-adamw", 2), ("bf16-adamw-fp32-grads", 4)])
def test_zero_stages_are_memledgers_sharding(stage, recipe, grad_bytes):
    assert tm.RULES["total" if stage == 0 else f"zero{stage}"] == POST_ZERO[stage]
    post = POST_ZERO[stage].subs({M: 2 * P, O: 12 * P, G: grad_bytes * P, A: 0, tm.Live: 0, N: N_d})
    assert sp.simplify(_states(recipe, stage) - post) == 0


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("name, grad_bytes", [("eleuther", 4), ("eleuther-fp16-grads", 2)])
def test_the_calculator_follows_the_posts_zero_rules(stage, name, grad_bytes):
    # the companion calculator (EleutherAI/cookbook calc_transformer_mem.py), one node of 8 GPUs, no tensor parallelism
    n = 2**33
    est = get_convention(name).estimate(Ledger(n_params=n, dp=8, zero_stage=stage))
    post = POST_ZERO[stage].subs({M: 2 * n, O: 12 * n, G: grad_bytes * n, A: 0, tm.Live: 0, N: 8})
    assert est.total("gpu", "model_states") == post


def test_zero3_live_params_are_memledgers_gathered_unit():
    # The post names "(ZeRO-3 Live Params)" (stage3_max_live_parameters, stage3_prefetch_bucket_size ...) and gives
    # no number; memledger books the least a GPU gathers, one block's 16-bit weights and gradients (LLaMA-2 7B's
    # block, 4d^2 + 3dF + 2d parameters, is larger than its V x d embedding)
    block = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096
    assert gather_buffer_bytes(Ledger("llama2-7b", zero_stage=3, dp=8)) == (2 + 2) * block
    assert gather_buffer_bytes(Ledger("llama2-7b", zero_stage=2, dp=8)) == 0


def test_zero_r_example_without_model_parallelism():
    # "Sharded Optimizers", the ZeRO-R + ZeRO-1 example: its activation term is undivided in 51846161625 (whose
    # translator notes that the post writes no partitioning factor there) and in 53766551515, "Activation Memory /
    # No. GPUs" in 59193786935. The transcriptions disagree: nothing is built on it. With no model parallelism
    # (its Model Memory is undivided) ZeRO's P_a partitions over an MP degree of 1, and memledger's activations do
    # not shrink with data parallelism. The paragraph's "over data parallel ranks" is recorded as an erratum.
    one = Ledger("article-7b", recompute="full", scope="layers")
    eight = replace(one, dp=8, zero_stage=1)
    assert eight.group_total("activations") == one.group_total("activations") == 2 * 2048 * 4096 * 32
    assert any(e.source == tm.BLOG and "ZeRO-R" in e.where for e in ERRATA)


# --- 3D parallelism (LLaMA-2 7B: untied embeddings, so the stages' parameters add up to the model's)

LLAMA, PP, TP = get_preset("llama2-7b"), 4, 8


def _stages(**ledger_options):
    return [Ledger(n_params=stage_params(LLAMA, PP, s), tp=TP, **ledger_options).by_role() for s in range(PP)]


def test_3d_model_memory_is_the_mean_over_memledgers_stages():
    # "3D Parallelism": memory_model w/ parallelism ≈ Model Memory / ((Pipe-Parallel-Size) × (Tensor-Parallel-Size))
    # (51846161625, 53766551515, 59193786935). "≈": the first stage also holds the embedding, the last the output
    # layer; averaged over the stages it is exact.
    assert tm.RULES["model_3d"] == M / (p_pp * t)
    stages = _stages()
    post = tm.RULES["model_3d"].subs({M: 2 * LLAMA.params, p_pp: PP, t: TP})
    assert Fraction(sum(r["param"] for r in stages), PP) == post == Fraction(2 * 6_738_415_616, 4 * 8)
    assert stages[0]["param"] > post


def test_3d_gradients_are_split_by_tp_too():
    # "3D Parallelism": memory_gradients w/ parallelism ≈ Gradient Memory / Pipe-Parallel-Size. memledger splits the
    # gradients like the weights, by pp x tp (a tensor-parallel rank computes its shard's gradients only): the
    # post's rule is tp times what a GPU holds. Recorded as the post's erratum, not a failing test.
    assert tm.RULES["gradients_3d"] == G / p_pp
    stages = _stages()
    post = tm.RULES["gradients_3d"].subs({G: 2 * LLAMA.params, p_pp: PP})
    assert Fraction(sum(r["grad"] for r in stages), PP) * TP == post == Fraction(2 * 6_738_415_616, 4)
    assert any(e.source == tm.BLOG and "3D Parallelism" in e.where for e in ERRATA)


def test_dp_degree_covers_every_gpu_once():
    # "Sharded Optimizers + 3D Parallelism": DP Degree = No. GPUs / ((Pipe-Parallel-Size) × (Tensor-Parallel-Size)),
    # and the 3D-parallel ZeRO-1 total divides Optimizer Memory by No. GPUs. With memledger's dp set to that
    # degree, the optimizer shards of all 256 GPUs (pp stages x tp ranks x dp ranks) add up to AdamW's 12 bytes
    # per parameter once: the mean is Optimizer Memory / No. GPUs.
    gpus = 256
    dp = tm.RULES["dp_degree"].subs({N: gpus, p_pp: PP, t: TP})
    assert dp == gpus // (4 * 8) == 8
    stages = _stages(dp=int(dp), zero_stage=1)
    assert sum(r["optimizer"] for r in stages) * TP * dp == 12 * LLAMA.params
    assert sp.diff(tm.RULES["zero1_3d"], O) == 1 / N


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_3d_activation_memory_over_tp(recompute):
    # "Sharded Optimizers + 3D Parallelism", ZeRO-1 with activation partitioning: Activation Memory /
    # Tensor-Parallel-Size (the three transcriptions agree). With Activation Memory at t = 1 that is Korthikanti's
    # tensor + sequence-parallel row: memledger's inventory with every saved tensor split t ways.
    assert sp.diff(tm.RULES["zero1_3d"], A) == 1 / t
    ours = activation_bytes(inventory(dtype="fp16"), recompute, tp=True, sequence_parallel=True).subs(F, 4 * d)
    assert sp.simplify(ours - POST_ACTIVATIONS[recompute].subs(t, 1) / t) == 0


def test_3d_zero1_total_term_by_term():
    # The whole 3D-parallel ZeRO-1 total as 51846161625 and 59193786935 write it (53766551515 has pp + tp in the
    # first denominator: not used): Model/(pp·tp) + Optimizer/No. GPUs + Activation/tp + Gradient/pp
    assert tm.RULES["zero1_3d"] == M / (p_pp * t) + O / N + A / t + G / p_pp
