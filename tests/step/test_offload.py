"""Activation offloading in the step (memledger/step/offload.py) against PyTorch's MemTracker.

The reference decoder with ``offload_activations`` runs each block under ``save_on_cpu(pin_memory=True)``'s
hooks (memledger/pytorch/offload.py: the host copies on the fake ``meta`` device, since the model runs on the
CPU); MemTracker counts each device apart. Every landmark on the GPU and on the host, each phase's peak, the
peak and each block's forward and backward peak equal MemTracker's to the byte, with no and with full
recomputation (then only the checkpoints are offloaded). The LLaMA-2 7B shapes run in the slow suite (one to two
minutes each); two small shapes run in the fast loop.
"""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import LANDMARKS, Step

from stepcheck import GPT7B, LLAMA7B, block_totals_agree, landmarks_are_sums_of_rows


def offloaded_against_memtracker(recompute, B, S, L=3, d=64, H=4, F_=96, V_=1000, loop="bf16-pure-adamw"):
    """The timeline's offloaded step beside MemTracker's run of the offloaded reference decoder (CPU backend)."""
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(d, L, H, F_, V_, "llama", recompute=recompute, offload_activations=True)
    measured = memtracker_step(c, loop, B, S, blocks=True, trace=d < 1024)
    step = Step(Ledger(architecture_of(c), batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0,
                       recompute=recompute, offload_activations=True), "cpu")
    for landmark in LANDMARKS:
        assert step.landmarks[landmark]["gpu"] == measured[landmark], landmark
        assert step.landmarks[landmark]["cpu"] == measured["host"][landmark], landmark
    assert step.landmarks["after forward"]["cpu"] > 0
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    ours = step.block_peaks()
    assert ours == {k: measured["block peaks"][k] for k in ours}
    if d < 1024 and recompute == "none":         # op by op: exact without recomputation (tests/stepcheck.py)
        block_totals_agree(step, measured)
    landmarks_are_sums_of_rows(step)
    return step, measured


@pytest.mark.slow
@pytest.mark.parametrize("recompute, loop, B, L", [("none", "bf16-pure-adamw", 2, 3), ("full", "bf16-pure-adamw", 2, 3),
                                                   ("none", "fp32-adamw", 1, 6), ("full", "fp32-adamw", 1, 6),
                                                   ("none", "bf16-adamw", 2, 6), ("full", "bf16-adamw", 1, 3)])
@pytest.mark.sample(2)
def test_small_offloaded_step_is_memtrackers(recompute, loop, B, L):
    """d = 64, 3 or 6 blocks (6: the middle ones lumped), FP32 or BF16: every landmark (GPU and host), phase peak
    and block peak to the byte, and (without recomputation) op by op the totals inside each block are totals
    MemTracker reaches there, in order."""
    offloaded_against_memtracker(recompute, B, 16, L, loop=loop)


@pytest.mark.slow
@pytest.mark.parametrize("recompute, B, S", [("none", 1, 4096), ("full", 1, 4096), ("none", 2, 8192),
                                              ("full", 2, 8192)])
def test_llama2_7b_offloaded_step_is_memtrackers(recompute, B, S):
    """LLaMA-2 7B's shape (32 blocks, d 4096, F 11008, V 32000), pure BF16: offloading moves every saved tensor
    of the blocks to the host (more than the GPU kept without it: copies per saving node and the weights'
    views) and the GPU keeps none of them at the end of the forward pass."""
    a = LLAMA7B
    step, _ = offloaded_against_memtracker(recompute, B, S, a.n_layers, a.d_model, a.n_heads, a.d_ff,
                                           a.vocab_size)
    kept = Step(Ledger(a, batch_size=B, seq_len=S, recipe="bf16-pure-adamw", overhead_bytes=0,
                       recompute=recompute), "cpu")
    assert step.landmarks["after forward"]["gpu"] < kept.landmarks["after forward"]["gpu"]
    assert step.landmarks["before forward"] == kept.landmarks["before forward"]


