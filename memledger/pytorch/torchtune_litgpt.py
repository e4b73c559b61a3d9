"""torchtune's and LitGPT's own model code, measured: what one layer saves, and a whole step as each recipe runs it.

Each model is built from its library's own builder or config without weights, under ``FakeTensorMode`` (nothing is
allocated), its parameters in BF16 (created under ``torch.set_default_dtype``: ``.to`` fails on fake parameters), as
the recipes train it (torchtune ``dtype: bf16``; LitGPT ``precision: bf16-true``).

* torchtune 0.6.1: ``torchtune.models.llama2.llama2`` and ``torchtune.models.llama3.llama3`` (its component builders,
  ``torchtune/models/llama2/_component_builders.py`` l. 42, ``torchtune/models/llama3/_component_builders.py``).
  torchtune ships no GPT-style (LayerNorm, GeLU) decoder.
* LitGPT 0.5.13: ``litgpt.model.GPT(Config.from_name(name, ...))`` (``litgpt/model.py`` l. 22), a LLaMA name
  ("Llama-2-7b-hf") or a GPT-NeoX one ("pythia-...": LayerNorm, GeLU, parallel residual, partial rotary).

:func:`layer_saved`: what one layer saves for backward, ``saved_tensors_hooks`` deduplicated by storage (the fake
storage's identity), parameters and buffers excluded, attributed to the layer that saved it first (forward pre/post
hooks); the 2-layer model's total minus the 1-layer model's is one layer.

:func:`library_step`: a steady-state step (the optimizer's state made by a first step) tracked by MemTracker, as
each recipe's loop runs it (its lines transcribed; the recipe modules are scripts, not importable):

* torchtune ``recipes/full_finetune_single_device.py`` (0.6.1): ``ignore_labels_cache = torch.full((B, 1),
  ignore_index)`` (l. 346-348), then per step ``current_num_tokens = (labels != ignore_index).sum()`` (l. 692-695),
  ``num_tokens += current_num_tokens`` (l. 696), ``_loss_step`` (l. 632-654: ``labels = torch.hstack((labels[...,
  1:], ignore_labels_cache[:B]))``, the model's logits, ``loss_fn(logits, labels)``, ``del logits``),
  ``current_loss = loss * current_num_tokens`` (l. 699), ``running_loss += current_loss`` (l. 700),
  ``current_loss.backward()`` (l. 701), ``training.scale_grads(model, 1 / num_tokens)`` (l. 706), ``optimizer.step()``,
  ``optimizer.zero_grad(set_to_none=True)`` (l. 712-713), then ``running_loss = 0``, ``num_tokens = 0`` (l. 754-755;
  the ``.item()`` logged in between cannot run on fake tensors and allocates nothing). Its losses:
  ``torch.nn.CrossEntropyLoss`` (the model returns ``self.output(h).float()``, ``torchtune/modules/transformer.py``
  l. 651-661) and ``CEWithChunkedOutputLoss(num_output_chunks)`` (``torchtune/modules/loss/ce_chunked_output_loss.py``
  l. 45-83; the model's ``chunked_output``, ``transformer.py`` l. 482-502: ``h.chunk(n, dim=1)``). The loss module
  is run by its ``forward``, not its ``__call__``: MemTracker's ``ModTracker`` puts a global forward pre-hook on every
  module (``torch/distributed/_tools/mod_tracker.py`` l. 215-228) that registers ``register_multi_grad_hook`` in its
  default mode "all" on the module's inputs, here the n logit chunks; that hook keeps each gradient it is handed in
  a buffer until all n have arrived (``torch/autograd/graph.py`` l. 638-680: ``buffer[id][idx] = grad``, freed
  after the last), and a non-leaf's tensor hook runs as its node (the chunk's LM head backward) starts, so every
  chunk's BF16 logits gradient would outlive its head's backward until chunk 0's, a tracker's artefact that
  torchtune's recipe, without such hooks, does not have (measured under ``__call__``: 4*B*ceil(S/n)*V bytes over
  the recipe's backward peak at the first weight-gradient sum, two chunks' gradients held).
* LitGPT ``litgpt/finetune/full.py`` (0.5.13) l. 230 (``model.max_seq_length`` set to the longest sequence, S here:
  the cos/sin buffers rebuilt for S positions), l. 278-291: ``logits = model(input_ids)``, ``loss =
  chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])`` (``litgpt/utils.py`` l. 302-351: the head not
  chunked, so the shifted logits are flattened and split by 128 tokens, the last chunk short),
  ``fabric.backward(loss / 1)``, ``optimizer.step()``, ``optimizer.zero_grad()``; ``litgpt/finetune/lora.py``
  l. 355-359 instead runs the head in chunks of 128 tokens (``model(input_ids, lm_head_chunk_size=128)``,
  ``litgpt/model.py`` l. 177-179), drops the last chunk's last position and passes the list (the ``"head-chunked"``
  loss here). ``running_loss.update(loss.detach())`` (a torchmetrics ``RunningMean``) is left out.

The optimizer is ``torch.optim.AdamW`` with its defaults (on these CPU tensors its for-loop; neither recipe's
7B single-device config names it: torchtune's names bitsandbytes' ``PagedAdamW``, which runs on CUDA only).
"""
from contextlib import contextmanager

