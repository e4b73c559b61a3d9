"""GPU capacities are what nvidia-smi reports, in MiB, as public outputs print them (sources in
memledger/ledger/hardware.py), not the data sheets' decimal gigabytes."""
from memledger.ledger.hardware import GPU_MEMORY, NOMINAL_MEMORY

MiB = 2**20
#: nvidia-smi's "Memory-Usage" totals: modal-labs/modal-client PR #2797 and Modal's table (thundergolfer.com/blog/
#: nvidia-gpu-memory-capacity) for the A100s, the L40S, the H100 and the H200; RLinf/RLinf issue #255, the RTX 4090
SMI_MIB = {"a100-80gb": 81920, "a100-40gb": 40960, "l40s": 46068, "h100-80gb": 81559, "h200": 143771,
           "rtx-4090": 24564}
#: the data sheets: "80GB", "40GB", "48GB", "80GB", "141GB HBM3e", "24 GB"
DATA_SHEET_GB = {"a100-80gb": 80, "a100-40gb": 40, "l40s": 48, "h100-80gb": 80, "h200": 141, "rtx-4090": 24}


def test_capacities_are_nvidia_smi_totals():
    assert GPU_MEMORY == {name: mib * MiB for name, mib in SMI_MIB.items()}


def test_nominal_capacities_are_the_data_sheets():
    assert NOMINAL_MEMORY == {name: gb * 10**9 for name, gb in DATA_SHEET_GB.items()}


def test_the_h200_offers_more_than_its_name_says():
    assert GPU_MEMORY["h200"] - NOMINAL_MEMORY["h200"] == 143771 * MiB - 141 * 10**9 > 9 * 10**9
