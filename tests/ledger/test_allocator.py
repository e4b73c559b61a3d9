"""The caching allocator's rules against PyTorch's source: c10/cuda/CUDACachingAllocator.cpp at commit
001074d25084fdb87a799823e395a50f5ec044d3 (pytorch/pytorch), the constants written out here as that file states them,
and requests worked by hand through ``round_size()``, ``get_allocation_size()`` and ``should_split()``."""
import pytest

from memledger.ledger import allocator
from memledger.ledger.allocator import allocation, allocation_table, block_size, expandable_mapped, measures_table, \
    pool, round_size, segment_size

#: name -> value, as the source prints them (lines 48-49 and 118-125)
SOURCE = {
    "K_LARGE_BUFFER": 20971520,       # line 48: "large" allocations may be packed in 20 MiB blocks
    "K_MIN_BLOCK_SIZE": 512,          # line 118: all sizes are rounded to at least 512 bytes
    "K_SMALL_SIZE": 1048576,          # line 120: largest "small" allocation is 1 MiB
    "K_SMALL_BUFFER": 2097152,        # line 121: "small" allocations are packed in 2 MiB blocks
    "K_MIN_LARGE_ALLOC": 10485760,    # line 123: allocations between 1 and 10 MiB may use kLargeBuffer
    "K_ROUND_LARGE": 2097152,         # line 125: round up large allocations to 2 MiB
}


def test_constants_are_the_sources():
    assert {name: getattr(allocator, name) for name in SOURCE} == SOURCE


@pytest.mark.parametrize("nbytes, rounded", [(0, 512), (1, 512), (512, 512), (513, 1024), (1000, 1024),
                                             (1_000_000, 1954 * 512), (4 * 4096 * 4096, 4 * 4096 * 4096)])
def test_round_size(nbytes, rounded):
    assert round_size(nbytes) == rounded


@pytest.mark.parametrize("nbytes, where, segment, block", [
    (1000, "small", 2097152, 1024),                          # packed in a 2 MiB segment
    (1048576, "small", 2097152, 1048576),                    # exactly 1 MiB: still small
    (1048577, "large", 20971520, 1049088),                   # 1 MiB + 1: rounded to 1 MiB + 512, a 20 MiB segment
    (5 * 1048576, "large", 20971520, 5 * 1048576),           # split: 15 MiB remain, more than 1 MiB
    (10 * 1048576, "large", 10 * 1048576, 10 * 1048576),     # 10 MiB: its own segment, nothing remains
    (10 * 1048576 + 1, "large", 12 * 1048576, 10 * 1048576 + 512),   # 2 MiB - 512 remain: split
    (11 * 1048576, "large", 12 * 1048576, 12 * 1048576),      # exactly 1 MiB remains: not more, not split
    (11 * 1048576 + 1, "large", 12 * 1048576, 12 * 1048576),  # 1 MiB - 512 remain: not split, the whole 12 MiB
])
def test_pool_segment_and_block(nbytes, where, segment, block):
    assert (pool(nbytes), segment_size(nbytes), block_size(nbytes)) == (where, segment, block)


def test_expandable_segments_split_every_block():
    assert block_size(11 * 1048576 + 1, expandable=True) == 11 * 1048576 + 512
    # pages: 2 MiB in the small pool, 20 MiB in the large (the note's "2MiB pages for our small pool and 20MiB
    # pages for our large pool")
    assert expandable_mapped(1000) == 2097152 and expandable_mapped(2004 * 1048576) == 101 * 20971520


def test_bad_sizes_are_refused():
    for bad in (-1, 1.5, "3", True):
        with pytest.raises(ValueError, match="nbytes must be a non-negative integer"):
            round_size(bad)


def test_tables():
    table = allocation_table([1000, 11 * 1048576 + 1])
    assert table.rows[1] == ("11,534,337", "11,534,848", "large", "12,582,912", "12 MiB", "1,048,575")
    assert allocation(1000)["block"] == 1024
    assert [r[0] for r in measures_table().rows][-1] == "nvidia-smi (this process)"
