"""Figures of the step and of its checks against PyTorch (chapters on the peak and on PyTorch).

* :func:`step_timelines`: several step timelines in one figure, one panel per
  setup, on a shared memory axis; each panel is
  :func:`memledger.views.plots.step_timeline` (memory on the GPU through one
  training step, stacked by kind, the landmarks dotted, the peak marked, the
  GPU's capacity dashed); the legend is drawn once.
* :func:`ladder_bars`: the exactness ladder of :func:`memledger.pytorch.compare.ladder`,
  one panel per block: memledger's bytes under each rung of conventions
  against what PyTorch saved.

Captions live in the chapters.
"""
import matplotlib.pyplot as plt

from .plots import GPU_LINE, PALETTE, step_timeline

__all__ = ["ladder_bars", "step_timelines"]

def step_timelines(steps: dict, gpu_bytes: int, unit: str = "GB", height: float = 2.6):
    """One panel per ``{label: Step}``, top to bottom, sharing the y axis; returns the figure."""
    fig, axes = plt.subplots(len(steps), 1, figsize=(8.5, height * len(steps)), sharey=True, squeeze=False)
    for i, (ax, (label, step)) in enumerate(zip(axes[:, 0], steps.items())):
        step_timeline(step, gpu_bytes, unit, ax=ax)
        ax.text(0.01, 0.96, label, transform=ax.transAxes, va="top", fontsize=9,
                bbox=dict(facecolor="white", edgecolor="none", alpha=0.8))
        handles, labels = ax.get_legend_handles_labels()
        ax.get_legend().remove()
        peak = next(h for h, lab in zip(handles, labels) if lab.startswith("peak"))
        ax.legend([peak], [labels[handles.index(peak)]], fontsize=8, frameon=False, loc="upper right")
        if i == 0:
            common = [(h, lab) for h, lab in zip(handles, labels) if not lab.startswith("peak")]
            fig.legend(*zip(*common), fontsize=8, frameon=False, loc="upper center", ncol=4,
                       bbox_to_anchor=(0.5, 1.0))
        if i < len(steps) - 1:
            ax.set_xticklabels([])
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    return fig


def ladder_bars(ladders: dict):
    """One panel per ``{block label: ladder rungs}``: a bar per rung (memledger's bytes for one block), the
    bytes PyTorch saved as a dashed line; returns the figure."""
    fig, axes = plt.subplots(1, len(ladders), figsize=(4.2 * len(ladders), 3.4), squeeze=False)
    for ax, (label, rungs) in zip(axes[0], ladders.items()):
        names = [r["step"].replace("the article's conventions", "article").replace("+ ", "+").replace(" = ", "=\n")
                 for r in rungs]
        ax.bar(range(len(rungs)), [r["predicted"] for r in rungs], color=PALETTE["activations"])
        ax.axhline(rungs[0]["measured"], color=GPU_LINE, linestyle="--", linewidth=1.5, label="PyTorch saved")
        ax.set_xticks(range(len(rungs)), names, fontsize=7)
        ax.set_ylabel(f"bytes kept by one {label} block")
        ax.set_ylim(0, 1.18 * max(rungs[0]["measured"], *(r["predicted"] for r in rungs)))
        ax.legend(fontsize=8, frameon=False, loc="upper left")
    fig.tight_layout()
    return fig
