"""The reference decoder as rank 0 of a world of N ranks: PyTorch's own distributed engine, measured.

One CPU process runs rank 0 of a world of any size on PyTorch's fake process
group (``torch.testing._internal.distributed.fake_pg``: collectives return
without communicating) under ``FakeTensorMode`` (nothing is allocated), the way
torchtitan's memory estimator does (``scripts/estimate/estimation.py``). Each
function runs two training steps of :class:`~memledger.pytorch.reference.Trainer`
and returns the second one, in exact CPU bytes: the total at each landmark,
the peak of each phase (``forward``: the forward pass and the loss;
``backward``; ``optimizer``: the step and ``zero_grad``) and the peak, plus the
tracker's own split by category at each landmark and at each phase peak.

* :func:`fsdp_step`: FSDP2 (``fully_shard`` on every block, then on the root)
  with a ``MixedPrecisionPolicy``, ``reshard_after_forward`` True, False or an
  int, HSDP on a 2-D (replicate, shard) mesh, and FSDP2 x TP on a 2-D (dp, tp)
  mesh; tracked by ``FSDPMemTracker`` (categories: sharded and unsharded
  parameters and gradients, all-gather and reduce-scatter buffers,
  activations, temporaries, optimizer states, inputs).
* :func:`tp_step`: tensor parallelism by DTensor's ``parallelize_module``
  (:func:`tp_plan`), with or without sequence parallelism, and the
  vocabulary-parallel loss (``loss_parallel()``); tracked by ``MemTracker``.
* :func:`ddp_buckets`: DDP with real tensors (its C++ reducer does not run on
  fake tensors) on a one-rank gloo group: the bytes of its gradient buckets.

What FSDP2 allocates, buffer by buffer and hook by hook, with the lines of its
source, is written as executable rules in ``tests/pytorch/test_distributed.py``
(``hooks``), checked there against FSDPMemTracker's snapshots. Imports PyTorch.
"""
from contextlib import contextmanager, nullcontext
import os
import socket

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .measure import _inputs
from .record import recorded
from .reference import LANDMARKS, RefConfig, Trainer, make_model

__all__ = ["DTYPES", "PHASES", "LossRoot", "fake_world", "fsdp_step", "tp_plan", "tp_step", "ddp_buckets", "gloo_world"]

#: MixedPrecisionPolicy dtypes by name; None: no cast (PyTorch's default policy).
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16, None: None}
#: The phase that ends at each landmark.
PHASES = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}
_CPU = torch.device("cpu")


