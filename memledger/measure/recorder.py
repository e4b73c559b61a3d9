"""Measuring the first training steps of a run on its own device, and reporting them beside memledger's prediction.

A :class:`Recorder` reads the device's memory at the four landmarks of each step
(:data:`memledger.step.timeline.LANDMARKS`) and the peak between consecutive landmarks (each phase's peak):

* on CUDA, PyTorch's caching-allocator counters: ``torch.cuda.memory_allocated()`` at each landmark,
  ``max_memory_allocated()`` and ``max_memory_reserved()`` since the last landmark
  (``reset_peak_memory_stats()`` at each);
* elsewhere (the CPU), PyTorch's ``torch.distributed._tools.mem_tracker.MemTracker``
  (:func:`memledger.pytorch.measure.tracker_class`: the global peak only), entered when the recorder attaches and
  left after the last measured step: every tensor created meanwhile is counted, and the model, the optimizer's
  state and the tensors reaching the model's forward are registered (``track_external``). Frozen parameters get a
  no-op gradient-hook handle first (MemTracker hooks every parameter it meets and cannot hook a frozen one).

Where the landmarks are read, unless a framework's callback says so itself (first reading wins):

* ``before forward``: the model's forward pre-hook (the first forward of the step);
* ``after forward``: when ``torch.autograd.backward`` is called (``Tensor.backward`` calls it,
  ``torch/_tensor.py``), before it seeds the gradient; the function is wrapped while the recorder is attached;
* ``after backward``: the global optimizer-step pre-hook, outside the autograd engine (an optimizer stepped in
  backward, torchtune's ``optimizer_in_bwd``, is not the end of backward);
* ``after step``: the model's or optimizer's ``zero_grad`` after an optimizer step (wrapped on those two objects
  while attached), else the step's end.

A step begins and ends where the framework says (:class:`~memledger.measure.hf.HFCallback`,
:class:`~memledger.measure.lightning.LightningCallback`); in a plain loop (:func:`track`,
:func:`~memledger.measure.torchtune.torchtune_hook`) a step begins at the model's first forward and ends at the
``zero_grad`` after its optimizer step, or at the next forward after one.
"""
import functools
import platform
import sys
import warnings

try:
    import torch
except ImportError:
    raise ImportError("memledger.measure measures a PyTorch run: it needs torch (pip install torch)") from None
from torch.utils._pytree import tree_flatten

from .plan import Plan, check_steps, output_path, predicted_side
from .report import LANDMARKS, PHASES, build_report, write_report

__all__ = ["Recorded", "Recorder", "track"]

_BATCH_NAMES = ("input_ids", "tokens", "idx", "ids", "input")
_MODTRACKER_WARNING = "The module hierarchy tracking maybe be messed up"
_LIBRARIES = ("transformers", "accelerate", "lightning", "pytorch_lightning", "torchtune", "peft")


class _NoHandle:
    """A gradient-hook handle for a frozen parameter (MemTracker removes it at exit)."""
    @staticmethod
    def remove():
        pass


def _quiet_module_tracker(mod_tracker):
    """ModTracker warns when a module runs inside a module of its own name (transformers' attention wrapper, a
    module named "Func", does) and sets ``warnings.formatwarning`` for good as it does (mod_tracker.py,
    ``_get_append_fn``): what it tracks there is the module hierarchy, not the totals read here. Its warning is
    silenced and the format put back."""
    original = mod_tracker._get_append_fn

    def append_fn(w_mod, name, is_bw):
        fn = original(w_mod, name, is_bw)

        def quiet(*args):
            shown = warnings.formatwarning
            try:
                with warnings.catch_warnings():
                    warnings.filterwarnings("ignore", message=_MODTRACKER_WARNING, category=UserWarning)
                    return fn(*args)
            finally:
                warnings.formatwarning = shown
        return quiet
    mod_tracker._get_append_fn = append_fn


