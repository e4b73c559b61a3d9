"""The chunked cross-entropy in the LoRA and QLoRA step (memledger/step/lora_loss.py) against MemTracker's run of the
reference's LoRA decoder (memledger/pytorch/lora.py) with the frozen head applied once per chunk, as torchtune's
``chunked_output`` + ``CEWithChunkedOutputLoss`` (its LoRA recipes' loss) and LitGPT's ``chunked_cross_entropy`` run
it: landmarks, phase peaks, block peaks and the peak equal MemTracker's to the byte, alone and with full
recomputation. An adapter on ``lm_head`` with the chunked loss is refused in one line."""
import pytest

from memledger.ledger.lora import LoraConfig, LoraLedger

from stepcheck import LORA_7B, LORA_ALL as ALL, LORA_QV as QV, LORA_SMALL as SMALL, lora_against_memtracker


@pytest.mark.slow
@pytest.mark.parametrize("batch, chunks, impl", [(1, 4, "torchtune"), (2, 4, "torchtune"), (2, 1, "litgpt"),
                                                 (2, 4, "litgpt")])
def test_chunked_lora_loss_equals_memtracker(batch, chunks, impl):
    """q and v adapters, S 16: torchtune's chunks (B 2: strided chunks the frozen head's matmul copies and does not
    keep) and LitGPT's loss in the logits' dtype, with and without chunks."""
    lora_against_memtracker(dict(SMALL, L=2), batch, 16, 8, QV, loss_chunks=chunks, loss_impl=impl)


@pytest.mark.slow
def test_chunks_lower_the_lora_peak_in_the_loss():
    """8 chunks of torchtune's loss keep the peak below the unchunked loss's (its three FP32 B S V tensors)."""
    chunked, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 16, 8, QV, loss_chunks=8)
    whole, _ = lora_against_memtracker(dict(SMALL, L=2), 2, 16, 8, QV)
    assert chunked.peak.bytes < whole.peak.bytes


@pytest.mark.slow
@pytest.mark.parametrize("targets, dropout, nf4, loop, recompute, refinements", [
    (ALL, 0.1, True, "bf16-adamw", "full", dict(kv=2)),
    (("o_proj", "down_proj"), 0.0, False, "fp32-adamw", "selective", dict(rmsnorm="fused")),
])
def test_chunked_lora_loss_with_recomputation_equals_memtracker(targets, dropout, nf4, loop, recompute, refinements):
    """The chunked loss with full recomputation (QLoRA, grouped-query attention) and with selective recomputation
    (FP32 adapters, fused RMSNorm); L = 6 (lumped)."""
    lora_against_memtracker(dict(SMALL, L=6), 2, 16, 8, targets, dropout, nf4, loop, recompute=recompute,
                            loss_chunks=8, **refinements)


@pytest.mark.slow
def test_llama2_7b_qlora_full_recomputation_and_chunks_equal_memtracker():
    """LLaMA-2 7B at B 1, S 4096: QLoRA r 64 on every projection, every block checkpointed, 8 chunks."""
    lora_against_memtracker(LORA_7B, 1, 4096, 64, ALL, 0.1, True, "bf16-adamw", recompute="full", loss_chunks=8)


def test_an_lm_head_adapter_with_the_chunked_loss_is_refused_in_one_line():
    with pytest.raises(ValueError, match="lm_head adapter with the chunked loss") as e:
        LoraLedger("llama2-7b", LoraConfig(8, QV + ("lm_head",)), 1, 4096, loss_chunks=8).step("cpu")
    assert "\n" not in str(e.value)


@pytest.mark.slow
def test_llama3_8b_lora_full_recomputation_and_chunks_equal_memtracker():
    """LLaMA-3 8B's shape (grouped-query attention, 8 key/value heads; a 128,256-token vocabulary) at B 1, S 4096:
    BF16 adapters r 8 on q and v, every block checkpointed, torchtune's 8 chunks (its LoRA recipes' defaults)."""
    shape = dict(d=4096, L=32, H=32, F=14336, V=128256)
    lora_against_memtracker(shape, 1, 4096, 8, QV, kv=8, recompute="full", loss_chunks=8)
