"""The knobs combined (issue 16): full recomputation, torchtune's chunked loss, activation offloading and the
optimizer's foreach implementation together, and pairs of knobs (the optimizer in backward with the chunked loss,
selective recomputation with a fused optimizer, ...), each beside MemTracker's run of the reference decoder
with the same knobs (memledger/pytorch/reference.py, measure.py) under the CPU backend: every landmark on the GPU
and on the host, each phase's peak, the peak and each block's forward and backward peak, to the byte. Small
shapes in the fast loop; LLaMA-2 7B's shape (B 1-2, S 4,096-8,192, also a 128k vocabulary) in the slow suite."""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import LANDMARKS, Step

from stepcheck import LLAMA7B, landmarks_are_sums_of_rows

#: Every knob at once: full recomputation, chunked cross-entropy, activation offloading, foreach AdamW.
EVERY = dict(recompute="full", loss_chunks=4, offload_activations=True, foreach=True)


def combined_against_memtracker(loop, B, S, L=3, d=64, H=4, F_=96, V_=1000, recompute="none", loss_chunks=1,
                                loss_impl="torchtune", offload_activations=False, foreach=False, fused=False,
                                in_backward=False):
    """The timeline's step with the knobs beside MemTracker's run of the reference decoder with the same knobs."""
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(d, L, H, F_, V_, "llama", recompute=recompute, loss_chunks=loss_chunks, loss_impl=loss_impl,
                  offload_activations=offload_activations)
    measured = memtracker_step(c, loop, B, S, foreach=foreach, fused=fused, in_backward=in_backward, blocks=True)
    step = Step(Ledger(architecture_of(c), batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0,
                       recompute=recompute, loss_chunks=loss_chunks, loss_impl=loss_impl,
                       offload_activations=offload_activations, optimizer_in_backward=in_backward), "cpu",
                foreach=foreach, fused=fused)
    for landmark in LANDMARKS:
        assert step.landmarks[landmark]["gpu"] == measured[landmark], landmark
        assert step.landmarks[landmark]["cpu"] == measured["host"][landmark], landmark
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    ours = step.block_peaks()
    assert ours == {k: measured["block peaks"][k] for k in ours}
    landmarks_are_sums_of_rows(step)
    return step, measured


@pytest.mark.slow
@pytest.mark.parametrize("loop, B, L", [("bf16-pure-adamw", 2, 3), ("fp32-adamw", 1, 6), ("bf16-adamw", 2, 3)])
@pytest.mark.sample(1)
def test_every_knob_combined_is_memtrackers(loop, B, L):
    """Full recomputation + 4 loss chunks + offloading + foreach: the checkpoints on the host, one FP32 chunk of
    logits at a time, foreach's temporaries over all moments (6 blocks: the middle ones lumped; bf16-adamw: FP32
    masters)."""
    step, _ = combined_against_memtracker(loop, B, 32, L, **EVERY)
    assert step.landmarks["after forward"]["cpu"] > 0


#: Pairs and triples of knobs (the optimizer in backward with each other knob, selective recomputation with the
#: optimizer's implementations, LitGPT's loss with offloading).
PAIRS = [
    ("bf16-pure-adamw", dict(in_backward=True, loss_chunks=4)),
    ("fp32-adamw", dict(in_backward=True, loss_chunks=4, recompute="full")),
    ("bf16-pure-adamw", dict(in_backward=True, offload_activations=True, recompute="full", loss_chunks=4)),
    ("bf16-pure-adamw", dict(in_backward=True, foreach=True, recompute="selective")),
    ("fp32-adamw", dict(recompute="selective", loss_chunks=4, fused=True)),
    ("bf16-adamw", dict(offload_activations=True, loss_chunks=4, fused=True)),
    ("bf16-pure-adamw", dict(offload_activations=True, loss_chunks=4, loss_impl="litgpt", foreach=True)),
    ("fp32-adamw", dict(offload_activations=True, in_backward=True)),
]


@pytest.mark.slow
@pytest.mark.parametrize("loop, knobs", PAIRS)
@pytest.mark.sample(3)
def test_knobs_in_pairs_are_memtrackers(loop, knobs):
    """Under the optimizer in backward the blocks' backward peaks include the per-parameter optimizer steps that
    run inside them (MemTracker samples them: memledger/pytorch/measure.py)."""
    combined_against_memtracker(loop, 2, 32, **knobs)


@pytest.mark.slow
def test_in_backward_steps_inside_the_block_peaks():
    """The optimizer stepped in a block's backward raises that block's backward peak above the same step's
    without it (its temporaries there), and MemTracker agrees block by block."""
    step, _ = combined_against_memtracker("fp32-adamw", 2, 32, in_backward=True)
    plain = Step(Ledger(step.ledger.arch, batch_size=2, seq_len=32, recipe="fp32-adamw", overhead_bytes=0), "cpu")
    assert step.block_peaks()[("backward", 0)] != plain.block_peaks()[("backward", 0)]


def test_combinations_that_cannot_apply_are_refused_in_one_line():
    """Offloading with selective recomputation, the optimizer in backward with FP32 masters: a ValueError naming
    the knob (the CLI: one line, exit 2)."""
    with pytest.raises(ValueError, match="offload_activations .*not for selective recomputation"):
        Ledger(LLAMA7B, recipe="bf16-pure-adamw", recompute="selective", offload_activations=True).step("cpu")
    with pytest.raises(ValueError, match="optimizer_in_backward .*master"):
        Ledger(LLAMA7B, recipe="bf16-adamw", loss_chunks=8, optimizer_in_backward=True)


@pytest.mark.slow
@pytest.mark.parametrize("B, S, V_", [(1, 4096, 32000), (1, 4096, 128256), (2, 8192, 32000)])
def test_llama2_7b_with_every_knob_is_memtrackers(B, S, V_):
    """LLaMA-2 7B's shape (32 blocks, d 4096, F 11008), pure BF16, every knob with 8 loss chunks (V 128,256:
    LLaMA-3's vocabulary, where the chunked loss matters most): about a minute of MemTracker per case. The host
    holds exactly the L checkpoints, 2BSd each."""
    a = LLAMA7B
    step, _ = combined_against_memtracker("bf16-pure-adamw", B, S, a.n_layers, a.d_model, a.n_heads, a.d_ff, V_,
                                          **(EVERY | dict(loss_chunks=8)))
    assert step.landmarks["after forward"]["cpu"] == a.n_layers * 2 * B * S * a.d_model


@pytest.mark.slow
def test_lora_with_knobs_it_does_not_model_is_refused_in_one_line():
    """LoRA + chunked loss + full recomputation + the optimizer in backward run in the LoRA step (tests/step/
    test_lora_loss.py, test_lora_in_backward.py); activation offloading with LoRA is refused by name."""
    from memledger.article.knobs import setup_step
    from memledger.ledger.lora import LoraConfig, LoraLedger
    config = LoraConfig(8, ("q_proj", "v_proj"), adapter_recipe="bf16-pure-adamw")
    knobs = dict(loss_chunks=8, recompute="full", optimizer_in_backward=True)
    step = setup_step("llama2-7b", 4096, dict(recipe="bf16-pure-adamw", lora=config, **knobs), "cpu")
    assert step.peak.bytes == LoraLedger("llama2-7b", config, 1, 4096, **knobs).step("cpu").peak.bytes
    with pytest.raises(ValueError, match="does not model offload_activations") as e:
        setup_step("llama2-7b", 4096, dict(recipe="bf16-pure-adamw", offload_activations=True, recompute="full",
                                           lora=config), "cpu")
    assert "\n" not in str(e.value)
