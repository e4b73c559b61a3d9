"""FP16 AMP against MemTracker (slow): B = 1, lumped blocks, fused RMSNorm, foreach and fused AdamW on small shapes,
and LLaMA-2 7B (B 1, S 4096)."""
import pytest

from ampcheck import amp_against_memtracker

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("B_,L_,kw", [(1, 5, {}), (2, 3, {"rmsnorm": "fused"}), (2, 3, {"foreach": True}),
                                      (1, 3, {"fused": True})])
def test_amp_step_is_memtrackers(B_, L_, kw):
    amp_against_memtracker(B_, 32, L_, **kw)


def test_llama2_7b_amp_is_memtrackers():
    amp_against_memtracker(1, 4096, L_=32, d=4096, H=32, F_=11008, V_=32000, trace=False)
