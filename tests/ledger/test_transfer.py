from fractions import Fraction

import pytest

from memledger.states.recipes import get_recipe
from memledger.ledger.transfer import LINKS, Traffic, link_bandwidth, step_traffic

ADAMW = get_recipe("bf16-adamw")
P = 7 * 10**9


def test_zero_offload_moves_4p():
    # Ren et al. 2021: 2P of gradients down, 2P of parameters up per step
    traffic = step_traffic(ADAMW, "cpu", "none", P)
    assert (traffic.gpu_to_cpu, traffic.cpu_to_gpu) == (2 * P, 2 * P)
    assert traffic.pcie_bytes == 4 * P
    assert traffic.pcie_seconds("pcie4-x16") == Fraction(4 * P, 32 * 10**9)
    assert traffic.pcie_seconds("pcie4-x16", duplex=True) == Fraction(2 * P, 32 * 10**9)


def test_no_offload_no_traffic():
    assert step_traffic(ADAMW, "none", "none", P) == Traffic()


def test_nvme_reads_and_writes_the_states():
    traffic = step_traffic(ADAMW, "nvme", "none", P)
    assert traffic.nvme_read == traffic.nvme_write == 12 * P
    assert traffic.nvme_seconds("nvme-3") == Fraction(24 * P, 3 * 10**9)


def test_parameter_offload_fetches_twice():
    traffic = step_traffic(ADAMW, "cpu", "cpu", P)
    assert traffic.cpu_to_gpu == 2 * 2 * P and traffic.gpu_to_cpu == 2 * P


def test_links_from_the_article():
    assert LINKS["pcie4-x16"] == 32 * 10**9
    assert (LINKS["nvme-3"], LINKS["nvme-7"]) == (3 * 10**9, 7 * 10**9)
    with pytest.raises(ValueError, match="unknown link"):
        link_bandwidth("carrier-pigeon")
