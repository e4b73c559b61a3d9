"""Figures for the book (matplotlib): each one draws library numbers, none typed.

One palette for every chapter: a component (a ledger row, a parameter part, a
kind of saved tensor) has the same colour in every figure. Captions live in
the chapters (cell metadata), so these functions set no titles.
"""
import re
from fractions import Fraction

import matplotlib.pyplot as plt
import numpy as np
import sympy as sp

from ..activations.inventory import inventory
from ..models.presets import get_preset
from ..ledger.hardware import GPU_MEMORY
from ..ledger.ledger import Ledger, sweep
from ..core.symbols import L, S
from ..core.units import in_unit, unit_size

__all__ = ["A100_BYTES", "GPU_LINE", "PALETTE", "STEP_KINDS", "activations_vs_seq", "bf16_master_drift",
           "checkpoint_trade", "colour", "landmark_bars", "largest_fit_chart", "layer_breakdown", "ledger_bars",
           "ledger_waterfall", "lora_vs_rank", "paired_bars", "parameter_breakdown", "parameter_shares",
           "parts_bars", "peak_vs_dp", "peaks_bars", "per_rank_lines", "reserved_two_lengths", "same_tokens_bars",
           "saved_parts_bars", "states_per_param_bars", "step_timeline", "sum_and_peak_bars", "unit_life",
           "unit_lifetimes", "variant_bars", "zero_states_vs_dp"]

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
    # what a layer saves, by the part of the layer that saved it (chapter 19), beside the three above
    "other": "#969696",
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


def saved_parts_bars(parts: dict, unit: str = "MB", ax=None):
    """Stacked bars of what one layer saves for backward, one bar per implementation (label -> {part: bytes}, left
    to right), stacked by the part of the layer that saved it (``norms``, ``attention``, ``MLP``, ``other``: the
    parts of :func:`memledger.pytorch.model_code.saved_by_part`), each bar's total written above it."""
    labels = list(parts)
    ax = ax or plt.subplots(figsize=(7.5, 4))[1]
    bottom = np.zeros(len(labels))
    for part in ("norms", "attention", "MLP", "other"):
        heights = np.array([float(in_unit(p.get(part, 0), unit)) for p in parts.values()])
        if heights.any():
            ax.bar(range(len(labels)), heights, bottom=bottom, label=part, color=colour(part), edgecolor="white",
                   linewidth=0.5)
            bottom += heights
    for x, top in enumerate(bottom):
        ax.text(x, top, f"{top:.0f}", ha="center", va="bottom", fontsize=8)
    ax.set_ylabel(f"saved for backward, one layer ({unit})")
    ax.set_ylim(0, max(bottom) * 1.1)
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    _bar_labels(ax, labels)
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


# --- figures added for issue 31: one per idea a chapter's prose teaches --------------------------------------------

def _legend_right(ax):
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))


def _capacity_line(ax, gpu_bytes, unit, vertical=False):
    capacity = float(in_unit(gpu_bytes, unit))
    line = ax.axvline if vertical else ax.axhline
    line(capacity, color=GPU_LINE, linestyle="--", linewidth=1.5, label=f"GPU memory ({capacity:.1f} {unit})")


def parameter_shares(presets, ax=None):
    """100 % stacked bars: each preset's parameters by part (attention, MLP, norms, embeddings), in percent of its
    counted parameters (:meth:`memledger.models.architecture.Architecture.parts`): how the embeddings' share shrinks as a
    model grows."""
    ax = ax or plt.subplots(figsize=(7.5, 3.6))[1]
    archs = [get_preset(name) for name in presets]
    parts = [a.parts() for a in archs]
    bottom = np.zeros(len(presets))
    for name in parts[0]:
        heights = np.array([100 * p[name] / a.computed_params for p, a in zip(parts, archs)])
        ax.bar(range(len(presets)), heights, bottom=bottom, label=name, color=colour(name), edgecolor="white",
               linewidth=0.5)
        bottom += heights
    ax.set_ylabel("share of the parameters (%)")
    ax.set_ylim(0, 100)
    _legend_right(ax)
    ax.figure.tight_layout()
    _bar_labels(ax, list(presets), fontsize=7)
    ax.figure.tight_layout()
    return ax.figure


