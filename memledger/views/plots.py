"""Figures for the book (matplotlib): each one draws library numbers, none typed.

One palette for every chapter: a component (a ledger row, a parameter part, a
kind of saved tensor) has the same colour in every figure. Captions live in
the chapters (cell metadata), so these functions set no titles.
"""
import re

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp

from ..activations.inventory import inventory
from ..models.presets import get_preset
from ..ledger.hardware import GPU_MEMORY
from ..ledger.ledger import Ledger, sweep
from ..core.symbols import L, S
from ..core.units import in_unit, unit_size

__all__ = ["A100_BYTES", "GPU_LINE", "PALETTE", "STEP_KINDS", "activations_vs_seq", "colour", "largest_fit_chart",
           "layer_breakdown", "ledger_bars", "parameter_breakdown", "parts_bars", "peaks_bars", "step_timeline",
           "zero_states_vs_dp"]

A100_BYTES = GPU_MEMORY["a100-80gb"]

#: The colour of each component, the same in every chapter: weights and gradients in blues,
#: optimizer states in greens, activations orange, overhead grey.
PALETTE = {
    "BF16 parameters": "#08306b", "FP32 parameters": "#2171b5",
    "BF16 gradients": "#6baed6", "FP32 gradients": "#9ecae1", "FP32 gradient accumulator": "#c6dbef",
    "FP32 master weights": "#00441b",
    "Adam first moment m": "#238b45", "Adam second moment v": "#74c476",
    "Adam first moment m (BF16)": "#006d2c", "Adam second moment v (BF16)": "#99d8c9",
    "SGD momentum": "#41ab5d", "Adam m (8-bit)": "#a1d99b", "Adam v (8-bit)": "#c7e9c0",
    "gathered parameters + gradients (largest layer)": "#6a51a3",
    "activations": "#f16913",
    "CUDA context + workspace": "#969696",
    # outside the blocks (scope "model"): ids, mask, final norm, LM head input, the loss's FP32 tensors
    "input ids": "#fdd0a2", "target ids": "#fdae6b", "causal mask": "#e6550d",
    "final LayerNorm input": "#a63603", "final RMSNorm input": "#a63603", "LM head input": "#7f2704",
    "log-softmax output (FP32)": "#cb181d", "loss": "#67000d", "nll_loss total weight": "#a50f15",
    # parameter parts (chapter 2)
    "attention": "#2171b5", "MLP": "#f16913", "norms": "#fec44f", "embeddings": "#6a51a3",
    # saved tensors (chapters 4 and 5): the B x S x d kind and the B x H x S x S kind
    "linear in S": "#2171b5", "quadratic in S": "#cb181d", "total": "#000000",
    # parts of one GPU's memory (memledger.calculators.parts), comparing calculators and fine-tuning methods:
    # the role colours of the components above
    "weights": "#08306b", "gradients": "#6baed6", "optimizer states": "#238b45",
    "model states, roles not split": "#807dba", "KV cache": "#e7298a", "working buffer": "#fdae6b",
    "overhead": "#969696",
    # ZeRO stages (chapter 10), each in the colour of what it adds to the shards
    "no ZeRO": "#000000", "ZeRO-1": "#238b45", "ZeRO-2": "#6baed6", "ZeRO-3": "#08306b",
    # real checkpoints (chapter 14)
    "llama3-8b": "#2171b5", "mistral-7b": "#f16913", "qwen2.5-7b": "#6a51a3", "gemma-7b": "#238b45",
    "mixtral-8x7b": "#cb181d", "bert-base-uncased": "#969696", "llama2-7b": "#000000",
}
GPU_LINE = "#cb181d"


def colour(name: str) -> str:
    """The palette's colour for ``name``; ``ValueError`` for a component the palette does not know."""
    try:
        return PALETTE[name]
    except KeyError:
        raise ValueError(f"no colour for {name!r}: add it to memledger.views.plots.PALETTE") from None


def _wrap(label: str, width: int) -> str:
    """``label`` on lines of at most ``width`` characters, broken after spaces and hyphens only."""
    lines = [""]
    for piece in re.findall(r"[^\s-]*-|\S+", label):
        if lines[-1] and len(lines[-1]) + len(piece) + (not lines[-1].endswith("-")) > width:
            lines.append("")
        lines[-1] += ("" if not lines[-1] or lines[-1].endswith("-") else " ") + piece
    return "\n".join(lines)


