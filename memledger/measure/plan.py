"""What to predict: the run's setup (a :class:`~memledger.ledger.ledger.Ledger`, or the keywords of one) checked when
the callback is made, and completed from what the run shows (its batch shape, its device, its optimizer).

Plain Python (no PyTorch). The prediction is ``Ledger(...).step(backend, **conventions)``
(:class:`memledger.step.timeline.Step`): its landmarks, its phase peaks, its peak and its curve
(:meth:`~memledger.step.timeline.Step.series`).
"""
from pathlib import Path

from ..activations.backends import BACKENDS, get_backend
from ..ledger.ledger import Ledger
from ..ledger.lora import LoraLedger

__all__ = ["Plan", "check_steps", "output_path", "predicted_side"]

_FIELDS = tuple(Ledger.keywords())


class Plan:
    """The setup to predict, checked now: ``setup`` a Ledger (or a LoraLedger) or a dict of Ledger keywords
    (``batch_size`` and ``seq_len`` may be left out: the first batch the model sees gives them; ``overhead_bytes``
    left out is 0, as neither PyTorch's allocator counters nor MemTracker count the CUDA context); ``backend``
    None (``"cuda"`` for a model on a CUDA device, else ``"cpu"``) or a backend's name; ``conventions``: the
    backend's switches (:mod:`memledger.activations.backends`), over those read off the optimizer (``foreach``,
    ``fused``).
    Bad input raises ValueError naming the field."""

    def __init__(self, setup, backend=None, conventions=None):
        if isinstance(setup, (Ledger, LoraLedger)):
            self.given, self.fields = setup, None
        elif isinstance(setup, dict):
            unknown = sorted(k for k in setup if k not in _FIELDS)
            if unknown:
                raise ValueError(f"setup: unknown Ledger field {unknown[0]!r}; known: {', '.join(_FIELDS)}")
            self.fields = {"overhead_bytes": 0, **setup}
            self.given = None
            Ledger(**self.fields)                # every field checked now (a missing batch shape: the defaults)
        else:
            raise ValueError(f"setup must be a memledger Ledger, LoraLedger or a dict of Ledger keywords, got "
                             f"{setup!r}"[:200])
        if backend is not None and backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)} or None, got {backend!r}")
        self.backend = backend
        if conventions is not None and not isinstance(conventions, dict):
            raise ValueError(f"conventions must be a dict of backend switches, got {conventions!r}"[:200])
        self.conventions = dict(conventions or {})
        try:
            get_backend("cpu", **self.conventions)
        except TypeError:
            from ..activations.backends import SWITCHES
            bad = next(k for k in self.conventions if k not in SWITCHES)
            raise ValueError(f"conventions: unknown switch {bad!r}; known: {', '.join(SWITCHES)}") from None

    def ledger(self, batch=None) -> tuple:
        """(the Ledger to predict, notes): the batch shape ``batch`` = (B, S) the model saw fills what the setup
        left out, and a setup whose batch shape differs from it is noted."""
        notes = []
        if self.given is not None:
            ledger = self.given
        else:
            values = dict(self.fields)
            if batch is not None:
                values.setdefault("batch_size", batch[0])
                values.setdefault("seq_len", batch[1])
            elif "batch_size" not in values or "seq_len" not in values:
                notes.append("the batch shape was not seen (no 2-D integer tensor reached the model's forward): "
                             "Ledger's default batch_size/seq_len predicted")
            ledger = Ledger(**values)
        if batch is not None and (ledger.batch_size, ledger.seq_len) != tuple(batch):
            notes.append(f"the setup predicts batch {ledger.batch_size} x {ledger.seq_len} tokens; the model saw "
                         f"{batch[0]} x {batch[1]}")
        return ledger, notes

    def step(self, device_type: str, read_conventions: dict, batch=None):
        """(Step, backend name, conventions, notes): the prediction for a run on ``device_type`` whose optimizer
        shows ``read_conventions`` (overridden by the ones given)."""
        ledger, notes = self.ledger(batch)
        backend = self.backend or ("cuda" if device_type == "cuda" else "cpu")
        conventions = {**read_conventions, **self.conventions}
        return ledger.step(backend, **conventions), backend, conventions, notes

    def inputs(self, step) -> dict:
        """The report's setup: the step's inputs (``memledger step --json``), a LoRA run's adapters beside them."""
        inputs = step.to_dict()["inputs"]
        if isinstance(self.given, LoraLedger):
            inputs["lora"] = self.given.to_dict()["inputs"]
        return inputs

    def bare(self):
        """The Ledger as given, without a batch shape filled in (for the report's setup when prediction fails)."""
        return self.given if self.given is not None else dict(self.fields)


def predicted_side(step) -> dict:
    """The prediction as the report holds it: landmarks (the device's bytes), phase peaks, the peak and where."""
    peak = step.peak
    return {"landmarks": {k: int(v["gpu"]) for k, v in step.landmarks.items()},
            "host_landmarks": {k: int(v["cpu"]) for k, v in step.landmarks.items()},
            "phase_peaks": {k: int(v) for k, v in step.phase_peaks().items()},
            "peak": int(peak.bytes), "peak_phase": peak.phase, "peak_detail": peak.detail, "peak_sample": int(peak.sample)}


def check_steps(steps) -> int:
    """The number of training steps to measure: a whole number >= 1, or ValueError naming ``steps``."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a whole number of training steps >= 1, got {steps!r}")
    return steps


def output_path(value, field: str, report=None):
    """Where to write: ``value`` a path (str or PathLike); None or False: nowhere; True (the plot): the report's
    path with ``.png`` (``memledger-report.png`` without a report). Anything else: ValueError naming ``field``."""
    if value is None or value is False:
        return None
    if value is True:
        return Path("memledger-report.png") if report is None else report.with_suffix(".png")
    if isinstance(value, (str, Path)) and str(value):
        return Path(value)
    raise ValueError(f"{field} must be a file path, None or False, got {value!r}"[:200])
