"""Selective recomputation in the LoRA and QLoRA step (memledger/step/lora.py): the attention core under
``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` in the reference's LoRA block
(memledger/pytorch/lora.py), as in the full-training block: the flash kernel's output and log-sum-exp are not
saved (an adapter on ``o_proj`` still keeps its input), and the core is re-run in backward. Landmarks, phase
peaks, block peaks and the peak equal MemTracker's to the byte. Full recomputation of a LoRA block is refused in
one line (not modelled)."""
import pytest

from memledger.ledger.lora import LoraConfig, LoraLedger

from stepcheck import LORA_7B, LORA_ALL as ALL, LORA_QV as QV, LORA_SMALL as SMALL, lora_against_memtracker

pytest.importorskip("torch")


def test_selective_lora_equals_memtracker_and_saves_the_core():
    """q and v adapters, B 2: the step with selective recomputation equals MemTracker's and keeps, at the end of
    the forward pass, each block's flash output (B S d, BF16) and log-sum-exp (B H S, FP32) fewer bytes."""
    step, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 8, 8, QV, recompute="selective")
    none, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 8, 8, QV)
    per_block = 2 * 8 * 64 * 2 + 2 * 4 * 8 * 4
    assert none.landmarks["after forward"]["gpu"] - step.landmarks["after forward"]["gpu"] == 2 * per_block


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


def test_full_recomputation_is_refused_in_one_line():
    with pytest.raises(ValueError, match="not full") as e:
        LoraLedger("llama2-7b", LoraConfig(8, QV), 1, 4096, recompute="full").step("cpu")
    assert "\n" not in str(e.value)
