"""PyTorch DDP's gradient buckets in the step (memledger/step/ddp.py).

The independent values: PyTorch's own defaults (torch/nn/parallel/distributed.py, torch.distributed), its own C++
bucket assignment (``dist._compute_bucket_assignment_by_size``, what ``Reducer::rebuild_buckets`` calls), and
MemTracker's account of the reference loop under ``DistributedDataParallel`` with real tensors on a one-rank
gloo group (memledger/pytorch/ddp.py): every landmark, every phase's peak and the reducer's buckets, to the byte.
"""
import random

import pytest

from memledger.ledger.ledger import Ledger
from memledger.models.architecture import Architecture
from memledger.step.ddp import assign_buckets, bucket_limits

from stepcheck import landmarks_are_sums_of_rows

SMALL = Architecture(128, 2, 4, 512, 2000, "llama")


def ddp_ledger(arch=SMALL, **kw):
    kw = {"batch_size": 2, "seq_len": 16, "recipe": "bf16-adamw", "overhead_bytes": 0, "framework": "ddp"} | kw
    return Ledger(arch, **kw)


@pytest.mark.slow
def test_bucket_limits_are_pytorchs_defaults():
    """_BucketCapacityConfig.create: bucket_cap_mb None -> 25 MiB with a first bucket of
    dist._DEFAULT_FIRST_BUCKET_BYTES; an explicit cap is every bucket's limit, the first's too."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.nn.parallel.distributed import _BucketCapacityConfig
    for cap in (None, 25, 0.25, 100, 0):
        config = _BucketCapacityConfig.create(bucket_cap_mb=cap, bucket_cap_mb_list=None, use_python_reducer=False)
        assert bucket_limits(cap) == (config.first_bucket_bytes_cap, config.bucket_bytes_cap)
    assert bucket_limits(None)[0] == dist._DEFAULT_FIRST_BUCKET_BYTES
    assert torch is not None


@pytest.mark.slow
def test_bucket_assignment_is_the_reducers():
    """Random gradient sizes in ready order, grouped by PyTorch's own C++ assignment (with tensor indices, as
    rebuild_buckets passes them: no sorting)."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    rng = random.Random(0)
    exact = [([512, 512, 2048, 1], (1024, 4096)), ([2 ** 19, 2 ** 19], (2 ** 20, 2 ** 20))]   # limits reached exactly
    for numels, limits in exact + [([rng.choice([1, 7, 64, 1000, 40000, 300000]) for _ in range(rng.randint(1, 25))],
                                    (rng.choice([1024, 2 ** 20]), rng.choice([4096, 2 ** 20, 25 * 2 ** 20])))
                                   for _ in range(30)]:
        tensors = [torch.empty(n, dtype=torch.bfloat16) for n in numels]
        theirs, _ = dist._compute_bucket_assignment_by_size(tensors, list(limits), [False] * len(tensors),
                                                            list(range(len(tensors))))
        assert assign_buckets([2 * n for n in numels], limits) == theirs


@pytest.mark.slow
@pytest.mark.parametrize("view", [False, True])
def test_landmarks_are_sums_of_rows(view):
    step = ddp_ledger(gradient_as_bucket_view=view, ddp_bucket_mb=0.25).step("cpu")
    landmarks_are_sums_of_rows(step)
    buckets = [r for r in step.rows if r["name"].startswith("DDP gradient bucket ")]
    assert len(buckets) > 2 and sum(r["bytes"] for r in buckets) == 2 * step.values["P"]
    assert all(r["live"] == {"before forward", "after forward", "after backward", "after step"} for r in buckets)
    names = [n for n, _ in step.live_at_peak()]
    assert all(r["name"] in names for r in buckets)


@pytest.mark.slow
def test_bucket_views_cost_no_gradients():
    """With views the gradients are the buckets: every landmark but "after backward" holds P x 2 bytes more
    than the plain loop, "after backward" none."""
    plain = Ledger(SMALL, batch_size=2, seq_len=16, recipe="bf16-adamw", overhead_bytes=0).step("cpu")
    view = ddp_ledger(gradient_as_bucket_view=True).step("cpu")
    beside = ddp_ledger().step("cpu")
    P2 = 2 * plain.values["P"]
    for mark, before in plain.landmarks.items():
        assert beside.landmarks[mark]["gpu"] == before["gpu"] + P2
        assert view.landmarks[mark]["gpu"] == before["gpu"] + (0 if mark == "after backward" else P2)


def test_options_of_another_framework_are_refused():
    with pytest.raises(ValueError, match="ddp_bucket_mb is an option of framework ddp"):
        Ledger(SMALL, ddp_bucket_mb=5)
    with pytest.raises(ValueError, match="gradient_as_bucket_view is an option of framework ddp"):
        Ledger(SMALL, gradient_as_bucket_view=True)
    with pytest.raises(ValueError, match="zero_stage must be 0"):
        ddp_ledger(zero_stage=2, dp=8)
    with pytest.raises(ValueError, match="gradients in the parameters' dtype"):
        ddp_ledger(recipe="bf16-adamw-fp32-grads")
    with pytest.raises(ValueError, match="framework must be one of"):
        Ledger(SMALL, framework="horovod")
    with pytest.raises(TypeError, match="ddp_bucket_mb"):
        ddp_ledger(ddp_bucket_mb="25")


# ---- against PyTorch's DDP, real tensors (slow: a few seconds each) --------------------------------------------

CASES = [  # (style, L, loop, bucket_cap_mb, view, B, S[, recompute])
    ("llama", 2, "fp32-adamw", None, False, 2, 16),
    ("llama", 2, "fp32-adamw", None, True, 2, 16),
    ("llama", 2, "bf16-adamw", 0.25, False, 2, 16),
    ("llama", 2, "bf16-adamw", 0.25, True, 2, 16),
    ("llama", 6, "bf16-pure-adamw", 0.1, True, 1, 32),       # lumped middle blocks, B = 1
    ("llama", 6, "bf16-adamw", 0.1, False, 2, 16),
    ("gpt", 3, "fp32-adamw", 0.05, True, 2, 16),             # tied embedding: its gradient is ready last
    ("gpt", 3, "bf16-adamw", None, False, 2, 16),
    ("llama", 3, "bf16-adamw", 0.1, True, 2, 16, "full"),      # checkpointed blocks: the same ready order
    ("gpt", 3, "bf16-adamw", 0.1, False, 2, 16, "selective"),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda case: "-".join(map(str, case)))
def test_ddp_step_is_pytorchs(case):
    style, L, loop, cap, view, B, S, recompute = case + ("none",) * (8 - len(case))
    torch = pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.ddp import ddp_step
    from memledger.pytorch.reference import RefConfig
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        c = RefConfig(128, L, 4, 512, 2000, style, recompute=recompute)
        measured = ddp_step(c, loop, B, S, bucket_cap_mb=cap, gradient_as_bucket_view=view)
    finally:
        torch.set_num_threads(threads)
    step = ddp_ledger(architecture_of(c), batch_size=B, seq_len=S, recipe=loop, dropout=False, ddp_bucket_mb=cap,
                      gradient_as_bucket_view=view, recompute=recompute).step("cpu")
    assert [b for _, b, _, _ in step.ddp_buckets] == measured["buckets"]
    for mark in ("before forward", "after forward", "after backward", "after step"):
        assert step.landmarks[mark]["gpu"] == measured[mark], mark
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
