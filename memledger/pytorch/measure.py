"""Measuring the reference decoder (:mod:`memledger.pytorch.reference`) with PyTorch's own tools.

* :func:`saved_tensors`: every tensor autograd saves in a forward pass, caught
  with ``torch.autograd.graph.saved_tensors_hooks``, each storage counted once
  (dedupe by ``untyped_storage().data_ptr()``), parameters skipped, and
  attributed to the block (or the part outside the blocks) that saved it first.
* :func:`live_after_forward`: storages created during the forward pass and
  still alive after it (what checkpointing keeps through closures, which the
  saved-tensor hooks cannot see), attributed the same way.
* :func:`memtracker_step`: a whole training step at full scale under
  ``FakeTensorMode`` (nothing is allocated), tracked by
  ``torch.distributed._tools.mem_tracker.MemTracker``: the total at each
  landmark of the second step, the peak of each phase and the overall peak.
  On the CPU backend MemTracker counts exact storage bytes.
"""
from contextlib import contextmanager
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from .packing import document_ids
from .record import recorded
from .reference import RefConfig, Trainer, make_model

__all__ = ["OUTSIDE", "live_after_forward", "memtracker_step", "saved_tensors", "tracker_class"]

OUTSIDE = "outside"


def _inputs(c: RefConfig, batch: int, seq: int):
    ids = torch.randint(0, c.V, (batch, seq))
    return ids, torch.randint(0, c.V, (batch, seq))


@contextmanager
def _layer_tags(model):
    """Yields a one-item list holding the index of the block now running forward (or OUTSIDE)."""
    where = [OUTSIDE]
    handles = []
    for i, block in enumerate(model.blocks):
        handles.append(block.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, i)))
        handles.append(block.register_forward_hook(lambda m, a, o: where.__setitem__(0, OUTSIDE)))
    try:
        yield where
    finally:
        for h in handles:
            h.remove()


@recorded
def saved_tensors(c: RefConfig, loop: str, batch: int, seq: int, seed: int = 0) -> dict:
    """{block index or "outside": sorted [(bytes, dtype, shape), ...]} of one forward pass with real tensors.

    A storage saved by several blocks (the shared causal mask) counts as outside."""
    torch.manual_seed(seed)
    model = make_model(c, loop)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    first = {}          # data_ptr -> (tags that saved it, bytes, dtype, shape)
    ids, targets = _inputs(c, batch, seq)
    with _layer_tags(model) as where:
        def pack(t):
            st = t.untyped_storage()
            if st.data_ptr() not in params:
                entry = first.setdefault(st.data_ptr(), (set(), st.nbytes(), str(t.dtype).replace("torch.", ""),
                                                         tuple(t.shape)))
                entry[0].add(where[0])
            return t
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model.loss(ids, targets)
    del loss
    found = {}
    for tags, nbytes, dtype, shape in first.values():
        tag = next(iter(tags)) if len(tags) == 1 else OUTSIDE      # shared by blocks: the causal mask
        found.setdefault(tag, []).append((nbytes, dtype, shape))
    return {k: sorted(v) for k, v in found.items()}


class _Births(TorchDispatchMode):
    """Records a weak reference to every storage an op creates, with the block running."""

    def __init__(self, where, skip):
        super().__init__()
        self.where, self.born, self.skip = where, {}, skip

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))

        def note(t):
            st = t.untyped_storage()
            key = st.data_ptr()
            known = self.born.get(key)
            if (known is None or known[0]() is None) and key not in self.skip and st.nbytes():
                self.born[key] = (weakref.ref(st), self.where[0], str(t.dtype).replace("torch.", ""),
                                  tuple(t.shape))
        tree_map_only(torch.Tensor, note, out)
        return out


@recorded
def live_after_forward(c: RefConfig, loop: str, batch: int, seq: int, seed: int = 0) -> dict:
    """{block index or "outside": sorted [(bytes, dtype, shape), ...]}: storages born in forward, alive after it
    (the loss included)."""
    torch.manual_seed(seed)
    model = make_model(c, loop)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ids, targets = _inputs(c, batch, seq)
    with _layer_tags(model) as where:
        births = _Births(where, params)
        with births:
            loss = model.loss(ids, targets)
    found = {}
    for ref, tag, dtype, shape in births.born.values():
        st = ref()
        if st is not None:
            found.setdefault(tag, []).append((st.nbytes(), dtype, shape))
    del loss
    return {k: sorted(found[k]) for k in sorted(found, key=str)}   # in key order: a record of it is byte-stable


