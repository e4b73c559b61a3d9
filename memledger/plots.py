"""Figures for the book (matplotlib): each one draws library numbers, none typed.

Captions live in the chapters (cell metadata), so these functions set no titles.
"""
import matplotlib.pyplot as plt
import numpy as np

from .activations import ARTICLE_INVENTORY, inventory
from .evaluate import vectorized_function
from .hardware import GPU_MEMORY
from .ledger import Ledger
from .symbols import L, S
from .units import in_unit, unit_size

A100_BYTES = GPU_MEMORY["a100-80gb"]


def ledger_bars(ledgers: dict, gpu_bytes: int = A100_BYTES, unit: str = "GB", ax=None):
    """Stacked bars of what each ledger keeps on one GPU, with the GPU's capacity as a line."""
    ax = ax or plt.subplots(figsize=(7, 3.8))[1]
    labels = list(ledgers)
    names = []
    for ledger in ledgers.values():
        names += [r.name for r in ledger.rows if r.device == "gpu" and r.name not in names]
    cmap = plt.get_cmap("tab20")
    bottom = np.zeros(len(labels))
    for i, name in enumerate(names):
        heights = np.array([float(in_unit(sum(r.bytes for r in l.rows if r.name == name and r.device == "gpu"), unit))
                            for l in ledgers.values()])
        ax.bar(labels, heights, bottom=bottom, label=name, color=cmap(i % 20), edgecolor="white", linewidth=0.5)
        bottom += heights
    ax.axhline(float(in_unit(gpu_bytes, unit)), color="crimson", linestyle="--", linewidth=1.5)
    ax.annotate(f"{float(in_unit(gpu_bytes, unit)):g} {unit} GPU", (-0.4, float(in_unit(gpu_bytes, unit))),
                xytext=(0, 4), textcoords="offset points", ha="left", color="crimson", fontsize=9)
    ax.set_ylabel(f"memory per GPU ({unit})")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure


def activations_vs_seq(preset: str = "article-7b", batch_size: int = 1, max_seq: int = 8192, unit: str = "GB",
                       ax=None):
    """Saved activations of all layers against S: the linear (B x S x d) and the quadratic (S x S) parts."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    ledger = Ledger(preset, batch_size=batch_size)
    arch = ledger.arch
    rows = inventory(arch.mlp, arch.norm, dropout=ledger.dropout)
    linear = L * sum(r.bytes for r in rows if not r.quadratic)
    quadratic = L * sum(r.bytes for r in rows if r.quadratic)
    bindings = ledger.bindings
    seq = np.linspace(256, max_seq, 200)
    f = vectorized_function((S,), tuple(e.subs({k: v for k, v in bindings.items() if k != S})
                                        for e in (linear, quadratic)))
    lin, quad = (np.broadcast_to(v, seq.shape) / unit_size(unit) for v in f(seq))
    ax.plot(seq, lin, label="B×S×d tensors (linear in S)")
    ax.plot(seq, quad, label="B×H×S×S tensors (quadratic in S)")
    ax.plot(seq, lin + quad, color="black", label="total")
    ax.set_xlabel("sequence length S (tokens)")
    ax.set_ylabel(f"saved activations, {arch.n_layers} layers ({unit})")
    ax.legend(frameon=False, fontsize=9)
    ax.figure.tight_layout()
    return ax.figure


def layer_breakdown(batch_size: int = 1, seq_len: int = 2048, ax=None):
    """The article's per-layer inventory in MiB, the three S x S tensors highlighted."""
    ax = ax or plt.subplots(figsize=(7, 4.2))[1]
    ledger = Ledger("article-7b", batch_size=batch_size, seq_len=seq_len)
    sizes = [ledger.evaluate(r.bytes) for r in ARTICLE_INVENTORY]
    mib = [float(in_unit(n, "MiB")) for n in sizes]
    labels = [f"{r.name} ({r.block})" for r in ARTICLE_INVENTORY]
    colours = ["#C44E52" if r.quadratic else "#4C72B0" for r in ARTICLE_INVENTORY]
    ax.barh(labels[::-1], mib[::-1], color=colours[::-1])
    ax.set_xlabel("saved per layer (MiB)")
    ax.figure.tight_layout()
    return ax.figure


def parameter_breakdown(presets, ax=None):
    """Stacked bars of where each preset's parameters live: attention, MLP, norms, embeddings (billions)."""
    from .architecture import get_preset
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    parts = [get_preset(name).parts() for name in presets]
    bottom = np.zeros(len(presets))
    for name in parts[0]:
        heights = np.array([p[name] for p in parts]) / 1e9
        ax.bar(list(presets), heights, bottom=bottom, label=name)
        bottom += heights
    ax.set_ylabel("parameters (billions)")
    ax.legend(frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure
