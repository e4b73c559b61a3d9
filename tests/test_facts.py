from fractions import Fraction

from memledger.facts import FACTS
from memledger.hardware import GPU_MEMORY, LINKS, gpu_memory

import pytest


def test_every_fact_computes():
    for fact in FACTS.values():
        assert isinstance(fact.value, Fraction) and fact.text


def test_facts_against_sources():
    # Ren et al. 2021: ZeRO-Offload moves 4P bytes per step; 28 GB at P = 7e9
    assert FACTS["offload.traffic"].value == 28
    assert FACTS["params.llama2_7b"].value == 6_738_415_616          # the released checkpoint
    assert FACTS["ckpt.gib"].value == Fraction(1, 2)                  # 32 x 2048 x 4096 x 2 = 2^29 bytes
    assert FACTS["bf16.spacing"].value == Fraction(1, 128)


def test_hardware():
    assert GPU_MEMORY["a100-80gb"] == 80 * 10**9 and LINKS["pcie4-x16"] == 32 * 10**9
    with pytest.raises(ValueError, match="unknown GPU"):
        gpu_memory("voodoo2")