import torch

from .libraries import _block_tracker
from .measure import tracker_class
from .record import recorded

__all__ = ["LIBRARIES", "LOSSES", "build", "checkpointed_layer", "checkpointing", "layer_saved", "library_step",
           "torchtune_checkpointed_step", "torchtune_offload_forward", "torchtune_offload_packs",
           "missing"]

LIBRARIES = ("torchtune", "litgpt")
#: Each library's losses, as its recipes run them (see the module's docstring).
LOSSES = {"torchtune": ("ce", "chunked"), "litgpt": ("full", "head-chunked")}
IGNORE = -100


def missing(library: str):
    """Why ``library`` cannot be measured here (not installed), or None."""
    module = {"torchtune": "torchtune.models.llama2", "litgpt": "litgpt.model"}[library]
    try:
        __import__(module)
    except ImportError as error:
        return f"{library} is not installed ({error}); pip install -r requirements.txt and requirements-nodeps.txt"
    return None


def _check(library, family, loss=None):
    if library not in LIBRARIES:
        raise ValueError(f"library must be one of {', '.join(LIBRARIES)}, got {library!r}")
    if loss is not None and loss not in LOSSES[library]:
        raise ValueError(f"loss for {library} must be one of {', '.join(LOSSES[library])}, got {loss!r}")


def build(library: str, family: str, d: int, L: int, H: int, F: int, V: int, n_kv_heads: int = None,
          max_seq_len: int = 4096):
    """The library's model in the default dtype (no weights loaded); returns (model, its layers)."""
    kv = n_kv_heads or H
    if library == "torchtune":
        if family == "llama2":
            from torchtune.models.llama2 import llama2 as builder
        elif family == "llama3":
            from torchtune.models.llama3 import llama3 as builder
        else:
            raise ValueError(f"torchtune family must be llama2 or llama3, got {family!r}")
        model = builder(vocab_size=V, num_layers=L, num_heads=H, num_kv_heads=kv, embed_dim=d,
                        max_seq_len=max_seq_len, intermediate_dim=F)
        return model, list(model.layers)
    from litgpt.config import Config
    from litgpt.model import GPT
    extra = {} if family.startswith("pythia") else {"n_query_groups": kv}
    config = Config.from_name(family, n_layer=L, n_embd=d, n_head=H, intermediate_size=F, padded_vocab_size=V,
                              vocab_size=V, block_size=max_seq_len, **extra)
    model = GPT(config)
    return model, list(model.transformer.h)


def _built(library, family, d, L, H, F, V, n_kv_heads, max_seq_len):
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return build(library, family, d, L, H, F, V, n_kv_heads, max_seq_len)
    finally:
        torch.set_default_dtype(before)


@contextmanager
def _layer_tags(layers):
    where, handles = ["outside"], []
    for i, layer in enumerate(layers):
        handles.append(layer.register_forward_pre_hook(lambda m, a, i=i: where.__setitem__(0, i)))
        handles.append(layer.register_forward_hook(lambda m, a, o: where.__setitem__(0, "outside")))
    try:
        yield where
    finally:
        for h in handles:
            h.remove()


