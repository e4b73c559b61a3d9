"""A step replayed through the caching allocator (memledger/ledger/replay.py): hand-made traces with their numbers
written out, determinism, and for fuzzed setups ``allocated >= peak`` and ``reserved >= allocated``."""
import random

import pytest

from memledger.ledger.ledger import Ledger
from memledger.ledger.replay import check_streams, replay, replay_step, run
from memledger.models.architecture import Architecture
from memledger.step.vocab import Stream

MiB = 1024 * 1024


def test_trace_frees_before_allocating_within_an_op():
    """30 MiB and 10 MiB (segments of their size, >= kMinLargeAlloc), then one op frees the 30 MiB tensor and
    allocates 25 MiB: freed first, the cached 30 MiB block is split for it, reserved stays 40 MiB; allocated peaks
    at 40 MiB. An overhead tensor (outside) is kept out of the allocator and counted beside it."""
    deltas = [[[0, 1], [3, 1]], [[1, 1]], [[0, -1], [2, 1]]]
    moments = [["forward", None], ["forward", 0], ["backward", 0]]
    sizes = [30 * MiB, 10 * MiB, 25 * MiB, 7]
    r = run(deltas, moments, sizes, outside=[3], steps=1)
    assert (r.allocated, r.reserved, r.outside) == (40 * MiB, 40 * MiB, 7)
    assert r.judged("allocated") == 40 * MiB + 7
    assert [s[3] for s in r.series] == [30 * MiB, 40 * MiB, 35 * MiB]


def test_second_step_starts_from_the_first_and_lazy_states_wait_for_the_optimizer():
    """Two steps: the step starts with a parameter (1 MiB + 512 B, large pool: a 20 MiB segment) and an optimizer
    state (lazy: created in step 1 only when the optimizer starts); the activation (30 MiB) is freed before the
    optimizer, so in step 1 the state takes 1 MiB + 512 B of the parameter's cached 20 MiB segment and reserved is
    20 + 30 MiB; in step 2 the state is live from the start."""
    deltas = [[[0, 1], [1, 1]], [[2, 1]], [[2, -1]], [[3, 1]], [[3, -1]]]
    moments = [["forward", None], ["forward", 0], ["backward", 0], ["optimizer", None], ["optimizer", None]]
    sizes = [MiB + 512, MiB + 512, 30 * MiB, 512]
    r = run(deltas, moments, sizes, lazy=[1])
    first = [s[3] for s in r.series if s[0] == 1]
    second = [s[3] for s in r.series if s[0] == 2]
    assert first[:3] == [MiB + 512, MiB + 512 + 30 * MiB, MiB + 512]       # the state not yet created
    assert first[3] == 2 * (MiB + 512) + 512 and second[0] == 2 * (MiB + 512)
    assert r.reserved == 50 * MiB + 2 * MiB      # + the small pool's 2 MiB segment of the 512 B temporary


def test_lumps_are_replayed_one_block_per_block():
    """``pieces``: a lumped tensor of 3 x 30 MiB is three 30 MiB blocks (three segments), not one 90 MiB block."""
    r = run([[[0, 1]]], [["forward", None]], [90 * MiB], steps=1, pieces={0: 3})
    assert r.allocated == 90 * MiB and len(r.segments) == 3


SHAPES = [Architecture(256, 6, 4, 688, 1000, "llama"), Architecture(128, 3, 4, 512, 512, "gpt")]


def test_replay_is_deterministic():
    ledger = Ledger(arch=SHAPES[0], batch_size=2, seq_len=128)
    a, b = replay(ledger), replay(ledger)
    assert a.to_dict() == b.to_dict() and a.series == b.series


@pytest.mark.parametrize("seed", range(6))
def test_fuzzed_setups_keep_the_order_of_the_measures(seed):
    """For random shapes, batches, sequences, recipes, recomputation and allocator options: the blocks hold at least
    the live tensors (allocated + overhead >= the step's peak) and the segments at least the blocks."""
    rng = random.Random(seed)
    for _ in range(4):
        base = rng.choice(SHAPES)
        arch = base.with_changes(d_model=64 * rng.randint(1, 8), n_layers=rng.choice([2, 3, 6, 9]))
        ledger = Ledger(arch=arch, batch_size=rng.randint(1, 8), seq_len=rng.choice([64, 100, 512, 1000]),
                        recipe=rng.choice(["bf16-adamw", "fp32-adamw", "bf16-pure-adamw"]),
                        recompute=rng.choice(["none", "full"]))
        r = replay(ledger, expandable_segments=rng.random() < 0.5, max_split_size_mb=rng.choice([None, 21, 200]))
        assert r.allocated + r.outside >= ledger.peak
        assert r.reserved >= r.allocated
        assert all(reserved >= allocated for _, _, _, allocated, reserved in r.series)


