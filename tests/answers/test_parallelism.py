"""Parallel layouts: per-GPU memory and traffic against the ZeRO paper, Korthikanti et al. (2022),
DeepSpeed's ZeRO-3 estimate and arithmetic written out here."""
from dataclasses import replace

import pytest

from memledger.ledger.ledger import Ledger
from memledger.answers.parallelism import (gather_buffer_bytes, layout_table, layouts, pipeline_sent_bytes,
                                   tensor_sent_bytes, zero_sent_bytes)

P = 7 * 10**9                          # the article's nominal count
D, LAYERS, BSD = 4096, 32, 2048 * 4096
ACT = LAYERS * BSD * 114               # Korthikanti Eq. 1 at the spec, 32 layers
GB = 10**9


def test_zero3_gathers_one_block_of_bf16_weights_and_gradients():
    # DeepSpeed's estimate_zero3_model_states_mem_needs: 4 x largest_layer_params; a GPT block 12d^2 + 13d
    # is larger than the 32000 x d embedding
    assert gather_buffer_bytes(Ledger("article-7b", zero_stage=3, dp=8)) == 4 * (12 * D**2 + 13 * D)
    assert gather_buffer_bytes(Ledger("article-7b", zero_stage=2, dp=8)) == 0
    assert gather_buffer_bytes(Ledger(n_params=P, zero_stage=3, dp=8)) == 0


@pytest.mark.parametrize("stage, factor", [(0, 2), (1, 2), (2, 2), (3, 3)])
def test_data_parallel_traffic(stage, factor):
    # ZeRO Sec. 7: 2 Psi per step for DP and stages 1-2, 3 Psi for stage 3, each x (N-1)/N on a ring; BF16
    assert zero_sent_bytes(Ledger("article-7b", zero_stage=stage, dp=8)) == factor * P * 7 // 8 * 2


def test_tensor_and_pipeline_traffic():
    # Korthikanti Sec. 4.2.2: 4 all-reduces of bsh per layer, 2(t-1)/t each; Megatron's p2p shape s x b x h
    assert tensor_sent_bytes(Ledger("article-7b", tp=8)) == LAYERS * 4 * 2 * BSD * 7 // 8 * 2
    assert tensor_sent_bytes(Ledger("article-7b", tp=8, sequence_parallel=True)) == LAYERS * 8 * BSD * 7 // 8 * 2
    assert pipeline_sent_bytes(Ledger("article-7b")) == 2 * BSD * 2
    assert pipeline_sent_bytes(Ledger("article-7b", tp=8, sequence_parallel=True)) == 2 * BSD * 2 // 8


@pytest.mark.slow
def test_layouts_on_eight_gpus():
    rows = {r.name: r for r in layouts(Ledger("article-7b", scope="layers"), 8, 32)}     # the blocks only
    assert rows["data parallel"].gpu_bytes == 16 * P + ACT + 2 * GB             # nothing of the ledger shrinks
    assert rows["ZeRO-1"].gpu_bytes == 4 * P + 12 * P // 8 + ACT + 2 * GB       # ZeRO: 4 Psi + K Psi / N_d
    assert rows["ZeRO-2"].gpu_bytes == 2 * P + 14 * P // 8 + ACT + 2 * GB       # 2 Psi + (2 + K) Psi / N_d
    assert rows["ZeRO-3"].gpu_bytes == 16 * P // 8 + ACT + 2 * GB               # (4 + K) Psi / N_d
    # Korthikanti Table 2: sbh(10 + 24/t + 5as/(ht)) per layer with TP, sbh(34 + 5as/h)/t with TP + SP
    tp_layer = BSD * (10 + 24 // 8 + 5 * 32 * 2048 // (4096 * 8))
    assert rows["tensor parallel"].gpu_bytes == 16 * P // 8 + LAYERS * tp_layer + 2 * GB
    assert rows["tensor + sequence parallel"].gpu_bytes == 16 * P // 8 + ACT // 8 + 2 * GB
    assert rows["pipeline (1F1B, 32 micro-batches)"].per == "micro-batch"
    text = layout_table(list(rows.values())).text()
    assert "ZeRO-3" in text and "0.806 GB" in text and "36.75 GB per step" in text


def test_layouts_need_a_one_gpu_template():
    with pytest.raises(ValueError, match="one-GPU template"):
        layouts(replace(Ledger("article-7b"), dp=2), 8, 32)
