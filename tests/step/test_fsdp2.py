"""The FSDP2 step (memledger/step/fsdp2.py) against PyTorch's own FSDP2 on a fake process group.

The independent values: ``FSDPMemTracker``'s account of the reference decoder under ``fully_shard`` per block
and the root (memledger/pytorch/distributed.py, ``fsdp_step``; rank 0 of a world of N ranks under
FakeTensorMode, CPU backend = exact storage bytes): the four landmarks and the peak of every phase, to the
byte, for memledger's ``Ledger(framework="fsdp2")`` step under the CPU backend. Plus the issue's published
figures (LLaMA-2 7B, world 8) where the setup is the same.
"""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import LANDMARKS

from stepcheck import GPT7B, LLAMA7B, landmarks_are_sums_of_rows

LLAMA = dict(d=4096, L=32, H=32, F=11008, V=32000, style="llama")        # LLaMA-2 7B's shape
GPT = dict(d=4096, L=32, H=32, F=16384, V=32000, style="gpt")            # the article's 7B GPT shape
#: Small, with no dim-0 size a multiple of 8 ranks (FSDP2 pads each parameter's dim 0); L = 6: lumped blocks.
ODD = dict(d=60, L=6, H=4, F=170, V=1001, style="llama")
SMALL_GPT = dict(d=64, L=6, H=4, F=256, V=1000, style="gpt")


def fsdp2_ledger(arch, B, S, N, recompute="none", reshard=True, param="bf16", reduce="fp32", loop="fp32-adamw",
                 dropout=False, replicate=1, loss_in_root=False, offload=False, pin=True):
    return Ledger(arch, batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0, dropout=dropout, recompute=recompute,
                  framework="fsdp2", dp=N, fsdp_param_dtype=param, fsdp_reduce_dtype=reduce,
                  reshard_after_forward=reshard, dp_replicate=replicate, fsdp_loss_in_root=loss_in_root,
                  fsdp_cpu_offload=offload, fsdp_offload_pin_memory=pin)


def against_fsdp2(shape, B, S, N, recompute="none", reshard=True, param="bf16", reduce="fp32", loop="fp32-adamw",
                  dropout=0.0, replicate=1, foreach=False, loss_in_root=False):
    """Landmarks and every phase peak of memledger's FSDP2 step equal FSDPMemTracker's, byte for byte."""
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.distributed import fsdp_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(**shape, recompute=recompute, dropout=dropout)
    pytorch_default = dict(reshard=True, root_reshard=False) if reshard is None else dict(reshard=reshard)
    measured = fsdp_step(c, loop, batch=B, seq=S, world=N, param_dtype=param, reduce_dtype=reduce,
                         replicate=replicate, foreach=foreach, track_first=False, loss_in_root=loss_in_root,
                         **pytorch_default)
    step = fsdp2_ledger(architecture_of(c), B, S, N, recompute, reshard, param, reduce, loop,
                        dropout > 0, replicate, loss_in_root).step("cpu", foreach=foreach)
    assert {k: step.landmarks[k]["gpu"] for k in LANDMARKS} == {k: measured[k] for k in LANDMARKS}
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    landmarks_are_sums_of_rows(step)
    return step, measured


def test_small_step_books_fsdp2s_buffers():
    """Fast (no PyTorch): the landmarks are sums of the rows; the step names FSDP2's buffers by block."""
    step = fsdp2_ledger(LLAMA7B, 1, 4096, 8).step("cpu")
    landmarks_are_sums_of_rows(step)
    names = [r["name"] for r in step.rows]
    assert "FSDP2 sharded parameters (FP32)" in names and not any("BF16 parameters" in n for n in names)
    live = dict(step.live_at_peak())
    assert step.peak.phase == "backward" and step.peak.layer == 30
    assert "FSDP2 all-gather output (BF16), block 29" in live            # prefetched by block 30's pre-backward
    assert "FSDP2 reduce-scatter input (FP32), block 31" in live         # held until block 30's reduce-scatter
    assert "FSDP2 unsharded parameters (BF16), block 30" in live
    kept = fsdp2_ledger(LLAMA7B, 1, 4096, 8, reshard=False).step("cpu")
    landmarks_are_sums_of_rows(kept)


