"""torchtune's activation offloading: memledger's rule (:mod:`memledger.step.torchtune_offload`) against torchtune
0.6.1's own ``OffloadActivations`` deciding in its llama2 model's forward under ``FakeTensorMode``, set up as
``recipes/full_finetune_single_device.py`` sets it up (:func:`memledger.pytorch.torchtune_litgpt.
torchtune_offload_packs`: layers checkpointed, the head under ``NoOpManager``; CUDA streams stubbed out, which
changes none of ``pack_tensor``'s decisions)."""
import pytest

pytest.importorskip("torch")

from memledger.ledger.ledger import Ledger  # noqa: E402
from memledger.pytorch.compare import architecture_of  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402
from memledger.pytorch.torchtune_litgpt import (missing, torchtune_checkpointed_step,  # noqa: E402
                                                torchtune_offload_forward, torchtune_offload_packs)
from memledger.step import torchtune_offload as rule  # noqa: E402
from memledger.step.timeline import LANDMARKS, Step  # noqa: E402
from memledger.step.vocab import OpRole, Phase  # noqa: E402

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


def checkpointed_step(shape, L, B, S, loss):
    """memledger's ``implementation="torchtune"`` step with ``recompute="full"`` (CPU conventions)."""
    arch = architecture_of(RefConfig(**shape, L=L, style="llama"))
    return Step(Ledger(arch, batch_size=B, seq_len=S, recipe="bf16-pure-adamw", overhead_bytes=0, recompute="full",
                       loss_chunks=8 if loss == "chunked" else 1, implementation="torchtune"), "cpu")


def differences(got, step) -> dict:
    """{landmark, phase peak: the measured bytes minus memledger's}."""
    out = {name: got[name] - step.landmarks[name]["gpu"] for name in LANDMARKS}
    peaks = step.phase_peaks()
    out.update({f"{phase} peak": got["phase peaks"][phase] - peaks[phase] for phase in got["phase peaks"]})
    return out


CASES = [(SMALL, 2, 2, 200, "chunked"), (SMALL, 3, 1, 200, "ce"), (SEVEN_B, 2, 1, 1024, "chunked")]


@pytest.mark.parametrize("shape, L, B, S, loss", CASES)
def test_torchtune_checkpointed_step_equals_memledgers(shape, L, B, S, loss):
    """torchtune's step with ``enable_activation_checkpointing`` as its recipe runs it (the layers wrapped by
    ``set_activation_checkpointing``, MemTracker) equals memledger's ``recompute="full"`` step under
    ``implementation="torchtune"`` at every landmark and phase peak."""
    diff = differences(torchtune_checkpointed_step(**shape, L=L, batch=B, seq=S, loss=loss),
                       checkpointed_step(shape, L, B, S, loss))
    assert diff == {k: 0 for k in diff}


@pytest.mark.parametrize("shape, L, B, S, loss", CASES)
def test_torchtune_offloaded_step_against_the_checkpointed_one(shape, L, B, S, loss):
    """torchtune's step with ``enable_activation_offloading`` (its own OffloadActivations, its stashes; the
    streams stubbed, the host copies brought back as device tensors of their size) against the checkpointed step
    memledger models: "after forward" and the forward's peak (at the loss) are lower by memledger's
    :func:`~memledger.step.torchtune_offload.freed_after_forward`, L*2*B*S*d; the other landmarks and the optimizer's
    peak are the same. The backward's peak: where memledger's checkpointed step has it at the embedding's backward
    (LLaMA-2 7B's width) it is higher by :func:`~memledger.step.torchtune_offload.embedding_backward_extra` (the
    token ids' copy and layer 0's input copy, still in ``bwd_tensor_stash``); at the small width both have it in
    layer 0's SwiGLU backward, holding the same. The step's own timeline under offloading is refused (its copies
    back are not modelled)."""
    step = checkpointed_step(shape, L, B, S, loss)
    diff = differences(torchtune_checkpointed_step(**shape, L=L, batch=B, seq=S, loss=loss, offload=True), step)
    freed = rule.freed_after_forward(B, S, shape["d"], L)
    at = step.built.ops[step.built.compiled.ops[backward_peak(step)]]
    extra = rule.embedding_backward_extra(B, S, shape["d"], L) if at.role is OpRole.EMBEDDING_BACKWARD else 0
    assert diff == {k: -freed if k in ("after forward", "forward peak") else extra if k == "backward peak" else 0
                    for k in diff}


def backward_peak(step) -> int:
    """The sample of the backward's highest total in ``step``."""
    return max((i for i, index in enumerate(step.built.compiled.ops)
                if step.built.ops[index].phase is Phase.BACKWARD), key=lambda i: step.totals[i])
