"""The optimizer in backward in the LoRA and QLoRA step (memledger/step/lora.py with memledger/step/optim.py's
``in_backward``): one ``torch.optim.AdamW`` per adapter tensor, stepped and its gradient freed in its
post-accumulate-grad hook (torchtune's ``optimizer_in_bwd``), against MemTracker's run of the reference's LoRA
decoder under :class:`memledger.pytorch.reference.Trainer` ``(in_backward=True)``: landmarks, phase peaks, block
peaks and the peak equal to the byte, alone and with full recomputation and the chunked loss. Adapter recipes
with FP32 masters or bitsandbytes' optimizer are refused in one line."""
import pytest

from memledger.ledger.lora import LoraConfig, LoraLedger

from stepcheck import LORA_7B, LORA_ALL as ALL, LORA_QV as QV, LORA_SMALL as SMALL, lora_against_memtracker


@pytest.mark.slow
@pytest.mark.parametrize("targets, nf4, dropout, loop, knobs", [
    (QV, False, 0.0, "bf16-pure-adamw", {}),
    (ALL + ("lm_head",), False, 0.0, "fp32-adamw", dict(recompute="full")),
    (ALL, True, 0.1, "bf16-pure-adamw", dict(recompute="full", loss_chunks=4)),
])
def test_lora_optimizer_in_backward_equals_memtracker(targets, nf4, dropout, loop, knobs):
    """BF16 adapters on q and v; FP32 adapters everywhere with the head adapted, full recomputation; QLoRA with
    dropout, full recomputation and 4 chunks of torchtune's loss; L = 6 (lumped), B 2, S 16."""
    step, _ = lora_against_memtracker(dict(SMALL, L=6), 2, 16, 8, targets, dropout, nf4, loop, in_backward=True,
                                      **knobs)
    assert step.landmarks["after backward"]["gpu"] == step.landmarks["after step"]["gpu"]


@pytest.mark.slow
def test_llama2_7b_qlora_every_knob_equals_memtracker():
    """LLaMA-2 7B at B 1, S 4096: QLoRA r 64 on every projection (BF16 adapters), full recomputation, 8 chunks,
    the optimizer in backward."""
    lora_against_memtracker(LORA_7B, 1, 4096, 64, ALL, 0.1, True, "bf16-pure-adamw", in_backward=True,
                            recompute="full", loss_chunks=8)


@pytest.mark.parametrize("recipe", ["bf16-adamw", "bf16-adamw32-bnb"])
def test_in_backward_with_masters_or_bitsandbytes_is_refused_in_one_line(recipe):
    with pytest.raises(ValueError, match="optimizer_in_backward") as e:
        LoraLedger("llama2-7b", LoraConfig(8, QV, adapter_recipe=recipe), 1, 4096,
                   optimizer_in_backward=True).step("cpu")
    assert "\n" not in str(e.value)
