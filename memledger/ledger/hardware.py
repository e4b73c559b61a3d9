"""The machines: GPU memory sizes, peak BF16 throughput and link bandwidths, written once.

:data:`GPU_MEMORY` is what a GPU really offers, in bytes: the total that
``nvidia-smi`` reports (in MiB). An "80 GB" A100 has 81,920 MiB = 80 GiB,
85.9x10^9 bytes, not 80x10^9; an "80 GB" H100 81,559 MiB; a "141 GB" H200
143,771 MiB. The CUDA context and workspaces come out of it (the ledger's
separate overhead row): what a process can allocate is what
``torch.cuda.mem_get_info()`` reports free once its context exists, and a verdict
that leaves less than :data:`memledger.answers.verdict.MARGIN` is no fit. Totals as
reported in public ``nvidia-smi`` output:

* A100 80 GB 81,920 MiB, A100 40 GB 40,960 MiB, L40S 46,068 MiB, H100 80 GB 81,559 MiB:
  modal-labs/modal-client pull request #2797 (docs: "nvidia quotes GB on their
  GPUs not GiB"); H100 80 GB HBM3 81,559 MiB also in NVIDIA/nccl issue #1264.
* RTX 4090: 24,564 MiB, RLinf/RLinf issue #255.
* H200 (SXM, "141 GB"): 143,771 MiB = 150.75x10^9 bytes, in Modal's table of the totals NVML reports
  (J. Belotti, "Why does an NVIDIA H100 80GB card offer 85.52 GB?",
  thundergolfer.com/blog/nvidia-gpu-memory-capacity, which also lists the H100's 81,559 and the
  A100's 81,920 MiB above) and in ``nvidia-smi`` tables of eight H200s (``0MiB / 143771MiB``)
  posted in public GitHub files.

:data:`NOMINAL_MEMORY` keeps the vendors' decimal figures, as the article
writes them ("an 80 GB A100"); the article's claims use it. Link speeds are
nominal and per direction (the article: PCIe 4.0 x16 ~32 GB/s, NVMe 3-7 GB/s).
"""
from ..core.choices import lookup
from ..core.units import GB, MiB

__all__ = ["ARTICLE_GPU", "CUDA_BLOCK_ROUNDING", "GPU_MEMORY", "HOST_LINKS", "HOST_MEMORY_BANDWIDTH", "LINKS",
           "NOMINAL_MEMORY", "NVME_LINKS", "PEAK_BF16_FLOPS", "gpu_memory"]

#: Capacity per GPU, bytes, as nvidia-smi reports it (sources in the module docstring).
GPU_MEMORY = {
    "a100-80gb": 81920 * MiB,     # the article's GPU
    "a100-40gb": 40960 * MiB,
    "l40s": 46068 * MiB,          # the data sheet's "48 GB GDDR6"
    "h100-80gb": 81559 * MiB,
    "h200": 143771 * MiB,         # the data sheet's "141 GB HBM3e"
    "rtx-4090": 24564 * MiB,
}
#: The vendors' decimal figures ("80 GB"), as the article uses them.
NOMINAL_MEMORY = {"a100-80gb": 80 * GB, "a100-40gb": 40 * GB, "l40s": 48 * GB, "h100-80gb": 80 * GB,
                  "h200": 141 * GB, "rtx-4090": 24 * GB}
#: The article's GPU: the default of every fits verdict.
ARTICLE_GPU = "a100-80gb"

#: Dense BF16 tensor-core peak, FLOP/s, from the vendors' data sheets.
PEAK_BF16_FLOPS = {
    "a100-80gb": 312 * 10**12,
    "a100-40gb": 312 * 10**12,
    "h100-80gb": 989 * 10**12,     # SXM
    "h200": 989 * 10**12,
}

#: Host links (GPU <-> CPU memory), one direction.
HOST_LINKS = {"pcie3-x16": 16 * GB, "pcie4-x16": 32 * GB, "pcie5-x16": 64 * GB}
#: NVMe drives (the article's 3-7 GB/s).
NVME_LINKS = {"nvme-3": 3 * GB, "nvme-7": 7 * GB}
#: Every link, host and NVMe.
LINKS = {**HOST_LINKS, **NVME_LINKS}


def gpu_memory(name: str) -> int:
    """Bytes of memory of a named GPU; ``ValueError`` if unknown."""
    return lookup(GPU_MEMORY, name, "GPU")


#: Peak host memory bandwidth of one CPU socket, bytes/s: channels x transfers/s x 8 bytes per 64-bit channel.
#: DDR4-3200 on 8 channels is AMD EPYC 7002/7003 (the host CPU of NVIDIA's DGX A100); DDR5-4800 on 12
#: channels is EPYC 9004. Both are quoted per socket by Tom's Hardware (2021-12-09): 204.8 and 460.8 GB/s.
HOST_MEMORY_BANDWIDTH = {
    "ddr4-3200-8ch": 8 * 3200 * 10**6 * 8,
    "ddr5-4800-12ch": 12 * 4800 * 10**6 * 8,
}

#: Bytes: PyTorch's CUDA caching allocator rounds every block up to a multiple of this size (PyTorch
#: documentation, "CUDA semantics", PYTORCH_CUDA_ALLOC_CONF, roundup_power2_divisions: "the sizes are rounded
#: up in multiple of blocks size of 512"). MemTracker on the CPU counts exact bytes instead.
CUDA_BLOCK_ROUNDING = 512
