"""The caching allocator's rules as a picture (:mod:`memledger.ledger.allocator`): what a request of n bytes
costs in the block ``memory_allocated`` counts and in the segment ``memory_reserved`` counts.

:func:`allocator_chart` draws, for requests from one byte to 64 MiB, (a) the block beyond the request, in
percent (the 512-byte rounding; a whole unsplit block of a large segment) and (b) the new segment a request makes when no
cached block fits. Captions live in the chapters; no function sets a title.
"""
import matplotlib.pyplot as plt
import numpy as np

from ..core.units import MiB
from ..ledger.allocator import K_MIN_LARGE_ALLOC, K_SMALL_SIZE, block_size, round_size, segment_size

__all__ = ["allocator_chart", "allocator_timeline", "published_chart", "request_sizes"]


def request_sizes(largest: int = 64 * MiB, points: int = 1500) -> list:
    """Request sizes from 1 byte to ``largest``: a geometric grid, plus each side of the pools' boundaries."""
    grid = {int(n) for n in np.geomspace(1, largest, points)}
    for edge in (K_SMALL_SIZE, K_MIN_LARGE_ALLOC):
        grid |= {edge - 1, edge, edge + 1}
    return sorted(grid)


def allocator_chart(largest: int = 64 * MiB):
    """(a) the block beyond the request, in percent of the request; (b) the new segment in MiB; against the
    request (log axes). Requests that are multiples of 512 B take no rounding and do not show in (a)."""
    sizes = request_sizes(largest)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7.5, 5.2), sharex=True)
    share = [100 * (block_size(n) - n) / n for n in sizes]
    rounded = [100 * (round_size(n) - n) / n for n in sizes]
    top.scatter(sizes, share, s=3, color="#C44E52", label="a whole unsplit block (large pool)")
    top.scatter(sizes, rounded, s=3, color="#4C72B0", label="rounded up to a multiple of 512 B")
    top.set_yscale("log")
    top.set_ylim(1e-4, 1e5)
    top.set_ylabel("block beyond the request (%)")
    top.legend(loc="upper right", fontsize=8, frameon=False, markerscale=3)
    bottom.step(sizes, [segment_size(n) / MiB for n in sizes], where="post", color="#55A868", lw=1.2,
                label="new segment (memory_reserved counts it)")
    bottom.plot(sizes, [n / MiB for n in sizes], color="#8C8C8C", lw=0.8, ls="--", label="the request itself")
    bottom.set_yscale("log")
    bottom.set_ylabel("MiB")
    bottom.set_xscale("log")
    bottom.set_xlabel("requested bytes")
    bottom.legend(loc="upper left", fontsize=8, frameon=False)
    for ax in (top, bottom):
        for edge in (K_SMALL_SIZE, K_MIN_LARGE_ALLOC):
            ax.axvline(edge, color="#bbbbbb", lw=0.8, ls=":")
        ax.spines[["top", "right"]].set_visible(False)
    for edge, label in ((K_SMALL_SIZE, "1 MiB"), (K_MIN_LARGE_ALLOC, "10 MiB")):
        bottom.annotate(label, (edge, bottom.get_ylim()[0]), xytext=(2, 4), textcoords="offset points", fontsize=7,
                        color="#777777")
    fig.tight_layout()
    return fig


def allocator_timeline(replay, unit: str = "GB", ax=None):
    """What ``max_memory_allocated`` and ``max_memory_reserved`` would read after every op of a replayed step
    (:func:`memledger.ledger.replay.replay`, two steps side by side): allocated as a line, reserved above it, the
    band between them the cached free blocks; the steps' phases marked on the axis, both peaks marked."""
    from ..core.units import in_unit
    ax = ax or plt.subplots(figsize=(8, 3.6))[1]
    scale = float(in_unit(1, unit))
    x = np.arange(len(replay.series))
    allocated = np.array([s[3] for s in replay.series], dtype=float) * scale
    reserved = np.array([s[4] for s in replay.series], dtype=float) * scale
    ax.fill_between(x, allocated, reserved, color="#DD8452", alpha=0.35, lw=0, label="cached, free (reserved only)")
    ax.plot(x, reserved, color="#DD8452", lw=1.4, label="reserved: segments")
    ax.plot(x, allocated, color="#4C72B0", lw=1.4, label="allocated: blocks of live tensors")
    for values, colour in ((allocated, "#4C72B0"), (reserved, "#DD8452")):
        top = int(np.argmax(values))
        ax.plot([x[top]], [values[top]], marker="v", color=colour, ms=7)
    ticks, labels, previous, steps = [], [], None, []
    for i, (step, _, phase, _, _) in enumerate(replay.series):
        if (step, phase) != previous:
            if step not in steps:
                steps.append(step)
            previous = (step, phase)
            ax.axvline(i, color="black", ls=":", lw=0.6)
            if phase != "loss":             # too short to label beside backward
                ticks.append(i)
                labels.append(f"{('first', 'second')[steps.index(step)]} step\n{phase}" if phase == "forward"
                              else phase)
    ax.set_xticks(ticks, labels, fontsize=7, ha="left")      # each label starts where its phase does
    ax.set_xlim(0, len(x) - 1)
    ax.set_ylim(0, None)
    ax.set_ylabel(f"memory ({unit})")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure


def published_chart(rows, unit: str = "GB", band: float = 0.05, ax=None):
    """Predicted against measured for published runs (:func:`memledger.article.published.compare`): one point per
    run, filled where memledger computed the row's own measure, hollow where it computed what it has instead; the
    diagonal and a band of ``band`` either side of it."""
    from ..core.units import in_unit
    ax = ax or plt.subplots(figsize=(6.2, 5.4))[1]
    scale = float(in_unit(1, unit))
    colours = {"pytorch/torchtune": "#4C72B0", "Lightning-AI/litgpt": "#55A868", "huggingface/transformers": "#C44E52"}
    top = max(max(r["measured"], r["predicted"]) for r in rows) * scale * 1.08
    line = np.array([0, top])
    ax.fill_between(line, line * (1 - band), line * (1 + band), color="#BBBBBB", alpha=0.4, lw=0,
                    label=f"within {band:.0%}")
    ax.plot(line, line, color="black", lw=0.8)
    seen = set()
    for r in rows:
        project = r["source"].split("@")[0]
        colour = colours.get(project, "#8172B2")
        label = project if project not in seen else None
        seen.add(project)
        ax.scatter([r["measured"] * scale], [r["predicted"] * scale], s=36, edgecolors=colour,
                   facecolors="none" if r["missing"] else colour, marker="s" if r["scope"] == "load" else "o",
                   label=label, linewidths=1.3)
    ax.set_xlim(0, top)
    ax.set_ylim(0, top)
    ax.set_xlabel(f"published measurement ({unit})")
    ax.set_ylabel(f"memledger's prediction ({unit})")
    ax.legend(fontsize=8, frameon=False, loc="upper left")
    ax.set_aspect("equal")
    ax.figure.tight_layout()
    return ax.figure
