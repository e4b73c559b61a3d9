"""QLoRA's NF4 forward on both sides of bitsandbytes' 1536-row switch (memledger/step/nf4.py), against MemTracker's
run of the reference (memledger/pytorch/lora.py ``gemm_4bit``): past M = B*S = 1536 rows (or for an input width not a
multiple of 64) ``MatMul4Bit.forward`` runs ``_dequant_linear_fallback`` (two FP32 absmax arrays and the weight
alive through ``F.linear``), at or below it the fused kernel (the output only): bitsandbytes
``backends/cuda/ops.py`` l. 904-914, 926, 954-983 at 95f9af30. A wide model (d 4096, F 64) makes the QKV
projection's dequantized weight the forward's block peak, so each path shows in the bytes compared."""
import pytest

from memledger.states.bnb import GEMM_4BIT_CUSTOM_MAX_M, nf4_gemm_fallback

from stepcheck import LORA_7B, LORA_QV as QV, LORA_SMALL as SMALL, lora_against_memtracker

WIDE = dict(d=4096, L=2, H=32, F=64, V=1000)


def test_the_switch_is_bitsandbytes_1536_rows_and_the_blocksize():
    """``_gemm_4bit_custom_max_m = 1536`` (CUDA) and ``K % blocksize != 0`` (blocksize 64) send gemm_4bit to the
    fallback."""
    assert GEMM_4BIT_CUSTOM_MAX_M == 1536
    assert not nf4_gemm_fallback(1536, 4096) and nf4_gemm_fallback(1537, 4096) and nf4_gemm_fallback(8, 160)


@pytest.mark.slow
@pytest.mark.parametrize("batch, seq, fallback", [(1, 1536, False), (1, 1537, True), (2, 800, True)])
def test_qlora_forward_on_both_sides_of_1536_rows_equals_memtracker(batch, seq, fallback):
    step, measured = lora_against_memtracker(WIDE, batch, seq, 8, QV, 0.0, True, "bf16-adamw")
    assert bool(step.structure.lora.nf4_fallback) == fallback
    assert step.block_peaks()[("forward", 0)] == measured["block peaks"][("forward", 0)]


@pytest.mark.slow
@pytest.mark.parametrize("batch, seq", [(1, 1536), (1, 1537)])
def test_full_recomputation_reruns_the_same_nf4_path(batch, seq):
    lora_against_memtracker(WIDE, batch, seq, 8, QV + ("down_proj",), 0.0, True, "bf16-adamw", recompute="full")
    lora_against_memtracker(WIDE, batch, seq, 8, QV, 0.1, True, "bf16-adamw", recompute="full")


@pytest.mark.slow
def test_small_qlora_past_1536_rows_equals_memtracker():
    """The small shape at M = 2048: every projection through the fallback."""
    lora_against_memtracker(dict(SMALL, L=3), 2, 1024, 8, QV, 0.1, True, "bf16-adamw")


@pytest.mark.slow
def test_llama2_7b_qlora_at_1024_rows_equals_memtracker():
    """LLaMA-2 7B below the switch (B 1, S 1024): the fused kernel, no dequantized weight in forward."""
    lora_against_memtracker(LORA_7B, 1, 1024, 64, QV, 0.0, True, "bf16-adamw")
