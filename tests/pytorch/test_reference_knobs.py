"""The reference decoder's packed and AMP options refuse what they do not run, in one line."""
import pytest

torch = pytest.importorskip("torch")

from memledger.pytorch.packing import block_causal_mask, document_ids  # noqa: E402
from memledger.pytorch.reference import RefConfig, Trainer, make_model  # noqa: E402

pytestmark = pytest.mark.slow


def test_packed_needs_llama_sdpa():
    with pytest.raises(ValueError, match="packed"):
        RefConfig(64, 2, 4, 160, 1000, "gpt", packed=2)
    with pytest.raises(ValueError, match="packed"):
        RefConfig(64, 2, 4, 160, 1000, "llama", packed=-1)


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
