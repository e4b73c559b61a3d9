"""LoRA / QLoRA: state bytes, derived activation rows, the QLoRA paper's bits per parameter."""
from fractions import Fraction

import pytest
import sympy as sp

from memledger.activations.inventory import inventory, per_layer_bytes
from memledger.models.presets import get_preset
from memledger.ledger.lora import (
    NF4,
    NF4_DOUBLE_QUANT,
    LoraConfig,
    LoraLedger,
    activation_rows,
    adapter_params,
    qlora,
    r_sym,
    state_rows,
)
from memledger.core.symbols import B, F, S, d


def test_qlora_bits_per_parameter():
    # Dettmers et al. 2023, Sec. 3 "Double Quantization": 32/64 = 0.5 bits of constants without, 8/64 + 32/(64*256)
    # = 0.127 bits with double quantization, a reduction of 0.373 bits per parameter
    single = 8 * (NF4.bytes_per_param - Fraction(1, 2))
    double = 8 * (NF4_DOUBLE_QUANT.bytes_per_param - Fraction(1, 2))
    assert single == Fraction(1, 2)
    assert round(float(double), 3) == 0.127 and round(float(single - double), 3) == 0.373


def test_adapter_parameter_count():
    # r (in + out) per adapted projection and layer: LLaMA-2 7B, r = 16 on q, k, v, o: 32 x 4 x 16 x 8192
    assert adapter_params(get_preset("llama2-7b"), LoraConfig(16, ("q_proj", "k_proj", "v_proj", "o_proj"))) \
        == 32 * 4 * 16 * 8192


def test_frozen_base_has_no_gradients_or_optimizer_state():
    arch = get_preset("llama2-7b")
    rows = state_rows(arch, LoraConfig(8, ("q_proj",)))
    base = [r for r in rows if r[0].startswith("frozen")]
    assert [r[1] for r in base] == ["param"] and base[0][3] == 2 * arch.params
    n = adapter_params(arch, LoraConfig(8, ("q_proj",)))
    assert {r[0].split(": ")[1]: r[3] for r in rows[1:]} == {
        "FP32 parameters": 4 * n, "FP32 gradients": 4 * n, "Adam first moment m": 4 * n,
        "Adam second moment v": 4 * n}


def test_qlora_base_is_nf4_projections_plus_bf16_rest():
    arch = get_preset("llama2-7b")
    rows = {r[0]: r[3] for r in state_rows(arch, qlora())}
    projections = 32 * (4 * 4096 * 4096 + 3 * 4096 * 11008)
    assert rows["frozen NF4 base projections (double-quantized absmax)"] == sum(
        32 * NF4_DOUBLE_QUANT.bytes_for(n) for n in [4096 * 4096] * 4 + [4096 * 11008] * 3)
    assert rows["frozen base weights (bf16; no grads, no states)"] == 2 * (arch.params - projections)


def test_frozen_projection_without_adapter_drops_its_saved_input():
    base = inventory("swiglu", "RMSNorm", False)
    lora = activation_rows("llama", LoraConfig(8, ("q_proj",)))
    dropped = {r.name for r in base} - {r.name for r in lora}
    assert dropped == {"output projection input", "MLP input", "down-projection input"}
    assert "Q/K/V projection input" in {r.name for r in lora}          # A's weight gradient needs x
    extra = sp.expand(per_layer_bytes(lora) - per_layer_bytes(base))
    assert sp.expand(extra - (2 * B * S * r_sym - 2 * B * S * d - 2 * B * S * d - 2 * B * S * F)) == 0


def test_lora_dropout_adds_a_mask_and_a_copy_per_adapted_projection():
    plain = per_layer_bytes(activation_rows("gpt", LoraConfig(4, ("q_proj", "v_proj")), dropout=True))
    dropped = per_layer_bytes(activation_rows("gpt", LoraConfig(4, ("q_proj", "v_proj"), dropout=True), dropout=True))
    # the shared x is no longer kept for q/v; two (mask + dropped copy) per adapted projection instead
    assert sp.expand(dropped - plain - (2 * 3 * B * S * d - 2 * B * S * d)) == 0


def test_lora_ledger_totals_and_roles():
    ledger = LoraLedger("llama2-7b", qlora(), batch_size=2, seq_len=1024)
    data = ledger.to_dict()
    assert data["totals"]["gpu"] == sum(r["bytes"] for r in data["rows"])
    assert data["model_states_by_role"]["grad"] == 2 * data["inputs"]["trainable_params"]


@pytest.mark.parametrize("kwargs, message", [
    ({"rank": 0}, "rank"), ({"targets": ()}, "targets"), ({"base": "int3"}, "base"),
    ({"adapter_recipe": "nope"}, "unknown recipe")])
def test_bad_config(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LoraConfig(**kwargs)


def test_unknown_target_for_style():
    with pytest.raises(ValueError, match="gate_proj are not projections of a gpt block"):
        LoraLedger("gpt2", LoraConfig(4, ("gate_proj",)))