def bf16_master_drift(weight=Fraction(5, 4), update=Fraction(-1, 1000), steps: int = 100, ax=None):
    """A weight given the same small update ``steps`` times: kept in BF16 alone (each step rounded back,
    :func:`memledger.core.dtypes.round_to_bf16`), kept as an FP32 master copy (NumPy float32 arithmetic), and the
    BF16 weights re-derived from that master after every step (what the forward pass uses)."""
    from ..core.dtypes import round_to_bf16
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    bf16 = [round_to_bf16(weight)]
    master = [np.float32(weight)]
    for _ in range(steps):
        bf16.append(round_to_bf16(bf16[-1] + update))
        master.append(np.float32(master[-1] + np.float32(update)))
    derived = [round_to_bf16(Fraction(float(m))) for m in master]
    k = np.arange(steps + 1)
    ax.plot(k, [float(w) for w in master], color=colour("FP32 master weights"), label="FP32 master copy")
    ax.step(k, [float(w) for w in derived], where="post", color=colour("BF16 parameters"), linestyle="--",
            label="BF16 weights re-derived from the master")
    ax.plot(k, [float(w) for w in bf16], color=colour("quadratic in S"), label="BF16 weights alone (updates lost)")
    ax.set_xlabel("optimizer steps")
    ax.set_ylabel("weight value")
    _legend_right(ax)
    ax.figure.tight_layout()
    return ax.figure


def _linear_quadratic(rows, ledger):
    """(linear, quadratic) bytes one layer of ``ledger`` saves under the inventory ``rows``."""
    linear = ledger.evaluate(sum(r.bytes for r in rows if not r.quadratic))
    quadratic = ledger.evaluate(sum((r.bytes for r in rows if r.quadratic), sp.Integer(0)))
    return int(linear), int(quadratic)


def variant_bars(variants: dict, ledger, unit: str = "MiB", ax=None):
    """One layer's saved bytes under each block variant (label -> inventory rows, :func:`memledger.inventory`), at
    ``ledger``'s B, S and shape, stacked: the B x S x d tensors and the B x H x S x S ones."""
    labels = list(variants)
    ax = ax or plt.subplots(figsize=(7.5, 3.8))[1]
    split = [_linear_quadratic(rows, ledger) for rows in variants.values()]
    lin = np.array([float(in_unit(a, unit)) for a, _ in split])
    quad = np.array([float(in_unit(b, unit)) for _, b in split])
    x = range(len(labels))
    ax.bar(x, lin, color=colour("linear in S"), label="B×S×d tensors (linear in S)", edgecolor="white")
    ax.bar(x, quad, bottom=lin, color=colour("quadratic in S"), label="B×H×S×S tensors (quadratic in S)",
           edgecolor="white")
    ax.set_ylabel(f"saved per layer ({unit})")
    _legend_right(ax)
    ax.figure.tight_layout()
    _bar_labels(ax, labels)
    ax.figure.tight_layout()
    return ax.figure


