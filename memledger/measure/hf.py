"""Hugging Face ``Trainer``: a ``TrainerCallback`` that measures the first training steps (docs/measure.md).

    from memledger.measure import HFCallback
    trainer = Trainer(model=model, args=args, train_dataset=data,
                      callbacks=[HFCallback(setup=dict(arch="llama2-7b", recipe="bf16-pure-adamw"), steps=2)])

The Trainer's events bound each step (transformers 5.25.0, ``trainer.py``: ``on_step_begin`` l. 1939, before the
micro-batches' forward and backward; ``on_pre_optimizer_step`` and ``optimizer.step()`` l. 1979-1980;
``model.zero_grad()`` l. 1991; ``on_step_end`` l. 1994); the landmarks inside are read as
:mod:`memledger.measure.recorder` says. Importing this module imports ``transformers``.
"""
from transformers import TrainerCallback

from .recorder import Recorded

__all__ = ["HFCallback"]


class HFCallback(Recorded, TrainerCallback):
    """Measures the Trainer's first ``steps`` optimizer steps and reports the last beside memledger's prediction
    for ``setup`` (a Ledger or a dict of its keywords; the batch shape, if left out, is the first batch's). The other
    arguments are :class:`~memledger.measure.recorder.Recorder`'s. After training, ``callback.report`` holds the
    report and ``callback.line`` the printed line."""

    def on_step_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        recorder = self.recorder
        if recorder.done:
            return
        if not recorder.attached:
            recorder.attach(model, optimizer)
        recorder.begin_step(label=f"global step {state.global_step + 1}")

    def on_step_end(self, args, state, control, **kwargs):
        self.recorder.end_step()

    def on_train_end(self, args, state, control, **kwargs):
        if self.recorder.attached or self.recorder.records:
            self.recorder.close()