def test_a_pool_per_stream():
    """Two streams, worked out from the allocator's rules (``c10/cuda/CUDACachingAllocator.cpp``): 30 MiB on the
    default stream, then freed as 25 MiB are allocated on FSDP2's reduce-scatter stream, then those freed as 20 MiB
    are allocated on the default stream.

    * op 0: 30 MiB >= kMinLargeAlloc (10 MiB): a segment of 30 MiB (rounded to 2 MiB), the default stream's.
    * op 1: the 30 MiB block is cached in the default stream's pool; ``get_free_block()`` searches by (stream, size),
      so the reduce-scatter stream finds nothing: a new segment of 26 MiB (25 MiB rounded up to 2 MiB), not split
      (``should_split()``: the 1 MiB left is not more than kSmallSize), so the block and allocated are 26 MiB.
      Reserved 30 + 26 = 56 MiB. On one stream the cached 30 MiB block would be split for it (30 - 25 = 5 MiB
      > kSmallSize remains): reserved 30 MiB.
    * op 2: the 25 MiB block returns to the reduce-scatter stream's pool; 20 MiB on the default stream split the
      default stream's 30 MiB block (10 MiB > 1 MiB remains): reserved stays 56 MiB.
    Allocated peaks at 30 MiB (op 0)."""
    deltas = [[[0, 1]], [[0, -1], [1, 1]], [[1, -1], [2, 1]]]
    moments = [["forward", None], ["backward", 0], ["backward", 0]]
    sizes = [30 * MiB, 25 * MiB, 20 * MiB]
    r = run(deltas, moments, sizes, steps=1, streams={1: Stream.REDUCE_SCATTER})
    assert (r.allocated, r.reserved) == (30 * MiB, 56 * MiB)
    assert [s[3:] for s in r.series] == [(30 * MiB, 30 * MiB), (26 * MiB, 56 * MiB), (20 * MiB, 56 * MiB)]
    assert sorted((s["stream"], s["total_size"], s["free_size"]) for s in r.segments) == [   # at op 1
        ("FSDP2 reduce-scatter", 26 * MiB, 0), ("default", 30 * MiB, 30 * MiB)]
    one = run(deltas, moments, sizes, steps=1)
    assert (one.allocated, one.reserved) == (30 * MiB, 30 * MiB)


def test_ddp_buckets_are_one_block_each():
    """``pieces[j]`` a list: tensor j is blocks of those bytes (DDP's buckets): 12 MiB and 14 MiB are two segments
    of their size (>= kMinLargeAlloc, multiples of 2 MiB), not one of 26 MiB."""
    r = run([[[0, 1]]], [["forward", None]], [26 * MiB], steps=1, pieces={0: [12 * MiB, 14 * MiB]})
    assert r.allocated == 26 * MiB and sorted(s["total_size"] for s in r.segments) == [12 * MiB, 14 * MiB]


def test_side_streams_are_refused_for_reserved():
    with pytest.raises(ValueError, match="framework deepspeed: DeepSpeed allocates"):
        check_streams("deepspeed")
    with pytest.raises(ValueError, match="framework megatron: Megatron-LM"):
        check_streams("megatron")
    check_streams("deepspeed", "allocated")
    for framework in ("plain", "fsdp2", "ddp"):
        check_streams(framework)
    with pytest.raises(ValueError, match="max_split_size_mb"):
        replay(Ledger(arch=SHAPES[0]), max_split_size_mb=20)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(4))
def test_fuzzed_strategies_keep_the_order_of_the_measures(seed):
    """The same order over strategies: ZeRO stages and data parallelism, tensor parallelism, FSDP2 (a pool per
    stream), selective recomputation, the cuda and cpu backends."""
    rng = random.Random(100 + seed)
    for _ in range(4):
        arch = SHAPES[0].with_changes(d_model=64 * rng.randint(2, 6), n_layers=rng.choice([3, 6]))
        strategy = rng.choice([dict(zero_stage=rng.choice([1, 2, 3]), dp=rng.choice([2, 4])), dict(tp=2),
                               dict(framework="fsdp2", dp=2, recipe="fp32-adamw"), {}])
        ledger = Ledger(arch=arch, batch_size=rng.randint(1, 4), seq_len=rng.choice([64, 256]),
                        recompute=rng.choice(["none", "selective", "full"]), **strategy)
        backend = rng.choice(["article", "cuda", "cpu"])
        r = replay(ledger, backend, expandable_segments=rng.random() < 0.5)
        assert r.allocated + r.outside >= ledger.step(backend).peak.bytes
        assert r.reserved >= r.allocated
        assert all(reserved >= allocated for _, _, _, allocated, reserved in r.series)


@pytest.mark.parametrize("setup, options", [
    (dict(arch="llama2-7b", batch_size=4, seq_len=4096, recompute="full", flash_attention=True), {}),
    (dict(arch="llama3-8b", seq_len=1024, recipe="fp32-adamw", zero_stage=1, dp=4), dict(expandable_segments=True)),
    (dict(arch="gpt2", batch_size=2, seq_len=1024, recompute="selective", dropout=False), dict(max_split_size_mb=64)),
])
def test_a_built_step_replays_as_its_compiled_record(setup, options):
    """replay_step reads the trace from the step's ops; replay from the compiled step's record: the same replay."""
    from memledger.step.timeline import Step
    ledger = Ledger(**setup)
    compiled, built = replay(ledger, "cuda", **options), replay_step(Step(ledger, "cuda"), **options)
    assert (built.allocated, built.reserved, built.outside, built.series, built.segments) == (
        compiled.allocated, compiled.reserved, compiled.outside, compiled.series, compiled.segments)


