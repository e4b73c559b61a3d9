"""The caching allocator's port (memledger/ledger/caching.py) against the expectations of PyTorch's own allocator
tests. Each test names the PyTorch test it follows; the expected numbers are those tests' assertions, or arithmetic
on the rules of ``c10/cuda/CUDACachingAllocator.cpp`` (commit eb42ad6eca0ce61e7c581212b4bf32f991425571) written out.
docs/allocator.md keeps the table (test, expected, memledger)."""
import random

import pytest

from memledger.ledger.caching import CachingAllocator, OutOfMemory, _roundup_power2_next_division, round_size

MiB = 1024 * 1024
FLOAT = 4


def test_memory_stats_one_kib():
    """test_cuda.py ``test_memory_stats``: ``torch.randn(256)`` makes ``active_bytes.all.current`` grow by 1024 and,
    deleted, ``active_bytes.all.freed`` 1024 and current back where it was."""
    a = CachingAllocator()
    t = a.malloc(256 * FLOAT)
    assert a.allocated == 1024
    a.free(t)
    assert a.allocated == 0 and a.reserved == 2 * MiB        # the 2 MiB small segment stays cached (kSmallBuffer)


def _power2_div(size, div_factor):
    """test_cuda.py ``test_allocator_settings``'s own ``power2_div`` helper, as written there."""
    pow2 = 1
    while pow2 < size:
        pow2 = pow2 * 2
    if pow2 == size:
        return pow2
    step = pow2 / 2 / div_factor
    ret = pow2 / 2
    while ret < size:
        ret = ret + step
    return ret


def test_allocator_settings_roundup_power2_divisions():
    """test_cuda.py ``test_allocator_settings``: ``torch.rand(21 * 1024 * 1024)`` allocates ``nbytes`` (4 x nelems);
    under ``roundup_power2_divisions:4`` the same request allocates ``power2_div(nbytes, 4)``; under
    ``max_split_size_mb:40`` after ``empty_cache()`` ``nbytes`` again."""
    nelems = 21 * 1024 * 1024
    nbytes = FLOAT * nelems
    a = CachingAllocator()
    start = a.allocated
    a.malloc(nbytes)
    reg = a.allocated
    assert reg - start == nbytes
    a.set_allocator_settings(roundup_power2_divisions=4)
    a.malloc(nbytes)
    assert a.allocated - reg == _power2_div(nbytes, 4) == 96 * MiB
    a.set_allocator_settings(roundup_power2_divisions=0, max_split_size_mb=40)
    a.empty_cache()
    start = a.allocated
    a.malloc(nbytes)
    assert a.allocated - start == nbytes


