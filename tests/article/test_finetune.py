"""Fine-tuning methods on one GPU, against the LoRA and QLoRA papers' own numbers."""
from fractions import Fraction

import sympy as sp

import pytest

from memledger.models.architecture import Architecture
from memledger.article.finetune import ONE_GPU, fits_on, fits_table, methods, parts_table, serving, trainable_params
from memledger.ledger.ledger import Ledger
from memledger.ledger.lora import LoraConfig, LoraLedger, qlora
from memledger.calculators.parts import gpu_parts, gpu_total
from memledger.core.units import GB, MiB

LLAMA = 6_738_415_616                  # the released Llama-2-7b checkpoint


def test_methods_share_one_workload():
    views = methods(seq_len=1024, recompute="full")
    full = views["full, BF16 + AdamW"]
    assert full.totals == Ledger("llama2-7b", seq_len=1024, recompute="full", scope="layers").totals
    assert all(v.seq_len == 1024 and v.recompute == "full" for v in views.values())
    assert trainable_params(full) == LLAMA
    assert trainable_params(views["LoRA r=16, Q and V"]) == 32 * 2 * 16 * (4096 + 4096)
    assert trainable_params(serving()) == 0


def test_cheaper_optimizers_keep_weights_gradients_and_activations():
    views = methods()
    full = gpu_parts(views["full, BF16 + AdamW"])
    for label in ("full, 8-bit Adam", "full, pure BF16 AdamW", "full, 8-bit Adam, no master", "full, BF16 Adafactor"):
        parts = gpu_parts(views[label])
        assert parts["optimizer states"] < full["optimizer states"]
        for kept in ("weights", "gradients", "activations"):
            assert parts[kept] == full[kept], (label, kept)
    # bitsandbytes 8-bit Adam: one byte per m and v plus an fp32 absmax per 256 (2 x (1 + 4/256)),
    # beside the FP32 master copy; tensors under 4096 elements (the RMSNorm weights) keep fp32 states
    eight = gpu_parts(views["full, 8-bit Adam"])["optimizer states"]
    assert abs(Fraction(eight, LLAMA) - (4 + 2 * (1 + Fraction(4, 256)))) < Fraction(1, 1000)


def test_lora_paper_gpt3():
    # Hu et al. 2021, Sec. 7.1: rank 4 on Wq and Wv of GPT-3 175B is an "18M" parameter budget;
    # Sec. 4.2: the frozen model is "350GB" (BF16/FP16 weights)
    gpt3 = LoraLedger("gpt3-175b", LoraConfig(rank=4))
    assert trainable_params(gpt3) // 10**6 == 18
    params = 96 * (12 * 12288**2 + 13 * 12288) + 50257 * 12288 + 2048 * 12288 + 2 * 12288
    frozen = gpu_parts(gpt3)["weights"] - 4 * trainable_params(gpt3)
    assert frozen == 2 * params and round(frozen / 10**9, -1) == 350


def test_qlora_paper_65b_on_one_48gb_gpu():
    # Dettmers et al. 2023, abstract: LLaMA 65B finetuned on a single 48GB GPU (with gradient checkpointing)
    llama65 = Architecture(8192, 80, 64, 22016, 32000, "llama")
    total = gpu_total(LoraLedger(llama65, qlora(), seq_len=512, recompute="full"))
    assert total <= 48 * GB < gpu_total(LoraLedger(llama65, qlora(), seq_len=512))
    assert ONE_GPU["L40S"] >= 46068 * MiB