def _forward(library, model, ids, loss):
    if library == "litgpt" and loss == "head-chunked":
        return model(ids, lm_head_chunk_size=128)
    return model(ids)


def checkpointing(library: str, model) -> None:
    """Each layer of ``model`` under activation checkpointing as ``library`` enables it, both through PyTorch's
    ``apply_activation_checkpointing`` with ``checkpoint_wrapper``'s default, ``CheckpointImpl.NO_REENTRANT``
    (``torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py`` l. 196-198):

    * torchtune 0.6.1: ``training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})``
      (``torchtune/training/memory.py`` l. 26-43), as ``recipes/full_finetune_single_device.py`` calls it with
      ``enable_activation_checkpointing: True``.
    * LitGPT 0.5.13: ``FSDPStrategy(activation_checkpointing_policy={Block})`` (``litgpt/finetune/full.py`` l. 107-114,
      only where ``devices * num_nodes > 1``), which Lightning applies with ``_setup_activation_checkpointing``
      (``lightning/fabric/strategies/fsdp.py`` l. 721-742; its kwargs from ``_activation_checkpointing_kwargs``,
      l. 684-706); called here on the unsharded model: the wrapper a layer gets, not the sharding."""
    if library == "torchtune":
        from torchtune import modules, training
        training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
        return
    from lightning.fabric.strategies.fsdp import _activation_checkpointing_kwargs, _setup_activation_checkpointing
    from litgpt.model import Block
    _setup_activation_checkpointing(model, _activation_checkpointing_kwargs(None, {Block}))


def _starts(i, tracker, entry):
    """A forward pre-hook noting the total as layer ``i`` starts; it returns None (anything else would replace the
    layer's arguments)."""
    def hook(module, args):
        entry.setdefault(i, tracker.get_tracker_snapshot("current")[torch.device("cpu")]["Total"])
    return hook


@recorded
def checkpointed_layer(library: str, family: str, d: int, H: int, F: int, V: int, batch: int, seq: int,
                       n_kv_heads: int = None) -> dict:
    """{"layer": what one checkpointed layer adds to MemTracker's total between before and after the forward pass
    (the 2-layer model's difference minus the 1-layer model's), "wrapped": how many CheckpointWrapper modules the
    2-layer model has, "forward rise": {layer: the largest total while it runs forward minus the total as it
    starts}}, ``library``'s model under :func:`checkpointing`, one forward pass (the logits) under
    ``FakeTensorMode``."""
    _check(library, family)
    import re

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper
    cpu, delta, wrapped = torch.device("cpu"), {}, 0
    layer = re.compile(r"(?:^|\.)(?:layers|h)\.(\d+)$")        # the wrapper (MemTracker: its qualified name)

    class Tracker(tracker_class()):
        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            total = self._curr_mem_snap.get(cpu, {"Total": 0})["Total"]
            for name in self._mod_tracker.parents:
                found = layer.search(name)
                if found:
                    i = int(found.group(1))
                    self.peaks[i] = max(self.peaks.get(i, 0), total)
    for L in (1, 2):
        with FakeTensorMode():
            model, _ = _built(library, family, d, L, H, F, V, n_kv_heads, max(4096, seq))
            checkpointing(library, model)
            wrapped = sum(isinstance(m, CheckpointWrapper) for m in model.modules())
            ids = torch.randint(0, V, (batch, seq))
            tracker, entry = Tracker(), {}
            tracker.peaks = {}

            for name, module in model.named_modules():
                found = layer.search(name)
                if found:
                    module.register_forward_pre_hook(_starts(int(found.group(1)), tracker, entry))
            tracker.track_external(model, ids)
            with tracker:
                before = tracker.get_tracker_snapshot("current")[cpu]["Total"]
                out = model(ids)
                delta[L] = tracker.get_tracker_snapshot("current")[cpu]["Total"] - before
            del out
    return {"layer": delta[2] - delta[1], "wrapped": wrapped,
            "forward rise": {i: tracker.peaks[i] - entry[i] for i in sorted(entry)}}