@contextmanager
def fake_world(world: int):
    """A fake process group of ``world`` ranks, this process rank 0; destroyed on exit."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextmanager
def _propagation_as_in_a_real_run():
    """DTensor derives an op's output shape by running it on global-shape fake tensors
    (``ShardingPropagator._propagate_tensor_meta_non_cached``: ``detect_fake_mode() or FakeTensorMode()``).
    In a real run that is a FakeTensorMode of its own, which the trackers skip; under our FakeTensorMode it
    would be ours, and the trackers would count those global-shape tensors (under ``loss_parallel()`` the
    B x S x V log-softmax of the whole vocabulary, t times the rank's). While this is active, the propagation
    gets a FakeTensorMode of its own, as in a real run."""
    from torch.distributed.tensor import _sharding_prop
    detect = _sharding_prop.detect_fake_mode
    _sharding_prop.detect_fake_mode = lambda *args, **kwargs: None
    try:
        yield
    finally:
        _sharding_prop.detect_fake_mode = detect


class _Chunks:
    """``_chunk_with_empty(tensor, n, dim)`` (``_fsdp_common.py:134-140``) as a lazy sequence: chunk ``i`` is
    the view ``torch.chunk`` gives (``narrow`` at ``i * ceil(size / n)``), or ``new_empty(0)`` past the last.

    ``fully_shard`` chunks every parameter into all ``n`` shards to keep rank 0's (and reads chunk 0 for the
    padded size); on fake tensors each chunk costs a dispatch, 80 s at ``n`` = 1024 for a small model. Only
    the chunks read are built; ``tests/pytorch/test_distributed.py`` compares every chunk with PyTorch's.
    """

    def __init__(self, tensor, num_chunks: int, dim: int):
        self.tensor, self.n, self.dim = tensor, num_chunks, dim
        self.size = tensor.size(dim)
        self.step = -(-self.size // num_chunks)

    def __len__(self):
        return self.n

    def __getitem__(self, i: int):
        if not -self.n <= i < self.n:
            raise IndexError(i)
        start = (i % self.n) * self.step
        if start >= self.size:
            return self.tensor.new_empty(0)
        return self.tensor.narrow(self.dim, start, min(self.step, self.size - start))


@contextmanager
def _rank0_chunks():
    """While ``fully_shard`` initializes (untracked), build only the chunks rank 0 reads (:class:`_Chunks`)."""
    from torch.distributed.fsdp._fully_shard import _fsdp_param
    original = _fsdp_param._chunk_with_empty

    def chunks(tensor, num_chunks, dim):
        return _Chunks(tensor, num_chunks, dim) if tensor.size(dim) > 0 else original(tensor, num_chunks, dim)
    _fsdp_param._chunk_with_empty = chunks
    try:
        yield
    finally:
        _fsdp_param._chunk_with_empty = original


class _Host:
    """The bytes of the storages registered as host memory and still alive (a running sum: each storage's bytes
    are subtracted when it dies)."""

    def __init__(self):
        from torch.utils.weak import WeakIdKeyDictionary
        self.bytes, self._seen = 0, WeakIdKeyDictionary()

    def add(self, tensor):
        import weakref
        storage = getattr(tensor, "_local_tensor", tensor).untyped_storage()     # a DTensor: this rank's
        if storage not in self._seen:
            self._seen[storage] = True
            self.bytes += storage.nbytes()
            weakref.finalize(storage, self._drop, storage.nbytes())

    def _drop(self, n):
        self.bytes -= n


@contextmanager
def _device_copies(host: _Host = None):
    """Under ``CPUOffloadPolicy`` FSDP2 copies each shard to the device before its all-gather
    (``_fsdp_param.py:898``, ``.to(self.device, non_blocking=True)``) and each sharded gradient to the host
    (``_fsdp_collectives.py:737``, ``.to(torch.device("cpu"), non_blocking=...)``). On the one fake CPU device
    those ``.to`` calls return the tensor itself; on a GPU each allocates a copy on the other side. While this is
    active, a ``.to(..., non_blocking=...)`` called from FSDP2's own files returns a clone: the allocation the
    real copy makes; the gradients' copies (from ``_fsdp_collectives.py``) are registered in ``host``.
    (``Tensor.to`` itself is wrapped: FSDP2's hooks run where a torch-function mode is not active.)"""
    import sys

    files = ("_fsdp_param.py", "_fsdp_collectives.py")
    to = torch.Tensor.to

    def copying_to(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        caller = sys._getframe(1).f_code.co_filename
        if "non_blocking" in kwargs and out is self and caller.endswith(files):
            out = out.clone()
            if host is not None and caller.endswith(files[1]):
                host.add(out)
        return out
    torch.Tensor.to = copying_to
    try:
        yield
    finally:
        torch.Tensor.to = to


def _categories(snap: dict) -> dict:
    """A tracker's snapshot as {category name: bytes}, zero categories and the total left out."""
    return {getattr(k, "value", k): v for k, v in snap.items() if v and k != "Total"}


def _phase_tracker(base):
    """``base`` (MemTracker or FSDPMemTracker) keeping only the global peak and its snapshot (its per-module
    peaks are not used), optionally a trace: (total, categories, backward?, optimizer?, modules, op) after
    every op."""

    class Tracker(base):
        trace = None
        _func = None
        host = None         # CPUOffloadPolicy: the host storages (a _Host); the rest is the device's
        gpu_peak = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self._func = func
            return super().__torch_dispatch__(func, types, args, kwargs)

        def _update_peak_stats(self, peak_state):
            snap = self._curr_mem_snap.get(_CPU)
            if snap is None:
                return
            if self.host is not None and not self._in_opt:      # the optimizer runs on the host
                self.gpu_peak = max(self.gpu_peak, snap["Total"] - self.host.bytes)
            if self._peak_mem.get(_CPU, 0) < snap["Total"]:
                self._peak_mem[_CPU] = snap["Total"]
                self._peak_mem_snap[_CPU] = dict(snap)
            if self.trace is not None:
                self.trace.append((snap["Total"], _categories(snap), self._mod_tracker.is_bw, self._in_opt,
                                   tuple(sorted(self._mod_tracker.parents)), str(self._func)))
    return Tracker


def _tracked_step(tracker, trainer, ids, targets, context=nullcontext, trace=False) -> dict:
    """Runs one step under ``tracker`` (entered by the caller) and returns landmarks, phase peaks and their
    categories."""
    result, phase_peaks, categories = {}, {}, {}
    gpu, host, gpu_phases = {}, {}, {}
    tracker.trace = [] if trace else None

    def landmark(name):
        snap = tracker.get_tracker_snapshot("current").get(_CPU, {"Total": 0})
        total = snap["Total"]
        if name in PHASES:
            peak = max(tracker._peak_mem.get(_CPU, 0), total)
            phase_peaks[PHASES[name]] = peak
            categories[PHASES[name] + " peak"] = _categories(tracker._peak_mem_snap.get(_CPU, {})
                                                             if peak > total else snap)
        result[name] = total
        categories[name] = _categories(snap)
        if tracker.host is not None:
            device = total - tracker.host.bytes
            gpu[name], host[name] = device, tracker.host.bytes
            if name in PHASES:
                gpu_phases[PHASES[name]] = max(tracker.gpu_peak, device)
            tracker.gpu_peak = device
        tracker._peak_mem[_CPU] = total
        tracker._peak_mem_snap[_CPU] = dict(snap)
        if trace:
            tracker.trace.append((total, _categories(snap), None, None, name, ""))

    with context():
        trainer.step(ids, targets, landmark)
    result["peak"] = max(phase_peaks.values())
    result["phase peaks"] = phase_peaks
    result["categories"] = categories
    if tracker.host is not None:
        result["device"] = {**gpu, "peak": max(gpu_phases.values()), "phase peaks": gpu_phases}
        result["host"] = host
    if trace:
        result["trace"] = tracker.trace
    if getattr(tracker, "memory_tracking", None) and hasattr(tracker, "_root_mod"):
        result["modules"] = {stats.mod_fqn: {getattr(state, "value", state): [_categories(s.get(_CPU, {}))
                                                                              for s in snaps]
                                             for state, snaps in stats.snapshots.items()
                                             if "Peak" not in getattr(state, "value", state)}
                             for stats in tracker.memory_tracking.values()}
    return result


class LossRoot(torch.nn.Module):
    """The decoder with its loss inside ``forward``: ``fully_shard`` on it makes the loss part of the root's
    forward, so FSDP's pre-backward hook (root unshard, first prefetch) fires on the loss, before the loss's
    backward, instead of on the logits after it."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, ids, targets):
        return self.model.loss(ids, targets)

    def loss(self, ids, targets):
        return self(ids, targets)


def _check(name, value, allowed):
    if value not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(map(str, allowed))}, got {value!r}")


@recorded
def fsdp_step(c: RefConfig, loop: str = "fp32-adamw", batch: int = 1, seq: int = 2048, world: int = 8, *,
              param_dtype: str = "bf16", reduce_dtype: str = "fp32", reshard=True, root_reshard=None,
              replicate: int = 1, tp: int = 1, sequence_parallel: bool = False, loss_in_root: bool = False,
              foreach: bool = False, track_first: bool = True, trace: bool = False, cpu_offload: bool = False,
              pin_memory: bool = True) -> dict:
    """``FSDPMemTracker``'s account of the second training step of ``c`` under FSDP2, rank 0 of ``world``.

    ``fully_shard(block, mesh, mp_policy=MixedPrecisionPolicy(param_dtype, reduce_dtype),
    reshard_after_forward=reshard)`` for each block, then the root (embedding, final norm, LM head) with
    ``reshard_after_forward=root_reshard`` (None: ``reshard``; torchtitan passes True without pipeline
    parallelism; PyTorch's own ``None`` is False for the root, :data:`DTYPES`' None for both dtypes is
    PyTorch's default ``MixedPrecisionPolicy()``, which casts nothing). ``loop``: ``fp32-adamw`` (FP32 sharded
    parameters, AdamW on them: the masters are the shards) or ``bf16-pure-adamw``. ``replicate`` > 1: HSDP on a
    (replicate, world/replicate) mesh. ``tp`` > 1: FSDP2 x TP on a (world/tp, tp) mesh, the blocks (and with
    :func:`tp_plan` the embedding and LM head) parallelized first. ``loss_in_root``: the root is
    :class:`LossRoot` (the loss computed in the root's forward; torchtitan and torchtune compute it outside the
    model, the default here). Both steps are tracked,
    ``reset_mod_stats()`` between them; ``track_first=False``: no first step, the optimizer's state made as one
    leaves it (:meth:`~memledger.pytorch.reference.Trainer.init_state`: zero gradients on the shards, one
    ``opt.step()``), which gives the same second step to the byte, category and hook (``tests/pytorch/
    test_distributed.py``) without running a forward and backward first.

    Returns {landmark: bytes, "peak": bytes, "phase peaks": {phase: bytes}, "categories": {landmark or
    "<phase> peak": {FSDPMemTracker category: bytes}}, "modules": {module name: {FSDP hook ("Before
    Pre-Forward", ..., "After Post-Backward"): [{category: bytes} at each call]}}} (and "trace" with
    ``trace``: (total, categories, in backward, in optimizer, modules, op) after every op).
    """
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy, fully_shard
    from torch.distributed.tensor.parallel import loss_parallel

    _check("loop", loop, ("fp32-adamw", "bf16-pure-adamw"))
    _check("param_dtype", param_dtype, tuple(DTYPES))
    _check("reduce_dtype", reduce_dtype, tuple(DTYPES))
    for name, value in (("reshard", reshard), ("root_reshard", root_reshard)):
        if not (value is None and name == "root_reshard" or isinstance(value, (bool, int))):
            raise TypeError(f"{name} must be True, False or an int, got {value!r}")
    if world < 1 or replicate < 1 or tp < 1 or world % (replicate * tp):
        raise ValueError(f"replicate ({replicate}) x tp ({tp}) must divide world ({world})")
    if cpu_offload and (track_first or tp > 1):
        raise ValueError("cpu_offload is measured with track_first=False (the optimizer's states exist before the "
                         "tracked step) and without tp")
    if replicate > 1 and tp > 1:
        raise ValueError("HSDP x TP (a 3-D mesh) is not run here")
    if tp > 1 and c.tp != tp:
        raise ValueError(f"the reference must view its heads for tp = {tp}: RefConfig(..., tp={tp})")
    shard = world // (replicate * tp)
    mp = MixedPrecisionPolicy(param_dtype=DTYPES[param_dtype], reduce_dtype=DTYPES[reduce_dtype])
    offload = CPUOffloadPolicy(pin_memory=pin_memory) if cpu_offload else OffloadPolicy()
    root_reshard = reshard if root_reshard is None else root_reshard
    with fake_world(world):
        if tp > 1:          # meshes are built outside FakeTensorMode (their rank maps are read), and so is an int
            mesh = init_device_mesh("cpu", (shard, tp), mesh_dim_names=("dp", "tp"))    # reshard's mesh
            dp_mesh = mesh["dp"]
        elif replicate > 1:
            dp_mesh = init_device_mesh("cpu", (replicate, shard), mesh_dim_names=("replicate", "shard"))
        else:
            dp_mesh = init_device_mesh("cpu", (world,))
        fake = FakeTensorMode()
        with fake:
            model = make_model(c, loop)
        if tp > 1:
            _parallelize(model, mesh["tp"], sequence_parallel)
        with _rank0_chunks():
            for block in model.blocks:
                fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard, offload_policy=offload)
            if loss_in_root:
                model = LossRoot(model)
            fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=root_reshard,
                        offload_policy=offload)
        host = _Host() if cpu_offload else None
        with fake, (_device_copies(host) if cpu_offload else nullcontext()):
            trainer = Trainer(model, loop, foreach=foreach)
            ids, targets = _inputs(c, batch, seq)
            tracker = _phase_tracker(FSDPMemTracker)(model, trainer.opt)
            tracker.track_inputs((ids, targets))
            context = loss_parallel if tp > 1 else nullcontext
            if not track_first:     # the optimizer's state as a first step leaves it (FSDP2 inits at forward)
                trainer.init_state()
            if cpu_offload:     # the sharded parameters, their gradients and the optimizer's states: host memory
                for param in model.parameters():
                    host.add(param.to_local())
                for state in trainer.opt.state.values():
                    for value in state.values():
                        host.add(value)
                tracker.host = host
            with _propagation_as_in_a_real_run(), tracker:
                if track_first:
                    with context():
                        trainer.step(ids, targets)
                    tracker.reset_mod_stats()
                return _tracked_step(tracker, trainer, ids, targets, context, trace)


def tp_plan(model, sequence_parallel: bool = False) -> dict:
    """The ``parallelize_module`` plan of the reference decoder (LLaMA or GPT blocks), as torchtitan's
    ``apply_tp`` builds it for LLaMA: {module path: ParallelStyle}.

    Column-wise: the fused QKV projection and the MLP's input projections (gate, up); row-wise: the output
    projection and the MLP's down projection; the embedding vocabulary-parallel (``RowwiseParallel(
    input_layouts=Replicate())``), the LM head column-wise with its output left sharded on the vocabulary
    (``output_layouts=Shard(-1), use_local_output=False``) for ``loss_parallel()``. With sequence parallelism
    the norms run on S/t positions (``SequenceParallel``), the embedding and the row-wise layers return
    Shard(1) (a reduce-scatter) and the column-wise layers all-gather their Shard(1) input.
    """
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    sp = sequence_parallel
    seq = dict(input_layouts=Shard(1)) if sp else {}
    out = dict(output_layouts=Shard(1)) if sp else {}
    plan = {"embed": RowwiseParallel(input_layouts=Replicate(), **out),
            "head": ColwiseParallel(**seq, output_layouts=Shard(-1), use_local_output=False)}
    if sp:
        plan["norm"] = SequenceParallel()
    mlp_in = ("up",) if model.c.style == "gpt" else ("gate", "up")
    for i in range(len(model.blocks)):
        p = f"blocks.{i}."
        plan[p + "qkv"] = ColwiseParallel(**seq)
        plan[p + "proj"] = RowwiseParallel(**out)
        for name in mlp_in:
            plan[p + name] = ColwiseParallel(**seq)
        plan[p + "down"] = RowwiseParallel(**out)
        if sp:
            plan[p + "norm1"] = plan[p + "norm2"] = SequenceParallel()
    return plan


def _parallelize(model, mesh, sequence_parallel):
    """``parallelize_module`` with :func:`tp_plan`. A tied LM head (GPT, Gemma) is tied again afterwards:
    ``parallelize_module`` gives the embedding and the head a DTensor parameter each (both Shard(0) on the
    vocabulary), so the head is pointed back at the embedding's, one parameter as in the model."""
    from torch.distributed.tensor.parallel import parallelize_module
    parallelize_module(model, mesh, tp_plan(model, sequence_parallel))
    if model.c.style == "gpt" or model.c.tied:
        model.head.weight = model.embed.weight


@recorded
def tp_step(c: RefConfig, loop: str = "bf16-pure-adamw", batch: int = 1, seq: int = 2048, *,
            sequence_parallel: bool = False, foreach: bool = False, trace: bool = False) -> dict:
    """``MemTracker``'s account of the second training step of ``c`` under tensor parallelism of degree
    ``c.tp`` (rank 0 of a fake world of ``c.tp`` ranks), plan :func:`tp_plan`, forward and backward inside
    ``loss_parallel()``. ``loop``: ``fp32-adamw`` or ``bf16-pure-adamw`` (DTensor parameters; the
    ``bf16-adamw`` masters are not built on DTensors here). The optimizer state is created by a first step
    (untracked). Returns what :func:`fsdp_step` returns, MemTracker's categories (Parameter, Gradient,
    Activation, Temp, Optstate, Other)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.device_mesh import init_device_mesh

    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed.tensor.parallel import loss_parallel

    _check("loop", loop, ("fp32-adamw", "bf16-pure-adamw"))
    if c.tp < 2:
        raise ValueError(f"tp_step needs RefConfig(..., tp=t) with t >= 2, got tp = {c.tp}")
    with fake_world(c.tp):
        mesh = init_device_mesh("cpu", (c.tp,))
        with FakeTensorMode():
            model = make_model(c, loop)
            _parallelize(model, mesh, sequence_parallel)
            trainer = Trainer(model, loop, foreach=foreach)
            ids, targets = _inputs(c, batch, seq)
            with loss_parallel():
                trainer.step(ids, targets)
            tracker = _phase_tracker(MemTracker)()
            tracker.track_external(model, trainer.opt, ids, targets)
            with _propagation_as_in_a_real_run(), tracker:
                return _tracked_step(tracker, trainer, ids, targets, loss_parallel, trace)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def gloo_world():
    """A real one-rank gloo process group (this process), destroyed on exit."""
    if dist.is_initialized():
        dist.destroy_process_group()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(_free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class _Births:
    """A dispatch mode keeping a weak reference to every storage an op returns (DDP's C++ reducer allocates
    through ATen, so its buckets are seen)."""

    def __new__(cls):
        import weakref

        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_map_only

        class Births(TorchDispatchMode):
            def __init__(self):
                super().__init__()
                self.born = []

            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                tree_map_only(torch.Tensor, lambda t: self.born.append(weakref.ref(t.untyped_storage())), out)
                return out

            def alive(self, skip=()) -> dict:
                """{data pointer: bytes} of the storages seen here and still alive, those at ``skip`` left out."""
                return {st.data_ptr(): st.nbytes() for r in self.born if (st := r()) is not None
                        and st.nbytes() and st.data_ptr() not in skip}
        return Births()


@recorded
def ddp_buckets(c: RefConfig, loop: str = "fp32-adamw", batch: int = 1, seq: int = 16, *,
                bucket_cap_mb: float = None, gradient_as_bucket_view: bool = False, seed: int = 0) -> dict:
    """DDP's gradient buckets, measured with real CPU tensors on a one-rank gloo group.

    DDP's reducer does not run on fake tensors, so this is a small-scale run: ``DistributedDataParallel(model,
    bucket_cap_mb=..., gradient_as_bucket_view=...)``, two steps of forward and ``loss.backward()`` (the
    buckets are rebuilt in gradient-ready order at the second forward), ``zero_grad(set_to_none=True)``
    between them. Storages are counted with a dispatch-mode census (weak references to every storage an op
    returns). Returns {"grads": bytes of all parameters' gradients, "wrap": bytes DDP allocates and keeps
    when wrapping (the first iteration's buckets), "buckets": [bytes of each rebuilt bucket, in the
    reducer's order], "step": bytes of storages born in the second step and alive after its backward (the
    rebuilt buckets, plus the gradients unless they are bucket views), "grads are bucket views": bool}.

    From ``torch/nn/parallel/distributed.py`` (2.13): without ``find_unused_parameters`` the first iteration
    has one bucket of every gradient (``compute_bucket_size_limits``: ``[sys.maxsize]``); the reducer then
    rebuilds them in gradient-ready order, a bucket closing once it reaches its limit (the gradient that
    crosses it included): the first limit ``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB) only when
    ``bucket_cap_mb`` is left None, every other ``bucket_cap_mb`` MiB (25 by default).
    """
    import gc

    from torch.nn.parallel import DistributedDataParallel as DDP

    _check("loop", loop, ("fp32-adamw", "bf16-pure-adamw"))
    with gloo_world():
        torch.manual_seed(seed)
        model = make_model(c, loop)
        ids, targets = _inputs(c, batch, seq)
        births = _Births()
        with births:
            ddp = DDP(model, bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=gradient_as_bucket_view)
        gc.collect()
        params = {t.untyped_storage().data_ptr() for t in (*model.parameters(), ids, targets)}
        wrap = sum(births.alive(params).values())
        for step in range(2):
            births = _Births()
            with births:
                loss = F.cross_entropy(ddp(ids).float().view(-1, c.V), targets.view(-1))
                loss.backward()
                del loss
            gc.collect()
            if step == 0:
                model.zero_grad(set_to_none=True)
        alive = births.alive(params)
        grads = {p.grad.untyped_storage().data_ptr() for p in model.parameters()}
        buckets = [b.buffer().untyped_storage().nbytes() for b in ddp.reducer._get_zeros_like_grad_buckets()]
        bucket_ptrs = {k for k in alive if k not in grads} if not gradient_as_bucket_view else set(alive)
        return {"grads": sum(p.numel() * p.element_size() for p in model.parameters()), "wrap": wrap,
                "buckets": buckets, "step": sum(alive.values()),
                "grads are bucket views": grads <= bucket_ptrs and not grads & params}


assert set(PHASES) | {"before forward"} == set(LANDMARKS)
