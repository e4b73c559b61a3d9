"""A head size other than d/H in the step timeline (Gemma-7B: 16 heads x 256 = 4096 != d = 3072).

Q and the output projection's input are H*d_h wide, K and V H_kv*d_h, the fused QKV weight (H + 2 H_kv) d_h x d
and the output projection (H*d_h) x d (memledger/models/parameters.py ``widths``). Fast tests: the step's parameter
tensors are the architecture's count, and what the blocks keep is the ledger's inventory; the slow ones run
MemTracker on the reference decoder with ``head_dim`` (memledger/pytorch/reference.py) and compare to the byte.
"""
import pytest

from memledger.models.architecture import Architecture
from memledger.models.presets import get_preset
from memledger.ledger.ledger import Ledger
from memledger.activations.outside import outside_inventory
from memledger.step.timeline import Step

from stepcheck import against_memtracker, peaks_agree


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["gemma-7b", Architecture(256, 3, 4, 1024, 1000, "gpt", head_size=96),
                                  Architecture(512, 4, 8, 2048, 5000, "llama", n_kv_heads=2, head_size=32)])
@pytest.mark.parametrize("recipe, per_param", [("bf16-pure-adamw", 8), ("bf16-adamw", 16)])
@pytest.mark.sample(2)
def test_parameter_tensors_are_the_architectures(arch, recipe, per_param):
    """After backward: every state of every parameter tensor, as the recipe books it (the ids aside); the
    tensors of a block with H*d_h != d add up to the architecture's count (Gemma-7B: 8,537,680,896, its
    published total, tests/models/test_hf_config.py)."""
    ledger = Ledger(arch, recipe=recipe, overhead_bytes=0)
    step = Step(ledger)
    ids = 2 * 8 * ledger.batch_size * ledger.seq_len
    assert step.landmarks["after backward"]["gpu"] - ids == per_param * ledger.arch.computed_params
    if arch == "gemma-7b":
        assert ledger.arch.computed_params == 8_537_680_896


def test_gemma_7b_keeps_the_ledgers_inventory():
    """Under the article's conventions the blocks add the ledger's activation row at the end of the forward
    pass: per layer Q and the output projection's input at H*d_h = 4096, not d = 3072."""
    ledger = Ledger("gemma-7b", batch_size=2, seq_len=1024, overhead_bytes=0)
    step = Step(ledger)
    added = step.landmarks["after forward"]["gpu"] - step.landmarks["before forward"]["gpu"]
    ids = sum(r.bytes for r in ledger.rows if r.name.endswith(" ids"))
    assert added == ledger.group_total("activations") - ids
    B, S, d, H, d_h, F, L = 2, 1024, 3072, 16, 256, 24576, 28
    kept = 2 * B * S * (3 * H * d_h + H * d_h + 4 * d + 4 * F) + B * H * S * S * 2   # + the softmax output
    outside = sum(ledger.evaluate(r.bytes) for r in outside_inventory("llama") if "ids" not in r.name)
    assert added == L * kept + outside


@pytest.mark.slow
def test_ledger_peak_is_the_steps():
    for kwargs in ({}, dict(recompute="selective"), dict(recompute="full", zero_stage=3, dp=8)):
        ledger = Ledger("gemma-7b", **kwargs)
        assert ledger.peak is not None and ledger.peak == ledger.step().peak.bytes


# -- against PyTorch -------------------------------------------------------------------------------

#: style, loop, B, S, recompute, keywords of stepcheck.against_memtracker (d = 64, H = 4: d/H = 16).
SMALL = [
    ("gpt", "bf16-pure-adamw", 2, 24, "none", dict(head_dim=24)),
    ("gpt", "bf16-adamw", 1, 64, "none", dict(head_dim=24, dropout=0.1)),
    ("gpt", "fp32-adamw", 3, 64, "selective", dict(head_dim=8, dropout=0.1, V_=40)),
    ("gpt", "bf16-adamw", 2, 64, "full", dict(head_dim=24, dropout=0.1, V_=40)),
    ("llama", "bf16-pure-adamw", 2, 24, "none", dict(head_dim=32, tied=True)),
    ("llama", "bf16-adamw", 1, 64, "none", dict(head_dim=32, attention="eager", tied=True)),
    ("llama", "bf16-pure-adamw", 3, 40, "none", dict(head_dim=32, kv=2, attention="eager", V_=40)),
    ("llama", "fp32-adamw", 2, 64, "selective", dict(head_dim=32, V_=40)),
    ("llama", "bf16-adamw", 2, 64, "selective", dict(head_dim=32, kv=1, attention="eager", V_=40)),
    ("llama", "bf16-adamw", 2, 64, "full", dict(head_dim=32, kv=2, V_=40, tied=True)),
]


@pytest.mark.slow
@pytest.mark.parametrize("style, loop, B, S, recompute, extra", SMALL)
def test_small_steps_with_a_head_size_match_memtracker(style, loop, B, S, recompute, extra):
    extra = dict(extra)
    dropout = extra.pop("dropout", 0.0)
    step, measured = against_memtracker(style, 320 if style == "gpt" else 256, loop, B, S, 3, dropout, recompute,
                                         trace=recompute != "full", **extra)
    peaks_agree(step, measured, op_by_op=recompute != "full")


@pytest.mark.slow
@pytest.mark.parametrize("loop, B, S, recompute, kernel", [
    ("bf16-adamw", 1, 2048, "none", "sdpa"), ("bf16-pure-adamw", 1, 2048, "selective", "eager"),
    ("bf16-adamw", 2, 2048, "full", "sdpa"), ("fp32-adamw", 1, 2048, "selective", "sdpa")])
def test_gemma_7b_matches_memtracker(loop, B, S, recompute, kernel):
    """Gemma-7B's shape at full scale under fake tensors: head size 256 (16 x 256 != 3072), tied, GeGLU run as
    SwiGLU (the same saved tensors), no rotary embedding; the ledger's own step (the preset) is the one measured."""
    a = get_preset("gemma-7b")
    eager = {"attention": "eager"} if kernel == "eager" else {}
    step, measured = against_memtracker("llama", a.d_ff, loop, B, S, a.n_layers, 0.0, recompute, d_=a.d_model,
                                         H=a.n_heads, V_=a.vocab_size, tied=True, head_dim=a.head_dim, trace=False,
                                         **eager)
    assert step.structure == Step(Ledger("gemma-7b", batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0,
                                         recompute=recompute), "cpu", **eager).structure
    peaks_agree(step, measured)
