"""FSDP2 with torchtitan's units (``fsdp_units="torchtitan"``, memledger/step/fsdp2.py ``wrap_titan``) against
torchtitan's own ``apply_fsdp_to_decoder`` (torchtitan 0.3.0, ``torchtitan/distributed/fsdp.py``) run on the
reference decoder on a fake process group (memledger/pytorch/titan.py, ``titan_fsdp_step``): the four landmarks
and every phase peak, to the byte, under the CPU backend.

torchtitan is not part of the pinned environment (its requirements conflict with transformers 5.25's; see
memledger/pytorch/titan.py for the ``pip install --no-deps`` recipe): the comparisons skip where it cannot be
imported. They run PyTorch live whatever ``--pytorch`` says (``titan_fsdp_step`` is not in the record).
"""
import math

import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import LANDMARKS

from stepcheck import GPT7B, LLAMA7B, landmarks_are_sums_of_rows

#: Small, no dim-0 size a multiple of 8 ranks (FSDP2 pads each parameter's dim 0); L = 6: lumped blocks.
ODD = dict(d=60, L=6, H=4, F=170, V=1001, style="llama")
LLAMA = dict(d=4096, L=32, H=32, F=11008, V=32000, style="llama")        # LLaMA-2 7B's shape


def titan_ledger(arch, B, S, N, recompute="none", reshard=True, units="torchtitan"):
    return Ledger(arch, batch_size=B, seq_len=S, recipe="fp32-adamw", overhead_bytes=0, recompute=recompute,
                  framework="fsdp2", dp=N, reshard_after_forward=reshard, fsdp_units=units)


def _titan():
    pytest.importorskip("torch")
    from memledger.pytorch.titan import import_titan
    try:
        import_titan()
    except ImportError as e:
        pytest.skip(f"torchtitan is not installed ({e})")


def against_titan(shape, B, S, N, recompute="none", policy="default"):
    """memledger's step with torchtitan's units equals FSDPMemTracker's account of torchtitan's own wrapping."""
    _titan()
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.reference import RefConfig
    from memledger.pytorch.titan import titan_fsdp_step
    c = RefConfig(**shape, recompute=recompute)
    measured = titan_fsdp_step(c, batch=B, seq=S, world=N, policy=policy)
    step = titan_ledger(architecture_of(c), B, S, N, recompute, policy != "never").step("cpu")
    assert {k: step.landmarks[k]["gpu"] for k in LANDMARKS} == {k: measured[k] for k in LANDMARKS}
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    landmarks_are_sums_of_rows(step)
    return step, measured


@pytest.mark.slow
@pytest.mark.parametrize("shape, B, S, N, options", [
    (ODD, 2, 16, 8, dict()),                                # torchtitan's "default" policy
    (ODD, 1, 16, 8, dict(policy="never")),                  # no unit resharded after forward
    (ODD, 2, 16, 8, dict(recompute="full")),
    (ODD, 2, 16, 64, dict(recompute="selective")),
])
def test_small_shapes_match_torchtitans_apply_fsdp(shape, B, S, N, options):
    against_titan(shape, B, S, N, **options)


@pytest.mark.slow
def test_llama2_7b_width_matches_torchtitans_apply_fsdp():
    """LLaMA-2 7B's shape, world 8, B 1, S 4096, torchtitan's default policy."""
    against_titan(LLAMA, 1, 4096, 8)


def test_the_head_unit_stays_unsharded_after_forward():
    """No PyTorch: torchtitan's final norm and LM head unit is not resharded after forward
    (``reshard_after_forward=policy == "always"``, torchtitan/distributed/fsdp.py l. 200-207), where the root of
    the per-block units is (with reshard_after_forward=True). After forward the difference is its BF16 unsharded
    parameters, each padded to a multiple of the 8 ranks on dim 0 (_fsdp_param.py:304): the norm's d and the
    head's V x d. The rest of the landmarks are equal; the embedding is resharded like the root was."""
    from memledger.models.architecture import Architecture
    arch = Architecture(d_model=60, n_layers=6, n_heads=4, d_ff=170, vocab_size=1001, style="llama")
    titan = titan_ledger(arch, 2, 16, 8).step("cpu")
    blocks = titan_ledger(arch, 2, 16, 8, units="per-block").step("cpu")
    padded = lambda n: math.ceil(n / 8) * 8     # noqa: E731
    head_unit = 2 * (padded(60) + padded(1001) * 60)
    assert head_unit == 121_088
    assert titan.landmarks["after forward"]["gpu"] - blocks.landmarks["after forward"]["gpu"] == head_unit
    for k in ("before forward", "after backward", "after step"):
        assert titan.landmarks[k] == blocks.landmarks[k]
    landmarks_are_sums_of_rows(titan)
    names = {r["name"] for r in titan.rows}
    assert "FSDP2 unsharded parameters (BF16), units not resharded" in names


def test_bad_input_is_refused():
    base = dict(recipe="fp32-adamw", framework="fsdp2", dp=8)
    with pytest.raises(ValueError, match="fsdp_units must be one of per-block, torchtitan"):
        Ledger(LLAMA7B, **base, fsdp_units="titan")
    with pytest.raises(ValueError, match="fsdp_units is an option of framework fsdp2"):
        Ledger(LLAMA7B, fsdp_units="torchtitan")
    with pytest.raises(ValueError, match="plain LLaMA-style decoder"):
        Ledger(GPT7B, **base, fsdp_units="torchtitan")
    for options, why in ((dict(tp=2), "tensor parallelism"), (dict(dp_replicate=2), "HSDP"),
                         (dict(reshard_after_forward=2), "reshard_after_forward 2"),
                         (dict(reshard_after_forward=None), "reshard_after_forward None"),
                         (dict(fsdp_loss_in_root=True), "fsdp_loss_in_root"),
                         (dict(fsdp_cpu_offload=True), "fsdp_cpu_offload")):
        with pytest.raises(ValueError, match=f"fsdp_units torchtitan is not modelled with {why}"):
            Ledger(LLAMA7B, **{**base, **options}, fsdp_units="torchtitan")


@pytest.mark.slow
@pytest.mark.parametrize("B, S", [(1, 1024), (2, 1304)])
def test_torchtitans_block_saves_what_the_cpu_backend_books(B, S):
    """torchtitan 0.3.0's own Llama3 block (its fused QKV, ComplexRoPE, nn.RMSNorm, SwiGLU), with torchtitan's
    SDPA module as the core (its language models use flex or varlen attention, not run here), LLaMA-2 7B's width:
    the bytes autograd saves per layer equal the block rows memledger books under the CPU conventions (the
    reference decoder's census, memledger/pytorch/compare.py), so its rotary code (complex, cache a buffer) adds
    no per-layer tensor and its RMSNorm (BF16 input, BF16 weight) takes the path the CPU backend books."""
    _titan()
    from memledger.pytorch.compare import _block_rows, ledger_for, run_options
    from memledger.pytorch.reference import RefConfig
    from memledger.pytorch.titan import titan_block_saved
    c = RefConfig(d=4096, L=1, H=32, F=11008, V=32000, style="llama")
    loop = "bf16-pure-adamw"
    ledger = ledger_for(c, loop, B, S)
    booked = sum(ledger.evaluate(r.bytes) for r in _block_rows(c, run_options(c, loop)))
    assert titan_block_saved(4096, 32, 11008, B, S) == booked
