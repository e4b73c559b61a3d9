"""torchtune's activation offloading: memledger's rule (:mod:`memledger.step.torchtune_offload`) against torchtune
0.6.1's own ``OffloadActivations`` deciding in its llama2 model's forward under ``FakeTensorMode``, set up as
``recipes/full_finetune_single_device.py`` sets it up (:func:`memledger.pytorch.torchtune_litgpt.
torchtune_offload_packs`: layers checkpointed, the head under ``NoOpManager``; CUDA streams stubbed out, which
changes none of ``pack_tensor``'s decisions)."""
import pytest

pytest.importorskip("torch")

from memledger.pytorch.torchtune_litgpt import missing, torchtune_offload_forward, torchtune_offload_packs  # noqa: E402
from memledger.step import torchtune_offload as rule  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing("torchtune") is not None, reason=missing("torchtune") or "")]

SMALL = dict(d=256, H=4, F=688, V=1000)
SEVEN_B = dict(d=4096, H=32, F=11008, V=32000)


@pytest.mark.parametrize("shape, L, B, S, chunks", [
    (SMALL, 2, 1, 200, 8),      # rstd 800 B: under min_offload_size, kept on the device
    (SMALL, 2, 2, 200, 0),      # rstd 1,600 B: offloaded; the head unchunked
    (SMALL, 3, 1, 256, 8),      # rstd exactly 1,024 B: offloaded (>=); three layers
    (SMALL, 1, 2, 64, 0),       # the token ids 1,024 B; rstd 512 B
    (SEVEN_B, 2, 1, 1024, 0)])  # the final norm's weight 8,192 B: a parameter, kept
def test_torchtune_offloads_what_memledger_says(shape, L, B, S, chunks):
    """Every pack in order (its bytes, offloaded or not), the host bytes and what ``fwd_stash`` keeps on the
    device after the forward equal memledger's rule; nothing of the head (under ``NoOpManager``) is packed."""
    got = torchtune_offload_packs(**shape, L=L, batch=B, seq=S, chunks=chunks)
    mine = rule.packs(B, S, shape["d"], L)
    assert [(size, offloaded) for size, _, _, offloaded in got["packs"]] == [(size, off) for _, size, off in mine]
    assert sum(size for size, _, _, offloaded in got["packs"] if offloaded) == rule.host_bytes(B, S, shape["d"], L)
    assert sorted(size for size, _, _ in got["stash"]) == sorted(
        size for _, size in rule.stash_after_forward(B, S, shape["d"], L))


@pytest.mark.parametrize("shape, L, B, S, chunks", [(SMALL, 2, 2, 200, 8), (SMALL, 3, 1, 200, 0),
                                                    (SMALL, 1, 2, 64, 0), (SEVEN_B, 2, 1, 1024, 8)])
def test_torchtune_offloading_frees_the_layer_inputs_by_the_end_of_the_forward(shape, L, B, S, chunks):
    """MemTracker's device total after torchtune's model forward (its layers checkpointed), without and with its
    OffloadActivations context: offloading frees what memledger's rule says, the L layers' BF16 inputs
    (L * 2*B*S*d); the final norm's saved tensors stay on the device in ``fwd_stash`` until its backward."""
    got = torchtune_offload_forward(**shape, L=L, batch=B, seq=S, chunks=chunks)
    freed = rule.freed_after_forward(B, S, shape["d"], L)
    assert got["checkpointed"] - got["offloaded"] == freed == L * 2 * B * S * shape["d"]
