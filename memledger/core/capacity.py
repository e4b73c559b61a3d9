"""What "fits" means, once for the whole library: the judged bytes leave at least a margin free on the GPU.

A plan that fills the GPU to the last byte does not run: the caching allocator rounds every block up and keeps
freed blocks of the wrong size (fragmentation), and libraries allocate beside it. So every verdict
(``Ledger.fits``, ``Step.fits``, :func:`memledger.fit`, the explorer, the static calculator, the command line)
asks for :data:`MARGIN`, about a gigabyte, to spare; ``within`` (no margin) is the article's bare comparison.
"""
from .units import GB

__all__ = ["MARGIN", "leaves_margin", "standing"]

#: Bytes a fit must leave free on the GPU beside what it judges (about 1 GB); less is no fit.
MARGIN = 1 * GB


def leaves_margin(judged_bytes: int, gpu_bytes: int, margin: int = MARGIN) -> bool:
    """Whether ``judged_bytes`` fits in ``gpu_bytes`` with at least ``margin`` bytes to spare."""
    return judged_bytes + margin <= gpu_bytes


def standing(judged_bytes: int, gpu_bytes: int, margin: int = MARGIN) -> str:
    """``"over"`` (more than the GPU), ``"tight"`` (less than ``margin`` left) or ``"fits"``."""
    room = gpu_bytes - judged_bytes
    return "over" if room < 0 else "tight" if room < margin else "fits"