class _CudaProbe:
    """The caching allocator's counters of one CUDA device."""
    what = "torch.cuda.max_memory_allocated"

    def __init__(self, device):
        self.device = device

    def start(self):
        torch.cuda.synchronize(self.device)

    def stop(self):
        pass

    def track(self, tensors):
        pass

    def now(self) -> int:
        return torch.cuda.memory_allocated(self.device)

    def reset(self):
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> tuple:
        return torch.cuda.max_memory_allocated(self.device), torch.cuda.max_memory_reserved(self.device)


class _TrackerProbe:
    """MemTracker's total on the model's device (exact storage bytes on the CPU)."""
    what = "MemTracker"

    def __init__(self, model, optimizers, device):
        from ..pytorch.measure import tracker_class

        class Tracker(tracker_class()):
            def _pre_fw_hook(self, module, inputs):
                # a root module's next call is the next iteration, which MemTracker refuses unless its module stats
                # are reset (mem_tracker.py, _pre_fw_hook, case 3): they are not used here
                if module in self.memory_tracking and not self._mod_tracker.is_bw:
                    name = self._mod_tracker.get_known_fqn(module)
                    if set(self._mod_tracker.parents) - {name} == {"Global"}:
                        self.reset_mod_stats()
                super()._pre_fw_hook(module, inputs)

        self.device = device
        self.tracker = Tracker()
        _quiet_module_tracker(self.tracker._mod_tracker)
        for p in model.parameters():
            if not p.requires_grad:         # docs: frameworks.md, "MemTracker installs a gradient hook on every ..."
                self.tracker._param_to_grad_hook_handles[p] = (_NoHandle, _NoHandle)
        self.tracker.track_external(model, *optimizers)

    def start(self):
        self.tracker.__enter__()

    def stop(self):
        self.tracker.__exit__(None, None, None)

    def track(self, tensors):
        if tensors:
            self.tracker.track_external(*tensors)

    def now(self) -> int:
        return self.tracker._curr_mem_snap.get(self.device, {}).get("Total", 0)

    def reset(self):
        self.tracker._peak_mem[self.device] = self.now()

    def peak(self) -> tuple:
        return max(self.tracker._peak_mem.get(self.device, 0), self.now()), None


class _StepRecord:
    def __init__(self, index, label):
        self.index, self.label = index, label
        self.landmarks, self.segments = {}, []
        self.last = "start"
        self.stepped = False

    def to_dict(self) -> dict:
        phase_peaks, reserved = {}, {}
        for seg in self.segments:
            phase = next((p for p, ends in PHASES.items() if ends == (seg["from"], seg["to"])), None)
            if phase is not None:
                phase_peaks[phase] = seg["peak"]
                if seg["reserved"] is not None:
                    reserved[phase] = seg["reserved"]
        inside = [s for s in self.segments if s["from"] != "start"] or self.segments
        peak = max((s["peak"] for s in inside), default=None)
        res = [s["reserved"] for s in inside if s["reserved"] is not None]
        return {"step": self.index, "label": self.label, "landmarks": dict(self.landmarks),
                "phase_peaks": phase_peaks, "phase_reserved_peaks": reserved, "segments": list(self.segments),
                "peak": peak, "peak_reserved": max(res) if res else None}


def _unwrap(optimizer):
    """The torch optimizer inside a framework's wrapper (accelerate's AcceleratedOptimizer, Lightning's)."""
    seen = 0
    while not isinstance(optimizer, torch.optim.Optimizer) or \
            isinstance(getattr(optimizer, "optimizer", None), torch.optim.Optimizer):
        inner = getattr(optimizer, "optimizer", None) or getattr(optimizer, "_optimizer", None)
        if inner is None or seen > 4:
            break
        optimizer, seen = inner, seen + 1
    return optimizer


def _tensors(obj) -> list:
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def _batch_shape(args, kwargs):
    """(B, S) of the token ids reaching the model: a 2-D integer tensor, by name first."""
    def ids(t):
        return isinstance(t, torch.Tensor) and t.dim() == 2 and not t.is_floating_point() and not t.is_complex() \
            and t.dtype != torch.bool
    for name in _BATCH_NAMES:
        if ids(kwargs.get(name)):
            return tuple(int(n) for n in kwargs[name].shape)
    for t in _tensors((args, kwargs)):
        if ids(t):
            return tuple(int(n) for n in t.shape)
    return None


