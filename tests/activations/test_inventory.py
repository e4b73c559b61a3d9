import pytest
import sympy as sp

from memledger.activations.inventory import (ARTICLE_INVENTORY, RELABELLED, activation_bytes, closed_form, inventory,
                                   per_layer_bytes, quadratic_share)
from memledger.core.symbols import B, F, H, L, S, d

EQ1 = B * S * d * (34 + 5 * H * S / d)     # Korthikanti et al. 2022, Eq. 1, as the article states it


def at_4d(expr):
    return sp.expand(expr.subs(F, 4 * d))


def test_autograd_inventory_sums_to_eq1():
    assert sp.expand(at_4d(per_layer_bytes(inventory())) - EQ1) == 0


def test_article_inventory_sums_to_eq1():
    assert len(ARTICLE_INVENTORY) == 15
    assert sp.expand(sum(r.bytes for r in ARTICLE_INVENTORY) - EQ1) == 0
    assert sp.expand(closed_form() - EQ1) == 0


def test_paper_subtotals():
    rows = inventory()
    attention = sum(r.bytes for r in rows if r.block == "attention" and "Norm" not in r.name)
    mlp = sum(r.bytes for r in rows if r.block == "mlp" and "Norm" not in r.name)
    norms = sum(r.bytes for r in rows if "Norm" in r.name)
    assert sp.expand(attention - (11 * S * B * d + 5 * H * S**2 * B)) == 0
    assert sp.expand(at_4d(mlp) - 19 * S * B * d) == 0
    assert sp.expand(norms - 4 * S * B * d) == 0


def test_same_total_different_rows():
    ours = {r.name for r in inventory()}
    # every article row stands for one autograd tensor of the same size
    by_name = {r.name: r for r in inventory()}
    for r in ARTICLE_INVENTORY:
        assert r.same_as in ours
        assert sp.expand(r.bytes - at_4d(by_name[r.same_as].bytes)) == 0
    assert len({r.same_as for r in ARTICLE_INVENTORY}) == 15
    relabelled = {r.name for r in ARTICLE_INVENTORY if r.name.split(" x ")[0].lower() not in r.same_as.lower()}
    assert set(RELABELLED) <= relabelled


def test_three_quadratic_rows_and_share():
    assert sum(r.quadratic for r in inventory()) == 3
    share = quadratic_share(inventory()).subs(F, 4 * d)
    assert sp.simplify(share - 5 * H * S / (34 * d + 5 * H * S)) == 0


def test_no_dropout():
    # without dropout: two residual masks and the S^2 mask and dropout output disappear
    assert sp.expand(at_4d(per_layer_bytes(inventory(dropout=False))) - B * S * d * (32 + 2 * H * S / d)) == 0


def test_flash_attention_has_no_s_squared():
    expr = at_4d(per_layer_bytes(inventory(flash_attention=True)))
    assert sp.degree(expr, S) == 1
    assert sp.expand(expr - (34 * B * S * d + 4 * B * H * S)) == 0


def test_swiglu_llama_block():
    expr = per_layer_bytes(inventory("swiglu", "RMSNorm", dropout=False))
    # norms 4BSd, Q/K/V input + Q + K + V + out-proj input 10BSd, MLP input 2BSd, four B x S x F tensors
    assert sp.expand(expr - (16 * B * S * d + 8 * B * S * F + 2 * B * H * S**2)) == 0


def test_full_checkpointing():
    assert sp.expand(activation_bytes(inventory(), "full") - L * B * S * d * 2) == 0


def test_selective_drops_quadratic():
    assert sp.expand(at_4d(per_layer_bytes(inventory(), "selective")) - 34 * B * S * d) == 0


def test_linear_in_b_quadratic_in_s():
    expr = at_4d(per_layer_bytes(inventory()))
    assert sp.degree(expr, B) == 1 and sp.degree(expr, S) == 2


@pytest.mark.parametrize("kwargs, message", [(dict(recompute="some"), "recompute"),
                                             (dict(sequence_parallel=True), "tensor parallelism")])