def test_memory_stats_generator():
    """test_cuda_multigpu.py ``_test_memory_stats_generator`` (N=35): each allocation raises ``memory_allocated``,
    ``alloc(0, 0, 0)`` leaves it unchanged, each free lowers it, and after every tensor of the second group is freed
    it is back at ``m1``, after the first group at ``m0``; ``memory_reserved`` never passes ``max_memory_reserved``."""
    a, n = CachingAllocator(), 35
    rng = random.Random(0)
    last = [a.allocated]

    def alloc(*shape):
        numel = 1
        for s in shape:
            numel *= s
        return a.malloc(FLOAT * numel), numel

    def change(comp):
        new = a.allocated
        assert (new > last[0]) if comp > 0 else (new < last[0]) if comp < 0 else (new == last[0])
        assert a.allocated <= a.max_allocated and a.reserved <= a.max_reserved
        last[0] = new
    m0 = a.allocated
    tensors1 = [alloc(1), alloc(10, 20), alloc(200, 300, 2000)]
    m1 = a.allocated
    change(1)
    tensors2 = []
    for i in range(1, n // 2 + 1):
        tensors2.append(alloc(i, i * 4))
        change(1)
    for i in range(5, n // 2 + 5):
        tensors2.append(alloc(i, i * 7, i * 9, i * 11))
        change(1)
    tensors2.append(alloc(0, 0, 0))
    change(0)
    rng.shuffle(tensors2)
    change(0)
    for i in range(n // 2):
        block, numel = tensors2.pop(i)
        a.free(block)
        change(-numel)
    for i in range(2, 2 * n // 3 + 2):
        tensors2.append(alloc(i, i * 3, i * 8))
        change(1)
    for block, _ in tensors2:
        a.free(block)
    change(-1)
    assert a.allocated == m1
    for block, _ in tensors1:
        a.free(block)
    change(-1)
    assert a.allocated == m0


def test_record_stream():
    """test_cuda.py ``test_record_stream``: a block allocated on a side stream and used on the current one
    (``record_stream``) is not reused on the side stream before the current stream's work completes ("allocation
    re-used to soon"), and is reused once it has ("allocation not re-used")."""
    a = CachingAllocator()
    side, current = 1, 0
    a.malloc(4 * FLOAT, current)                  # result
    tmp = a.malloc(4 * FLOAT, side)
    ptr = tmp.addr
    a.record_stream(tmp, current)
    a.free(tmp)
    tmp2 = a.malloc(4 * FLOAT, side)
    assert tmp2.addr != ptr
    a.synchronize(current)                        # torch.cuda.current_stream().synchronize()
    tmp3 = a.malloc(4 * FLOAT, side)
    assert tmp3.addr == ptr


def test_record_stream_on_shifted_view():
    """test_cuda.py ``test_record_stream_on_shifted_view`` (issue #27366): "the allocator will not reuse free blocks
    which were allocated from another stream"; a block allocated on ``stream_alloc`` and used (through a view) on
    ``stream_record`` is not reused on ``stream_alloc`` after only ``stream_alloc`` is synchronized
    (``assertNotEqual(try_realloc.data_ptr(), data_ptr)``). The isolation the test relies on: a block the default
    stream freed is not given to ``stream_alloc`` either."""
    a = CachingAllocator()
    current, stream_alloc, stream_record = 0, 1, 2
    a.free(a.malloc(100 * FLOAT, current))       # a cached block of the default stream
    base = a.malloc(100 * FLOAT, stream_alloc)   # torch.cuda.FloatTensor([10, 10]) under stream_alloc
    assert base.segment is not a.segments[0] and a.reserved == 2 * 2 * MiB    # its own 2 MiB small segment
    data_ptr = base.addr
    a.record_stream(base, stream_record)         # view.record_stream(stream_record), the stream still busy
    a.free(base)
    a.synchronize(stream_alloc)
    try_realloc = a.malloc(100 * FLOAT, stream_alloc)
    assert try_realloc.addr != data_ptr


def test_max_split_expandable():
    """test_cuda.py ``test_max_split_expandable``: with 120 MiB allowed, 40 MiB with expandable segments off, on, then
    off (max_split_size_mb:40) fit, a fourth 40 MiB raises OutOfMemoryError, and after the three are freed 120 MiB
    can be allocated (release_cached_blocks runs with an expandable segment in the free list)."""
    a = CachingAllocator(allowed=120 * MiB)
    a.set_allocator_settings(expandable_segments=False, max_split_size_mb=40)
    x = a.malloc(40 * MiB)
    a.set_allocator_settings(expandable_segments=True)
    y = a.malloc(40 * MiB)
    a.set_allocator_settings(expandable_segments=False)
    z = a.malloc(40 * MiB)
    assert a.reserved == 120 * MiB
    with pytest.raises(OutOfMemory):
        a.malloc(40 * MiB)
    for block in (x, y, z):
        a.free(block)
    a.malloc(120 * MiB)
    assert a.allocated == 120 * MiB and a.reserved == 120 * MiB


def test_snapshot_tiles_minimum_blocks():
    """test_cuda.py ``test_memory_snapshot``: tensors of 128 floats are 512 B, "the minimum block size, so we allocate
    all the tensors to this size to make sure they tile evenly": 1000 of them share one 2 MiB segment."""
    a = CachingAllocator()
    blocks = [a.malloc(128 * FLOAT) for _ in range(1000)]
    segments = a.snapshot()
    assert len(segments) == 1 and segments[0]["total_size"] == 2 * MiB
    assert a.allocated == 1000 * 512 and segments[0]["free_size"] == 2 * MiB - 1000 * 512
    rng = random.Random(1)
    while blocks:
        a.free(blocks.pop(rng.randrange(len(blocks))))
    assert a.snapshot()[0]["blocks"] == [(2 * MiB, False)]      # every split merged back (try_merge_blocks)


# The rules of CUDACachingAllocator.cpp, arithmetic written out.

def test_large_block_not_split_within_one_mib():
    """``should_split()``: a large-pool block is split only when more than kSmallSize (1 MiB) remains.
    ``get_allocation_size()``: 17 MiB + 1 B (rounded to 17 MiB + 512 B, >= kMinLargeAlloc) gets an 18 MiB segment
    (kRoundLarge) and all of it, 1 MiB - 512 B remaining; 9 MiB (under kMinLargeAlloc) gets a 20 MiB segment
    (kLargeBuffer), 11 MiB remaining, split off."""
    a = CachingAllocator()
    a.malloc(17 * MiB + 1)
    assert a.allocated == 18 * MiB and a.reserved == 18 * MiB
    b = CachingAllocator()
    b.malloc(9 * MiB)
    assert b.allocated == 9 * MiB and b.reserved == 20 * MiB


def test_best_fit_reuses_and_splits_a_cached_segment():
    """``get_free_block()`` best fit and ``free_block()``: 30 MiB and 10 MiB segments (>= kMinLargeAlloc: their size
    rounded to 2 MiB); the 30 MiB one freed is cached; 25 MiB takes it (the smallest large enough), split (5 MiB >
    1 MiB remains): reserved stays 40 MiB."""
    a = CachingAllocator()
    x = a.malloc(30 * MiB)
    ptr = x.addr
    a.malloc(10 * MiB)
    a.free(x)
    assert a.reserved == 40 * MiB and a.allocated == 10 * MiB
    y = a.malloc(25 * MiB)
    assert y.addr == ptr and a.reserved == 40 * MiB and a.allocated == 35 * MiB


def test_expandable_segment_maps_pages():
    """"Note [Expandable Segments]": one segment per pool and stream grows in 20 MiB pages (large pool): 30 MiB maps
    two pages, 30 MiB more a third and fourth page of the same segment (40 + 40 MiB, not two 30 MiB segments)."""
    a = CachingAllocator(expandable_segments=True)
    a.malloc(30 * MiB)
    assert a.reserved == 40 * MiB and a.allocated == 30 * MiB
    a.malloc(30 * MiB)
    assert a.reserved == 60 * MiB and a.allocated == 60 * MiB and len(a.snapshot()) == 1


def test_max_split_size_keeps_oversize_blocks_whole():
    """``get_free_block()`` with ``max_split_size_mb:40``: a cached 60 MiB block is not given to a 30 MiB request
    (under the limit), which gets its own segment; a 50 MiB request (over it, within kLargeBuffer) takes it whole."""
    a = CachingAllocator(max_split_size_mb=40)
    x = a.malloc(60 * MiB)
    ptr = x.addr
    a.free(x)
    a.malloc(30 * MiB)
    assert a.reserved == 90 * MiB
    y = a.malloc(50 * MiB)
    assert y.addr == ptr and y.size == 60 * MiB and a.allocated == 90 * MiB


def test_zero_bytes_take_no_block_and_sizes_round():
    a = CachingAllocator()
    assert a.malloc(0) is None and a.allocated == 0 and a.reserved == 0
    assert [round_size(n) for n in (1, 512, 513, 1200)] == [512, 512, 1024, 1536]
    assert _roundup_power2_next_division(1200, 4) == 1280       # the function's own comment: 1200, 4 divisions
    assert round_size(1200, 4) == 1536      # round_size() divides only sizes above kMinBlockSize * divisions
    with pytest.raises(ValueError, match="nbytes"):
        a.malloc(-1)


def test_expandable_blocks_are_skipped_once_expandable_segments_are_off():
    """``get_free_block()``: "Rarely expandable segments has been turned off after we have already allocated some
    blocks as expandable ... we need to honor this request by only finding non-expandable blocks": a cached 40 MiB
    expandable block is not given to a 30 MiB request once the option is off; a new 30 MiB segment is."""
    a = CachingAllocator(expandable_segments=True)
    a.free(a.malloc(40 * MiB))
    a.set_allocator_settings(expandable_segments=False)
    a.malloc(30 * MiB)
    assert a.reserved == 40 * MiB + 30 * MiB