def _device_of(model) -> torch.device:
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")


class Recorder:
    """Measures the first ``steps`` training steps and reports the last beside memledger's prediction
    (the first step creates the optimizer's state: the last measured one is the steady step memledger predicts).

    ``setup``: a :class:`~memledger.ledger.ledger.Ledger` (or LoraLedger), or a dict of Ledger keywords
    (:class:`~memledger.measure.plan.Plan`); ``report``: the JSON file (None: none); ``plot``: True (the report's
    path with ``.png``), a path, or False; ``backend``: None (from the model's device) or a backend's name;
    ``conventions``: backend switches over those read off the optimizer; ``echo``: print the one-line summary.
    ``auto``: steps begin and end by themselves (a plain loop) rather than by a framework's events."""

    def __init__(self, setup, steps=2, report="memledger-report.json", plot=True, backend=None, conventions=None,
                 echo=True, auto=True):
        self.plan = Plan(setup, backend, conventions)
        self.steps = check_steps(steps)
        self.report_path = output_path("memledger-report.json" if report is True else report, "report")
        self.plot_path = output_path(plot, "plot", self.report_path)
        self.echo, self.auto = bool(echo), bool(auto)
        self.records, self.current = [], None
        self.attached = self.done = False
        self.batch = None
        self.report = self.line = self.step = None
        self._undo = []

    # -- attaching --------------------------------------------------------------------------------------------
    def attach(self, model, optimizers=()):
        """Start measuring ``model`` (and its optimizers: one, a list, or None)."""
        if self.attached or self.done:
            return
        if not isinstance(model, torch.nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if optimizers is None:
            optimizers = ()
        elif not isinstance(optimizers, (list, tuple)):
            optimizers = (optimizers,)
        self.model = model
        self.optimizers = [_unwrap(o) for o in optimizers]
        for o in self.optimizers:
            if not isinstance(o, torch.optim.Optimizer):
                raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(o).__name__}")
        self.device = _device_of(model)
        self.probe = _CudaProbe(self.device) if self.device.type == "cuda" else \
            _TrackerProbe(model, self.optimizers, self.device)
        self._hooks()
        self.probe.start()
        self.attached = True

    def _hooks(self):
        from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
        handles = [self.model.register_forward_pre_hook(self._on_forward, with_kwargs=True),
                   register_optimizer_step_pre_hook(self._on_optimizer_step),
                   register_optimizer_step_post_hook(self._on_optimizer_stepped)]
        self._undo += [h.remove for h in handles]
        original = torch.autograd.backward

        @functools.wraps(original)
        def backward(*args, **kwargs):
            if not self.done and torch._C._current_graph_task_id() == -1:
                self.mark("after forward")
            return original(*args, **kwargs)
        torch.autograd.backward = backward

        def restore():
            if torch.autograd.backward is backward:
                torch.autograd.backward = original
        self._undo.append(restore)
        for obj in [self.model, *self.optimizers]:
            self._wrap_zero_grad(obj)

    def _wrap_zero_grad(self, obj):
        original = obj.zero_grad

        @functools.wraps(original)
        def zero_grad(*args, **kwargs):
            out = original(*args, **kwargs)
            if self.current is not None and self.current.stepped:
                self.mark("after step")
                if self.auto:
                    self.end_step()
            return out
        obj.zero_grad = zero_grad

        def restore():
            if obj.__dict__.get("zero_grad") is zero_grad:
                del obj.zero_grad
        self._undo.append(restore)

    def _detach(self):
        if not self.attached:
            return
        self.attached = False
        try:
            self.probe.stop()
        finally:
            for undo in reversed(self._undo):
                undo()
            self._undo = []

    # -- events -----------------------------------------------------------------------------------------------
    def _on_forward(self, module, args, kwargs):
        if self.done:
            return
        if self.batch is None:
            self.batch = _batch_shape(args, kwargs)
        if self.current is None:
            if not self.auto:
                return              # a forward outside the framework's steps (evaluation)
            self.begin_step()
        elif self.auto and self.current.stepped:
            self.end_step()         # the last measured step may end here: MemTracker is left from this hook
            if self.done:
                return
            self.begin_step()
        self.probe.track(_tensors((args, kwargs)))
        self.mark("before forward")

    def _on_optimizer_step(self, optimizer, args, kwargs):
        if torch._C._current_graph_task_id() == -1:
            self.mark("after backward")

    def _on_optimizer_stepped(self, optimizer, args, kwargs):
        # (never the end of the measurement: the optimizer is iterating the global hooks that stopping removes)
        if self.current is not None:
            self.current.stepped = True

    def begin_step(self, label=None):
        """A training step begins (a framework's event); one still open ends first."""
        if self.done or not self.attached:
            return
        if self.current is not None:
            self.end_step()
            if self.done:
                return
        self.current = _StepRecord(len(self.records) + 1, label)
        self.probe.reset()

    def mark(self, name: str):
        """Read the landmark ``name`` now, unless this step has read it (or a later one) already;
        ``after forward`` and ``after backward`` only after the landmark before them."""
        step = self.current
        if step is None or self.done or name in step.landmarks:
            return
        i = LANDMARKS.index(name)
        if any(later in step.landmarks for later in LANDMARKS[i + 1:]):
            return
        if name in ("after forward", "after backward") and LANDMARKS[i - 1] not in step.landmarks:
            return
        self._read(step, name)

    def _read(self, step, name):
        now = self.probe.now()
        peak, reserved = self.probe.peak()
        step.segments.append({"from": step.last, "to": name, "peak": max(peak, now), "reserved": reserved})
        step.landmarks[name] = now
        step.last = name
        self.probe.reset()

    def end_step(self):
        """The step ends (a framework's event): ``after step`` is read if it was not."""
        step = self.current
        if step is None or self.done:
            return
        if "after step" not in step.landmarks:
            self._read(step, "after step")
        self.records.append(step)
        self.current = None
        if len(self.records) >= self.steps:
            self.finish()

    def track_tensors(self, obj):
        """Count the tensors in ``obj`` (a batch) if the measurement did not see them made (MemTracker)."""
        if self.attached and not self.done:
            self.probe.track(_tensors(obj))

    # -- the end ----------------------------------------------------------------------------------------------
    def close(self):
        """Stop measuring: an open step that reached its forward counts; report if nothing has yet."""
        if self.done:
            return self.report
        if self.current is not None and "before forward" in self.current.landmarks:
            self.end_step()
        self.current = None
        return self.finish()

    def abort(self):
        """Stop measuring without a report (the run raised)."""
        self.done = True
        self._detach()

    def finish(self):
        """Stop measuring, predict, compare, write the report and the plot, print the line; returns the report."""
        if self.done:
            return self.report
        self.done = True
        self._detach()
        if not hasattr(self, "model"):
            raise RuntimeError("memledger.measure: nothing was measured (the recorder never attached to a model)")
        notes, predicted, step, setup = [], None, None, None
        read = self._read_conventions()
        try:
            step, backend, conventions, more = self.plan.step(self.device.type, read, self.batch)
            notes += more
            predicted = predicted_side(step)
            predicted.update(backend=backend, conventions=conventions, n_params=int(step.values["P"]))
            setup = self.plan.inputs(step)
        except (ValueError, NotImplementedError) as error:
            notes.append(f"memledger cannot predict this setup: {error}")
            setup = _plain(self.plan.bare())
        measured = self._measured()
        observed = self._observed(read)
        if predicted is not None and predicted["n_params"] != observed["parameters"]:
            notes.append(f"the model has {observed['parameters']:,} parameters; the setup predicts "
                         f"{predicted['n_params']:,}")
        report = build_report(setup, predicted, measured, self._environment(), observed, notes)
        self.report, self.line, self.step = report, report["line"], step
        if self.report_path is not None:
            write_report(report, self.report_path)
        if self.plot_path is not None and step is not None and measured["peak"] is not None:
            from .plot import plot_report
            plot_report(step, report, self.plot_path)
        if self.echo:
            print(report["line"], flush=True)
        return report

    def _measured(self) -> dict:
        steps = [r.to_dict() for r in self.records]
        last = steps[-1] if steps else {}
        return {"what": self.probe.what, "device": str(self.device), "steps": steps,
                "compared_step": last.get("step"), "landmarks": last.get("landmarks", {}),
                "phase_peaks": last.get("phase_peaks", {}), "peak": last.get("peak"),
                "peak_reserved": last.get("peak_reserved")}

    def _read_conventions(self) -> dict:
        """``foreach``/``fused`` as the optimizer was made (None, PyTorch's default: the backend's)."""
        out = {}
        for o in self.optimizers:
            for key in ("foreach", "fused"):
                if o.defaults.get(key) is not None:
                    out[key] = bool(o.defaults[key])
        if out.get("fused"):
            out["foreach"] = False
        return out

    def _observed(self, conventions) -> dict:
        params = {p: None for p in self.model.parameters()}           # each once (tied weights)
        dtypes = {}
        for p in params:
            key = str(p.dtype).replace("torch.", "")
            dtypes[key] = dtypes.get(key, 0) + p.numel()
        return {"batch": list(self.batch) if self.batch else None,
                "parameters": sum(p.numel() for p in params),
                "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
                "parameter_elements_by_dtype": dtypes,
                "optimizers": [type(o).__name__ for o in self.optimizers],
                "optimizer_conventions": conventions}

    def _environment(self) -> dict:
        from .. import __version__
        env = {"memledger": __version__, "torch": torch.__version__, "python": platform.python_version(),
               "device": str(self.device), "measured_with": self.probe.what}
        if self.device.type == "cuda":
            env["device_name"] = torch.cuda.get_device_name(self.device)
            env["cuda"] = torch.version.cuda
        env["libraries"] = {name: getattr(sys.modules[name], "__version__", None)
                            for name in _LIBRARIES if name in sys.modules}
        return env

    # -- a plain loop -----------------------------------------------------------------------------------------
    def __enter__(self):
        return self

    def __exit__(self, kind, error, trace):
        if kind is not None:
            self.abort()
            return False
        self.close()
        return False


