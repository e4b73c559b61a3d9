"""bitsandbytes' 8-bit and 32-bit Adam, plain and paged, in the step (memledger/step/bnb.py), **from source**: its
kernels run on CUDA only, so no MemTracker run here. Checked against bitsandbytes' own numbers: its sources
(bitsandbytes-foundation/bitsandbytes 95f9af30: ``optim/optimizer.py`` ``init_state``, ``csrc/ops.cu``
``BLOCKSIZE_2STATE``) applied to the tensors PyTorch builds for the reference decoder, and its documentation
(``docs/source/optimizers.mdx`` line 3: "75% less GPU memory" than 32-bit optimizers)."""
import subprocess
import sys

import pytest

from memledger.ledger.ledger import Ledger
from memledger.models.architecture import Architecture

from stepcheck import LLAMA7B

#: bitsandbytes' numbers (optim/optimizer.py lines 414, 502, 524, 383; csrc/ops.cu line 154; functional.py
#: create_dynamic_map: 256 entries, two maps).
BLOCK, MIN_8BIT, PAGED_MIN, QMAPS = 256, 4096, 10**5, 2 * 256 * 4
SMALL = Architecture(64, 3, 4, 160, 1000, "llama")
EIGHT, THIRTY_TWO = "bf16-adam8bit-bnb-nomaster", "bf16-adamw32-bnb"


def rows(step, device="gpu"):
    return {r["name"]: r["bytes"] for r in step.rows if r["kind"] == "optimizer" and r["device"] == device}


def pytorch_tensor_sizes(arch) -> list:
    """numel of every parameter of the reference decoder as PyTorch builds it (on the meta device)."""
    torch = pytest.importorskip("torch")
    from memledger.pytorch.reference import RefConfig, make_model
    with torch.device("meta"):
        model = make_model(RefConfig(arch.d_model, arch.n_layers, arch.n_heads, arch.d_ff, arch.vocab_size, "llama"),
                           "bf16-pure-adamw")
    return [p.numel() for p in model.parameters()]


