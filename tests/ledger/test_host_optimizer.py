from fractions import Fraction

import pytest

from memledger.ledger.hardware import HOST_MEMORY_BANDWIDTH
from memledger.ledger.host_optimizer import host_bandwidth, step_bytes, step_seconds
from memledger.states.recipes import get_recipe

ADAMW = get_recipe("bf16-adamw")


def test_adamw_streams_28_bytes_per_parameter():
    # read the 2-byte gradient, read and write 4-byte master, m and v, write the 2-byte weight
    assert step_bytes(ADAMW, 7 * 10**9) == (2 + 2 * (4 + 4 + 4) + 2) * 7 * 10**9       # 196 GB
    assert step_bytes(get_recipe("bf16-sgd-momentum"), 1) == 2 + 2 * (4 + 4) + 2


def test_the_step_takes_about_as_long_as_the_pcie_transfer():
    # 204.8 GB/s: a socket of 8 DDR4-3200 channels (Tom's Hardware, 2021-12-09)
    assert HOST_MEMORY_BANDWIDTH["ddr4-3200-8ch"] == 204_800_000_000
    assert HOST_MEMORY_BANDWIDTH["ddr5-4800-12ch"] == 460_800_000_000
    seconds = step_seconds(ADAMW, 7 * 10**9)
    assert seconds == Fraction(196, Fraction(2048, 10)) and seconds > Fraction(28, 32)   # > 0.875 s of PCIe


@pytest.mark.parametrize("bad", [-1, 1.5, True, "7e9"])
def test_bad_counts_are_refused(bad):
    with pytest.raises((ValueError, TypeError), match="n_elements"):
        step_bytes(ADAMW, bad)


def test_unknown_memory_is_named():
    with pytest.raises(ValueError, match="ddr4-3200-8ch"):
        host_bandwidth("ddr3")
