"""FP16 AMP at LLaMA-2 7B's shape (B 1, S 4096) against MemTracker: slow."""
import pytest

from test_amp import amp_against_memtracker

pytestmark = pytest.mark.slow


def test_llama2_7b_amp_is_memtrackers():
    step, measured = amp_against_memtracker(1, 4096, L_=32, d=4096, H=32, F_=11008, V_=32000, trace=False)
    assert step.peak.bytes == measured["peak"]