def test_bad_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        per_layer_bytes(inventory(), **kwargs)


def test_bad_mlp():
    with pytest.raises(ValueError, match="mlp"):
        inventory("relu")


# --- real checkpoints: GQA, head size, MoE (keyword options; defaults leave the rows above unchanged) ---

def test_defaults_unchanged_by_new_options():
    assert sp.expand(per_layer_bytes(inventory(gqa=False, head_dim=False, moe=False))
                     - per_layer_bytes(inventory())) == 0


def test_megatron_selective_closed_form_at_any_ffn_width():
    # Megatron-LM theoretical_memory_usage.compute_activation_memory: sbh(18 + 4 ffn/h) per layer
    # (selective recompute; Korthikanti Table 2's 34 at ffn = 4h)
    assert sp.expand(per_layer_bytes(inventory(), "selective") - S * B * d * (18 + 4 * F / d)) == 0


@pytest.mark.slow
def test_gqa_keeps_k_and_v_at_kv_width():
    from memledger.core.symbols import H_kv
    rows = {r.name: r for r in inventory("swiglu", "RMSNorm", dropout=False, gqa=True)}
    assert sp.simplify(rows["K"].bytes - 2 * B * S * d * H_kv / H) == 0
    assert sp.simplify(rows["V"].bytes - 2 * B * S * d * H_kv / H) == 0
    assert rows["Q"].bytes == 2 * B * S * d
    gqa = per_layer_bytes(inventory("swiglu", "RMSNorm", dropout=False, gqa=True))
    mha = per_layer_bytes(inventory("swiglu", "RMSNorm", dropout=False))
    assert sp.simplify(mha - gqa - 4 * B * S * d * (1 - H_kv / H)) == 0
    assert sp.simplify(gqa.subs(H_kv, H) - mha) == 0          # H_kv = H is multi-head attention
    # an eager implementation that repeats K/V to all heads keeps them at full width
    assert sp.expand(per_layer_bytes(inventory("swiglu", "RMSNorm", dropout=False, gqa=True, repeat_kv=True))
                     - mha) == 0


def test_head_dim_widens_q_and_output_projection_input():
    from memledger.core.symbols import d_h
    rows = {r.name: r for r in inventory("swiglu", "RMSNorm", dropout=False, head_dim=True)}
    assert rows["Q"].bytes == 2 * B * S * H * d_h and rows["output projection input"].bytes == 2 * B * S * H * d_h


def test_moe_rows_top_k_dropless_and_capacity():
    from memledger.core.symbols import E, k
    dense = per_layer_bytes(inventory("swiglu", "RMSNorm", dropout=False))
    moe = per_layer_bytes(inventory("swiglu", "RMSNorm", dropout=False, moe=True))
    # the four B x S x F tensors become k x B x S x F (each token visits k experts, dropless),
    # plus routed inputs and outputs (2 x 2kBSd), routing weights 2kBS, fp32 router probabilities 4BSE,
    # int64 top-k indices 8kBS
    expected = dense + 8 * B * S * F * (k - 1) + 4 * k * B * S * d + 2 * k * B * S + 4 * B * S * E + 8 * k * B * S
    assert sp.expand(moe - expected) == 0
    assert sp.expand(moe.subs(k, 1) - dense - 4 * B * S * d - 10 * B * S - 4 * B * S * E) == 0
    padded = per_layer_bytes(inventory("swiglu", "RMSNorm", dropout=False, moe=True, capacity_factor="1.25"))
    assert sp.expand(padded - moe - sp.Rational(1, 4) * (8 * k * B * S * F + 4 * k * B * S * d + 2 * k * B * S)) == 0


@pytest.mark.parametrize("kwargs, message", [(dict(moe=True), "gated MLP"),
                                             (dict(mlp="swiglu", moe=True, capacity_factor=0), "capacity_factor"),
                                             (dict(mlp="swiglu", moe=True, capacity_factor="x"), "capacity_factor")])
def test_bad_moe_options(kwargs, message):
    with pytest.raises(ValueError, match=message):
        inventory(**kwargs)