@recorded
def layer_saved(library: str, family: str, d: int, H: int, F: int, V: int, batch: int, seq: int,
                n_kv_heads: int = None) -> dict:
    """{"layer": what one layer saves (2-layer total minus 1-layer total), "tensors": the second layer's saved
    storages, sorted [(bytes, dtype, shape)], "outside": the 2-layer model's saved bytes outside its layers}, one
    forward pass (the logits, no loss) under ``FakeTensorMode``."""
    _check(library, family)
    from torch._subclasses.fake_tensor import FakeTensorMode
    totals, tensors, outside = {}, None, 0
    for L in (1, 2):
        with FakeTensorMode():
            model, layers = _built(library, family, d, L, H, F, V, n_kv_heads, max(4096, seq))
            skip = {id(t.untyped_storage()) for t in (*model.parameters(), *model.buffers())}
            seen = {}
            ids = torch.randint(0, V, (batch, seq))
            with _layer_tags(layers) as where:
                def pack(t, skip=skip, seen=seen, where=where):
                    st = t.untyped_storage()
                    if id(st) not in skip and id(st) not in seen:
                        seen[id(st)] = (st, where[0], st.nbytes(), str(t.dtype).replace("torch.", ""),
                                        tuple(t.shape))
                    return t
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = model(ids)
            del out
        totals[L] = sum(v[2] for v in seen.values())
        if L == 2:
            tensors = sorted(v[2:] for v in seen.values() if v[1] == 1)
            outside = sum(v[2] for v in seen.values() if v[1] == "outside")
    return {"layer": totals[2] - totals[1], "tensors": tensors, "outside": outside}


def _torchtune_step(model, opt, loss_fn, batch, cache, landmark, kept, ctx=None):
    """One iteration of ``full_finetune_single_device``'s loop (0.6.1, l. 689-754; ``_loss_step`` l. 632-654) on
    ``batch`` ({"tokens", "labels"}: the labels are popped and die at the shift, as in the recipe). ``kept``: the
    loop's variables that outlive an iteration (``current_num_tokens``, ``current_loss``), rebound where the loop
    rebinds them. ``ctx``: the recipe's ``activations_handling_ctx`` around the model's forward (l. 636-637)."""
    import contextlib

    from torchtune import training
    landmark("before forward")
    kept["current_num_tokens"] = current_num_tokens = (batch["labels"] != loss_fn.ignore_index).sum()
    num_tokens = 0
    num_tokens += current_num_tokens
    labels_ = batch.pop("labels")
    with ctx or contextlib.nullcontext():
        logits = model(**batch)
    labels_ = torch.hstack((labels_[..., 1:], cache[: labels_.shape[0]]))
    if not isinstance(logits, list):
        labels_ = labels_.reshape(-1)
        logits = logits.reshape(-1, logits.size(-1))
    loss = loss_fn.forward(logits, labels_)     # not loss_fn(...): see the module's docstring (MemTracker's hooks)
    del logits, labels_                     # _loss_step returns
    kept["current_loss"] = current_loss = loss * current_num_tokens
    del loss
    running_loss = 0
    running_loss += current_loss
    landmark("after forward")
    current_loss.backward()
    del current_loss, current_num_tokens
    landmark("after backward")
    training.scale_grads(model, 1 / num_tokens)
    opt.step()
    opt.zero_grad(set_to_none=True)
    del running_loss, num_tokens            # l. 754-755: running_loss = 0, num_tokens = 0
    landmark("after step")


def _litgpt_step(model, opt, loss, batch, landmark, kept):
    """One iteration of ``litgpt/finetune/full.py``'s ``fit`` (0.5.13, l. 278-291); ``"head-chunked"``: the head
    and loss of ``finetune/lora.py`` l. 355-359. ``kept``: ``logits`` and ``loss``, which the loop never deletes:
    they live until the next iteration rebinds them."""
    from litgpt.utils import chunked_cross_entropy
    landmark("before forward")
    ids, targets = batch["input_ids"], batch["labels"]
    if loss == "head-chunked":
        kept["logits"] = logits = model(ids, lm_head_chunk_size=128)
        logits[-1] = logits[-1][..., :-1, :]
        kept["loss"] = value = chunked_cross_entropy(logits, targets[..., 1:])
    else:
        kept["logits"] = logits = model(ids)
        kept["loss"] = value = chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])
    del logits
    scaled = value / 1                      # loss / train.gradient_accumulation_iters(devices, num_nodes)
    del value
    landmark("after forward")
    scaled.backward()                       # fabric.backward under bf16-true: loss.backward()
    del scaled
    landmark("after backward")
    opt.step()
    opt.zero_grad()
    landmark("after step")