@pytest.mark.slow
def test_fits_on_and_tables():
    # the capacities nvidia-smi reports: 24,564 MiB (RTX 4090), 46,068 MiB (L40S), 81,920 MiB (A100 80GB)
    # and a fit leaves about 1 GB free (issue 17)
    room = 24564 * MiB - 10**9
    assert fits_on(room) == "RTX 4090, L40S, A100 80GB" and fits_on(room + 1) == "L40S, A100 80GB"
    assert fits_on(81920 * MiB - 10**9 + 1) == "none"
    by_mode = {m: methods(recompute=m) for m in ("none", "full")}
    table = fits_table(by_mode)
    assert table.header[:3] == ("method", "trainable parameters", "GPU total (none)")
    assert [r[0] for r in table.rows] == list(by_mode["none"])
    qlora_row = next(r for r in table.rows if r[0].startswith("QLoRA"))
    assert qlora_row[-1] == "RTX 4090, L40S, A100 80GB"
    parts = parts_table({"QLoRA": by_mode["none"]["QLoRA r=64, every projection"], "serving": serving()})
    assert [r[0] for r in parts.rows] == ["weights", "gradients", "optimizer states", "activations", "KV cache",
                                          "working buffer", "overhead"]


def test_lora_on_q_and_v_drops_the_inputs_of_frozen_projections_only():
    from memledger.article.finetune import activation_changes
    from memledger.core.symbols import B, S, d
    from memledger.ledger.lora import r_sym
    removed, added = activation_changes("llama", LoraConfig(rank=16))
    # PyTorch's linear backward saves its input only for the weight gradient: the output projection's,
    # the MLP's (gate and up share one) and the down projection's inputs go; Q/K/V's input stays (Q and V
    # carry adapters); each adapter adds its B x S x r intermediate A x
    assert [r.name for r in removed] == ["output projection input", "MLP input", "down-projection input"]
    assert [r.name for r in added] == ["LoRA q_proj A output", "LoRA v_proj A output"]
    assert all(r.bytes == 2 * B * S * r_sym for r in added)
    assert removed[0].bytes == 2 * B * S * d
    assert activation_changes("llama", qlora(dropout=False))[0] == []   # every projection adapted: nothing goes


def test_qlora_as_published_keeps_dropout_copies_and_fp32_moments():
    """qlora.py (artidoro/qlora 7f4e95a): optim paged_adamw_32bit (line 198), --lora_dropout 0.1 for 7B; with
    dropout each adapted projection reads a dropped copy of its input (kept with its 1-byte mask), so the plain
    inputs go."""
    from memledger.article.finetune import activation_changes
    from memledger.core.symbols import B, F, S, d
    from memledger.ledger.lora import r_sym
    from memledger.states.recipes import get_recipe
    config = qlora()
    assert config.dropout and config.paged and get_recipe(config.adapter_recipe).bytes_per_param == 2 + 2 + 4 + 4
    removed, added = activation_changes("llama", config)
    gone = sum(r.bytes for r in removed)
    new = sum(r.bytes for r in added)
    assert sp.expand(gone - 2 * B * S * (3 * d + F)) == 0
    assert sp.expand(new - (3 * B * S * (6 * d + F) + 7 * 2 * B * S * r_sym)) == 0      # masks 1 B, copies 2 B


def test_frozen_base_of_qlora_7b():
    from memledger.article.finetune import frozen_base_bytes
    # NF4 projections: 4 bits + an int8 absmax per 64 + an fp32 constant per 64 x 256 (QLoRA Sec. 3),
    # every projection of Llama-2-7b divisible into whole blocks; embeddings, head and norms in BF16
    proj = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
    nf4 = proj // 2 + proj // 64 + 4 * proj // (64 * 256)
    assert frozen_base_bytes(LoraLedger("llama2-7b", qlora())) == nf4 + 2 * (LLAMA - proj)
    assert frozen_base_bytes(LoraLedger("llama2-7b", LoraConfig())) == 2 * LLAMA


def test_dropped_bytes_and_table_at_the_spec():
    from memledger.article.finetune import activation_changes_table, dropped_bytes_per_layer
    # output projection input and MLP input (B x S x d) and the down projection's input (B x S x F), BF16
    assert dropped_bytes_per_layer("llama2-7b", LoraConfig()) == 2 * 2048 * (4096 + 4096 + 11008)
    table = activation_changes_table("llama2-7b", LoraConfig())
    assert [r[0] for r in table.rows] == ["dropped"] * 3 + ["added"] * 2
    assert table.rows[-1][3] == f"{2 * 2048 * 16 / 2**20:.2f} MiB"