@pytest.mark.slow
def test_offloading_moves_the_blocks_saved_tensors_to_the_host():
    """Without PyTorch: at the end of forward the GPU holds what it holds without the blocks' saved tensors
    (the step's own rows), and the host holds the L x rows of the host copies."""
    ledger = Ledger(LLAMA7B, batch_size=1, seq_len=4096, recipe="bf16-pure-adamw", overhead_bytes=0)
    kept = Step(ledger, "cpu")
    off = Step(Ledger(LLAMA7B, batch_size=1, seq_len=4096, recipe="bf16-pure-adamw", overhead_bytes=0,
                      offload_activations=True), "cpu")
    blocks = sum(r["bytes"] for r in kept.rows if r["name"].startswith("L x "))
    assert off.landmarks["after forward"]["gpu"] == kept.landmarks["after forward"]["gpu"] - blocks
    host = [r for r in off.rows if r["device"] == "cpu"]
    assert host and all(r["name"].startswith("L x ") for r in host)
    assert off.landmarks["after forward"]["cpu"] == sum(r["bytes"] for r in host) > blocks


@pytest.mark.parametrize("changes, backend, named", [
    ({"arch": GPT7B}, "cpu", "GPT blocks"), ({"recompute": "selective"}, "cpu", "selective recomputation"),
    ({}, "cuda", "a fused RMSNorm kernel"), ({}, "article", "the eager attention core"),
    ({"arch": "llama3-8b"}, "cpu", "grouped-query attention")])
def test_unmodelled_offloading_is_refused_by_name(changes, backend, named):
    ledger = Ledger(**({"arch": LLAMA7B, "offload_activations": True, "overhead_bytes": 0} | changes))
    with pytest.raises(ValueError, match=named):
        Step(ledger, backend)


def test_nothing_saved_is_refused():
    with pytest.raises(ValueError, match="offload_activations: nothing is saved"):
        Ledger(n_params=7 * 10**9, offload_activations=True)


@pytest.mark.parametrize("args, message", [
    (["ledger", "--params", "7e9", "--offload-activations"], "--offload-activations need an architecture"),
    (["ledger", "--preset", "llama2-7b", "--offload-activations"], "does not read --offload-activations"),
    (["compare", "--preset", "llama2-7b", "--offload-activations"], "does not read --offload-activations"),
    (["fit", "--preset", "llama2-7b", "--vary", "batch", "--offload-activations"],
     "does not read --offload-activations"),
    (["step", "--preset", "llama2-7b", "--offload-activations"], "not for the eager attention core")])
def test_command_line_refuses_what_it_does_not_model(args, message, capsys):
    """Nothing saved (no architecture), a path that books activations on the GPU, a setup not modelled: one
    line on stderr, exit 2."""
    from memledger.cli.main import main
    assert main(args) == 2
    out, err = capsys.readouterr()
    assert out == "" and message in err and err.count("\n") == 1


@pytest.mark.slow
def test_command_line_step_offloads(capsys):
    """``memledger step --offload-activations --backend cpu --json``: the host holds the L x host rows after
    forward, the GPU none of the blocks' saved tensors (the Python step's numbers)."""
    import json
    from memledger.cli.main import main
    assert main(["step", "--preset", "llama2-7b", "--recipe", "bf16-pure-adamw", "--seq", "4096", "--overhead", "0",
                 "--backend", "cpu", "--offload-activations", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    step = Step(Ledger("llama2-7b", seq_len=4096, recipe="bf16-pure-adamw", overhead_bytes=0,
                       offload_activations=True), "cpu")
    assert data["landmarks"] == step.landmarks and data["peak"]["gpu"] == step.peak.bytes
    assert data["landmarks"]["after forward"]["cpu"] == sum(r["bytes"] for r in data["rows"] if r["device"] == "cpu")