@recorded
def library_step(library: str, family: str, d: int, L: int, H: int, F: int, V: int, batch: int, seq: int,
                 loss: str, chunks: int = 8, n_kv_heads: int = None) -> dict:
    """MemTracker's totals of a steady-state step of ``library``'s model under ``FakeTensorMode`` (the CPU backend:
    exact storage bytes): {landmark: bytes, "peak": int, "phase peaks": {"forward", "backward", "optimizer"}, "block
    peaks": {("forward" | "backward", layer): int} (:func:`memledger.pytorch.libraries._block_tracker`)};
    ``chunks``: torchtune's ``num_output_chunks`` (loss "chunked")."""
    return _library_step(library, family, d, L, H, F, V, batch, seq, loss, chunks, n_kv_heads)


def _library_step(library, family, d, L, H, F, V, batch, seq, loss, chunks=8, n_kv_heads=None, prepare=None):
    """:func:`library_step`'s body; ``prepare(model)``, torchtune's only: wraps the built model and returns the
    context its recipe runs the forward under."""
    _check(library, family, loss)
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu = torch.device("cpu")
    with FakeTensorMode():
        model, layers = _built(library, family, d, L, H, F, V, n_kv_heads, max(4096, seq))
        if library == "litgpt":     # finetune/full.py l. 230: the RoPE cache rebuilt for the longest sequence
            model.max_seq_length = seq
        ctx = prepare(model) if prepare else None
        opt = torch.optim.AdamW(model.parameters())
        extra = []
        if library == "torchtune":
            from torchtune.modules.loss import CEWithChunkedOutputLoss
            loss_fn = torch.nn.CrossEntropyLoss() if loss == "ce" else CEWithChunkedOutputLoss(chunks)
            if loss == "chunked":
                model.set_num_output_chunks(loss_fn.num_output_chunks)
            cache = torch.full((batch, 1), loss_fn.ignore_index)
            extra = [cache]
        result, phase_peaks = {}, {}
        phases = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}
        tracker = _block_tracker()()       # MemTracker keeping each layer's highest total, forward and backward
        tracker.layer_peaks = {}

        def landmark(name):
            total = tracker.get_tracker_snapshot("current")[cpu]["Total"]
            if name in phases:
                phase_peaks[phases[name]] = max(tracker._peak_mem[cpu], total)
            result[name] = tracker._peak_mem[cpu] = total

        names = ("tokens", "labels") if library == "torchtune" else ("input_ids", "labels")

        def iteration(mark, kept):
            if library == "torchtune":
                _torchtune_step(model, opt, loss_fn, kept.pop("batch"), cache, mark, kept, ctx)
            else:
                _litgpt_step(model, opt, loss, kept["batch"], mark, kept)

        # the loop's variables that outlive an iteration; each iteration's batch is new (the data loader's), the
        # previous one dies when the loop rebinds ``batch``
        kept = {"batch": {name: torch.randint(0, V, (batch, seq)) for name in names}}
        iteration(lambda name: None, kept)  # the first makes the optimizer's state; its leftovers live into the second
        kept["batch"] = {name: torch.randint(0, V, (batch, seq)) for name in names}
        leftovers = [t for v in kept.values() for t in (v if isinstance(v, list) else
                                                        v.values() if isinstance(v, dict) else [v])]
        tracker.track_external(model, opt, *extra, *leftovers)
        del leftovers
        with tracker:
            iteration(landmark, kept)
        del kept
        result["peak"] = max(phase_peaks.values())
        result["phase peaks"] = phase_peaks
        result["block peaks"] = dict(sorted(tracker.layer_peaks.items()))
    return result