def bnb_init_state_bytes(numel: int, eight_bit: bool) -> int:
    """``Optimizer2State.init_state`` for one tensor: FP32 state1/state2 below ``min_8bit_size``, else uint8 codes
    and two FP32 absmax vectors of ``(n // blocksize) + bool(n % blocksize)`` entries."""
    if not eight_bit or numel < MIN_8BIT:
        return 2 * 4 * numel
    return 2 * numel + 2 * 4 * ((numel // BLOCK) + bool(numel % BLOCK))


@pytest.mark.slow
@pytest.mark.parametrize("arch", [SMALL, LLAMA7B], ids=["small", "llama2-7b"])
@pytest.mark.parametrize("recipe", [EIGHT, THIRTY_TWO])
def test_states_are_init_state_s_over_pytorch_s_tensors(arch, recipe):
    """Adam's states, to the byte: bitsandbytes' rule over every tensor PyTorch builds (the small decoder's norms
    and the 7B's nothing under 4,096 elements), plus the two shared qmaps where any tensor is 8-bit."""
    eight = recipe == EIGHT
    sizes = pytorch_tensor_sizes(arch)
    expected = sum(bnb_init_state_bytes(n, eight) for n in sizes) + (QMAPS if eight else 0)
    step = Ledger(arch, recipe=recipe, seq_len=64, overhead_bytes=0).step("cpu")
    assert sum(rows(step).values()) == expected
    assert any(n < MIN_8BIT for n in sizes) == (arch is SMALL)


@pytest.mark.slow
def test_8bit_adam_uses_75_percent_less_optimizer_memory():
    """bitsandbytes' documentation: 8-bit optimizers use 75% less memory than 32-bit ones; LLaMA-2 7B's states:
    2 bytes per parameter and 4/256 per state of absmax (74.6% less)."""
    eight = sum(rows(Ledger(LLAMA7B, recipe=EIGHT, overhead_bytes=0).step("cpu")).values())
    full = sum(rows(Ledger(LLAMA7B, recipe=THIRTY_TWO, overhead_bytes=0).step("cpu")).values())
    assert round(1 - eight / full, 2) == 0.75
    params = sum(pytorch_tensor_sizes(LLAMA7B))
    assert 2 < eight / params < 2 + 2 * 4 / BLOCK + 1e-6


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [EIGHT, THIRTY_TWO, "bf16-adam8bit-bnb"])
def test_the_update_is_in_place(recipe):
    """One in-place kernel per tensor (``update_step``): the optimizer phase allocates nothing beyond what it starts
    with (the FP32 masters' gradients where the recipe keeps masters)."""
    step = Ledger(LLAMA7B, recipe=recipe, seq_len=4096, overhead_bytes=0).step("cpu")
    if recipe == "bf16-adam8bit-bnb":
        assert step.phase_peaks()["optimizer"] > step.landmarks["after backward"]["gpu"]     # FP32 gradients
    else:
        assert step.phase_peaks()["optimizer"] == step.landmarks["after backward"]["gpu"]
    assert step.landmarks["after step"] == step.landmarks["before forward"]


@pytest.mark.slow
@pytest.mark.parametrize("recipe", [EIGHT, THIRTY_TWO])
def test_paged_states_leave_the_allocator_s_count(recipe):
    """``get_state_buffer``: state buffers of tensors of at least 1e5 elements in unified memory (a host row of
    their own), the rest (the 4,096-element norms' buffers, the absmax vectors, the qmaps) on the device; the
    GPU drops by exactly what moved."""
    sizes = pytorch_tensor_sizes(LLAMA7B)
    plain = Ledger(LLAMA7B, recipe=recipe, seq_len=4096, overhead_bytes=0).step("cpu")
    paged = Ledger(LLAMA7B, recipe=recipe, seq_len=4096, overhead_bytes=0, paged_optimizer=True).step("cpu")
    per_element = 2 if recipe == EIGHT else 8
    moved = per_element * sum(n for n in sizes if n >= PAGED_MIN)
    assert sum(rows(paged, "cpu").values()) == moved
    for landmark in plain.landmarks:
        assert plain.landmarks[landmark]["gpu"] - paged.landmarks[landmark]["gpu"] == moved
        assert paged.landmarks[landmark]["cpu"] == moved
    assert plain.peak.bytes - paged.peak.bytes == moved
    assert sum(rows(paged).values()) == sum(rows(plain).values()) - moved > 0


@pytest.mark.parametrize("fields, backend, message", [
    (dict(recipe="bf16-adamw", paged_optimizer=True), "cpu", "paged_optimizer"),
    (dict(recipe=EIGHT, paged_optimizer="yes"), "cpu", "paged_optimizer"),
    (dict(recipe=EIGHT, zero_stage=2, dp=2), "cpu", "no ZeRO"),
    (dict(recipe=EIGHT, optimizer_in_backward=True), "cpu", "optimizer_in_backward"),
])
def test_what_cannot_apply_is_refused_by_name(fields, backend, message):
    with pytest.raises((ValueError, TypeError), match=message):
        Ledger(LLAMA7B, **fields).step(backend)


@pytest.mark.slow
def test_the_command_line():
    """``step --paged-optimizer`` runs; ``ledger`` books the states on the GPU and refuses it in one line, exit 2;
    ``--fused`` with a bitsandbytes recipe likewise."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "memledger", *args], capture_output=True, text=True)
    done = run("step", "--preset", "llama2-7b", "--recipe", EIGHT, "--paged-optimizer", "--seq", "4096", "--json")
    assert done.returncode == 0, done.stderr
    for args, name in [(("ledger", "--recipe", EIGHT, "--paged-optimizer"), "--paged-optimizer"),
                       (("step", "--recipe", EIGHT, "--fused", "--backend", "cpu"), "fused")]:
        bad = run(args[0], "--preset", "llama2-7b", *args[1:])
        assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and name in bad.stderr, bad.stderr
