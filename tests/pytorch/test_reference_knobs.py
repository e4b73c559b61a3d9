"""The reference decoder's packed and AMP options refuse what they do not run, in one line."""
import pytest

torch = pytest.importorskip("torch")

from memledger.pytorch.packing import block_causal_mask, document_ids, masked_positions  # noqa: E402
from memledger.pytorch.reference import RefConfig, Trainer, make_model  # noqa: E402

pytestmark = pytest.mark.slow


def test_packed_refusals():
    with pytest.raises(ValueError, match="packed"):
        RefConfig(64, 2, 4, 160, 1000, "llama", attention="eager", softmax_fp32=True, packed=2)
    with pytest.raises(ValueError, match="packed"):
        RefConfig(64, 2, 4, 160, 1000, "llama", packed=-1)


def test_masked_positions_are_the_block_causal_mask_inverted():
    """The eager core's mask is True where masked_fill writes -inf (Megatron-LM's convention), one (B, 1, S, S)
    view of a (B, S, S) tensor."""
    masked = masked_positions(document_ids(2, 6, 2))
    assert masked.shape == (2, 1, 6, 6) and masked.untyped_storage().nbytes() == 2 * 6 * 6
    tril = torch.ones(3, 3, dtype=torch.bool).tril()
    assert torch.equal(masked[1, 0], ~torch.block_diag(tril, tril))


def test_packed_eager_core_is_sdpas():
    """The same FP32 weights and packed batch: the eager core with masked_fill computes SDPA's block-causal
    logits, and each document's logits are those of the document alone (nothing crosses a boundary)."""
    torch.manual_seed(0)
    sdpa, eager = (make_model(RefConfig(64, 2, 4, 160, 1000, "llama", packed=2, attention=a), "fp32-adamw")
                   for a in ("sdpa", "eager"))
    eager.load_state_dict(sdpa.state_dict())
    ids, documents = torch.randint(0, 1000, (2, 16)), document_ids(2, 16, 2)
    with torch.no_grad():
        packed = eager(ids, documents)
        assert torch.allclose(packed, sdpa(ids, documents), atol=1e-5)
        alone = make_model(RefConfig(64, 2, 4, 160, 1000, "llama", attention="eager"), "fp32-adamw")
        alone.load_state_dict(sdpa.state_dict())
        assert torch.allclose(packed[:, 8:], alone(ids[:, 8:]), atol=1e-5)


def test_block_causal_mask_is_torchtunes():
    """Two documents of 3 tokens: each token sees the earlier tokens of its own document only (torchtune's
    create_block_causal_mask, block_diag of tril(ones))."""
    mask = block_causal_mask(document_ids(1, 6, 2))[0]
    tril = torch.ones(3, 3, dtype=torch.bool).tril()
    assert torch.equal(mask, torch.block_diag(tril, tril))


def test_amp_runs_its_loop_only():
    model = make_model(RefConfig(64, 2, 4, 160, 1000, "llama"), "bf16-adamw")
    with pytest.raises(ValueError, match="amp"):
        Trainer(model, "bf16-adamw", amp=True)
