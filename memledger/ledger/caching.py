"""A port of PyTorch's CUDA caching allocator: blocks, segments, pools and streams, in pure Python.

:mod:`memledger.ledger.allocator` has the rules for one request; this module keeps the allocator's whole state so
that a sequence of requests and frees (a step's trace, :mod:`memledger.ledger.replay`) gives what
``torch.cuda.memory_allocated()`` and ``memory_reserved()`` would report after each. It follows
``DeviceCachingAllocator`` in ``c10/cuda/CUDACachingAllocator.cpp`` of PyTorch at commit
eb42ad6eca0ce61e7c581212b4bf32f991425571 (the functions are named as there; the same rules hold from PyTorch 2.1 to
2.8, the releases with ``expandable_segments``):

* ``malloc()``: the size is rounded (``round_size()``: 512 bytes, or ``roundup_power2_divisions``); requests of at
  most ``kSmallSize`` (1 MiB) go to the small pool, larger ones to the large pool (``get_pool()``); each pool is
  searched best-fit, the smallest free block of the same stream at least as large, ties by address
  (``get_free_block()``, ``BlockComparatorSize``); with ``max_split_size_mb`` a request under it never takes a block
  of at least that size, and one above it only a block less than ``kLargeBuffer`` (20 MiB) larger.
* No block found: a new segment of ``get_allocation_size()`` bytes (2 MiB, 20 MiB, or the size rounded up to 2 MiB;
  ``alloc_block()``), or, with ``expandable_segments``, pages mapped at the end of the stream's one segment of the
  pool, 2 MiB (small) or 20 MiB (large) each (``try_allocate_expandable_block()``, ``map_block()``).
* The block found is split where ``should_split()`` says so (small pool or expandable: at least 512 bytes remain;
  large pool: the request is under ``max_split_size`` and more than 1 MiB remains), else the request takes all of it
  and ``memory_allocated`` counts all of it (``alloc_found_block()``).
* ``free()``: a block used on another stream (``record_stream()``) waits for that stream's work (its events)
  before it returns to the pool (``insert_events()``, ``process_events()``); a free block merges with free
  neighbours of its segment (``free_block()``, ``try_merge_blocks()``) and stays cached: segments go back to the
  driver only when a ``cudaMalloc`` would pass the allowed memory (``release_available_cached_blocks()``,
  ``release_cached_blocks()``) or on ``empty_cache()``.
* A request of 0 bytes takes no block (``torch.empty(0)`` leaves ``memory_allocated`` unchanged).

Addresses are a model's: each new segment is placed after the last one (what ties between equal sizes are broken
by). Statistics are those of ``torch.cuda.memory_stats()``: ``allocated_bytes`` and ``reserved_bytes``, current and
peak; ``requested_bytes`` (the bytes asked for).
"""
from bisect import bisect_left, insort

from .allocator import K_LARGE_BUFFER, K_MIN_BLOCK_SIZE, K_MIN_LARGE_ALLOC, K_ROUND_LARGE, K_SMALL_BUFFER, K_SMALL_SIZE

__all__ = ["Block", "CachingAllocator", "OutOfMemory", "get_allocation_size", "round_size"]

#: Virtual address space reserved for one expandable segment (its pages are mapped as needed): far more than any GPU.
_EXPANDABLE_SPAN = 1 << 44
_NO_LIMIT = (1 << 64) - 1          # ``std::numeric_limits<size_t>::max()``: max_split_size unset


class OutOfMemory(Exception):
    """``torch.OutOfMemoryError``: a segment would pass the allowed memory even after releasing cached ones."""