def _plain(setup):
    if isinstance(setup, dict):
        return {k: (v if isinstance(v, (int, float, str, bool, type(None))) else str(v)) for k, v in setup.items()}
    return str(setup)


def track(model, optimizer=None, *, setup, steps=2, report="memledger-report.json", plot=True, backend=None,
          conventions=None, echo=True) -> Recorder:
    """Measure a plain training loop's first ``steps`` steps (a context manager)::

        with memledger.measure.track(model, optimizer, setup=dict(arch=..., recipe="bf16-pure-adamw")) as m:
            for batch in data:
                loss = model(batch).loss
                loss.backward()
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        m.report          # the report (also written to memledger-report.json, the plot beside it)

    The report is written after the last measured step (the loop goes on unmeasured), or when the block ends.
    See :class:`Recorder` for the arguments."""
    recorder = Recorder(setup, steps=steps, report=report, plot=plot, backend=backend, conventions=conventions,
                        echo=echo, auto=True)
    recorder.attach(model, optimizer)
    return recorder


class Recorded:
    """What every measuring tool (:class:`~memledger.measure.hf.HFCallback`, the Lightning callback, the torchtune
    hook) shares: a :class:`Recorder` made from the same arguments (``AUTO``: whether the tool's calls mark the
    steps themselves), and its ``report`` and printed ``line``."""
    AUTO = False

    def __init__(self, setup, steps=2, report="memledger-report.json", plot=True, backend=None, conventions=None,
                 echo=True):
        super().__init__()
        self.recorder = Recorder(setup, steps=steps, report=report, plot=plot, backend=backend,
                                 conventions=conventions, echo=echo, auto=self.AUTO)

    @property
    def report(self):
        return self.recorder.report

    @property
    def line(self):
        return self.recorder.line