class _InertStream:
    """Stands for a CUDA stream where there is none (CPU-only PyTorch): waits and events do nothing. Only the
    order of ``OffloadActivations.pack_tensor``'s decisions is measured, not its copies' timing."""

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self):
        return None


@recorded
def torchtune_offload_packs(d: int, L: int, H: int, F: int, V: int, batch: int, seq: int, chunks: int = 0) -> dict:
    """What torchtune 0.6.1's own ``OffloadActivations`` decides in the forward of its llama2 model as
    ``recipes/full_finetune_single_device.py`` sets it up: ``enable_activation_offloading`` needs
    ``enable_activation_checkpointing`` (l. 166-174, so each layer under :func:`checkpointing`), the context made by
    ``training.get_act_offloading_ctx_manager(model, True)`` (``training/_activation_offloading.py`` l. 373-416: the
    output head under ``NoOpManager``), entered around ``self._model(**batch)`` only (recipe l. 636-637).
    ``chunks``: ``num_output_chunks`` (0: the unchunked head).

    ``OffloadActivations.__init__`` asks for CUDA streams (l. 93-97), which CPU-only PyTorch has not: under
    ``FakeTensorMode`` ``torch.cuda.default_stream``, ``Stream`` and ``stream`` are stand-ins that do nothing
    (:class:`_InertStream`), and ``use_pin_memory`` is off (pinned memory needs CUDA). Its own ``pack_tensor``
    (l. 133-200) decides. Returns {"packs": [(bytes, dtype, shape, offloaded)] in pack order (``tracker``'s second
    field: True where a host copy was made), "stash": [(bytes, dtype, shape)] of ``fwd_stash`` after the forward
    (offloaded tensors it keeps alive on the device, l. 154-162, 189-193)}."""
    import contextlib
    from unittest import mock

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchtune import training

    def row(t):
        return t.element_size() * t.nelement(), str(t.dtype).replace("torch.", ""), tuple(t.shape)
    with FakeTensorMode(), mock.patch("torch.cuda.default_stream", _InertStream), \
            mock.patch("torch.cuda.Stream", _InertStream), \
            mock.patch("torch.cuda.stream", lambda stream: contextlib.nullcontext()):
        model, _ = _built("torchtune", "llama2", d, L, H, F, V, None, max(4096, seq))
        checkpointing("torchtune", model)
        if chunks:
            model.set_num_output_chunks(chunks)
        ctx = training.get_act_offloading_ctx_manager(model, True)
        ctx.use_pin_memory = False
        packs, pack = [], ctx.pack_hook

        def noting(tensor):
            tensor_id = pack(tensor)
            packs.append(row(tensor) + (ctx.tracker[tensor_id][1],))
            return tensor_id
        ctx.pack_hook = noting
        with ctx:
            out = model(torch.randint(0, V, (batch, seq)))
        stash = [row(t) for t, _ in ctx.fwd_stash.values()]
        del out
    return {"packs": packs, "stash": stash}


def _host_on_meta(empty_like):
    """``torch.empty_like`` with ``OffloadActivations``' host copies (``device="cpu"``, ``pin_memory=...``, l. 169-172)
    made on the ``meta`` device, so that MemTracker, which counts per device, keeps them apart from the model's
    fake CPU tensors (the CPU backend stands for the accelerator, as in :mod:`memledger.pytorch.offload`)."""
    def made(tensor, *args, **kwargs):
        if "pin_memory" in kwargs and kwargs.get("device") == "cpu":
            kwargs = {k: v for k, v in kwargs.items() if k != "pin_memory"} | {"device": "meta"}
        return empty_like(tensor, *args, **kwargs)
    return made


