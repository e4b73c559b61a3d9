"""Packed sequences at LLaMA-2 7B's shape (B 1, S 4096, 4 documents per row) against MemTracker: slow."""
import pytest

from test_packing import packed_against_memtracker

pytestmark = pytest.mark.slow


def test_llama2_7b_packed_is_memtrackers():
    step, measured = packed_against_memtracker(1, 4096, 4, L_=32, d=4096, H=32, F_=11008, V_=32000, trace=False)
    assert step.landmarks["after forward"]["gpu"] == measured["after forward"]
