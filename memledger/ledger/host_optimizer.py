"""The optimizer step on the host: the bytes it streams through CPU memory, and the time that takes.

With the optimizer offloaded (ZeRO-Offload, Ren et al. 2021), AdamW updates the FP32 states on the CPU.
For every parameter of this rank's shard the step reads the gradient that crossed the link and the
optimizer states (FP32 master weight, m, v), writes the states back, and writes the new 16-bit weight
that goes back to the GPU. For a recipe with gradient bytes g, optimizer-state bytes K and parameter
bytes p per parameter, the host memory traffic is

    (g + 2K + p) * P bytes        bf16-adamw: (2 + 2 * 12 + 2) * 7e9 = 196 GB

Adam performs a few FLOPs per parameter, so the step is bound by memory bandwidth: it takes at least
that traffic divided by the socket's peak bandwidth (:data:`memledger.ledger.hardware.HOST_MEMORY_BANDWIDTH`),
about a second for a 7B model on an 8-channel DDR4-3200 host, which is as long as the PCIe transfer
itself. This is why ZeRO-Offload ships a vectorized CPU Adam (DeepSpeedCPUAdam, "5X-7X faster than the
standard PyTorch implementation", DeepSpeed's ZeRO-Offload tutorial) and a one-step delayed parameter
update that overlaps the CPU step with the next step's forward and backward (Ren et al. 2021).
"""
from fractions import Fraction

from ..core.choices import check_count, lookup
from .hardware import HOST_MEMORY_BANDWIDTH

__all__ = ["host_bandwidth", "step_bytes", "step_seconds"]

def step_bytes(recipe, n_elements: int) -> int:
    """Bytes one optimizer step reads and writes in host memory for ``n_elements`` parameters.

    Gradient read once (the recipe's gradient components), optimizer states read and written
    (``role == "optimizer"``: FP32 master, m, v), the 16-bit parameters written once.
    """
    n_elements = check_count("n_elements", n_elements, minimum=0)
    per_param = recipe.role_bytes("grad") + 2 * recipe.role_bytes("optimizer") + recipe.role_bytes("param")
    return per_param * n_elements


def host_bandwidth(name: str) -> int:
    """Peak bytes/s of a named host memory configuration; ``ValueError`` listing the known ones."""
    return lookup(HOST_MEMORY_BANDWIDTH, name, "host memory")


def step_seconds(recipe, n_elements: int, memory: str = "ddr4-3200-8ch") -> Fraction:
    """Lower bound on the CPU optimizer step: :func:`step_bytes` at the peak bandwidth of ``memory``."""
    return Fraction(step_bytes(recipe, n_elements), host_bandwidth(memory))