def same_tokens_bars(preset: str = "article-7b", tokens: int = 8192, seqs=(1024, 2048, 4096, 8192),
                     unit: str = "GB", ax=None):
    """Saved activations of all layers for one token budget B x S = ``tokens`` cut into different shapes, stacked:
    the linear part is the same for every shape, the quadratic part grows with S."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    ledgers = [Ledger(preset, batch_size=tokens // s, seq_len=s, scope="layers") for s in seqs]
    rows = inventory(ledgers[0].arch.mlp, ledgers[0].arch.norm, dropout=ledgers[0].dropout,
                     attention_dropout=ledgers[0].arch.attention_dropout)
    split = [_linear_quadratic(rows, led) for led in ledgers]
    n = ledgers[0].arch.n_layers
    lin = np.array([float(in_unit(n * a, unit)) for a, _ in split])
    quad = np.array([float(in_unit(n * b, unit)) for _, b in split])
    x = range(len(seqs))
    ax.bar(x, lin, color=colour("linear in S"), label="B×S×d tensors (linear in S)", edgecolor="white")
    ax.bar(x, quad, bottom=lin, color=colour("quadratic in S"), label="B×H×S×S tensors (quadratic in S)",
           edgecolor="white")
    ax.set_xticks(list(x), [f"B = {tokens // s}\nS = {s}" for s in seqs], fontsize=8)
    ax.set_ylabel(f"saved activations, {n} layers ({unit})")
    _legend_right(ax)
    ax.figure.tight_layout()
    return ax.figure


def ledger_waterfall(ledger, gpu_bytes: int = A100_BYTES, unit: str = "GB", ax=None):
    """The ledger's GPU rows stacked one on the next, left to right (a waterfall): each bar starts where the rows
    before it end, the last reaches the total; the GPU's capacity dashed."""
    rows = [r for r in ledger.rows if r.device == "gpu"]
    ax = ax or plt.subplots(figsize=(7.5, 4))[1]
    start = 0
    for i, r in enumerate(rows):
        ax.bar(i, float(in_unit(r.bytes, unit)), bottom=float(in_unit(start, unit)), color=colour(r.name),
               edgecolor="white")
        start += r.bytes
    ax.bar(len(rows), float(in_unit(start, unit)), color="#525252", edgecolor="white")
    _capacity_line(ax, gpu_bytes, unit)
    ax.set_ylabel(f"memory per GPU ({unit})")
    _legend_right(ax)
    ax.figure.tight_layout()
    _bar_labels(ax, [r.name for r in rows] + ["total"], fontsize=7)
    ax.figure.tight_layout()
    return ax.figure


def checkpoint_trade(ledgers: dict, extra_flops: dict, unit: str = "GB", ax=None):
    """Each recomputation mode as a point: its extra FLOPs (``extra_flops``: mode -> a fraction of the step's
    FLOPs, a SymPy expression or number, evaluated at the ledger's values) against the activations it saves
    (``ledgers``: mode -> Ledger)."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    for mode, ledger in ledgers.items():
        x = 100 * float(sp.sympify(extra_flops[mode]).subs(ledger.bindings))
        y = float(in_unit(ledger.group_total("activations"), unit))
        ax.plot([x], [y], marker="o", markersize=8, linestyle="none", color=colour("activations"))
        ax.annotate(f" {mode}", (x, y), fontsize=9, va="bottom")
    ax.set_xlabel("extra FLOPs per training step (%)")
    ax.set_ylabel(f"saved activations ({unit})")
    ax.set_xlim(left=-2)
    ax.set_ylim(bottom=0)
    ax.figure.tight_layout()
    return ax.figure


def per_rank_lines(setup: dict, dps=(1, 2, 4, 8), unit: str = "GB", ax=None):
    """GPU and host memory per rank and the PCIe bytes per rank per step (:attr:`Ledger.traffic`) against the
    number of data-parallel GPUs, for ``setup`` (Ledger keyword arguments) at each ``dp``."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    ledgers = [Ledger(**setup, dp=n) for n in dps]
    series = {"GPU memory per rank": ([led.totals["gpu"] for led in ledgers], colour("BF16 parameters"), "o"),
              "host memory per rank": ([led.totals["cpu"] for led in ledgers], colour("Adam first moment m"), "s"),
              "PCIe traffic per rank per step": ([led.traffic.pcie_bytes for led in ledgers], colour("activations"),
                                                 "^")}
    for label, (values, c, marker) in series.items():
        ax.plot(list(dps), [float(in_unit(v, unit)) for v in values], color=c, marker=marker, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(dps), [str(n) for n in dps])
    ax.set_xlabel("data-parallel GPUs $N_d$")
    ax.set_ylabel(unit)
    ax.set_ylim(bottom=0)
    _legend_right(ax)
    ax.figure.tight_layout()
    return ax.figure


