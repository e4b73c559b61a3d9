"""torchtitan's own Llama3 model and training loop, measured under ``FakeTensorMode``: what one layer saves, and a
whole step as ``Trainer.train_step`` runs it (the proof of ``implementation="torchtitan"``).

torchtitan 0.3.0 (installed ``--no-deps``, see :mod:`memledger.pytorch.titan`), read from its sources:

* The model: ``torchtitan/models/llama3/__init__.py`` l. 69-111 (``_build_llama3_layers``: fused QKV,
  ``ComplexRoPE`` per layer) and l. 230-272 (``_8b``), ``Llama3Model`` (``models/llama3/model.py``),
  ``Decoder`` (``models/common/decoder.py`` l. 193-248). Built here from the same config classes with the
  caller's widths, no weights, its parameters in BF16 (``training.dtype = "bfloat16"``: the trainer builds the model
  under ``set_default_dtype``, ``trainer.py`` l. 365).
* The attention: torchtitan's language models run FlexAttention or varlen (``config_utils.get_attention_config``
  l. 71-103 refuses ``sdpa``); neither runs eagerly on a CPU tensor without compiling. Its
  ``ScaledDotProductAttention`` (``models/common/attention.py`` l. 385-445: causal, no mask) is what its own
  graph_trainer tests swap in for every layer (``experiments/graph_trainer/common_utils.py`` l. 58-71): done
  here the same way. No positions are passed (one document a row): ``ComplexRoPE``'s cache is then sliced, a view
  (``models/common/rope.py`` l. 360-368).
* The RoPE cache: a non-persistent buffer of every layer's ``ComplexRoPE`` (``rope.py`` l. 111-114, 185-234),
  complex64, ``max_seq_len`` x d_h/2; the trainer sets ``max_seq_len`` to ``training.seq_len``
  (``decoder.py`` l. 165-181). Built here for ``seq`` positions.
* The loop (``trainer.py`` l. 871-945, 808-829): ``optimizers.zero_grad(set_to_none=disable_cuda_graphs)``
  (False by default, ``config/configs.py`` l. 66: the gradients are zeroed and kept), ``local_valid_tokens =
  torch.tensor(0, dtype=torch.int64)``, ``local_valid_tokens += (labels != IGNORE_INDEX).sum()``,
  ``global_valid_tokens = local_valid_tokens.to(device)`` (the same tensor on the CPU), ``pred = model(inputs)``,
  ``loss, _ = loss_fn(pred, labels, global_valid_tokens)`` (``components/loss.py`` l. 32-65, 351-367:
  ``cross_entropy(pred.flatten(0, 1).float(), labels.flatten(0, 1), reduction="sum", ignore_index=-100)``, divided
  by the count), ``del pred``, ``loss.backward()``, ``dist_utils.clip_grad_norm_(params, max_norm=1.0,
  foreach=True)`` (``distributed/utils.py`` l. 599-676), ``optimizers.step()``. The loss is logged (``should_log``)
  every ``log_freq`` steps only: left out (its ``clone`` is one FP32 scalar).
* The optimizer: ``OptimizersContainer`` with ``default_adamw`` (``components/optimizer/optimizer.py`` l. 378-399)
  and the given ``implementation`` ("for-loop", "foreach" or "fused"; torchtitan's default is "fused").
"""
import torch

from .measure import tracker_class
from .record import recorded

__all__ = ["CHECKPOINTING", "IMPLEMENTATIONS", "build", "checkpointing", "layer_saved", "missing", "titan_fsdp1_step",
           "titan_step", "tp_layer_saved"]

IMPLEMENTATIONS = ("for-loop", "foreach", "fused")
#: torchtitan's activation checkpointing policies run here (``distributed/activation_checkpoint.py``): none,
#: ``FullAC`` (l. 166-182) and ``SelectiveAC`` (l. 185-287), with their configs' defaults.
CHECKPOINTING = ("none", "full", "selective")
IGNORE = -100


def missing():
    """Why torchtitan cannot be measured here, or None."""
    try:
        from .titan import import_titan
        import_titan()
    except ImportError as error:
        return f"torchtitan is not installed ({error}); pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro"
    return None