def _up(n: int, step: int) -> int:
    return -(-n // step) * step


def _roundup_power2_next_division(size: int, divisions: int) -> int:
    """``roundup_power2_next_division()``: ``size`` rounded up to the next of ``divisions`` equal steps between
    two powers of two (1200 with 4 divisions: 1280)."""
    if size <= 4 or divisions <= 1 or size & (size - 1) == 0:
        return size
    floor = 1 << (size.bit_length() - 1)
    step = floor >> (divisions.bit_length() - 1)
    if step == 0:
        return floor << 1
    low = size & ~(step - 1)
    return size if low == size else low + step


def round_size(size: int, divisions: int = 0) -> int:
    """``round_size()``: at least ``kMinBlockSize`` (512), else a multiple of 512 or, with
    ``roundup_power2_divisions`` > 0 and a size above 512 x divisions, the next power-of-two division."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    if divisions > 0 and size > K_MIN_BLOCK_SIZE * divisions:
        return _roundup_power2_next_division(size, divisions)
    return _up(size, K_MIN_BLOCK_SIZE)


def get_allocation_size(size: int) -> int:
    """``get_allocation_size()`` of a rounded size: the segment a new ``cudaMalloc`` gets."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return _up(size, K_ROUND_LARGE)


def _grows(block) -> int:
    """The size a free block of an expandable segment can grow to: its own and its unmapped neighbour's."""
    following = block.next
    return block.size + (following.size if following is not None and not following.mapped else 0)


class Block:
    """``struct Block``: a range of a segment, allocated or free, with its neighbours in the segment."""
    __slots__ = ("addr", "size", "stream", "small", "allocated", "prev", "next", "segment", "mapped", "stream_uses",
                 "requested", "events")

    def __init__(self, addr, size, stream, small, segment, mapped=True):
        self.addr, self.size, self.stream, self.small, self.segment = addr, size, stream, small, segment
        self.allocated, self.prev, self.next, self.mapped = False, None, None, mapped
        self.stream_uses, self.requested, self.events = set(), 0, 0

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None

    def __repr__(self):
        state = "allocated" if self.allocated else ("free" if self.mapped else "unmapped")
        return f"Block({self.size:,} B at {self.addr:#x}, stream {self.stream}, {state})"


class _Pool:
    """``struct BlockPool``: the free blocks of one pool, ordered by (stream, size, address), and its unmapped ranges
    (expandable segments) by (stream, address)."""

    def __init__(self, small: bool):
        self.small = small
        self.keys, self.by_key = [], {}           # sorted (stream, size, addr) -> Block
        self.unmapped = []                        # Blocks, sorted by (stream, addr)

    def insert(self, block):
        key = (block.stream, block.size, block.addr)
        insort(self.keys, key)
        self.by_key[key] = block

    def erase(self, block):
        key = (block.stream, block.size, block.addr)
        del self.keys[bisect_left(self.keys, key)]
        del self.by_key[key]

    def add_unmapped(self, block):
        self.unmapped.append(block)
        self.unmapped.sort(key=lambda b: (b.stream, b.addr))

    def blocks(self):
        return [self.by_key[k] for k in self.keys]


class CachingAllocator:
    """One device's caching allocator. ``expandable_segments``, ``max_split_size_mb`` and
    ``roundup_power2_divisions`` are ``PYTORCH_CUDA_ALLOC_CONF``'s; ``allowed`` bounds the segments
    (``set_per_process_memory_fraction`` times the device's memory; None: no bound, nothing is ever released)."""

    def __init__(self, expandable_segments: bool = False, max_split_size_mb=None, roundup_power2_divisions: int = 0,
                 allowed=None):
        self.expandable = bool(expandable_segments)
        self.max_split = _NO_LIMIT if max_split_size_mb is None else int(max_split_size_mb) * 1024 * 1024
        self.divisions = int(roundup_power2_divisions)
        self.allowed = allowed
        self.pools = {True: _Pool(True), False: _Pool(False)}
        self.segments = []                # the head blocks of every segment (cudaMalloc'd or expandable)
        self.pending = []                 # freed blocks waiting for events on other streams
        self.next_addr = 1 << 32
        self.allocated = self.reserved = self.requested = 0
        self.max_allocated = self.max_reserved = 0

    def set_allocator_settings(self, expandable_segments=None, max_split_size_mb=..., roundup_power2_divisions=None):
        """``torch.cuda.memory._set_allocator_settings``: change the options between requests."""
        if expandable_segments is not None:
            self.expandable = bool(expandable_segments)
        if max_split_size_mb is not ...:
            self.max_split = _NO_LIMIT if max_split_size_mb is None else int(max_split_size_mb) * 1024 * 1024
        if roundup_power2_divisions is not None:
            self.divisions = int(roundup_power2_divisions)

    # -- statistics -------------------------------------------------------------------------------------------
    def _add(self, allocated=0, reserved=0):
        self.allocated += allocated
        self.reserved += reserved
        if self.allocated > self.max_allocated:
            self.max_allocated = self.allocated
        if self.reserved > self.max_reserved:
            self.max_reserved = self.reserved

    def reset_peak(self):
        """``torch.cuda.reset_peak_memory_stats()``."""
        self.max_allocated, self.max_reserved = self.allocated, self.reserved

    # -- malloc -------------------------------------------------------------------------------------------------
    def malloc(self, nbytes: int, stream=0):
        """``malloc()``: a block for ``nbytes`` on ``stream`` (None for 0 bytes); :class:`OutOfMemory` past
        ``allowed``."""
        if type(nbytes) is not int and (isinstance(nbytes, bool) or not isinstance(nbytes, int)) or nbytes < 0:
            raise ValueError(f"nbytes must be a non-negative integer, got {nbytes!r}")
        if nbytes == 0:
            return None
        if self.pending:
            self.process_events()
        size = round_size(nbytes, self.divisions)
        pool = self.pools[size <= K_SMALL_SIZE]
        block = self._get_free_block(pool, size, stream)
        if block is None:
            block = self._alloc_block(pool, size, stream)
        if block is None and self.allowed is not None:      # free cached segments and retry
            if self._release_available_cached_blocks(pool, size, stream):
                block = self._alloc_block(pool, size, stream)
            if block is None:
                self.release_cached_blocks()
                block = self._alloc_block(pool, size, stream)
        if block is None:
            raise OutOfMemory(f"tried to allocate {get_allocation_size(size):,} bytes with {self.reserved:,} "
                              f"reserved of {self.allowed:,} allowed")
        return self._alloc_found_block(pool, block, size, nbytes, stream, self._should_split(block, size))

    def _should_split(self, block, size) -> bool:
        remaining = block.size - size
        if block.small or self.expandable:
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.max_split and remaining > K_SMALL_SIZE

    def _get_free_block(self, pool, size, stream):
        keys = pool.keys
        i = bisect_left(keys, (stream, size, -1))
        if i == len(keys) or keys[i][0] != stream:
            return None
        block = pool.by_key[keys[i]]
        if block.segment.expandable:
            if self.expandable:     # best fit by the size a block can grow to (its unmapped neighbour)
                j = i + 1
                while block.segment.expandable and j < len(keys) and keys[j][0] == stream and \
                        _grows(pool.by_key[keys[j]]) < _grows(block):
                    i, block, j = j, pool.by_key[keys[j]], j + 1
            else:                   # expandable segments turned off: only other blocks
                i += 1
                while i < len(keys) and keys[i][0] == stream and pool.by_key[keys[i]].segment.expandable:
                    i += 1
                if i == len(keys) or keys[i][0] != stream:
                    return None
                block = pool.by_key[keys[i]]
        if size < self.max_split and block.size >= self.max_split:
            return None             # no oversize block for a smaller request
        if size >= self.max_split and block.size >= size + K_LARGE_BUFFER:
            return None             # an oversize block only within 20 MiB of the request
        pool.erase(block)
        return block

    def _alloc_block(self, pool, size, stream):
        alloc_size = get_allocation_size(size)
        if self.allowed is not None and self.reserved + alloc_size > self.allowed:
            return None
        if self.expandable:
            return self._try_allocate_expandable_block(pool, size, stream)
        segment = _Segment(self.next_addr, alloc_size, pool.small, stream, expandable=False)
        self.next_addr += _up(alloc_size, K_SMALL_BUFFER)
        block = Block(segment.base, alloc_size, stream, pool.small, segment)
        segment.head = block
        self.segments.append(segment)
        self._add(reserved=alloc_size)
        return block

    def _alloc_found_block(self, pool, block, size, nbytes, stream, split):
        if split:
            remaining = block
            block = Block(remaining.addr, size, stream, pool.small, remaining.segment)
            block.prev = remaining.prev
            if block.prev is not None:
                block.prev.next = block
            else:
                remaining.segment.head = block
            block.next = remaining
            remaining.prev = block
            remaining.addr += size
            remaining.size -= size
            pool.insert(remaining)
        block.allocated, block.requested = True, nbytes
        self.requested += nbytes
        self.allocated += block.size            # _add(allocated=block.size)
        if self.allocated > self.max_allocated:
            self.max_allocated = self.allocated
        return block

    # -- expandable segments ----------------------------------------------------------------------------------
    def _find_expandable_block(self, pool, size, stream):
        """``find_expandable_block()``: the lowest unmapped range of the stream's segments with room for ``size``
        (with the free block before it), else a new segment's whole range."""
        def allocatable(b):
            return b is not None and not b.allocated and b.events == 0 and not b.stream_uses

        def room(b):
            total = 0
            while total < size and allocatable(b):
                total, b = total + b.size, b.next
            return total >= size
        for c in pool.unmapped:
            if c.stream != stream:
                continue
            if allocatable(c.prev):
                c = c.prev
            if room(c):
                return c
        page = K_SMALL_BUFFER if pool.small else K_LARGE_BUFFER
        segment = _Segment(self.next_addr, _EXPANDABLE_SPAN, pool.small, stream, expandable=True, page=page)
        self.next_addr += _EXPANDABLE_SPAN
        candidate = Block(segment.base, _EXPANDABLE_SPAN, stream, pool.small, segment, mapped=False)
        segment.head = candidate
        self.segments.append(segment)
        pool.add_unmapped(candidate)
        return candidate

    def _map_block(self, pool, block, size):
        """``map_block()``: map whole pages from ``block``'s start to cover ``size`` bytes and make them a free
        block, merged with free neighbours."""
        page = block.segment.page
        mapped = min(_up(block.addr - block.segment.base + size, page) - (block.addr - block.segment.base),
                     block.size)
        pool.unmapped.remove(block)
        block.mapped = True
        if mapped < block.size:
            rest = Block(block.addr + mapped, block.size - mapped, block.stream, block.small, block.segment,
                         mapped=False)
            rest.prev, rest.next = block, block.next
            if block.next is not None:
                block.next.prev = rest
            block.next = rest
            pool.add_unmapped(rest)
            block.size = mapped
        block = self._merge(pool, block, block.prev)
        block = self._merge(pool, block, block.next)
        pool.insert(block)
        self._add(reserved=mapped)
        return block

    def _try_allocate_expandable_block(self, pool, size, stream):
        candidate = self._find_expandable_block(pool, size, stream)
        if not candidate.mapped:
            candidate = self._map_block(pool, candidate, min(candidate.size, size))
        while candidate.size < size:
            following = candidate.next
            candidate = self._map_block(pool, following, min(size - candidate.size, following.size))
        pool.erase(candidate)
        return candidate

    # -- free -----------------------------------------------------------------------------------------------------
    def record_stream(self, block, stream):
        """``recordStream()``: ``block`` is used on ``stream`` too; uses on its own stream are ignored."""
        if block is not None and stream != block.stream:
            block.stream_uses.add(stream)

    def free(self, block):
        """``free()``: the block is no longer allocated; it returns to its pool now, or, if used on other streams,
        once their work recorded at this moment has completed (:meth:`synchronize`)."""
        if block is None:
            return
        if not block.allocated:
            raise ValueError(f"{block!r} is not allocated")
        block.allocated = False
        self.allocated -= block.size            # _add(allocated=-block.size): no new peak
        self.requested -= block.requested
        if block.stream_uses:
            block.events = len(block.stream_uses)
            self.pending.append((block, set(block.stream_uses)))
            block.stream_uses = set()
        else:
            self._free_block(block)

    def synchronize(self, stream=None):
        """The work queued so far on ``stream`` (None: every stream) has completed: the events recorded for blocks
        used there complete, and those blocks return to their pools at the next request (``process_events()``)."""
        for entry in self.pending:
            block, streams = entry
            done = streams if stream is None else streams & {stream}
            streams -= done
            block.events = len(streams)

    def process_events(self):
        """``process_events()``: blocks whose events have all completed return to their pools."""
        ready = [b for b, streams in self.pending if not streams]
        self.pending = [(b, s) for b, s in self.pending if s]
        for block in ready:
            self._free_block(block)

    def _free_block(self, block):
        pool = self.pools[block.small]
        block = self._merge(pool, block, block.prev)
        block = self._merge(pool, block, block.next)
        pool.insert(block)

    def _merge(self, pool, dst, src):
        """``try_merge_blocks()``: ``src``, a free neighbour of ``dst`` in the same state (mapped or not), joins it."""
        if src is None or src.allocated or src.events > 0 or src.stream_uses or src.mapped != dst.mapped:
            return dst
        if src.mapped:
            pool.erase(src)
        else:
            pool.unmapped.remove(src)
        if dst.prev is src:
            dst.addr = src.addr
            dst.prev = src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            else:
                dst.segment.head = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return dst

    # -- giving memory back ------------------------------------------------------------------------------------
    def _release_block(self, pool, block):
        """``release_block()``: ``cudaFree`` of a whole free segment."""
        pool.erase(block)
        self.segments.remove(block.segment)
        self._add(reserved=-block.size)

    def _release_available_cached_blocks(self, pool, size, stream) -> bool:
        """``release_available_cached_blocks()``: with ``max_split_size`` set, free oversize cached segments, the
        smallest large enough or else the largest until enough is freed."""
        if self.max_split == _NO_LIMIT:
            return False
        want = max(size, self.max_split)
        keys = pool.keys
        i = bisect_left(keys, (stream, want, -1))
        if i < len(keys) and keys[i][0] == stream:
            block = pool.by_key[keys[i]]
            if block.is_split() or block.segment.expandable:
                return False
            self._release_block(pool, block)
            return True
        released, i = 0, i - 1        # expandable blocks are skipped (release_block() refuses them), as later PyTorch
        while released < want and i >= 0 and keys[i][0] == stream and keys[i][1] >= self.max_split:
            block = pool.by_key[keys[i]]
            i -= 1
            if not block.is_split() and not block.segment.expandable:
                released += block.size
                self._release_block(pool, block)
        return released >= want

    def release_cached_blocks(self):
        """``release_cached_blocks()`` (``torch.cuda.empty_cache()``): every free unsplit segment goes back to the
        driver, and the free pages of expandable segments are unmapped."""
        self.synchronize()                  # synchronize_and_free_events()
        self.process_events()
        for pool in self.pools.values():
            for block in pool.blocks():
                if block.segment.expandable:
                    self._unmap_block(pool, block)
                elif not block.is_split():
                    self._release_block(pool, block)

    empty_cache = release_cached_blocks

    def _unmap_block(self, pool, block):
        """``unmap_block()``: the whole pages inside a free block of an expandable segment are unmapped."""
        seg, page = block.segment, block.segment.page
        start = _up(block.addr - seg.base, page) + seg.base
        end = (block.addr + block.size - seg.base) // page * page + seg.base
        if start >= end:
            return
        pool.erase(block)
        if start > block.addr:
            before = Block(block.addr, start - block.addr, block.stream, block.small, seg)
            before.prev, before.next = block.prev, block
            if block.prev is not None:
                block.prev.next = before
            else:
                seg.head = before
            block.prev = before
            pool.insert(before)
        if end < block.addr + block.size:
            after = Block(end, block.addr + block.size - end, block.stream, block.small, seg)
            after.prev, after.next = block, block.next
            if block.next is not None:
                block.next.prev = after
            block.next = after
            pool.insert(after)
        block.addr, block.size, block.mapped = start, end - start, False
        block = self._merge(pool, block, block.prev)
        block = self._merge(pool, block, block.next)
        pool.add_unmapped(block)
        self._add(reserved=-(end - start))

    # -- what a snapshot shows ----------------------------------------------------------------------------------
    def snapshot(self) -> list:
        """``torch.cuda.memory._snapshot()["segments"]``, in short: one dict per segment (per mapped range of an
        expandable one), by address: {"address", "stream", "pool", "expandable", "total_size", "allocated_size",
        "free_size", "blocks": [(size, allocated)]}."""
        out = []
        for seg in sorted(self.segments, key=lambda s: s.base):
            block, current = seg.head, None
            while block is not None:
                if block.mapped:
                    if current is None:
                        current = {"address": block.addr, "stream": seg.stream, "pool": "small" if seg.small
                                   else "large", "expandable": seg.expandable, "total_size": 0,
                                   "allocated_size": 0, "blocks": []}
                        out.append(current)
                    current["total_size"] += block.size
                    current["allocated_size"] += block.size if block.allocated else 0
                    current["blocks"].append((block.size, block.allocated or block.events > 0))
                else:
                    current = None
                block = block.next
        for seg in out:
            seg["free_size"] = seg["total_size"] - seg["allocated_size"]
        return out


class _Segment:
    """A ``cudaMalloc`` (``expandable``: a reserved address range whose pages are mapped as needed)."""
    __slots__ = ("base", "size", "small", "stream", "expandable", "page", "head")

    def __init__(self, base, size, small, stream, expandable, page=0):
        self.base, self.size, self.small, self.stream = base, size, small, stream
        self.expandable, self.page, self.head = expandable, page, None