def sum_and_peak_bars(ledgers: dict, gpu_bytes: int = A100_BYTES, unit: str = "GB", ax=None):
    """Two bars per setup: the sum of the ledger's GPU rows and the peak of its step
    (:meth:`Ledger.step`); the GPU's capacity dashed."""
    labels = list(ledgers)
    ax = ax or plt.subplots(figsize=(7.5, 3.8))[1]
    x = np.arange(len(labels))
    sums = [float(in_unit(led.totals["gpu"], unit)) for led in ledgers.values()]
    peaks = [float(in_unit(led.step().peak.bytes, unit)) for led in ledgers.values()]
    ax.bar(x - 0.2, sums, width=0.4, color="#9e9ac8", label="sum of the rows", edgecolor="white")
    ax.bar(x + 0.2, peaks, width=0.4, color=colour("activations"), label="peak of the step", edgecolor="white")
    _capacity_line(ax, gpu_bytes, unit)
    ax.set_ylabel(f"memory per GPU ({unit})")
    _legend_right(ax)
    ax.figure.tight_layout()
    _bar_labels(ax, labels)
    ax.figure.tight_layout()
    return ax.figure


def landmark_bars(steps: dict, unit: str = "GB", ax=None):
    """Grouped bars: each step's GPU memory at its landmarks (before forward, after forward, after backward, after
    the optimizer step) and its peak, one colour per step (label -> :class:`memledger.step.timeline.Step`)."""
    ax = ax or plt.subplots(figsize=(7.5, 3.8))[1]
    names = list(next(iter(steps.values())).landmarks) + ["peak"]
    width = 0.8 / len(steps)
    colours = ("#2171b5", "#f16913", "#238b45", "#6a51a3")
    for i, (label, step) in enumerate(steps.items()):
        values = [step.landmarks[n]["gpu"] for n in names[:-1]] + [step.peak.bytes]
        ax.bar(np.arange(len(names)) + (i - (len(steps) - 1) / 2) * width, [float(in_unit(v, unit)) for v in values],
               width=width, label=label, color=colours[i % len(colours)], edgecolor="white")
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel(f"memory on the GPU ({unit})")
    _legend_right(ax)
    ax.figure.tight_layout()
    return ax.figure


def states_per_param_bars(views: dict, params: int, ax=None):
    """Bytes per parameter of model states that each view books (a ledger or a convention's estimate, label ->
    view), stacked by role (:func:`memledger.calculators.parts.gpu_parts`), over ``params`` parameters."""
    from ..calculators.parts import gpu_parts
    labels = list(views)
    parts = [gpu_parts(v) for v in views.values()]
    ax = ax or plt.subplots(figsize=(7.5, 3.8))[1]
    bottom = np.zeros(len(labels))
    for part in ("weights", "gradients", "optimizer states", "model states, roles not split"):
        heights = np.array([p[part] / params for p in parts], dtype=float)
        if heights.any():
            ax.bar(range(len(labels)), heights, bottom=bottom, label=part, color=colour(part), edgecolor="white")
            bottom += heights
    ax.set_ylabel("model states (bytes per parameter)")
    _legend_right(ax)
    ax.figure.tight_layout()
    _bar_labels(ax, labels, fontsize=7)
    ax.figure.tight_layout()
    return ax.figure


def paired_bars(values: dict, ylabel: str, unit: str = "GB", colours=None, ax=None):
    """Grouped bars: ``values`` is label -> {series -> bytes}, one group per label, one bar per series, each series
    in its colour (``colours``: series -> colour, default the palette's activations and losses)."""
    labels = list(values)
    series = list(next(iter(values.values())))
    colours = colours or dict(zip(series, ("#2171b5", "#cb181d", "#238b45", "#6a51a3")))
    ax = ax or plt.subplots(figsize=(7.5, 3.8))[1]
    width = 0.8 / len(series)
    for i, name in enumerate(series):
        ax.bar(np.arange(len(labels)) + (i - (len(series) - 1) / 2) * width,
               [float(in_unit(values[label][name], unit)) for label in labels], width=width, label=name,
               color=colours[name], edgecolor="white")
    ax.set_ylabel(f"{ylabel} ({unit})")
    _legend_right(ax)
    ax.figure.tight_layout()
    _bar_labels(ax, labels, fontsize=7)
    ax.figure.tight_layout()
    return ax.figure