def _bar_labels(ax, labels, fontsize=8):
    """Category labels under bars, wrapped (at spaces and hyphens) to the width of one bar's slot."""
    slot_points = ax.get_position().width * ax.figure.get_figwidth() * 72 / len(labels)
    width = max(6, int(slot_points / (0.7 * fontsize)) - 1)
    ax.set_xticks(range(len(labels)), [_wrap(label, width) for label in labels],
                  fontsize=fontsize)


def ledger_bars(ledgers: dict, gpu_bytes: int = A100_BYTES, unit: str = "GB", ax=None):
    """Stacked bars of what each ledger keeps on one GPU, with the GPU's capacity as a dashed line."""
    ax = ax or plt.subplots(figsize=(7.5, 4))[1]
    labels = list(ledgers)
    names = []
    for ledger in ledgers.values():
        names += [r.name for r in ledger.rows if r.device == "gpu" and r.name not in names]
    bottom = np.zeros(len(labels))
    for name in names:
        heights = np.array([float(in_unit(sum(r.bytes for r in led.rows if r.name == name and r.device == "gpu"), unit))
                            for led in ledgers.values()])
        ax.bar(range(len(labels)), heights, bottom=bottom, label=name, color=colour(name), edgecolor="white",
               linewidth=0.5)
        bottom += heights
    capacity = float(in_unit(gpu_bytes, unit))
    ax.axhline(capacity, color=GPU_LINE, linestyle="--", linewidth=1.5, label=f"GPU memory ({capacity:g} {unit})")
    ax.set_ylabel(f"memory per GPU ({unit})")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    _bar_labels(ax, labels)
    ax.figure.tight_layout()
    return ax.figure


