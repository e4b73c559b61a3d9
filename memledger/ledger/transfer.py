"""Host<->device traffic per optimizer step under offloading, and its time.

With the optimizer offloaded, each step sends the gradients of this rank's
shard to the host and brings the updated BF16 parameters back: 2P + 2P = 4P
bytes for the 16 B/param recipe on one GPU (Ren et al. 2021, ZeRO-Offload).
The FP32 master weights and Adam moments never cross the link: they live
where the update runs. Offloaded parameters (ZeRO-Infinity) are fetched for
forward and again for backward. States on NVMe are read and written back
once per step.

Link speeds are nominal, one direction (the article: PCIe 4.0 x16 ~32 GB/s,
NVMe 3-7 GB/s).
"""
from dataclasses import dataclass
from fractions import Fraction

from ..core.choices import lookup
from .hardware import LINKS

__all__ = ["Traffic", "link_bandwidth", "step_traffic"]

def link_bandwidth(name: str) -> int:
    """Bytes per second of a named link (one direction); ``ValueError`` if unknown."""
    return lookup(LINKS, name, "link")


@dataclass(frozen=True)
class Traffic:
    """Bytes moved per optimizer step, per GPU rank."""
    gpu_to_cpu: int = 0
    cpu_to_gpu: int = 0
    nvme_read: int = 0
    nvme_write: int = 0

    @property
    def pcie_bytes(self) -> int:
        return self.gpu_to_cpu + self.cpu_to_gpu

    def pcie_seconds(self, link: str = "pcie4-x16", duplex: bool = False) -> Fraction:
        """Time on the host link: both directions one after the other, or
        (``duplex``) overlapped, so the larger direction decides."""
        moved = max(self.gpu_to_cpu, self.cpu_to_gpu) if duplex else self.pcie_bytes
        return Fraction(moved, link_bandwidth(link))

    def nvme_seconds(self, link: str = "nvme-3") -> Fraction:
        """Time to read and write the NVMe-resident states at ``link`` speed."""
        return Fraction(self.nvme_read + self.nvme_write, link_bandwidth(link))


def step_traffic(recipe, offload_optimizer: str, offload_params: str, shard_elements: int) -> Traffic:
    """Traffic of one step for ``recipe`` under the offload settings.

    ``shard_elements`` is the number of parameters whose update this rank
    computes: ceil(P/(t*N_d)) under ZeRO >= 1, else ceil(P/t). The gradient
    that crosses is the recipe's first gradient component (2 bytes for BF16).
    """
    params = int(recipe.role_bytes_for("param", shard_elements))
    grads = int(recipe.grad_component.bytes_for(shard_elements))
    if offload_optimizer == "nvme" and any(c.factored for c in recipe.components):
        raise ValueError("NVMe traffic of a factored (Adafactor) state depends on the matrix shapes; "
                         "offload it to the CPU instead")
    states = 0 if offload_optimizer != "nvme" else int(recipe.role_bytes_for("optimizer", shard_elements))
    to_cpu = to_gpu = 0
    if offload_optimizer != "none":
        to_cpu += grads                                   # gradients to the CPU optimizer
        to_gpu += params if offload_params == "none" else 0   # updated parameters come back
    if offload_params != "none":
        to_gpu += 2 * params                              # fetched for forward, again for backward
        to_cpu += params if offload_optimizer == "none" else 0  # GPU-updated parameters go back
    nvme_states = states if offload_optimizer == "nvme" else 0
    nvme_params = params if offload_params == "nvme" else 0
    return Traffic(to_cpu, to_gpu, nvme_states + 2 * nvme_params, nvme_states + nvme_params)