def lora_vs_rank(preset: str, target_sets: dict, ranks=(1, 2, 4, 8, 16, 32, 64, 128, 256), full=None,
                 gpu_bytes: int = None, unit: str = "GB", ax=None, **setup):
    """GPU memory of a LoRA run (:class:`memledger.ledger.lora.LoraLedger`, ``setup`` its other fields) against
    the rank, one line per set of targets (label -> projection names), beside a full fine-tune (``full``, a
    Ledger, dotted) and a GPU's capacity (dashed)."""
    from ..calculators.parts import gpu_total
    from ..ledger.lora import LoraConfig, LoraLedger
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    for (label, targets), c in zip(target_sets.items(), ("#2171b5", "#6a51a3", "#238b45")):
        totals = [gpu_total(LoraLedger(preset, LoraConfig(rank=r, targets=tuple(targets)), **setup)) for r in ranks]
        ax.plot(list(ranks), [float(in_unit(t, unit)) for t in totals], marker="o", markersize=3, color=c,
                label=f"LoRA, {label}")
    if full is not None:
        ax.axhline(float(in_unit(gpu_total(full), unit)), color="black", linestyle=":", label="full fine-tuning")
    return _powers_of_two(ax, ranks, "LoRA rank r", f"memory per GPU ({unit})", gpu_bytes, unit)


def peak_vs_dp(setups: dict, dps=(2, 4, 8, 16, 32, 64), gpu_bytes: int = None, unit: str = "GB", ax=None):
    """Each setup's step peak per GPU (label -> Ledger keyword arguments, run at each ``dp``) against the number
    of data-parallel GPUs; the GPU's capacity dashed."""
    ax = ax or plt.subplots(figsize=(6.5, 3.8))[1]
    for (label, setup), c in zip(setups.items(), ("#2171b5", "#f16913", "#238b45", "#6a51a3", "#cb181d")):
        peaks = [Ledger(**{**setup, "dp": n}).step().peak.bytes for n in dps]
        ax.plot(list(dps), [float(in_unit(p, unit)) for p in peaks], marker="o", markersize=3, color=c, label=label)
    return _powers_of_two(ax, dps, "data-parallel GPUs $N_d$", f"peak of a step per GPU ({unit})", gpu_bytes, unit)


def _powers_of_two(ax, ticks, xlabel: str, ylabel: str, gpu_bytes, unit: str):
    """Finish a plot over powers of two: the GPU's capacity dashed, a log-2 axis ticked at ``ticks``, the labels,
    the legend on the right."""
    if gpu_bytes is not None:
        _capacity_line(ax, gpu_bytes, unit)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ticks), [str(n) for n in ticks])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    _legend_right(ax)
    ax.figure.tight_layout()
    return ax.figure


def reserved_two_lengths(first: int, sizes, label_of=None, xlabel: str = "request (bytes)", unit: str = "MiB", ax=None):
    """What the caching allocator reserves for one tensor of ``first`` bytes followed by one of each size in
    ``sizes`` (:mod:`memledger.ledger.allocator`): by default the first segment, plus a second where the later
    request's rounded size does not fit in it; with expandable segments the pages mapped for the larger of the two.
    ``label_of`` maps a size to its x value (e.g. the sequence length); default the size itself."""
    from ..ledger.allocator import expandable_mapped, round_size, segment_size
    ax = ax or plt.subplots(figsize=(6.5, 3.6))[1]
    label_of = label_of or (lambda n: n)
    x = [label_of(n) for n in sizes]
    default = [segment_size(first) + (segment_size(n) if round_size(n) > segment_size(first) else 0) for n in sizes]
    expandable = [max(expandable_mapped(first), expandable_mapped(n)) for n in sizes]
    ax.step(x, [float(in_unit(v, unit)) for v in default], where="post", color=colour("quadratic in S"),
            label="default segments")
    ax.step(x, [float(in_unit(v, unit)) for v in expandable], where="post", color=colour("linear in S"),
            label="expandable segments")
    ax.axvline(label_of(first), color="black", linestyle=":", linewidth=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"reserved ({unit})")
    ax.set_ylim(bottom=0)
    _legend_right(ax)
    ax.figure.tight_layout()
    return ax.figure


