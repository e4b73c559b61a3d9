"""A pool per stream in the step's replay (memledger/ledger/replay.py): the stream each FSDP2 buffer is allocated on
(memledger/step/fsdp2.py, from PyTorch 2.13's ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``), DDP's
buckets (all on the default stream, one block per bucket), determinism, and for fuzzed FSDP2 and DDP setups
``reserved >= allocated`` and ``allocated + overhead >= the step's peak`` after every op."""
import random

import pytest

from memledger.activations.backends import get_backend
from memledger.ledger.ledger import Ledger
from memledger.ledger.replay import replay, roles
from memledger.models.architecture import Architecture
from memledger.step.ddp import BUCKETS, assign_buckets, bucket_limits
from memledger.step.structure import StepStructure
from memledger.step.vocab import Stream

SHAPE = Architecture(256, 6, 4, 688, 1000, "llama")


def streams_of(ledger) -> dict:
    """{tensor name: Stream} of the tensors of ``ledger``'s step not allocated on the default stream."""
    from memledger.step.build import build
    built = build(StepStructure.of(ledger, get_backend("article")))
    return {name: t.stream for name, t in built.tensors.items() if t.stream is not Stream.DEFAULT}


def test_fsdp2_buffers_are_allocated_on_their_streams():
    """``foreach_all_gather`` allocates the cast copy (``_fsdp_collectives.py:419``) and the output (``:351``) under
    ``all_gather_copy_in_stream`` (``:336``); the copy-out (unsharded parameters, ``:463``) and the reduce-scatter
    input (``:597``, before ``:611``) on the current stream; the reduce-scatter output under
    ``reduce_scatter_stream`` (``:611-616``), and the sharded gradients where that stream casts it (``:685-696``);
    under HSDP the cast runs on the all-reduce stream (``:652``)."""
    ledger = Ledger(arch=SHAPE, framework="fsdp2", dp=2, recipe="fp32-adamw", batch_size=1, seq_len=64)
    on = streams_of(ledger)
    for unit in ("", ", root"):
        assert on[f"FSDP2 all-gather input (BF16){unit}"] is Stream.ALL_GATHER_COPY_IN
        assert on[f"FSDP2 all-gather output (BF16){unit}"] is Stream.ALL_GATHER_COPY_IN
        assert on[f"FSDP2 reduce-scatter output (FP32){unit}"] is Stream.REDUCE_SCATTER
        assert on[f"FSDP2 sharded gradients (FP32){unit}"] is Stream.REDUCE_SCATTER
        assert f"FSDP2 unsharded parameters (BF16){unit}" not in on         # the default stream
        assert f"FSDP2 reduce-scatter input (FP32){unit}" not in on
    hsdp = streams_of(Ledger(arch=SHAPE, framework="fsdp2", dp=4, dp_replicate=2, fsdp_reduce_dtype="bf16",
                             recipe="fp32-adamw", batch_size=1, seq_len=64))
    assert hsdp["FSDP2 reduce-scatter output (BF16)"] is Stream.REDUCE_SCATTER
    assert hsdp["FSDP2 sharded gradients (FP32)"] is Stream.ALL_REDUCE


