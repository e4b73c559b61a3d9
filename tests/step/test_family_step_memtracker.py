"""GPT blocks with multi-query and grouped-query attention (GPT-BigCode) in the step, against MemTracker's run
of the reference decoder: landmarks, phase peaks, the peak and each block's peaks to the byte, op by op on
small shapes without recomputation; and StarCoder's block width (d 6144, 48 heads, one K/V head, F 24576,
vocabulary 49152) at S 8192 on fake tensors (two blocks: any L gives the same program past four)."""
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


def test_starcoder_width_step():
    step, measured = against_memtracker("gpt", 24576, "bf16-adamw", 1, 8192, 2, 0.0, "none", kv=1, d_=6144, H=48,
                                        V_=49152)
    peaks_agree(step, measured)
