"""Recomputation in the LoRA and QLoRA step (memledger/step/lora.py), against MemTracker's run of the reference's
LoRA decoder (memledger/pytorch/lora.py) under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``.

Selective: the attention core checkpointed, as in the full-training block: the flash kernel's output and
log-sum-exp are not saved (an adapter on ``o_proj`` still keeps its input), and the core is re-run in backward.
Full: every block checkpointed whole (torchtune's activation checkpointing of each layer, a frozen base): only
the block's input is kept; its backward re-runs the forward up to the last tensor it saved. Landmarks, phase
peaks, block peaks and the peak equal MemTracker's to the byte."""
import pytest

from stepcheck import LORA_7B, LORA_ALL as ALL, LORA_QV as QV, LORA_SMALL as SMALL, lora_against_memtracker



@pytest.mark.slow
def test_selective_lora_equals_memtracker_and_saves_the_core():
    """q and v adapters, B 2: the step with selective recomputation equals MemTracker's and keeps, at the end of
    the forward pass, each block's flash output (B S d, BF16) and log-sum-exp (B H S, FP32) fewer bytes."""
    step, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 8, 8, QV, recompute="selective")
    none, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 8, 8, QV)
    per_block = 2 * 8 * 64 * 2 + 2 * 4 * 8 * 4
    assert none.landmarks["after forward"]["gpu"] - step.landmarks["after forward"]["gpu"] == 2 * per_block


@pytest.mark.slow
def test_an_o_proj_adapter_keeps_the_attention_output():
    """With an adapter on o_proj (no dropout) only the log-sum-exp goes."""
    step, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 8, 8, ("o_proj",), recompute="selective")
    none, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 8, 8, ("o_proj",))
    assert none.landmarks["after forward"]["gpu"] - step.landmarks["after forward"]["gpu"] == 2 * (2 * 4 * 8 * 4)


@pytest.mark.slow
@pytest.mark.parametrize("targets, dropout, nf4, loop, refinements", [
    (("o_proj", "down_proj"), 0.1, False, "bf16-pure-adamw", {}),
    (ALL, 0.1, True, "bf16-adamw", dict(kv=2)),
    (ALL + ("lm_head",), 0.0, False, "fp32-adamw", dict(rmsnorm="fused")),
])
def test_selective_lora_variants_equal_memtracker(targets, dropout, nf4, loop, refinements):
    """Dropout on o_proj's adapter (its dropped copy kept, the attention output not), QLoRA with grouped-query
    attention, FP32 adapters with the head adapted and fused RMSNorm; L = 6 (lumped)."""
    lora_against_memtracker(dict(SMALL, L=6), 2, 16, 8, targets, dropout, nf4, loop, recompute="selective",
                            **refinements)


@pytest.mark.slow
def test_llama2_7b_selective_qlora_equals_memtracker():
    """LLaMA-2 7B's shape at S 4096: QLoRA r 64 on every projection with dropout, selective recomputation."""
    lora_against_memtracker(LORA_7B, 1, 4096, 64, ALL, 0.1, True, "bf16-adamw", recompute="selective")


@pytest.mark.slow
def test_full_lora_equals_memtracker_and_keeps_only_the_block_inputs():
    """q and v adapters, B 2, S 8: the step with each block checkpointed equals MemTracker's; at the end of the
    forward pass it holds each block's input (B S d, BF16) instead of what the block saved (block 0's input, the
    leaf PEFT's enable_input_require_grads makes, is held by the graph either way)."""
    step, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 8, 8, QV, recompute="full")
    none, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 8, 8, QV)
    kept = none.landmarks["after forward"]["gpu"] - step.landmarks["after forward"]["gpu"]
    d, F, H, r = SMALL["d"], SMALL["F"], SMALL["H"], 8
    # the LoRA block saves: q, k, v (3 B S d), the flash output and log-sum-exp, norm 1's and norm 2's FP32 input
    # and rstd, the Q/K/V input for the adapters' A and their A x, gate, SiLU and up outputs (3 B S F)
    saved = 2 * 8 * (3 * d * 2 + d * 2 + H * 4 + 2 * (d * 4 + 4) + d * 2 + 2 * r * 2 + 3 * F * 2)
    assert kept == 2 * saved - 2 * 8 * d * 2


@pytest.mark.slow
@pytest.mark.parametrize("targets, dropout, nf4, loop, refinements", [
    (("down_proj",), 0.1, False, "bf16-pure-adamw", {}),
    (("o_proj", "down_proj"), 0.1, False, "bf16-pure-adamw", {}),
    (ALL, 0.1, True, "bf16-adamw", dict(kv=2)),
    (("gate_proj", "up_proj"), 0.1, True, "fp32-adamw", {}),
    (ALL + ("lm_head",), 0.0, False, "fp32-adamw", dict(rmsnorm="fused")),
])
def test_full_lora_variants_equal_memtracker(targets, dropout, nf4, loop, refinements):
    """The recomputation starts where the backward first unpacks (the down projection's, or its adapter B's) and
    stops before the last saving op's kernel (under QLoRA after MatMul4Bit's forward): dropout, QLoRA with
    grouped-query attention, FP32 adapters with the head adapted and fused RMSNorm; L = 6 (lumped)."""
    lora_against_memtracker(dict(SMALL, L=6), 2, 16, 8, targets, dropout, nf4, loop, recompute="full",
                            **refinements)


@pytest.mark.slow
def test_llama2_7b_full_qlora_equals_memtracker():
    """LLaMA-2 7B's shape at S 4096: QLoRA r 64 on every projection with dropout, every block checkpointed."""
    lora_against_memtracker(LORA_7B, 1, 4096, 64, ALL, 0.1, True, "bf16-adamw", recompute="full")


@pytest.mark.slow
def test_llama2_7b_full_lora_qv_equals_memtracker():
    """LLaMA-2 7B at B 2, S 4096: torchtune's 7B_lora_single_device adapters (q, v; BF16), each block
    checkpointed."""
    lora_against_memtracker(LORA_7B, 2, 4096, 8, QV, 0.0, False, "bf16-pure-adamw", recompute="full")
