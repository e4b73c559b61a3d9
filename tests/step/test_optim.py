"""The optimizer step as PyTorch runs it (memledger/step/optim.py): AdamW and SGD for-loop, foreach and fused, SGD
with and without momentum, Adafactor's for-loop, FP32 masters, and torchtune's optimizer stepped in backward,
each beside MemTracker's run of the reference Trainer (memledger/pytorch/reference.py) under fake tensors: every
landmark, each phase's peak and the peak to the byte. Small shapes here; LLaMA-2 7B's in test_optim_7b.py."""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.structure import MODELLED_RECIPES
from memledger.step.timeline import Step
from memledger.states.recipes import ALL_RECIPES
from stepcheck import LLAMA7B, against_memtracker, peaks_agree

IMPLEMENTATIONS = {"for-loop": {}, "foreach": dict(foreach=True), "fused": dict(fused=True)}


@pytest.mark.slow
@pytest.mark.sample(3)
@pytest.mark.parametrize("loop, impl, in_backward, style", [
    ("bf16-adamw", "fused", False, "llama"),            # fused AdamW after the masters' FP32 gradients
    ("fp32-adamw", "fused", False, "gpt"),
    ("bf16-pure-adamw", "for-loop", True, "llama"),     # optimizer in backward, each implementation
    ("fp32-adamw", "foreach", True, "gpt"),
    ("bf16-pure-adamw", "fused", True, "llama"),
    ("fp32-sgd", "for-loop", False, "llama"),
    ("fp32-sgd-momentum", "foreach", False, "gpt"),
    ("bf16-sgd", "fused", False, "llama"),
    ("bf16-sgd-momentum", "for-loop", False, "gpt"),
    ("bf16-pure-sgd-momentum", "for-loop", True, "llama"),
    ("adafactor", "for-loop", False, "llama"),
    ("adafactor", "for-loop", True, "gpt"),
])
def test_small_optimizer_steps_match_memtracker(loop, impl, in_backward, style):
    step, measured = against_memtracker(style, 256, loop, 1, 32, 2, 0.0, "none", trace=False, in_backward=in_backward,
                                        **IMPLEMENTATIONS[impl])
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]


@pytest.mark.slow
def test_lumped_blocks_in_backward_match_memtracker():
    """L = 6: blocks 2..L-3 run as one lump, whose gradients are stepped and freed inside it."""
    step, measured = against_memtracker("llama", 256, "fp32-adamw", 1, 32, 6, 0.0, "none", trace=False,
                                        in_backward=True)
    assert step.peak.bytes == measured["peak"] and step.phase_peaks() == measured["phase peaks"]


@pytest.mark.slow
def test_fused_and_sgd_keep_block_peaks():
    """Outside the optimizer phase nothing changes: the blocks' peaks too are MemTracker's."""
    step, measured = against_memtracker("gpt", 256, "bf16-sgd-momentum", 1, 32, 2, 0.0, "none", trace=False,
                                        fused=True)
    peaks_agree(step, measured)


def test_in_backward_holds_no_gradients():
    """After backward nothing but the states: each gradient was stepped and freed as backward wrote it."""
    step = Step(Ledger(LLAMA7B, recipe="bf16-pure-adamw", seq_len=4096, overhead_bytes=0, optimizer_in_backward=True),
                "cpu")
    assert step.landmarks["after backward"] == step.landmarks["before forward"] == step.landmarks["after step"]
    assert step.phase_peaks()["optimizer"] == step.landmarks["after step"]["gpu"]


@pytest.mark.parametrize("fields, message", [
    (dict(recipe="bf16-adamw"), "FP32 master weights"),
    (dict(recipe="bf16-pure-adamw", zero_stage=2, dp=2), "one device"),
    (dict(recipe="bf16-adam8bit-bnb-nomaster"), "bitsandbytes optimizer per parameter"),
    (dict(recipe="bf16-pure-adamw", optimizer_in_backward="yes"), "optimizer_in_backward"),
])
def test_in_backward_refused_where_it_cannot_apply(fields, message):
    fields = {"optimizer_in_backward": True, **fields}
    with pytest.raises((ValueError, TypeError), match=message):
        Ledger(LLAMA7B, **fields)


def test_fused_excludes_foreach_and_adafactor_has_no_fused():
    with pytest.raises(ValueError, match="exclude each other"):
        Step(Ledger(LLAMA7B), "cuda", fused=True)
    with pytest.raises(ValueError, match="no fused implementation"):
        Step(Ledger(LLAMA7B, recipe="adafactor"), "cpu", fused=True)


@pytest.mark.slow
@pytest.mark.parametrize("recipe", sorted(ALL_RECIPES))
def test_every_recipe_steps_or_is_refused_in_one_line(recipe):
    """No recipe of ``memledger recipes`` ends in anything but a step or a ValueError that says why."""
    ledger = Ledger(LLAMA7B, recipe=recipe)
    if recipe in MODELLED_RECIPES:
        step = Step(ledger, "cuda")
        assert step.peak.bytes >= max(v["gpu"] for v in step.landmarks.values())
        states = sum(r["bytes"] for r in step.rows if r["kind"] == "optimizer" and "step counters" not in r["name"]
                     and "GradScaler" not in r["name"])        # fp16-amp-adamw: its scale and growth tracker
        # the ledger books Hugging Face's q, k, v projections; Adafactor's factored moment of the reference's
        # fused QKV matrix (3d x d) has rows + columns 4d, three d x d matrices 6d: 2d x L x 4 bytes fewer
        fewer = 2 * 4096 * 32 * 4 if recipe == "adafactor" else 0
        if recipe.startswith("bf16-adam8bit-bnb"):      # the step adds bitsandbytes' two 256-entry FP32 qmaps
            fewer = -2 * 256 * 4
        assert states == ledger.by_role()["optimizer"] - fewer
    else:
        with pytest.raises(ValueError, match=recipe) as e:
            Step(ledger)
        assert "\n" not in str(e.value)
