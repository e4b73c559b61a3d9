"""Lightning: a ``Callback`` that measures the first training steps (docs/measure.md).

    from memledger.measure import LightningCallback
    trainer = L.Trainer(callbacks=[LightningCallback(setup=dict(arch="llama2-7b", recipe="bf16-pure-adamw"))])

Lightning runs the forward and backward inside ``optimizer.step(closure)`` (automatic optimization), so the
optimizer's pre-step hook comes before the forward: the landmarks come from Lightning's own hooks instead
(``on_train_batch_start``: before forward, ``on_before_backward``: after forward, ``on_after_backward``: after
backward, ``on_train_batch_end``: after step). Each training batch is a step (with ``accumulate_grad_batches``
> 1, a micro-batch). Needs ``lightning`` or ``pytorch_lightning``; importing this module imports it.
"""
try:
    from lightning.pytorch import Callback
except ImportError:
    try:
        from pytorch_lightning import Callback
    except ImportError:
        raise ImportError("memledger.measure.LightningCallback needs Lightning: pip install lightning "
                          "(or pytorch-lightning); memledger does not install it") from None

from .recorder import Recorded, _batch_shape

__all__ = ["LightningCallback"]


class LightningCallback(Recorded, Callback):
    """Measures the first ``steps`` training batches and reports the last beside memledger's prediction for
    ``setup``; the other arguments are :class:`~memledger.measure.recorder.Recorder`'s."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        recorder = self.recorder
        if recorder.done:
            return
        if not recorder.attached:
            recorder.attach(pl_module, list(trainer.optimizers))
        recorder.begin_step(label=f"batch {batch_idx}")
        if recorder.batch is None:
            recorder.batch = _batch_shape((batch,), {})
        recorder.track_tensors(batch)
        recorder.mark("before forward")

    def on_before_backward(self, trainer, pl_module, loss):
        self.recorder.mark("after forward")

    def on_after_backward(self, trainer, pl_module):
        self.recorder.mark("after backward")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.recorder.end_step()

    def on_train_end(self, trainer, pl_module):
        if self.recorder.attached or self.recorder.records:
            self.recorder.close()
