"""Numbers the book prints that the article does not state, each computed by the library.

The article's own figures live in :mod:`memledger.claims`; everything else a
chapter writes in prose is a :class:`Fact` here, so that the build's glued
values can be checked against the library (``tests/test_book.py``).
"""
from dataclasses import dataclass
from fractions import Fraction

from .architecture import block_params_expr, get_preset
from .dtypes import bf16_spacing
from .ledger import Ledger
from .recipes import get_recipe
from .symbols import F, d
from .hardware import GPU_MEMORY, LINKS
from .units import in_unit


@dataclass(frozen=True)
class Fact:
    """A library-computed number with its unit and printed digits."""
    name: str
    text: str
    compute: callable
    unit: str = ""
    digits: int = 0

    @property
    def value(self) -> Fraction:
        return Fraction(self.compute())


def _gb(n):
    return in_unit(n, "GB")


def _blocks(arch):
    """Parameters in the L transformer blocks alone."""
    expr = arch.n_layers * block_params_expr(arch.style)
    return int(expr.subs({d: arch.d_model, F: arch.d_ff}))


def _per_layer(ledger):
    """Saved activation bytes of one layer: the ledger's activations over its L layers."""
    return Fraction(ledger.group_total("activations"), ledger.arch.n_layers)


def _offloaded(device="cpu", **kw):
    """The article's setting for offloading: full checkpointing, optimizer states on ``device``."""
    return _ledger(recompute="full", offload_optimizer=device, **kw)


def _ledger(preset="article-7b", **kw):
    return Ledger(preset, **kw)


_FACTS = [
    # chapter 2: the spec and its parameter count
    Fact("params.article_blocks", "parameters in the 32 blocks of the article's spec, billions",
         lambda: Fraction(_blocks(get_preset("article-7b")), 10**9), "billion", 2),
    Fact("params.article_total", "parameters of the article's spec with a 32000-token tied embedding, billions",
         lambda: Fraction(get_preset("article-7b").computed_params, 10**9), "billion", 2),
    Fact("spec.vocab", "vocabulary assumed for the article's spec", lambda: get_preset("article-7b").vocab_size),
    Fact("params.llama2_7b", "LLaMA-2 7B parameter count", lambda: get_preset("llama2-7b").computed_params),
    Fact("params.llama2_7b_b", "LLaMA-2 7B parameters, billions",
         lambda: Fraction(get_preset("llama2-7b").computed_params, 10**9), "billion", 2),
    # chapter 3: recipes
    Fact("bf16.spacing", "gap between BF16 values in [1, 2)", lambda: bf16_spacing(1), "", 7),
    Fact("recipe.fp32_grads", "bytes/param with FP32 gradients", lambda: get_recipe("bf16-adamw-fp32-grads")
         .bytes_per_param, "B/param"),
    Fact("recipe.sgd", "bytes/param, SGD with momentum", lambda: get_recipe("bf16-sgd-momentum").bytes_per_param,
         "B/param"),
    Fact("recipe.adam8bit", "bytes/param, 8-bit Adam", lambda: get_recipe("bf16-adam-8bit").bytes_per_param,
         "B/param"),
    Fact("states.llama2_7b", "model states of LLaMA-2 7B",
         lambda: _gb(_ledger("llama2-7b").group_total("model_states")), "GB", 1),
    Fact("states.gib", "the article's 112 GB of model states in GiB",
         lambda: in_unit(_ledger().group_total("model_states"), "GiB"), "GiB", 1),
    # chapter 4: activations
    Fact("act.layer_bytes", "saved bytes per layer at the spec", lambda: _per_layer(_ledger()), "bytes"),
    Fact("act.layer_mib", "saved MiB per layer at the spec", lambda: in_unit(_per_layer(_ledger()), "MiB"), "MiB"),
    Fact("act.layer_gib", "saved GiB per layer at the spec", lambda: in_unit(_per_layer(_ledger()), "GiB"), "GiB", 2),
    Fact("act.total_gib", "32 layers in GiB", lambda: in_unit(_ledger().group_total("activations"), "GiB"), "GiB", 1),
    Fact("act.flash_total", "activations with FlashAttention at the spec",
         lambda: _gb(_ledger(flash_attention=True).group_total("activations")), "GB", 1),
    Fact("act.nodrop_total", "activations without dropout at the spec",
         lambda: _gb(_ledger(dropout=False).group_total("activations")), "GB", 1),
    Fact("act.llama_total", "LLaMA-2 7B activations at B=1, S=2048",
         lambda: _gb(_ledger("llama2-7b").group_total("activations")), "GB", 1),
    # chapter 7: checkpointing
    Fact("ckpt.selective_total", "activations with selective recompute at the spec",
         lambda: _gb(_ledger(recompute="selective").group_total("activations")), "GB", 1),
    Fact("ckpt.gib", "full checkpointing in GiB", lambda: in_unit(_ledger(recompute="full")
                                                                 .group_total("activations"), "GiB"), "GiB", 1),
    # chapter 8: offloading
    Fact("offload.traffic", "bytes over PCIe per step, article placement",
         lambda: _gb(_offloaded().traffic.pcie_bytes), "GB"),
    Fact("offload.seconds", "PCIe 4.0 x16 time per step, one direction after the other",
         lambda: _offloaded().traffic.pcie_seconds("pcie4-x16"), "s", 3),
    Fact("offload.seconds_duplex", "PCIe 4.0 x16 time per step, both directions overlapped",
         lambda: _offloaded().traffic.pcie_seconds("pcie4-x16", True), "s", 2),
    Fact("offload.article_seconds", "the article's 84 GB at PCIe 4.0 x16 speed",
         lambda: Fraction(_offloaded().totals["cpu"], LINKS["pcie4-x16"]),
         "s", 1),
    Fact("offload.zero_gpu", "GPU total under ZeRO-Offload placement with checkpointing",
         lambda: _gb(_offloaded(offload_placement="zero-offload")
                     .totals["gpu"]), "GB", 1),
    Fact("offload.zero_cpu", "CPU total under ZeRO-Offload placement",
         lambda: _gb(_offloaded(offload_placement="zero-offload")
                     .totals["cpu"]), "GB"),
    Fact("offload.nvme_seconds_slow", "NVMe traffic time at 3 GB/s",
         lambda: _offloaded("nvme").traffic.nvme_seconds("nvme-3"), "s"),
    Fact("offload.nvme_seconds_fast", "NVMe traffic time at 7 GB/s",
         lambda: _offloaded("nvme").traffic.nvme_seconds("nvme-7"), "s"),
    Fact("offload.nvme_gb", "NVMe bytes read + written per step",
         lambda: _gb(_offloaded("nvme").traffic.nvme_read + _offloaded("nvme").traffic.nvme_write), "GB"),
    Fact("offload.no_ckpt_gpu", "GPU total with offload but no checkpointing",
         lambda: _gb(_ledger(offload_optimizer="cpu").totals["gpu"]), "GB", 1),
]
_FACTS += [Fact(f"gpu.{name}", f"memory of one {name}", lambda n=n: _gb(n), "GB") for name, n in GPU_MEMORY.items()]
_FACTS += [Fact(f"link.{name}", f"bandwidth of {name}, one direction", lambda n=n: _gb(n), "GB/s")
           for name, n in LINKS.items()]
FACTS = {f.name: f for f in _FACTS}