def test_issue_figures_llama2_7b_world_8():
    """Issue 15's FSDPMemTracker figures, LLaMA-2 7B shape, world 8, B 1, S 4096, bf16/fp32 policy: before
    forward 10.11 GB (FP32 shards and AdamW's moments on them, no BF16 copy), after forward 37.39 GB (with the
    loss inside or outside the root), and the 39.37 GB peak with the loss inside the root's forward
    (``fsdp_loss_in_root``: the root's pre-backward re-gathers it and prefetches the last block before the
    loss's backward, docs/fsdp2.md section 7); outside the root the peak is lower, in block 30's backward."""
    for inside in (True, False):
        step = fsdp2_ledger(LLAMA7B, 1, 4096, 8, loss_in_root=inside).step("cpu")
        assert round(step.landmarks["before forward"]["gpu"] / 1e9, 2) == 10.11
        assert round(step.landmarks["after forward"]["gpu"] / 1e9, 2) == 37.39
        assert (round(step.peak.bytes / 1e9, 2) == 39.37) is inside
    inside = fsdp2_ledger(LLAMA7B, 1, 4096, 8, loss_in_root=True).step("cpu")
    assert inside.peak.phase == "loss"
    live = dict(inside.live_at_peak())
    assert "FSDP2 all-gather output (BF16), block 31" in live and "FSDP2 unsharded parameters (BF16), root" in live


@pytest.mark.slow
@pytest.mark.parametrize("shape, B, S, N, options", [
    (ODD, 2, 16, 8, dict()),
    (ODD, 1, 16, 8, dict(reshard=False)),
    (ODD, 2, 16, 64, dict(recompute="selective")),
    (ODD, 2, 16, 8, dict(recompute="full", reshard=False)),
    (ODD, 2, 16, 8, dict(param=None, reduce=None)),                     # MixedPrecisionPolicy(): no cast
    (ODD, 2, 16, 8, dict(reduce="bf16")),                                # BF16 reduce, cast to FP32 shards
    (ODD, 2, 16, 8, dict(loop="bf16-pure-adamw")),                       # BF16 shards: no all-gather cast
    (SMALL_GPT, 2, 16, 8, dict()),
    (SMALL_GPT, 2, 16, 1024, dict(dropout=0.1, recompute="selective", reshard=False)),
    (ODD, 2, 16, 8, dict(replicate=2, reduce="bf16")),       # HSDP: the BF16 outputs held to finalize_backward
    (ODD, 2, 16, 16, dict(replicate=4)),                     # HSDP (4, 4): FSDP2 over 4 ranks
    (ODD, 2, 16, 8, dict(reshard=None, param=None, reduce=None)),   # fully_shard's defaults: root kept, no cast
    (ODD, 2, 16, 8, dict(foreach=True)),                     # AdamW(foreach=True) on the DTensor shards
    (ODD, 2, 16, 8, dict(loss_in_root=True)),                # the loss in the root's forward (the issue's setup)
    (ODD, 2, 16, 8, dict(loss_in_root=True, reshard=None)),  # ... with PyTorch's root default (kept unsharded)
    (ODD, 1, 16, 8, dict(loss_in_root=True, reshard=False)),
    (SMALL_GPT, 2, 16, 8, dict(loss_in_root=True, recompute="full")),
    (ODD, 2, 16, 8, dict(reshard=2)),                        # int: each unit keeps its 1/2 slice after forward
    (ODD, 2, 16, 8, dict(reshard=4, param=None, reduce=None)),          # ... no cast: no all-gather input copy
    (ODD, 2, 16, 8, dict(reshard=2, loss_in_root=True, reduce="bf16")),
    (SMALL_GPT, 2, 16, 64, dict(reshard=8, recompute="selective")),
])
def test_small_shapes_match_fsdp_mem_tracker(shape, B, S, N, options):
    against_fsdp2(shape, B, S, N, **options)