def build(d: int, L: int, H: int, F: int, V: int, seq: int, n_kv_heads: int = None, sequence_parallel: bool = None):
    """torchtitan's ``Llama3Model`` (BF16, no weights) with SDPA in every layer and a RoPE cache of ``seq``
    positions; returns (model, its layers). ``sequence_parallel`` (True or False): its sharding declarations filled
    in as ``Llama3Model.Config.update_from_config`` fills them (``models/llama3/model.py`` l. 83-88:
    ``set_llama3_sharding_config(enable_sp=parallelism.enable_sequence_parallel)``, True by default,
    ``config/configs.py`` l. 160); None: none (one device)."""
    from .titan import import_titan
    import_titan()
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    from torchtitan.models.llama3 import Llama3Model, _build_llama3_layers
    layers = _build_llama3_layers(n_layers=L, dim=d, n_heads=H, n_kv_heads=n_kv_heads, hidden_dim=F,
                                  rope=ComplexRoPE.Config(dim=d // H, max_seq_len=seq, theta=500000, scaling="llama"),
                                  attn_backend="flex", fuse_qkv=True)
    for layer in layers:
        layer.attention.inner_attention = ScaledDotProductAttention.Config()
    config = Llama3Model.Config(dim=d, vocab_size=V, tok_embeddings=Embedding.Config(num_embeddings=V, embedding_dim=d),
                                norm=RMSNorm.Config(normalized_shape=d),
                                lm_head=Linear.Config(in_features=d, out_features=V), layers=layers)
    if sequence_parallel is not None:
        from torchtitan.models.llama3.sharding import set_llama3_sharding_config
        set_llama3_sharding_config(config, enable_sp=sequence_parallel)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        model = config.build()
    finally:
        torch.set_default_dtype(before)
    return model, list(model.layers.values())


@recorded
def layer_saved(d: int, H: int, F: int, V: int, batch: int, seq: int, n_kv_heads: int = None) -> dict:
    """{"layer": what one layer saves for backward (2-layer total minus 1-layer total, saved-tensor hooks deduplicated
    by storage, parameters and buffers excluded), "buffers": the 2-layer model's buffer bytes}, one forward pass."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    totals, buffers = {}, 0
    for L in (1, 2):
        with FakeTensorMode():
            model, _ = build(d, L, H, F, V, seq, n_kv_heads)
            skip = {id(t.untyped_storage()) for t in (*model.parameters(), *model.buffers())}
            seen = {}

            def pack(t, skip=skip, seen=seen):
                st = t.untyped_storage()
                if id(st) not in skip:
                    seen.setdefault(id(st), (st, st.nbytes()))
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                out = model(torch.randint(0, V, (batch, seq)))
            del out
            totals[L] = sum(v[1] for v in seen.values())
            buffers = sum(b.untyped_storage().nbytes() for b in model.buffers())
    return {"layer": totals[2] - totals[1], "buffers": buffers}


def _local(t):
    """A DTensor's local shard (this rank's), else ``t``."""
    while hasattr(t, "_local_tensor"):
        t = t._local_tensor
    return t


def _parallel_dims(tp: int, backend: str = "spmd_types"):
    """torchtitan's ``ParallelDims`` of tensor parallelism ``tp`` alone (``backend``: its
    ``parallelism.spmd_backend``, "spmd_types" by default, ``config/configs.py`` l. 163-172), its meshes built on
    the CPU (``tools/utils.py`` l. 54-57 picks "cuda" when no accelerator is found) before any ``FakeTensorMode``."""
    import torchtitan.distributed.parallel_dims as parallel_dims
    device_type, parallel_dims.device_type = parallel_dims.device_type, "cpu"
    try:
        dims = parallel_dims.ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=tp, pp=1, ep=1, world_size=tp,
                                          spmd_backend=backend)
        dims.build_mesh()
    finally:
        parallel_dims.device_type = device_type
    return dims


@recorded
def tp_layer_saved(d: int, H: int, F: int, V: int, batch: int, seq: int, tp: int, sequence_parallel: bool = True,
                   n_kv_heads: int = None, backend: str = "spmd_types") -> int:
    """What one layer saves on rank 0 of a fake world of ``tp`` ranks under torchtitan's own tensor parallelism
    (2-layer total minus 1-layer total, one forward pass, local shards only, deduplicated by storage, parameters
    and buffers excluded).

    As its trainer does it (torchtitan 0.3.0): the sharding declarations set (:func:`build`), ``model.parallelize(
    parallel_dims)`` (``models/llama3/parallelize.py`` l. 41-52, ``protocols/module.py`` l. 248-294),
    ``set_spmd_backend`` (``trainer.py`` l. 319) and the forward inside its ``train_context``
    (``distributed/utils.py`` l. 400-427, ``trainer.py`` l. 813): without that context ``current_spmd_mesh()`` is
    None and every redistribution is skipped (``distributed/spmd_types.py`` l. 124-131, 374-375), so sequence
    parallelism would silently not happen. DTensor's sharding propagation gets its own ``FakeTensorMode``
    (:func:`memledger.pytorch.distributed._propagation_as_in_a_real_run`). ``backend``: "spmd_types" (plain local
    tensors) or "partial_dtensor" (DTensors on the tp axis)."""
    if backend not in ("spmd_types", "partial_dtensor"):
        raise ValueError(f"backend must be spmd_types or partial_dtensor, got {backend!r}")
    from torch._subclasses.fake_tensor import FakeTensorMode
    from .distributed import _propagation_as_in_a_real_run, fake_world
    totals = {}
    for L in (1, 2):
        with fake_world(tp):
            dims = _parallel_dims(tp, backend)
            from torchtitan.distributed import utils as dist_utils
            dist_utils.set_spmd_backend(dims.spmd_backend)      # before parallelize, as the trainer does
            with FakeTensorMode():
                model, _ = build(d, L, H, F, V, seq, n_kv_heads, sequence_parallel=sequence_parallel)
                model.parallelize(dims)
                skip = {id(_local(x).untyped_storage()) for x in (*model.parameters(), *model.buffers())}
                seen = {}

                def pack(x, skip=skip, seen=seen):
                    st = _local(x).untyped_storage()
                    if id(st) not in skip:
                        seen.setdefault(id(st), (st, st.nbytes()))
                    return x
                with dist_utils.get_spmd_context(parallel_dims=dims)(), _propagation_as_in_a_real_run(), \
                        torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
                    out = model(torch.randint(0, V, (batch, seq)))
                del out
                totals[L] = sum(v[1] for v in seen.values())
    return totals[2] - totals[1]


def checkpointing(model, policy: str) -> None:
    """torchtitan's own activation checkpointing applied to every layer of ``model`` (``ActivationCheckpointing.apply``,
    ``activation_checkpoint.py`` l. 152-164, as ``models/llama3/parallelize.py`` l. 59 calls it): ``FullAC`` wraps each
    block in ``checkpoint_wrapper(preserve_rng_state=True, early_stop=False)``; ``SelectiveAC`` adds its op policy
    (compute-intensive and collective ops saved, every second mm recomputed)."""
    if policy not in CHECKPOINTING:
        raise ValueError(f"checkpointing must be one of {', '.join(CHECKPOINTING)}, got {policy!r}")
    if policy == "none":
        return
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    cls = FullAC if policy == "full" else SelectiveAC
    cls(cls.Config()).apply(model)


def _optimizers(model, implementation):
    from torchtitan.components.optimizer.optimizer import OptimizersContainer, default_adamw
    config = default_adamw()
    config.implementation = implementation
    return OptimizersContainer(config, model_parts=[model])


def _train_step(model, optimizers, loss_fn, batch, landmark):
    """``Trainer.train_step`` (torchtitan 0.3.0, ``trainer.py`` l. 871-945, ``_forward_backward_body`` l. 808-829) on
    one batch, one data-parallel rank, no pipeline, no gradient accumulation."""
    from torchtitan.distributed import utils as dist_utils
    inputs, labels = batch
    landmark("before forward")
    optimizers.zero_grad(set_to_none=False)
    local_valid_tokens = torch.tensor(0, dtype=torch.int64)
    local_valid_tokens += (labels != IGNORE).sum()
    global_valid_tokens = local_valid_tokens.to(inputs.device)
    pred = model(inputs)
    loss, _ = loss_fn(pred, labels, global_valid_tokens)
    del pred
    landmark("after forward")
    loss.backward()
    landmark("after backward")
    grad_norm = dist_utils.clip_grad_norm_([p for p in model.parameters()], 1.0, foreach=True)
    optimizers.step()
    del grad_norm, loss, local_valid_tokens, global_valid_tokens
    landmark("after step")


def _fsdp_world_one(model):
    """torchtitan's ``apply_fsdp_to_decoder`` on a 1-rank mesh, as ``parallelize_llama`` always calls it
    (``models/llama3/parallelize.py`` l. 69-90: "with shard_degree=1 it is a no-op for the all-gather but still
    installs the MixedPrecisionPolicy"; ``training.mixed_precision_param`` bfloat16, ``mixed_precision_reduce``
    float32, ``config/configs.py`` l. 85-97)."""
    from torch.distributed.device_mesh import init_device_mesh
    from .distributed import _rank0_chunks
    from .titan import import_titan
    mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("fsdp",))
    with _rank0_chunks():
        import_titan().fsdp.apply_fsdp_to_decoder(model, mesh, param_dtype=torch.bfloat16, reduce_dtype=torch.float32,
                                                  pp_enabled=False, reshard_after_forward_policy="default")


@recorded
def titan_fsdp1_step(d: int, L: int, H: int, F: int, V: int, batch: int, seq: int) -> dict:
    """{landmark: bytes, "peak": int} of :func:`titan_step`'s loop with the model first wrapped as
    ``parallelize_llama`` wraps it on one GPU (:func:`_fsdp_world_one`, a fake 1-rank process group),
    ``FSDPMemTracker``'s totals."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from .distributed import _propagation_as_in_a_real_run, fake_world
    from torchtitan.components.loss import CrossEntropyLoss
    cpu, result = torch.device("cpu"), {}
    with fake_world(1):
        fake = FakeTensorMode()
        with fake:
            model, _ = build(d, L, H, F, V, seq)
        _fsdp_world_one(model)
        with fake, _propagation_as_in_a_real_run():
            loss_fn, optimizers = CrossEntropyLoss(CrossEntropyLoss.Config()), _optimizers(model, "for-loop")

            def data():
                return torch.randint(0, V, (batch, seq)), torch.randint(0, V, (batch, seq))
            _train_step(model, optimizers, loss_fn, data(), lambda name: None)
            tracker, batch_ = FSDPMemTracker(model, optimizers.optimizers[0]), data()
            tracker.track_inputs(batch_)
            with tracker:
                _train_step(model, optimizers, loss_fn, batch_, lambda name: result.__setitem__(
                    name, tracker.get_tracker_snapshot("current")[cpu]["Total"]))
            result["peak"] = tracker.get_tracker_snapshot("peak")[cpu]["Total"]
    return result


