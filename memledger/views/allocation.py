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

__all__ = ["allocator_chart", "request_sizes"]


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
