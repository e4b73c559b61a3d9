"""PyTorch's CUDA caching allocator: how a tensor's bytes become a block, and a block a segment.

memledger counts exact bytes; on a GPU every tensor takes a **block** of the caching allocator, and
``torch.cuda.memory_allocated()`` / ``max_memory_allocated()`` count blocks, not tensors. Blocks are cut
from **segments**, which the allocator gets from ``cudaMalloc`` and keeps after the tensors in them die:
``torch.cuda.memory_reserved()`` counts segments. The rules, from ``c10/cuda/CUDACachingAllocator.cpp``
(PyTorch, commit 001074d25084fdb87a799823e395a50f5ec044d3; the same rules since PyTorch 1.x):

* lines 118-119, ``kMinBlockSize = 512``: "all sizes are rounded to at least 512 bytes"
  (:func:`round_size`: ``round_size()``, the default ``roundup_power2_divisions`` off);
* line 120, ``kSmallSize = 1048576``: the largest "small" request, 1 MiB (:func:`pool`);
* lines 121-122, ``kSmallBuffer = 2097152``: small requests are packed in 2 MiB segments;
* lines 123-124, ``kMinLargeAlloc = 10485760``: requests between 1 and 10 MiB get a segment of
  ``kLargeBuffer`` (lines 48-49, ``20971520``, 20 MiB), larger ones their size rounded up to
  ``kRoundLarge`` (line 125, ``2097152``, 2 MiB) (:func:`segment_size`: ``get_allocation_size()``);
* ``should_split()``: a block from the small pool is split when at least 512 bytes remain, one from the
  large pool only when more than ``kSmallSize`` remains; otherwise the request gets the whole block, and
  ``memory_allocated`` counts all of it (:func:`block_size`). With ``expandable_segments:True`` every
  block is split down to 512 bytes, and a segment grows in pages of 2 MiB (small pool) or 20 MiB (large
  pool) instead of one ``cudaMalloc`` per segment ("Note [Expandable Segments]" in the same file).

:data:`MEASURES` says what each number a run can print includes, from the CUDA context (outside PyTorch)
to the 512-byte rounding.
"""
from ..core.table import Table
from ..core.units import MiB

__all__ = ["K_LARGE_BUFFER", "K_MIN_BLOCK_SIZE", "K_MIN_LARGE_ALLOC", "K_ROUND_LARGE", "K_SMALL_BUFFER",
           "K_SMALL_SIZE", "MEASURES", "allocation", "allocation_table", "block_size", "expandable_mapped",
           "measures_table", "pool",
           "round_size", "segment_size"]

#: ``kMinBlockSize`` (line 118): every request is rounded up to a multiple of 512 bytes.
K_MIN_BLOCK_SIZE = 512
#: ``kSmallSize`` (line 120): requests up to 1 MiB (after rounding) come from the small pool.
K_SMALL_SIZE = 1 * MiB
#: ``kSmallBuffer`` (line 121): the small pool's segments, 2 MiB.
K_SMALL_BUFFER = 2 * MiB
#: ``kMinLargeAlloc`` (line 123): requests under 10 MiB share 20 MiB segments.
K_MIN_LARGE_ALLOC = 10 * MiB
#: ``kLargeBuffer`` (line 48): the segment of a request between 1 and 10 MiB, 20 MiB.
K_LARGE_BUFFER = 20 * MiB
#: ``kRoundLarge`` (line 125): larger requests get a segment of their size rounded up to 2 MiB.
K_ROUND_LARGE = 2 * MiB


def _check(nbytes) -> int:
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0:
        raise ValueError(f"nbytes must be a non-negative integer (a tensor's bytes), got {nbytes!r}")
    return nbytes