def tracker_class():
    """MemTracker's subclass the package measures with (also :mod:`memledger.measure`'s CPU measurement)."""
    from torch.distributed._tools.mem_tracker import MemTracker

    class Tracker(MemTracker):
        """MemTracker keeping only the global peak (its per-module peaks cost 2/3 of the run and are not
        used), optionally the largest total while each block runs forward and backward (with an optimizer stepped
        in backward, its ops inside the block included), and optionally a
        trace: (total, backward?, innermost modules) after every op."""
        trace = None
        blocks = None
        _func = None

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self._func = func
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state):
            for dev, snap in self._curr_mem_snap.items():
                if self._peak_mem.get(dev, 0) < snap["Total"]:
                    self._peak_mem[dev] = snap["Total"]
                    self._peak_mem_snap[dev] = dict(snap)
            # the optimizer's own phase is no block's; an optimizer stepped in backward (its hook) is its block's
            if self.blocks is not None and (not self._in_opt or self._mod_tracker.is_bw):
                total = self._curr_mem_snap.get(torch.device("cpu"), {"Total": 0})["Total"]
                for name in self._mod_tracker.parents:
                    if name.split(".")[0].endswith("Decoder") and ".blocks." in name and name.count(".") == 2:
                        key = ("backward" if self._mod_tracker.is_bw else "forward", int(name.split(".")[2]))
                        self.blocks[key] = max(self.blocks.get(key, 0), total)
            if self.trace is not None:
                snap = self._curr_mem_snap.get(torch.device("cpu"), {"Total": 0})
                self.trace.append((snap["Total"], self._mod_tracker.is_bw, self._in_opt,
                                   tuple(sorted(self._mod_tracker.parents)), str(self._func)))
    return Tracker


_tracker_class = tracker_class          # the name the package's modules import


@recorded
def memtracker_step(c: RefConfig, loop: str, batch: int, seq: int, foreach: bool = False,
                    trace: bool = False, blocks: bool = False, lora=None, fused: bool = False,
                    in_backward: bool = False, amp: bool = None) -> dict:
    """MemTracker totals of one steady-state training step under ``FakeTensorMode``.

    The optimizer state is created first (zero gradients, one ``opt.step()``),
    so the tracked step is a second step. Returns {"before forward": int, ...,
    "after step": int, "peak": int, "phase peaks": {"forward": int,
    "backward": int, "optimizer": int}, "host": {landmark: int}} in CPU bytes (the host: the ``meta`` device's,
    where :mod:`memledger.pytorch.offload` puts offloaded activations), and with ``trace`` the
    list of (total, in backward, in optimizer, modules, op) after every op. ``lora``: a
    :class:`memledger.pytorch.lora.LoraRef` (the frozen decoder with adapters). ``fused``, ``in_backward``: the
    optimizer's implementation and torchtune's optimizer in backward (:class:`~memledger.pytorch.reference.Trainer`);
    ``amp``: FP16 autocast and a GradScaler (None: as the loop says; :class:`~memledger.pytorch.optimizers.Scaler`);
    Adafactor's ``.item()`` calls are answered by :class:`~memledger.pytorch.optimizers.ScalarsAnswered`. The
    phase peaks reset MemTracker's ``_peak_mem`` at each landmark. With ``blocks``, "block peaks":
    {("forward" or "backward", block index): the largest total after an op that block ran}.
    """
    from contextlib import nullcontext

    from torch._subclasses.fake_tensor import FakeTensorMode

    from .optimizers import AMP_LOOPS, LOOP_OPTIMIZERS, ScalarsAnswered

    cpu, meta = torch.device("cpu"), torch.device("meta")
    host = {}
    amp = loop in AMP_LOOPS if amp is None else amp
    scalars = ScalarsAnswered() if LOOP_OPTIMIZERS[loop][2] == "adafactor" else nullcontext()
    with FakeTensorMode(), scalars:
        if lora is None:
            model = make_model(c, loop)
        else:
            from .lora import make_lora_model
            model = make_lora_model(c, lora, loop)
        trainer = Trainer(model, loop, foreach=foreach, fused=fused, in_backward=in_backward, amp=amp)
        trainer.init_state()
        ids, targets = _inputs(c, batch, seq)
        documents = document_ids(batch, seq, c.packed) if c.packed else None
        tracker = tracker_class()()
        tracker.trace = [] if trace else None
        tracker.blocks = {} if blocks else None
        tracker.track_external(model, *trainer.optimizers, ids, targets, *trainer.masters,
                               *([documents] if c.packed else []), *trainer.extras)
        result, phase_peaks = {}, {}
        phases = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}

        def landmark(name):
            snapshot = tracker.get_tracker_snapshot("current")
            total = snapshot[cpu]["Total"]
            host[name] = snapshot.get(meta, {"Total": 0})["Total"]
            if name in phases:
                phase_peaks[phases[name]] = max(tracker._peak_mem[cpu], total)
            result[name] = tracker._peak_mem[cpu] = total
            if trace:
                tracker.trace.append((total, None, None, name, ""))

        with tracker:
            trainer.step(ids, targets, landmark, documents=documents)
        result["peak"] = max(phase_peaks.values())
        result["host"] = host
        result["phase peaks"] = phase_peaks
        if trace:
            result["trace"] = tracker.trace
        if blocks:
            result["block peaks"] = tracker.blocks
    return result