def unit_lifetimes(step, prefix: str = "FSDP2", layers=(None, 0, 1)) -> list:
    """(unit, name, bytes, born, freed) of each tensor whose name starts with ``prefix`` and belongs to one of
    ``layers`` (``None`` is the root unit), every time it is allocated: op indices into ``step.built.ops`` (freed
    at the step's last op where nothing frees it); :func:`unit_life` draws them."""
    built = step.built
    size = dict(zip(built.names, (int(b) for b in step.sizes)))
    open_, out = {}, []
    for i, op in enumerate(built.ops):
        for layer, name in op.frees:
            if (layer, name) in open_:
                out.append((layer, name, size[name], open_.pop((layer, name)), i))
        for layer, name in op.allocs:
            if name.startswith(prefix) and layer in layers and (layer, name) not in open_:
                open_[(layer, name)] = i
    out += [(layer, name, size[name], born, len(built.ops) - 1) for (layer, name), born in open_.items()]
    return sorted(out, key=lambda r: (layers.index(r[0]), r[3]))


#: the colour of each kind of FSDP2 buffer in :func:`unit_life`
FSDP2_KINDS = {"all-gather input": "#9ecae1", "all-gather output": "#2171b5", "unsharded parameters": "#08306b",
               "reduce-scatter input": "#f16913", "sharded gradients": "#6baed6"}


def _unit_label(layer, name: str) -> str:
    return f"{'root' if layer is None else f'block {layer}'}: {name.removeprefix('FSDP2 ').split(' (')[0]}"


def unit_life(step, layers=(None, 0, 1), ax=None):
    """An FSDP2 unit's life on the step's op axis: for the root and the first blocks, each buffer FSDP2 allocates
    (all-gather input and output, unsharded parameters, reduce-scatter input, sharded gradients) as a bar from
    the op that allocates it to the op that frees it, one row per unit and buffer; the phases shaded."""
    rows = unit_lifetimes(step, layers=layers)
    labels = []
    for layer, name, *_ in rows:
        label = _unit_label(layer, name)
        if label not in labels:
            labels.append(label)
    ax = ax or plt.subplots(figsize=(8, 0.6 + 0.28 * len(labels)))[1]
    ops = step.built.ops
    phases = [op.phase.value for op in ops]
    starts = [i for i in range(len(ops)) if i == 0 or phases[i] != phases[i - 1]] + [len(ops)]
    shade = {"forward": "#f7f7f7", "loss": "#fee0d2", "backward": "#deebf7", "optimizer": "#e5f5e0"}
    for a, b in zip(starts, starts[1:]):
        ax.axvspan(a - 0.5, b - 0.5, color=shade.get(phases[a], "#ffffff"), zorder=0)
    y = {label: len(labels) - 1 - i for i, label in enumerate(labels)}
    for layer, name, _, born, freed in rows:
        label = _unit_label(layer, name)
        kind = next(k for k in FSDP2_KINDS if k in name)
        ax.barh(y[label], max(freed - born, 0.6), left=born, color=FSDP2_KINDS[kind], height=0.7, zorder=2)
    ax.set_yticks(list(y.values()), list(y), fontsize=7)
    ax.set_xticks([(a + b - 1) / 2 for a, b in zip(starts, starts[1:])], [phases[a] for a in starts[:-1]],
                  fontsize=8)
    ax.set_xlim(-0.5, len(ops) - 0.5)
    ax.set_xlabel("the step, op by op")
    ax.figure.tight_layout()
    return ax.figure
