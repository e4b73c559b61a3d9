"""torchtune: a hook its recipes call once per optimizer step (docs/measure.md).

torchtune's recipes are scripts, not a framework with callbacks: copy the recipe (``tune cp
full_finetune_single_device .``) and add two lines. In ``setup()``::

    from memledger.measure import torchtune_hook
    self._memledger = torchtune_hook(setup=dict(arch="llama2-7b", recipe="bf16-pure-adamw"), steps=2)

and in ``train()``, after the optimizer step (``recipes/full_finetune_single_device.py`` at bd2a0fc7, l. 634-640:
``self.optimizer.step()``, ``self.optimizer.zero_grad(set_to_none=True)``, ... ``self.global_step += 1``)::

    self._memledger(self._model, self.optimizer)

The first call comes after the first step, which creates the optimizer's state: it starts the measurement, so the
steps measured are the next ``steps`` ones. Each later call ends a step (if the optimizer's ``zero_grad`` has not);
inside a step the landmarks are read as :mod:`memledger.measure.recorder` says. The report is written after the
last measured step; ``hook.close()`` (e.g. in the recipe's ``cleanup()``) writes it if training ended first.
"""
from .recorder import Recorded

__all__ = ["TorchtuneHook", "torchtune_hook"]


class TorchtuneHook(Recorded):
    """Call it with the model and the optimizer after each optimizer step; see the module's docstring."""

    AUTO = True

    def __call__(self, model, optimizer=None):
        recorder = self.recorder
        if recorder.done:
            return
        if not recorder.attached:
            recorder.attach(model, optimizer)
            return
        recorder.end_step()

    def close(self):
        if self.recorder.attached or self.recorder.records:
            return self.recorder.close()
        return self.recorder.report


def torchtune_hook(setup, steps=2, report="memledger-report.json", plot=True, backend=None, conventions=None,
                   echo=True) -> TorchtuneHook:
    """A :class:`TorchtuneHook`: ``hook(model, optimizer)`` after each optimizer step of a torchtune recipe."""
    return TorchtuneHook(setup, steps=steps, report=report, plot=plot, backend=backend, conventions=conventions,
                         echo=echo)