def _up(n: int, step: int) -> int:
    return -(-n // step) * step


def round_size(nbytes: int) -> int:
    """``round_size()``: at least 512 bytes, else ``nbytes`` rounded up to a multiple of 512."""
    return max(K_MIN_BLOCK_SIZE, _up(_check(nbytes), K_MIN_BLOCK_SIZE))


def pool(nbytes: int) -> str:
    """``get_pool()``: ``"small"`` where the rounded size is at most 1 MiB, else ``"large"``."""
    return "small" if round_size(nbytes) <= K_SMALL_SIZE else "large"


def segment_size(nbytes: int) -> int:
    """``get_allocation_size()`` of the rounded size: the ``cudaMalloc`` a request makes when no cached block
    fits: 2 MiB (small pool), 20 MiB (under 10 MiB), else the size rounded up to 2 MiB."""
    size = round_size(nbytes)
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return _up(size, K_ROUND_LARGE)


def block_size(nbytes: int, expandable: bool = False) -> int:
    """The block a request gets from a fresh segment, what ``memory_allocated`` counts for it: the rounded
    size, or the whole segment where ``should_split()`` refuses to split (large pool, at most 1 MiB left;
    never with ``expandable`` segments)."""
    size = round_size(nbytes)
    remaining = segment_size(nbytes) - size
    if pool(nbytes) == "small" or expandable or remaining > K_SMALL_SIZE:
        return size
    return size + remaining


def expandable_mapped(nbytes: int) -> int:
    """With ``expandable_segments:True``: what a lone request maps in a fresh segment, its rounded size rounded up
    to whole pages of 2 MiB (small pool) or 20 MiB (large pool) ("Note [Expandable Segments]")."""
    page = K_SMALL_BUFFER if pool(nbytes) == "small" else K_LARGE_BUFFER
    return _up(round_size(nbytes), page)


def allocation(nbytes: int, expandable: bool = False) -> dict:
    """One request through the rules: {"bytes", "rounded", "pool", "block", "segment"}."""
    return {"bytes": _check(nbytes), "rounded": round_size(nbytes), "pool": pool(nbytes),
            "block": block_size(nbytes, expandable), "segment": segment_size(nbytes)}


def allocation_table(sizes, unit=None) -> Table:
    """:func:`allocation` of each of ``sizes`` (bytes) as a table: requested, rounded, pool, block, segment."""
    rows = []
    for n in sizes:
        a = allocation(n)
        rows.append((f"{n:,}", f"{a['rounded']:,}", a["pool"], f"{a['block']:,}", f"{a['segment'] / MiB:g} MiB",
                     f"{a['block'] - n:,}"))
    return Table(("requested bytes", "rounded", "pool", "block (allocated)", "new segment (reserved)",
                  "allocated - requested"), rows, numeric=(0, 1, 3, 4, 5))


#: What each measurement of a run's memory includes, smallest first: (measure, what it counts, what it leaves out).
MEASURES = (
    ("memledger's step, MemTracker on the CPU", "the exact bytes of every live tensor",
     "rounding, the allocator's cache, the CUDA context, libraries' own buffers"),
    ("torch.cuda.memory_allocated(), max_memory_allocated()", "the blocks of live tensors: each rounded up to "
     "512 B, or a whole unsplit block; cuBLAS's workspaces once a matmul has run, and cuDNN's convolution "
     "workspaces, which PyTorch takes from the same allocator (aten/src/ATen/native/cudnn/Conv_v7.cpp, Conv_v8.cpp)",
     "freed blocks kept in the cache, the CUDA context, NCCL's and other libraries' own buffers"),
    ("torch.cuda.memory_reserved(), max_memory_reserved()", "the allocator's segments: live blocks and the free "
     "blocks it keeps cached (fragmentation)", "the CUDA context, NCCL's and other libraries' own buffers"),
    ("torch.cuda.mem_get_info()", "free and total bytes of the device, as the driver sees them: total less "
     "everything every process holds", "nothing on the device; it does not say who holds what"),
    ("nvidia-smi (this process)", "reserved + the CUDA context + what NCCL and other libraries allocate outside "
     "PyTorch's allocator", "nothing of this process's"),
)


def measures_table() -> Table:
    """:data:`MEASURES` as a table."""
    return Table(("measure", "counts", "leaves out"), MEASURES)