#: Sampled from LLaMA-2 7B and the article's 7B GPT x worlds 8, 64, 1024 x B 1, 2 x S 2048, 4096, 8192 x
#: resharding on/off x no/selective/full recomputation: every value of every axis at least twice.
FULL_SCALE = [
    (LLAMA, 1, 4096, 8, dict()),
    (GPT, 1, 2048, 8, dict()),
    (LLAMA, 2, 2048, 64, dict(recompute="selective", reshard=False)),
    (GPT, 2, 4096, 1024, dict(recompute="full")),
    (LLAMA, 1, 8192, 1024, dict(recompute="full", reshard=False)),
    (GPT, 1, 8192, 64, dict(recompute="selective")),
    (LLAMA, 2, 8192, 64, dict(param=None, reduce=None)),
    (GPT, 2, 2048, 8, dict(reshard=False, reduce="bf16")),
    (LLAMA, 1, 4096, 8, dict(loss_in_root=True)),                       # the issue's own setup: 39.37 GB
    (GPT, 2, 4096, 64, dict(loss_in_root=True, reshard=None, recompute="selective")),
    (LLAMA, 1, 4096, 8, dict(reshard=2)),                               # reshard_after_forward=2
    (GPT, 1, 2048, 64, dict(reshard=8, recompute="full")),
]


@pytest.mark.slow
@pytest.mark.parametrize("shape, B, S, N, options", FULL_SCALE)
def test_7b_shapes_match_fsdp_mem_tracker(shape, B, S, N, options):
    against_fsdp2(shape, B, S, N, **options)


def test_an_int_reshard_is_normalized_as_fully_shard_does():
    """``_fsdp_init.py:174-182``: an int equal to the shard group is True, 1 is False (no post-forward slices)."""
    def peak(reshard, dp=8, replicate=1):
        return fsdp2_ledger(LLAMA7B, 1, 1024, dp, reshard=reshard, replicate=replicate).step("cpu").peak.bytes
    assert peak(8) == peak(True) and peak(1) == peak(False) != peak(True)
    assert peak(4, 16, 4) == peak(True, 16, 4) and peak(2, 16, 4) not in (peak(True, 16, 4), peak(False, 16, 4))
    step = fsdp2_ledger(LLAMA7B, 1, 4096, 8, reshard=2).step("cpu")
    landmarks_are_sums_of_rows(step)
    assert "FSDP2 post-forward slices (BF16), every unit" in [r["name"] for r in step.rows]


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="zero_stage must be 0"):
        Ledger(LLAMA7B, recipe="fp32-adamw", framework="fsdp2", dp=8, zero_stage=3)
    with pytest.raises(ValueError, match="recipe must be one of"):
        Ledger(LLAMA7B, framework="fsdp2", dp=8)
    with pytest.raises(ValueError, match="dp must be at least 2"):
        Ledger(LLAMA7B, recipe="fp32-adamw", framework="fsdp2")
    with pytest.raises(ValueError, match="reshard_after_forward is an option of framework fsdp2"):
        Ledger(LLAMA7B, reshard_after_forward=False)
    with pytest.raises(ValueError, match=r"reshard_after_forward \(3\) must be a positive divisor"):
        Ledger(LLAMA7B, recipe="fp32-adamw", framework="fsdp2", dp=8, reshard_after_forward=3)
    with pytest.raises(TypeError, match="reshard_after_forward must be"):
        Ledger(LLAMA7B, recipe="fp32-adamw", framework="fsdp2", dp=8, reshard_after_forward=2.0)
    with pytest.raises(ValueError, match="fsdp_loss_in_root is an option of framework fsdp2"):
        Ledger(LLAMA7B, fsdp_loss_in_root=True)
    with pytest.raises(ValueError, match="framework must be one of"):
        Ledger(LLAMA7B, framework="fsdp3")
    with pytest.raises(ValueError, match="fsdp_param_dtype"):
        Ledger(LLAMA7B, recipe="fp32-adamw", framework="fsdp2", dp=8, fsdp_param_dtype="int8")
    with pytest.raises(ValueError, match="does not book FSDP2"):
        _ = Ledger(GPT7B, recipe="fp32-adamw", framework="fsdp2", dp=8).totals