def activations_vs_seq(preset: str = "article-7b", batch_size: int = 1, max_seq: int = 8192, unit: str = "GB",
                       ax=None):
    """Saved activations of all layers against S: the linear (B x S x d) and the quadratic (S x S) parts."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    ledger = Ledger(preset, batch_size=batch_size)
    rows = inventory(ledger.arch.mlp, ledger.arch.norm, dropout=ledger.dropout,
                     attention_dropout=ledger.arch.attention_dropout)
    fixed = {k: v for k, v in ledger.bindings.items() if k != S}
    linear = sp.lambdify(S, (L * sum(r.bytes for r in rows if not r.quadratic)).subs(fixed), "numpy")
    quadratic = sp.lambdify(S, (L * sum(r.bytes for r in rows if r.quadratic)).subs(fixed), "numpy")
    seq = np.linspace(256, max_seq, 200)
    lin = np.broadcast_to(linear(seq), seq.shape) / unit_size(unit)
    quad = np.broadcast_to(quadratic(seq), seq.shape) / unit_size(unit)
    ax.plot(seq, lin, color=colour("linear in S"), label="B×S×d tensors (linear in S)")
    ax.plot(seq, quad, color=colour("quadratic in S"), label="B×H×S×S tensors (quadratic in S)")
    ax.plot(seq, lin + quad, color=colour("total"), label="total")
    ax.set_xlabel("sequence length S (tokens)")
    ax.set_ylabel(f"saved activations, {ledger.arch.n_layers} layers ({unit})")
    ax.legend(frameon=False, fontsize=9)
    ax.figure.tight_layout()
    return ax.figure


def layer_breakdown(batch_size: int = 1, seq_len: int = 2048, ax=None):
    """What autograd keeps in one GPT block, in MiB, by tensor (Korthikanti et al. 2022, Sec. 4.1).

    The rows are the tensors autograd keeps, with their names, not the article's labels (three of
    which name tensors autograd frees); the B x H x S x S tensors are highlighted.
    """
    ax = ax or plt.subplots(figsize=(7, 4.2))[1]
    rows = inventory()
    ledger = Ledger("article-7b", batch_size=batch_size, seq_len=seq_len)
    sizes = [ledger.evaluate(r.bytes) for r in rows]
    mib = [float(in_unit(n, "MiB")) for n in sizes]
    labels = [f"{r.name} ({r.block})" for r in rows]
    colours = [colour("quadratic in S" if r.quadratic else "linear in S") for r in rows]
    ax.barh(labels[::-1], mib[::-1], color=colours[::-1])
    ax.set_xlabel("saved per layer (MiB)")
    ax.figure.tight_layout()
    return ax.figure


def parameter_breakdown(presets, ax=None):
    """Stacked bars of where each preset's parameters live: attention, MLP, norms, embeddings (billions)."""
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    parts = [get_preset(name).parts() for name in presets]
    bottom = np.zeros(len(presets))
    for name in parts[0]:
        heights = np.array([p[name] for p in parts]) / 1e9
        ax.bar(range(len(presets)), heights, bottom=bottom, label=name, color=colour(name))
        bottom += heights
    ax.set_ylabel("parameters (billions)")
    ax.legend(frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    _bar_labels(ax, list(presets))
    ax.figure.tight_layout()
    return ax.figure


def parts_bars(views: dict, capacities: dict = None, unit: str = "GB", ax=None):
    """Horizontal stacked bars of each view's GPU memory by part (:func:`memledger.calculators.parts.gpu_parts`): a
    ledger, a LoRA ledger, an inference or a convention's estimate per label, top to bottom; each of
    ``capacities`` (label -> bytes) a dashed vertical line."""
    from ..calculators.parts import PARTS, gpu_parts
    labels = list(views)
    parts = [gpu_parts(v) for v in views.values()]
    ax = ax or plt.subplots(figsize=(7.5, 0.8 + 0.38 * len(labels)))[1]
    y = np.arange(len(labels))[::-1]
    left = np.zeros(len(labels))
    for part in PARTS:
        widths = np.array([float(in_unit(p[part], unit)) for p in parts])
        if widths.any():
            ax.barh(y, widths, left=left, label=part, color=colour(part), edgecolor="white", linewidth=0.5)
            left += widths
    for (name, nbytes), style in zip((capacities or {}).items(), ("--", "-.", ":", (0, (5, 1)))):
        size = f"{float(in_unit(nbytes, unit)):.4g} {unit}"
        ax.axvline(float(in_unit(nbytes, unit)), color=GPU_LINE, linestyle=style, linewidth=1.2,
                   label=name if name == size else f"{name} ({size})")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel(f"memory per GPU ({unit})")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure


def peaks_bars(peaks: dict, capacities: dict = None, unit: str = "GB", ax=None):
    """Horizontal bars of each run's step peak (label -> bytes, top to bottom, in the activations' orange), each of
    ``capacities`` (label -> bytes) a dashed vertical line: which GPU holds which run."""
    labels = list(peaks)
    ax = ax or plt.subplots(figsize=(7.5, 0.8 + 0.38 * len(labels)))[1]
    y = np.arange(len(labels))[::-1]
    widths = [float(in_unit(b, unit)) for b in peaks.values()]
    ax.barh(y, widths, color=colour("activations"), edgecolor="white")
    for yi, w in zip(y, widths):
        ax.text(w, yi, f" {w:.1f}", va="center", fontsize=8)
    for (name, nbytes), style in zip((capacities or {}).items(), ("--", "-.", ":", (0, (5, 1)))):
        ax.axvline(float(in_unit(nbytes, unit)), color=GPU_LINE, linestyle=style, linewidth=1.2,
                   label=f"{name} ({float(in_unit(nbytes, unit)):.4g} {unit})")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel(f"peak of a training step per GPU ({unit})")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure


def zero_states_vs_dp(n_params: int = 7 * 10**9, recipe: str = "bf16-adamw", max_dp: int = 64,
                      gpu_bytes: int = A100_BYTES, unit: str = "GB", ax=None):
    """Model states per GPU against the data-parallel degree N_d, one line per ZeRO stage
    (Rajbhandari et al. 2020, Sec. 5: 16P, 4P + 12P/N_d, 2P + 14P/N_d, 16P/N_d for 16 B/param)."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    dps = np.arange(1, max_dp + 1)
    for stage, label in enumerate(("no ZeRO", "ZeRO-1", "ZeRO-2", "ZeRO-3")):
        template = Ledger(n_params=n_params, recipe=recipe, zero_stage=stage, overhead_bytes=0)
        states = sweep(template, dp=dps)["gpu"] / unit_size(unit)
        ax.plot(dps, states, color=colour(label), label=label, marker="o" if stage else None, markersize=2.5)
    capacity = float(in_unit(gpu_bytes, unit))
    ax.axhline(capacity, color=GPU_LINE, linestyle="--", linewidth=1.5, label=f"GPU memory ({capacity:g} {unit})")
    ax.set_xscale("log", base=2)
    ax.set_xticks([2**i for i in range(int(np.log2(max_dp)) + 1)], [str(2**i) for i in range(int(np.log2(max_dp)) + 1)])
    ax.set_xlabel("data-parallel GPUs $N_d$")
    ax.set_ylabel(f"model states per GPU ({unit})")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure


def largest_fit_chart(answers: dict, ylabel: str, unit: str = "GB", ax=None):
    """The largest value that fits against GPU memory, one line per model.

    ``answers``: model -> {GPU bytes: the answer, or None where nothing fits (left out)}; log scale.
    """
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    sizes = sorted({gpu for per_gpu in answers.values() for gpu in per_gpu})
    for name, per_gpu in answers.items():
        points = [(float(in_unit(gpu, unit)), n) for gpu, n in sorted(per_gpu.items()) if n is not None]
        if points:
            ax.plot(*zip(*points), color=colour(name), marker="o", label=name)
    ax.set_yscale("log")
    ax.set_xticks([float(in_unit(g, unit)) for g in sizes], [f"{float(in_unit(g, unit)):.1f}" for g in sizes])
    ax.set_xlabel(f"GPU memory ({unit})")
    ax.set_ylabel(ylabel)
    ax.legend(frameon=False, fontsize=9, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure


#: The kinds of a step's rows (memledger.step.timeline), in stacking order, with their colours.
STEP_KINDS = {"param": ("parameters", "#08306b"), "optimizer": ("optimizer states", "#238b45"),
              "grad": ("gradients", "#6baed6"), "activation": ("saved activations and ids", "#f16913"),
              "transient": ("transients", "#cb181d"), "overhead": ("CUDA context + workspace", "#969696")}


def step_timeline(step, gpu_bytes: int = A100_BYTES, unit: str = "GB", ax=None):
    """Memory on the GPU through one training step (:class:`memledger.step.timeline.Step`), stacked by kind:
    forward through the blocks, the loss, backward, the optimizer step; the landmarks as dotted lines,
    the peak marked, the GPU's capacity dashed. The picture PyTorch's memory snapshot would give."""
    ax = ax or plt.subplots(figsize=(8, 4))[1]
    x, by_kind, marks = step.series()
    order = np.argsort(x, kind="stable")
    scale = float(in_unit(1, unit))
    layers = [by_kind[k][order] * scale for k in STEP_KINDS]
    ax.stackplot(x[order], *layers, labels=[label for label, _ in STEP_KINDS.values()],
                 colors=[c for _, c in STEP_KINDS.values()], linewidth=0)
    capacity = float(in_unit(gpu_bytes, unit))
    ax.axhline(capacity, color=GPU_LINE, linestyle="--", linewidth=1.5, label=f"GPU memory ({capacity:.1f} {unit})")
    for position in marks.values():
        ax.axvline(position, color="black", linestyle=":", linewidth=0.8)
    peak = step.peak
    ax.plot([x[peak.sample]], [float(in_unit(peak.bytes, unit))], marker="v", color="black",
            label=f"peak {float(in_unit(peak.bytes, unit)):.1f} {unit}: {peak.phase}")
    L = step.values["L"]
    ax.set_xticks([(L + 1) / 2, L + 1.5, (3 * L + 4) / 2, 2 * L + 2.5],
                  ["forward\n(blocks 0 to L-1)", "loss", "backward\n(blocks L-1 to 0)", "optimizer"], fontsize=8)
    ax.set_xlim(0, 2 * L + 3)
    ax.set_ylabel(f"memory on the GPU ({unit})")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure
