"""Selective recomputation in the step timeline (memledger/step/block.py, the save policy).

Fast tests: what the blocks keep at the end of the forward pass is the ledger's selective inventory
(Korthikanti et al. 2022, Sec. 5: 34 B*S*d per GPT layer under the article's conventions), the core's
tensors come back in backward as transients, and the ledger, the compiled peak and the command line judge
by the step's peak. The slow ones run PyTorch's MemTracker on the reference decoder with its attention core
checkpointed (memledger/pytorch/reference.py, ``recompute="selective"``) and compare every landmark, each phase's
peak, the peak and each block's forward and backward peak to the byte (op by op on small configs).
"""
import pytest

from memledger.activations.inventory import inventory, per_layer_bytes
from memledger.models.architecture import Architecture
from memledger.activations.backends import get_backend
from memledger.ledger.ledger import Ledger
from memledger.activations.outside import outside_inventory
from memledger.step.timeline import LANDMARKS, Step

from stepcheck import GPT7B, LLAMA3_8B, LLAMA7B, against_memtracker, landmarks_are_sums_of_rows, peaks_agree

GB = 10**9


def _added(step):
    marks = step.landmarks
    return marks["after forward"]["gpu"] - marks["before forward"]["gpu"]


@pytest.mark.slow
def test_article_forward_keeps_korthikanti_34_per_layer():
    """Korthikanti Sec. 5 (Table 2, t = 1): with the S x S tensors recomputed a GPT layer keeps 34 B*S*d bytes
    (16-bit activations, 1-byte masks, F = 4d); the step adds that for each of the L layers, and the loss's
    tensors outside them."""
    B, S, d, L = 2, 2048, 4096, 32
    ledger = Ledger(GPT7B, batch_size=B, seq_len=S, overhead_bytes=0, recompute="selective")
    outside = sum(ledger.evaluate(r.bytes) for r in outside_inventory("gpt") if "ids" not in r.name)
    assert _added(Step(ledger)) == L * 34 * B * S * d + outside


@pytest.mark.slow
@pytest.mark.parametrize("arch, backend, flash", [
    (GPT7B, "article", False), (GPT7B, "cuda", False), (GPT7B, "cpu", False), (GPT7B, "article", True),
    (LLAMA7B, "article", False), (LLAMA7B, "cuda", False), (LLAMA7B, "cpu", False),
    (LLAMA3_8B, "article", True), (LLAMA3_8B, "cpu", False)])
@pytest.mark.sample(2)
def test_after_forward_is_the_selective_inventory(arch, backend, flash):
    """Every backend: the blocks keep L x the inventory without the attention core's tensors; under the article's
    conventions that is the ledger's own activation row (its sum at the end of the forward pass)."""
    ledger = Ledger(arch, batch_size=3, seq_len=1024, overhead_bytes=0, recompute="selective", flash_attention=flash)
    step = Step(ledger, backend)
    conv = get_backend(backend)
    dtype = "bf16"
    options = conv.inventory_options(arch.style, dtype, ledger.dropout, flash)
    mlp, norm = ("gelu", "LayerNorm") if arch.style == "gpt" else ("swiglu", "RMSNorm")
    rows = inventory(mlp, norm, ledger.dropout, gqa=arch.features.gqa, **options)
    outside = outside_inventory(arch.style, **{k: options[k] for k in ("dtype", "norm_stats", "rmsnorm", "attention")})
    expected = ledger.evaluate(arch.n_layers * per_layer_bytes(rows, "selective")) + sum(
        ledger.evaluate(r.bytes) for r in outside if "ids" not in r.name)
    assert _added(step) == expected
    if backend == "article":
        ids = sum(r.bytes for r in ledger.rows if r.name.endswith(" ids"))
        assert _added(step) == ledger.group_total("activations") - ids


@pytest.mark.slow
def test_the_core_is_recomputed_not_kept():
    """No S x S row is kept from forward to backward; the recomputed scores, probabilities and dropout tensors
    are transients of the backward pass."""
    step = Step(Ledger(GPT7B, recompute="selective", dropout=True))
    kept = {r["name"] for r in step.rows if "after forward" in r["live"]}
    assert not {"L x softmax output", "L x attention dropout mask", "L x attention dropout output"} & kept
    assert {"L x Q", "L x K", "L x V", "L x output projection input"} <= kept
    recomputed = {r["name"]: r for r in step.rows if r["name"].endswith("(recomputed)")}
    assert {"softmax output (recomputed)", "attention dropout mask (recomputed)",
            "attention dropout output (recomputed)", "scaled scores (recomputed)"} <= set(recomputed)
    assert all(r["kind"] == "transient" and r["phase"] == "backward" for r in recomputed.values())
    assert recomputed["softmax output (recomputed)"]["bytes"] == 1 * 32 * 2048 * 2048 * 2      # B*H*S*S, BF16


@pytest.mark.slow
def test_the_peak_shows_the_recomputed_core():
    """With the core's S x S tensors recomputed, the backward pass peaks inside the last block's core: its
    recomputed probabilities and dropout output (B*H*S^2 each) are live at the peak."""
    B, H, S = 4, 32, 2048
    step = Step(Ledger(GPT7B, batch_size=B, seq_len=S, recipe="bf16-pure-adamw", recompute="selective",
                       dropout=True, overhead_bytes=0))
    assert (step.peak.phase, step.peak.layer) == ("backward", 31)
    live = dict(step.live_at_peak())
    assert live["softmax output (recomputed), 1 block"] == live["attention dropout output (recomputed), 1 block"] \
        == B * H * S * S * 2
    none = Step(Ledger(GPT7B, batch_size=B, seq_len=S, recipe="bf16-pure-adamw", dropout=True, overhead_bytes=0))
    assert step.peak.bytes < none.peak.bytes                          # still far below no recomputation


@pytest.mark.slow
@pytest.mark.parametrize("backend, kwargs", [
    ("article", dict(recompute="selective", zero_stage=3, dp=8)),
    ("cuda", dict(recompute="selective", tp=4, sequence_parallel=True, dropout=True)),
    ("cpu", dict(recompute="selective", recipe="bf16-pure-adamw", batch_size=3, zero_stage=2, dp=4,
                 offload_optimizer="nvme"))])
@pytest.mark.parametrize("arch", [LLAMA3_8B, Architecture(256, 3, 4, 1024, 1000, "gpt")])
@pytest.mark.sample(2)
def test_selective_landmarks_are_sums_of_rows(arch, backend, kwargs):
    landmarks_are_sums_of_rows(Step(Ledger(arch, **kwargs), backend))


def test_ledger_and_command_line_judge_the_peak(capsys):
    """``Ledger.peak`` (the compiled step) is the step's peak, and ``memledger ledger`` judges it."""
    from memledger.cli.main import main
    from memledger.ledger.hardware import GPU_MEMORY
    ledger = Ledger("llama2-7b", recompute="selective")
    peak, total = ledger.step().peak.bytes, ledger.totals["gpu"]
    assert ledger.peak == peak
    assert main(["ledger", "--preset", "llama2-7b", "--recompute", "selective"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[-1] == (
        f"does not fit: {(peak - GPU_MEMORY['a100-80gb']) / GB:,.2f} GB over; {peak / GB:,.2f} GB per GPU against "
        f"{GPU_MEMORY['a100-80gb'] / GB:,.2f} GB, the peak of a "
        f"training step (the sum of the rows at the end of the forward pass: {total / GB:,.2f} GB).")


# -- against PyTorch -------------------------------------------------------------------------------

#: style, F, loop, B, S, L, dropout, extra keywords of stepcheck.against_memtracker. V = 40 in some rows so
#: that the blocks, not the loss, hold the backward's peak (then it is in a recomputed core).
SMALL = [
    ("gpt", 320, "bf16-pure-adamw", 2, 24, 3, 0.0, {}),
    ("gpt", 320, "bf16-adamw", 1, 64, 6, 0.1, {}),
    ("gpt", 320, "fp32-adamw", 3, 64, 3, 0.1, dict(V_=40)),
    ("gpt", 320, "bf16-pure-adamw", 1, 128, 5, 0.1, dict(V_=40)),
    ("gpt", 256, "bf16-adamw", 2, 40, 3, 0.1, dict(native_dropout=True, V_=40)),
    ("gpt", 256, "fp32-adamw", 1, 64, 3, 0.1, dict(native_dropout=True)),
    ("gpt", 256, "bf16-pure-adamw", 3, 40, 6, 0.0, dict(d_=96, H=6, V_=40)),
    ("llama", 256, "bf16-adamw", 2, 24, 3, 0.0, {}),                                # SDPA flash
    ("llama", 256, "fp32-adamw", 1, 64, 6, 0.0, dict(V_=40)),
    ("llama", 256, "bf16-pure-adamw", 3, 128, 3, 0.0, dict(attention="eager", V_=40)),
    ("llama", 256, "bf16-adamw", 1, 64, 5, 0.0, dict(attention="eager")),
    ("llama", 256, "bf16-pure-adamw", 2, 40, 3, 0.0, dict(kv=2, V_=40)),             # GQA, flash
    ("llama", 256, "fp32-adamw", 1, 64, 6, 0.0, dict(kv=1, V_=40)),                  # MQA, flash
    ("llama", 256, "bf16-adamw", 3, 40, 3, 0.0, dict(kv=2, attention="eager", H=8, d_=96, V_=40)),
    ("llama", 256, "bf16-pure-adamw", 1, 64, 6, 0.0, dict(kv=1, attention="eager", V_=40)),
    ("llama", 256, "bf16-adamw", 2, 64, 3, 0.0, dict(kv=2, attention="eager", qkv_bias=True, tied=True)),
]


@pytest.mark.slow
@pytest.mark.parametrize("style, F_, loop, B, S, L, dropout, extra", SMALL)
@pytest.mark.parametrize("foreach", [False, True])
def test_small_selective_steps_match_memtracker_to_the_byte(style, F_, loop, B, S, L, dropout, extra, foreach):
    """Landmarks, each phase's peak, the peak and each block's forward and backward peak equal MemTracker's;
    op by op, every total the timeline reaches inside a block (the recomputed core included) is one MemTracker
    reaches there, in the same order."""
    step, measured = against_memtracker(style, F_, loop, B, S, L, dropout, "selective", foreach, trace=True,
                                         **extra)
    peaks_agree(step, measured, op_by_op=True)


#: The article's 7B GPT shape (parameters counted) and LLaMA-2 7B at full scale, under fake tensors.
FULL = [("gpt", 16384, "bf16-adamw", 1, 2048, 0.1), ("gpt", 16384, "bf16-pure-adamw", 4, 2048, 0.0),
        ("llama", 11008, "bf16-adamw", 1, 2048, 0.0), ("llama", 11008, "bf16-pure-adamw", 2, 4096, 0.0)]


@pytest.mark.slow
@pytest.mark.parametrize("style, F_, loop, B, S, dropout", FULL)
def test_7b_selective_steps_match_memtracker(style, F_, loop, B, S, dropout):
    step, measured = against_memtracker(style, F_, loop, B, S, 32, dropout, "selective", d_=4096, H=32, V_=32000,
                                         trace=False)
    peaks_agree(step, measured)
    if style == "llama":         # the preset is the shape: the ledger's own step is the one measured
        assert step.structure == Step(Ledger("llama2-7b", batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0,
                                             recompute="selective"), "cpu").structure
    assert set(LANDMARKS) <= set(measured)
