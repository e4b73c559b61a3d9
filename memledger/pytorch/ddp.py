"""The reference loop under PyTorch's ``DistributedDataParallel``, measured with real tensors.

DDP's C++ reducer (``torch/csrc/distributed/c10d/reducer.cpp``) allocates real bucket storage, so it does not
run under ``FakeTensorMode``: this runs a small decoder with real CPU tensors on a one-rank gloo group, the
model (the loss inside its ``forward``, :class:`~memledger.pytorch.distributed.LossRoot`) wrapped in
``DistributedDataParallel(..., bucket_cap_mb=..., gradient_as_bucket_view=...)``, tracked by PyTorch's
``MemTracker`` from before the wrap. Three steps of :class:`~memledger.pytorch.reference.Trainer` run; the
reducer rebuilds its buckets in gradient-ready order at the second forward, so the third is the steady state
reported. The buckets stay allocated for the whole run (``Reducer::initialize_buckets``:
``bucket.gradients = at::empty({offset}, options)``). Imports PyTorch.
"""
import torch

from .distributed import LossRoot, gloo_world
from .measure import _inputs, _tracker_class
from .record import recorded
from .reference import RefConfig, Trainer, make_model

__all__ = ["ddp_step"]

_CPU = torch.device("cpu")


class _Wrapped:
    """What :class:`Trainer` needs of a model (``parameters()``, ``loss()``), the loss run through DDP's forward."""

    def __init__(self, ddp):
        self.ddp = ddp

    def parameters(self):
        return self.ddp.module.parameters()

    def loss(self, ids, targets):
        return self.ddp(ids, targets)


@recorded
def ddp_step(c: RefConfig, loop: str = "fp32-adamw", batch: int = 2, seq: int = 16, *, bucket_cap_mb=None,
             gradient_as_bucket_view: bool = False, foreach: bool = False, seed: int = 0) -> dict:
    """MemTracker's account of the third training step of ``c`` under DDP (real tensors, world 1): {landmark:
    bytes, "peak": bytes, "phase peaks": {"forward", "backward", "optimizer": bytes}, "buckets": [bytes of each
    bucket, in the reducer's order], "grads": bytes of the parameters' gradients}; the optimizer state is
    created first (:meth:`Trainer.init_state`), as :func:`memledger.pytorch.measure.memtracker_step` does."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(seed)
    with gloo_world():
        model = make_model(c, loop)
        trainer = Trainer(model, loop, foreach=foreach)
        trainer.init_state()
        ids, targets = _inputs(c, batch, seq)
        tracker = _tracker_class()()
        tracker.track_external(model, trainer.opt, ids, targets, *trainer.masters)
        result, phase_peaks = {}, {}
        phases = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}
        record = [False]

        def landmark(name):
            if not record[0]:
                return
            total = tracker.get_tracker_snapshot("current")[_CPU]["Total"]
            if name in phases:
                phase_peaks[phases[name]] = max(tracker._peak_mem[_CPU], total)
            result[name] = tracker._peak_mem[_CPU] = total

        with tracker:
            ddp = DDP(LossRoot(model), bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gradient_as_bucket_view)
            trainer.model = _Wrapped(ddp)
            for step in range(3):
                record[0] = step == 2
                trainer.step(ids, targets, landmark)
                tracker.reset_mod_stats()
        result["peak"] = max(phase_peaks.values())
        result["phase peaks"] = phase_peaks
        result["buckets"] = [b.buffer().untyped_storage().nbytes() for b in ddp.reducer._get_zeros_like_grad_buckets()]
        result["grads"] = sum(p.numel() * p.element_size() for p in model.parameters())
    return result