@pytest.mark.parametrize("quantized", [False, True])
def test_the_lora_step_replays_with_the_measures_in_order(quantized):
    """The LoRA and QLoRA steps (not compiled to a record) replayed: blocks never below the step's live tensors, nor
    above them by more than a whole unsplit block (< 1 MiB) or 511 bytes per tensor; segments never below blocks."""
    from memledger.ledger.lora import LoraConfig, LoraLedger, qlora
    config = (qlora(8, ("q_proj", "v_proj"), "llama") if quantized else
              LoraConfig(rank=8, targets=("q_proj", "v_proj"), adapter_recipe="bf16-pure-adamw", dropout=True))
    step = LoraLedger("llama2-7b", config, batch_size=2, seq_len=512, recompute="full").step("cuda",
                                                                                            rmsnorm="composite")
    replayed = replay_step(step)
    tensors = len(step.built.names)
    assert step.peak.bytes <= replayed.judged("allocated") <= step.peak.bytes + tensors * (2**20 + 511)
    assert all(allocated <= reserved for *_, allocated, reserved in replayed.series)
    assert replayed.outside == 2 * 10**9                    # the overhead row, beside the allocator
    with pytest.raises(ValueError, match="max_split_size_mb"):
        replay_step(step, max_split_size_mb=8)


def _peak_setups():
    """Replays whose reserved peak rises many times (loading, the first forward pass), each as a function of nothing."""
    from memledger.ledger.lora import LoraConfig, LoraLedger, qlora
    arch = Architecture(1024, 12, 16, 2752, 32000, "llama")
    quantized = LoraLedger(arch, qlora(8), 1, 512, overhead_bytes=0).step("cuda")
    plain = LoraLedger(arch, LoraConfig(rank=8), 1, 512, overhead_bytes=0).step("cuda")
    ledger = Ledger(arch=arch, batch_size=2, seq_len=512)
    fsdp2 = Ledger(arch=arch, batch_size=2, seq_len=512, framework="fsdp2", dp=4, recipe="fp32-adamw")
    return [lambda: replay_step(quantized, load="torchtune"),
            lambda: replay_step(quantized, True, load="torchtune"),
            lambda: replay_step(quantized, False, 32, load="litgpt"),
            lambda: replay_step(plain, load="litgpt"),
            lambda: replay_step(plain, True, load="torchtune"),
            lambda: replay(ledger), lambda: replay(ledger, expandable_segments=True), lambda: replay(fsdp2)]


def test_the_segments_are_those_at_the_reserved_peak(monkeypatch):
    """``segments``, the snapshot at the reserved peak, is the allocator's state where the peak last rose: its
    segments hold exactly the reserved peak, their allocated blocks the bytes allocated at that point of the
    series, and their blocks tile them. It is the same whether every rise of the peak is snapshotted (the replay as
    it was first written), a budget of them, or none but the last, read by walking the trace again
    (``SNAPSHOT_BUDGET``, :func:`memledger.ledger.replay.run`)."""
    import memledger.ledger.replay as module
    from memledger.ledger.caching import CachingAllocator
    walked, again = [], []
    snapshot, snapshot_at = CachingAllocator.snapshot, module._snapshot_at

    def counted(self):
        out = snapshot(self)
        walked.append(sum(len(s["blocks"]) + 1 for s in out))
        return out
    monkeypatch.setattr(CachingAllocator, "snapshot", counted)
    monkeypatch.setattr(module, "_snapshot_at", lambda *a: again.append(a[1]) or snapshot_at(*a))
    for setup in _peak_setups():
        results = {}
        for budget in (10**12, module.SNAPSHOT_BUDGET, 0):
            monkeypatch.setattr(module, "SNAPSHOT_BUDGET", budget)
            walked.clear()
            r = setup()
            results[budget] = (r.allocated, r.reserved, r.allocated_at, r.reserved_at, r.series, r.segments)
            rises = sum(1 for before, now in zip([(0, 0, 0, 0, -1)] + r.series, r.series) if now[4] > before[4])
            if budget == 10**12:
                assert len(walked) == rises          # every rise snapshotted
            elif budget == 0:
                assert len(walked) <= rises // 2     # one in several
        assert len(set(map(repr, results.values()))) == 1
        at = next(s for s in r.series if s[4] == r.reserved)
        assert at[:3] == r.reserved_at
        assert sum(s["total_size"] for s in r.segments) == r.reserved
        assert sum(s["allocated_size"] for s in r.segments) == at[3]
        assert all(sum(size for size, _ in s["blocks"]) == s["total_size"] for s in r.segments)
    assert again                               # the walk to the last rise was taken
