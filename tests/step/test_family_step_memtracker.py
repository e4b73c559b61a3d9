"""GPT blocks with multi-query and grouped-query attention (GPT-BigCode) in the step, against MemTracker's run
of the reference decoder: landmarks, phase peaks, the peak and each block's peaks to the byte, op by op on
small shapes without recomputation; StarCoder with its learned positions (d 6144, 48 heads, one K/V head,
F 24576, vocabulary 49152, 8192 positions) at S 8192, and BLOOM 7B1 (ALiBi, embedding LayerNorm; d 4096, 32 heads,
F 16384, vocabulary 250880) at B 1, S 2048, on fake tensors (two blocks: any L gives the same program past four;
five blocks on small shapes run the lumped program)."""
import pytest
from stepcheck import against_memtracker, peaks_agree

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kv", [1, 2])
@pytest.mark.parametrize("loop, B, S, L, dropout, recompute", [
    ("bf16-pure-adamw", 2, 16, 2, 0.1, "none"), ("fp32-adamw", 1, 24, 3, 0.0, "none"),
    ("bf16-adamw", 2, 16, 2, 0.1, "selective"), ("bf16-pure-adamw", 2, 16, 3, 0.1, "full")])
def test_small_grouped_gpt_steps(kv, loop, B, S, L, dropout, recompute):
    step, measured = against_memtracker("gpt", 256, loop, B, S, L, dropout, recompute, kv=kv)
    peaks_agree(step, measured, op_by_op=recompute == "none")


FAMILIES = [(dict(positions=40), 1), (dict(alibi=True, input_norm=True), None), (dict(alibi=True), 2),
            (dict(input_norm=True, positions=16), None)]
RUNS = [("bf16-pure-adamw", 2, 16, 2, 0.1, "none", False), ("fp32-adamw", 1, 16, 5, 0.0, "none", True),
        ("bf16-adamw", 1, 16, 3, 0.0, "selective", False), ("bf16-pure-adamw", 2, 16, 5, 0.1, "full", False)]


@pytest.mark.parametrize("family, kv, loop, B, S, L, dropout, recompute, foreach", [
    (f, kv) + run for f, kv in FAMILIES for run in RUNS])
def test_small_family_steps(family, kv, loop, B, S, L, dropout, recompute, foreach):
    """Learned positions, ALiBi and the embedding LayerNorm (alone and together, in multi-head, multi-query and
    grouped blocks), each recipe's loop, each save policy (under recomputation the ALiBi bias is every checkpoint's
    input until block 0's backward)."""
    if family.get("positions"):     # the step refuses learned positions with dropout (the embeddings' own)
        dropout = 0.0
    step, measured = against_memtracker("gpt", 256, loop, B, S, L, dropout, recompute, kv=kv, foreach=foreach,
                                        family=family)
    peaks_agree(step, measured, op_by_op=recompute == "none")


def test_starcoder_step():
    step, measured = against_memtracker("gpt", 24576, "bf16-adamw", 1, 8192, 2, 0.0, "none", kv=1, d_=6144, H=48,
                                        V_=49152, family=dict(positions=8192))
    peaks_agree(step, measured)


@pytest.mark.parametrize("recompute", ["none", "selective"])
def test_bloom_7b1_step(recompute):
    step, measured = against_memtracker("gpt", 16384, "bf16-adamw", 1, 2048, 2, 0.0, recompute, d_=4096, H=32,
                                        V_=250880, family=dict(alibi=True, input_norm=True))
    peaks_agree(step, measured)