@recorded
def torchtune_offload_forward(d: int, L: int, H: int, F: int, V: int, batch: int, seq: int, chunks: int = 0) -> dict:
    """{"checkpointed", "offloaded"}: what torchtune's llama2 forward (``self._model(**batch)``, its layers
    checkpointed as the recipe needs for offloading) adds to MemTracker's device total, without and with
    ``get_act_offloading_ctx_manager(model, True)``'s context around it (its CUDA streams stubbed as in
    :func:`torchtune_offload_packs`, its host copies on ``meta``: :func:`_host_on_meta`). The backward cannot run
    here: ``unpack_tensor_with_streams`` copies back with ``.to("cuda")`` (l. 275)."""
    import contextlib
    from unittest import mock

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchtune import training
    cpu, out = torch.device("cpu"), {}
    for case in ("checkpointed", "offloaded"):
        with FakeTensorMode(), mock.patch("torch.cuda.default_stream", _InertStream), \
                mock.patch("torch.cuda.Stream", _InertStream), \
                mock.patch("torch.cuda.stream", lambda stream: contextlib.nullcontext()), \
                mock.patch("torch.empty_like", _host_on_meta(torch.empty_like)):
            model, _ = _built("torchtune", "llama2", d, L, H, F, V, None, max(4096, seq))
            checkpointing("torchtune", model)
            if chunks:
                model.set_num_output_chunks(chunks)
            ctx = training.get_act_offloading_ctx_manager(model, case == "offloaded")
            ids = torch.randint(0, V, (batch, seq))
            tracker = tracker_class()()
            tracker.track_external(model, ids)
            with tracker:
                before = tracker.get_tracker_snapshot("current")[cpu]["Total"]
                with ctx:
                    logits = model(ids)
                out[case] = tracker.get_tracker_snapshot("current")[cpu]["Total"] - before
            del logits
    return out


class _HostCopy:
    """An offloaded tensor's host copy (``meta``) that comes back as a new fake CPU tensor of its size and strides:
    ``unpack_tensor_with_streams`` calls ``.to("cuda", non_blocking=True)`` on it (l. 275), which CPU-only PyTorch
    cannot; the CPU stands for the accelerator, as everywhere in these measurements."""

    def __init__(self, host):
        self.host = host

    def to(self, device, non_blocking=False):
        return torch.empty_strided(self.host.size(), self.host.stride(), dtype=self.host.dtype, device="cpu")


def _checkpointed(model):
    """torchtune's recipe with ``enable_activation_checkpointing`` on ``model`` (:func:`checkpointing`); no context
    around the forward."""
    checkpointing("torchtune", model)


def _offloading(model):
    """torchtune's recipe with ``enable_activation_offloading`` (and so ``enable_activation_checkpointing``) on
    ``model``: its layers checkpointed, ``get_act_offloading_ctx_manager(model, True)``'s context returned, its
    offloaded tensors' host copies coming back through :class:`_HostCopy`."""
    from torchtune import training
    checkpointing("torchtune", model)
    ctx = training.get_act_offloading_ctx_manager(model, True)
    pack = ctx.pack_hook

    def packing(tensor):
        tensor_id = pack(tensor)
        host, modified = ctx.tracker[tensor_id]
        if modified:
            ctx.tracker[tensor_id] = (_HostCopy(host), True)
        return tensor_id
    ctx.pack_hook = packing
    return ctx


@recorded
def torchtune_checkpointed_step(d: int, L: int, H: int, F: int, V: int, batch: int, seq: int, loss: str,
                                chunks: int = 8, offload: bool = False) -> dict:
    """:func:`library_step` of torchtune's llama2 with ``enable_activation_checkpointing: True`` and, ``offload``,
    ``enable_activation_offloading: True``: its own ``OffloadActivations`` decides and keeps its stashes, its CUDA
    streams stubbed (:class:`_InertStream`), its host copies on ``meta`` (:func:`_host_on_meta`) and brought back
    as fake CPU tensors (:class:`_HostCopy`)."""
    import contextlib
    from unittest import mock
    with mock.patch("torch.cuda.default_stream", _InertStream), mock.patch("torch.cuda.Stream", _InertStream), \
            mock.patch("torch.cuda.stream", lambda stream: contextlib.nullcontext()), \
            mock.patch("torch.empty_like", _host_on_meta(torch.empty_like)):
        return _library_step("torchtune", "llama2", d, L, H, F, V, batch, seq, loss, chunks,
                             prepare=_offloading if offload else _checkpointed)