def test_ddp_allocates_on_the_default_stream_one_block_per_bucket():
    """DDP: no tensor off the default stream; its buckets (one row of the step) replayed one block each, as
    ``compute_bucket_assignment_by_size`` groups the gradients in the order backward writes them (a bucket closes
    once it reaches ``bucket_cap_mb``): every bucket, rounded to 512 bytes, is an allocated block at the peak."""
    from memledger.step.cache import compiled_step
    from memledger.step.structure import step_values
    ledger = Ledger(arch=SHAPE, framework="ddp", dp=2, batch_size=1, seq_len=64, ddp_bucket_mb=1)
    structure = StepStructure.of(ledger, get_backend("article"))
    assert streams_of(ledger) == {}
    part = roles(structure)
    assert part["streams"] == {}
    step = compiled_step(structure)
    sizes = step.sizes(step_values(ledger))
    j, before, block, after = part["buckets"]
    assert step.names[j] == BUCKETS
    order = [sizes[i] for i in before + block * SHAPE.n_layers + after]
    assert sum(order) == sizes[j]                     # every gradient once
    buckets = [sum(order[i] for i in members) for members in assign_buckets(order, bucket_limits(1))]
    assert len(buckets) > 1
    r = replay(ledger, steps=1)
    blocks = sorted(size for s in r.segments for size, allocated in s["blocks"] if allocated)
    for bucket in sorted((-(-b // 512) * 512 for b in buckets), reverse=True):
        # its block: its size rounded to 512, or a whole large block it did not split (at most 1 MiB left over,
        # should_split())
        block = next(size for size in blocks if bucket <= size <= bucket + 2**20)
        blocks.remove(block)


def test_fsdp2_and_ddp_replays_are_deterministic():
    for ledger in (Ledger(arch=SHAPE, framework="fsdp2", dp=2, recipe="fp32-adamw", batch_size=2, seq_len=128),
                   Ledger(arch=SHAPE, framework="ddp", dp=2, batch_size=2, seq_len=128)):
        a, b = replay(ledger), replay(ledger)
        assert a.to_dict() == b.to_dict() and a.series == b.series


def test_fsdp2_side_streams_hold_segments_of_their_own():
    """At the reserved peak of an FSDP2 step (here in the first step's optimizer, the activations freed into the
    cache) the all-gather copy-in and reduce-scatter streams hold segments of their own beside the default stream's."""
    ledger = Ledger(arch=SHAPE, framework="fsdp2", dp=2, recipe="fp32-adamw", batch_size=2, seq_len=128)
    r = replay(ledger)
    assert {s["stream"] for s in r.segments} == {"default", "FSDP2 all-gather copy-in", "FSDP2 reduce-scatter"}


def _fuzzed(rng):
    arch = SHAPE.with_changes(d_model=64 * rng.randint(2, 6), n_layers=rng.choice([2, 3, 6]))
    common = dict(arch=arch, batch_size=rng.randint(1, 4), seq_len=rng.choice([64, 100, 256]),
                  recompute=rng.choice(["none", "full"]))
    if rng.random() < 0.5:
        extra = rng.choice([dict(dp=rng.choice([2, 4])), dict(dp=4, dp_replicate=2),
                            dict(dp=2, fsdp_cpu_offload=True)])
        return Ledger(framework="fsdp2", recipe=rng.choice(["fp32-adamw", "bf16-pure-adamw"]),
                      fsdp_reduce_dtype=rng.choice(["fp32", "bf16", None]),
                      reshard_after_forward=rng.choice([True, False, None, 2]), **extra, **common)
    return Ledger(framework="ddp", dp=rng.choice([2, 8]), ddp_bucket_mb=rng.choice([None, 1, 4]),
                  gradient_as_bucket_view=rng.random() < 0.5, recipe=rng.choice(["bf16-adamw", "fp32-adamw"]),
                  **common)


@pytest.mark.parametrize("seed", range(6))
def test_fuzzed_fsdp2_and_ddp_setups_keep_the_order_of_the_measures(seed):
    """For random shapes, batches, FSDP2 (world, HSDP, CPU offload, reduce dtype, reshard_after_forward) and DDP
    (world, bucket size, gradient_as_bucket_view) setups, with and without expandable segments: the blocks hold at
    least the live tensors and the segments at least the blocks, after every op."""
    rng = random.Random(300 + seed)
    for _ in range(4):
        try:
            ledger = _fuzzed(rng)
        except ValueError:              # a combination the ledger refuses (one line): nothing to replay
            continue
        r = replay(ledger, expandable_segments=rng.random() < 0.5)
        assert r.allocated + r.outside >= ledger.peak
        assert r.reserved >= r.allocated
        assert all(reserved >= allocated for _, _, _, allocated, reserved in r.series)
