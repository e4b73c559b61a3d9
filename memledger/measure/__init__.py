"""Checking memledger's prediction on the user's own device: measure a run's first training steps and report them
beside the prediction for the run's own setup (docs/measure.md).

* :func:`track`: a plain loop (a context manager);
* :class:`HFCallback`: Hugging Face's ``Trainer`` (a ``transformers.TrainerCallback``);
* :class:`LightningCallback`: Lightning's ``Trainer`` (a ``Callback``; needs ``lightning`` or
  ``pytorch_lightning``);
* :func:`torchtune_hook`: a function a torchtune recipe calls after each optimizer step.

Each writes a JSON report and a PNG of predicted against measured through the step, and prints one line.
PyTorch, transformers and Lightning are imported only when one of these is used: ``import memledger`` needs none.
"""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    "recorder": ("Recorder", "track"),
    "hf": ("HFCallback",),
    "lightning": ("LightningCallback",),
    "torchtune": ("TorchtuneHook", "torchtune_hook"),
    "report": ("build_report", "summary_line"),
    "plan": ("Plan",),
    "plot": ("plot_report",),
})