@recorded
def titan_step(d: int, L: int, H: int, F: int, V: int, batch: int, seq: int, implementation: str = "for-loop",
               n_kv_heads: int = None, ac: str = "none") -> dict:
    """MemTracker's totals of a steady-state step of torchtitan's model and loop (:func:`_train_step`) under
    ``FakeTensorMode``: {landmark: bytes, "peak": int, "phase peaks": {"forward", "backward", "optimizer"}};
    ``ac``: torchtitan's activation checkpointing (:func:`checkpointing`)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
    from torch._subclasses.fake_tensor import FakeTensorMode
    cpu = torch.device("cpu")
    with FakeTensorMode():
        model, _ = build(d, L, H, F, V, seq, n_kv_heads)
        checkpointing(model, ac)
        from torchtitan.components.loss import CrossEntropyLoss
        loss_fn = CrossEntropyLoss(CrossEntropyLoss.Config())
        optimizers = _optimizers(model, implementation)
        result, phase_peaks = {}, {}
        phases = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}
        tracker = tracker_class()()

        def landmark(name):
            total = tracker.get_tracker_snapshot("current")[cpu]["Total"]
            if name in phases:
                phase_peaks[phases[name]] = max(tracker._peak_mem[cpu], total)
            result[name] = tracker._peak_mem[cpu] = total

        def batch_():
            return torch.randint(0, V, (batch, seq)), torch.randint(0, V, (batch, seq))
        _train_step(model, optimizers, loss_fn, batch_(), lambda name: None)    # the state, the kept gradients
        data = batch_()
        tracker.track_external(model, *optimizers.optimizers, *data)
        with tracker:
            _train_step(model, optimizers, loss_fn, data, landmark)
        result["peak"] = max(phase_peaks.values())
        result["phase peaks"] = phase_peaks
    return result
