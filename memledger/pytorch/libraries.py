"""The libraries' own model code, measured (issue 28): what memledger's ``implementation`` other than reference is
proved against.

Each model is built from its library's config, without weights, under ``FakeTensorMode`` (nothing is allocated),
in pure BF16 (created under ``torch.set_default_dtype``: ``.to`` fails on fake parameters), on the CPU.

* :func:`saved_per_layer`: every tensor autograd saves in one forward pass and its loss, caught with
  ``torch.autograd.graph.saved_tensors_hooks``, each storage counted once (fake tensors: the storage object's
  identity), parameters skipped; the model with two layers minus the model with one is one layer's bytes.
* :func:`library_step`: a whole training step (memledger's :class:`~memledger.pytorch.reference.Trainer`: forward
  and the library's own loss, ``loss.backward()``, the optimizer the loop names, ``zero_grad(set_to_none=True)``)
  tracked by MemTracker, as :func:`memledger.pytorch.measure.memtracker_step` tracks the reference decoder.

transformers (``implementation="hf"``): ``LlamaForCausalLM`` from a ``LlamaConfig``
(``attn_implementation`` sdpa or eager), its loss ``ForCausalLMLoss`` (``labels=``). **A trap, patched away
here**: under ``FakeTensorMode`` transformers' packed-sequence check
(``transformers/masking_utils.py`` ``find_packed_sequence_indices``, called at l. 870 when no attention mask is
given) cannot tell fake position ids apart, so it reports packed sequences, and the model builds a (B, 1, S, S)
causal mask a real run never builds (a real run passes no mask to SDPA and uses ``is_causal``), which SDPA then
turns into an additive BF16 mask saved by every layer (2·B·S² bytes per layer). :func:`_unpacked` makes the check
return None, what it returns on a real unpacked batch.

PEFT's LoRA on it (``lora=``, PEFT 0.22.0: :func:`_peft`): built as ``get_peft_model`` builds it (two moves that
change nothing are skipped, checked by ``tests/pytorch/test_peft.py``), MemTracker kept off the frozen parameters'
gradient hooks (:func:`_frozen`). **A MemTracker artifact, corrected**: with ``gradient_checkpointing=True`` the
embedding's output is a leaf that requires grad (``enable_input_require_grads``); under MemTracker that leaf and its
``.grad`` (2 B·S·d BF16 bytes) are still alive after the step, where the same step without MemTracker has freed them
(:func:`leaf_alive_after_step`: a plain weak reference). Apparently its module tracker's multi-grad hooks on the
modules' inputs (``mod_tracker.py`` l. 228, ``register_multi_grad_hook`` on the leaf's ``AccumulateGrad`` node, which
holds the leaf) keep it; :func:`library_step` takes their bytes off the landmarks after the graph is freed
(:func:`_without`).
"""
from contextlib import contextmanager

import torch

from .record import recorded
from .reference import Trainer

__all__ = ["LIBRARIES", "leaf_alive_after_step", "library_step", "saved_per_layer"]

#: The libraries this module builds models of (memledger.step.implementations' names).
LIBRARIES = ("hf", "litgpt")
#: The families each builds (Hugging Face model_type): transformers' LlamaForCausalLM and GPTNeoXForCausalLM.
FAMILIES = {"hf": ("llama", "gpt_neox"), "litgpt": ("llama",)}


@contextmanager
def _unpacked():
    """transformers' packed-sequence check answers "not packed" (see the module's docstring)."""
    from transformers import masking_utils
    before = masking_utils.find_packed_sequence_indices
    masking_utils.find_packed_sequence_indices = lambda position_ids: None
    try:
        yield
    finally:
        masking_utils.find_packed_sequence_indices = before


class LibraryModel(torch.nn.Module):
    """A library's causal LM with the reference decoder's ``loss(ids, targets)`` (what
    :class:`~memledger.pytorch.reference.Trainer` calls): the library's forward with its own loss, which alone is
    returned (as ``Trainer.compute_loss`` returns ``outputs.loss``: the logits go with the output object)."""

    def __init__(self, library: str, model):
        super().__init__()
        self.library, self.model = library, model

    def loss(self, ids, targets):
        if self.library == "litgpt":        # litgpt/utils.py chunked_cross_entropy, chunk_size 0: one cross-entropy
            from litgpt.utils import chunked_cross_entropy
            return chunked_cross_entropy(self.model(ids), targets, chunk_size=0)
        with _unpacked():
            return self.model(input_ids=ids, labels=targets).loss


def make_library_model(library: str, d: int, H: int, F: int, V: int, L: int, attn: str = "sdpa",
                       dtype=torch.bfloat16, kv: int = None, gradient_checkpointing: bool = False,
                       lora: tuple = None, family: str = "llama") -> LibraryModel:
    """``library``'s model of ``family`` at these sizes, built under the current mode (``FakeTensorMode``: no
    weights); ``gradient_checkpointing``: transformers' ``model.gradient_checkpointing_enable()`` with its defaults
    (every decoder layer's ``forward`` under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``);
    ``lora`` (library hf): PEFT's LoRA on it (:func:`_peft`). ``family``: ``"llama"`` (``LlamaForCausalLM``) or,
    transformers only, ``"gpt_neox"`` (:func:`_gpt_neox`)."""
    if library not in LIBRARIES:
        raise ValueError(f"library must be one of {', '.join(LIBRARIES)}, got {library!r}")
    if family not in FAMILIES[library]:
        raise ValueError(f"family for {library} must be one of {', '.join(FAMILIES[library])}, got {family!r}")
    if library == "litgpt":
        if gradient_checkpointing:
            raise ValueError("gradient_checkpointing is transformers' (library hf)")
        return _litgpt(d, H, F, V, L, dtype)
    if family == "gpt_neox":
        config = _gpt_neox(d, H, F, V, L, attn)
        from transformers import GPTNeoXForCausalLM as Model
    else:
        from transformers import LlamaConfig, LlamaForCausalLM as Model
        config = LlamaConfig(hidden_size=d, intermediate_size=F, num_attention_heads=H, num_key_value_heads=kv or H,
                             num_hidden_layers=L, vocab_size=V, max_position_embeddings=4096, attention_dropout=0.0,
                             attn_implementation=attn, use_cache=False)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = Model(config)
    finally:
        torch.set_default_dtype(before)
    model.train()
    if gradient_checkpointing:
        model.gradient_checkpointing_enable()
    return LibraryModel(library, _peft(model, *lora) if lora else model)


def _peft(model, targets: str, rank: int, alpha: int, dropout: float, fp32_adapters: bool):
    """PEFT's ``get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, lora_dropout=
    dropout), autocast_adapter_dtype=fp32_adapters)`` (``targets``: comma-separated module names or
    ``"all-linear"``), after ``gradient_checkpointing_enable()`` where asked, as PEFT's guides order them (then
    ``get_peft_model`` calls ``enable_input_require_grads``: ``peft/peft_model.py`` l. 243-244, 772-788 at 0.22.0).
    The base is frozen; the adapters are FP32 under ``autocast_adapter_dtype`` (its default: ``cast_adapter_dtype``,
    ``peft/tuners/tuners_utils.py`` l. 2873-2914, new FP32 parameters), else BF16. PEFT moves each new module to its
    base layer's device (``peft/tuners/lora/model.py`` l. 487) and each adapter to the base's device and dtype
    (``_move_adapter_to_device_of_base_layer``, ``tuners_utils.py`` l. 2290-2316) with ``Module.to``, which cannot
    swap a fake parameter held elsewhere: the adapters are created here under the base's default dtype on its
    device, so those moves change nothing and :func:`_unmoved` skips them."""
    from peft import LoraConfig, get_peft_model
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, bias="none", task_type="CAUSAL_LM",
                        target_modules=targets if targets == "all-linear" else targets.split(","))
    before = torch.get_default_dtype()
    torch.set_default_dtype(next(model.parameters()).dtype)
    try:
        with _unmoved():
            return get_peft_model(model, config, autocast_adapter_dtype=fp32_adapters)
    finally:
        torch.set_default_dtype(before)


@contextmanager
def _unmoved():
    """``Module.to`` returns the module where it would change nothing (every tensor already on the device and, if
    one is named, in the dtype), and refuses any other conversion."""
    to = torch.nn.Module.to

    def unmoved(self, *args, **kwargs):
        device, dtype, _, _ = torch._C._nn._parse_to(*args, **kwargs)
        tensors = list(self.parameters()) + list(self.buffers())
        if all((device is None or t.device.type == torch.device(device).type)
               and (dtype is None or not t.is_floating_point() or t.dtype == dtype) for t in tensors):
            return self
        raise RuntimeError(f"PEFT asked for a conversion to {device}, {dtype} under FakeTensorMode")
    torch.nn.Module.to = unmoved
    try:
        yield
    finally:
        torch.nn.Module.to = to


def _gpt_neox(d, H, F, V, L, attn):
    """transformers' ``GPTNeoXConfig`` as pythia's ``config.json`` sets it (EleutherAI/pythia-6.9b: ``rotary_pct``
    0.25, ``use_parallel_residual``, ``hidden_act`` gelu, biases, an untied ``embed_out``), dropout 0, at these sizes."""
    from transformers import GPTNeoXConfig
    return GPTNeoXConfig(hidden_size=d, intermediate_size=F, num_attention_heads=H, num_hidden_layers=L, vocab_size=V,
                         max_position_embeddings=4096, rotary_pct=0.25, use_parallel_residual=True, hidden_act="gelu",
                         attention_bias=True, tie_word_embeddings=False, hidden_dropout=0.0, attention_dropout=0.0,
                         attn_implementation=attn, use_cache=False)


def _litgpt(d, H, F, V, L, dtype) -> LibraryModel:
    """LitGPT's ``GPT`` from a LLaMA-style ``Config`` (RMSNorm, LLaMAMLP, full rotary, no biases, untied head)."""
    from litgpt.config import Config
    from litgpt.model import GPT
    config = Config(n_layer=L, n_head=H, n_query_groups=H, n_embd=d, intermediate_size=F, vocab_size=V,
                    padded_vocab_size=V, block_size=4096, bias=False, norm_class_name="RMSNorm",
                    mlp_class_name="LLaMAMLP", parallel_residual=False, rotary_percentage=1.0, norm_eps=1e-5)
    before = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = GPT(config)
    finally:
        torch.set_default_dtype(before)
    model.train()
    return LibraryModel("litgpt", model)


def _ids(V, batch, seq):
    return torch.randint(0, V, (batch, seq)), torch.randint(0, V, (batch, seq))


def _saved_bytes(library, d, H, F, V, L, attn, batch, seq, kv=None, lora=None, family="llama") -> int:
    """The bytes of every storage autograd saves in one forward pass with the loss (parameters skipped)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        model = make_library_model(library, d, H, F, V, L, attn, kv=kv, lora=lora, family=family)
        params = {id(p.untyped_storage()) for p in model.parameters()}
        seen = {}                       # id -> storage (kept alive, so that no id is reused)

        def pack(t):
            st = t.untyped_storage()
            if id(st) not in params:
                seen.setdefault(id(st), st)
            return t
        ids, targets = _ids(V, batch, seq)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss = model.loss(ids, targets)
        del loss
        return sum(st.nbytes() for st in seen.values())


@recorded
def saved_per_layer(library: str, d: int, H: int, F: int, V: int, batch: int, seq: int, attn: str = "sdpa",
                    kv: int = None, lora: tuple = None, family: str = "llama") -> dict:
    """{"layer": one layer's saved bytes (two layers minus one), "one layer": the whole forward's saved bytes with
    one layer} of ``library``'s model of ``family`` in BF16; ``lora``: PEFT's (:func:`_peft`'s arguments)."""
    one = _saved_bytes(library, d, H, F, V, 1, attn, batch, seq, kv, lora, family)
    two = _saved_bytes(library, d, H, F, V, 2, attn, batch, seq, kv, lora, family)
    return {"layer": two - one, "one layer": one}


def _block_tracker():
    """MemTracker (:func:`memledger.pytorch.measure.tracker_class`) keeping the largest total after any op a layer
    runs, forward and backward: {("forward" | "backward", layer index): bytes} in ``blocks``. A layer is a module
    named ``....layers.<i>`` (transformers) or ``....h.<i>`` (LitGPT) directly."""
    import re

    from .measure import tracker_class
    layer = re.compile(r"\.(?:layers|h)\.(\d+)$")

    class Tracker(tracker_class()):
        def _update_peak_stats(self, peak_state):
            super()._update_peak_stats(peak_state)
            if self._in_opt:
                return
            total = self._curr_mem_snap.get(torch.device("cpu"), {"Total": 0})["Total"]
            for name in self._mod_tracker.parents:
                found = layer.search(name)
                if found:
                    key = ("backward" if self._mod_tracker.is_bw else "forward", int(found.group(1)))
                    self.layer_peaks[key] = max(self.layer_peaks.get(key, 0), total)
    return Tracker


class _NoHook:
    """The handle of a hook never registered."""
    def remove(self):
        pass


def _frozen(tracker, model):
    """MemTracker registers a gradient hook on every parameter of a module it enters
    (``torch/distributed/_tools/mem_tracker.py`` l. 599-610), which a frozen one (LoRA's base) refuses: its handles
    are given beforehand (the hooks could never run). The frozen parameters are still counted as parameters."""
    for p in model.parameters():
        if not p.requires_grad:
            tracker._param_to_grad_hook_handles[p] = (_NoHook(), _NoHook())


@recorded
def library_step(library: str, d: int, H: int, F: int, V: int, L: int, batch: int, seq: int, attn: str = "sdpa",
                 loop: str = "bf16-pure-adamw", foreach: bool = False, kv: int = None,
                 gradient_checkpointing: bool = False, lora: tuple = None, family: str = "llama") -> dict:
    """MemTracker's totals of the second training step of ``library``'s model (pure BF16 under ``loop``):
    {"before forward", "after forward", "after backward", "after step": int, "peak": int, "phase peaks":
    {"forward", "backward", "optimizer"}, "block peaks": {("forward" | "backward", layer): int}}, CPU bytes, as
    :func:`memledger.pytorch.measure.memtracker_step`. ``gradient_checkpointing``: transformers'
    ``gradient_checkpointing_enable()`` (:func:`make_library_model`); ``lora``: PEFT's LoRA (:func:`_peft`'s
    arguments), the loop over the adapters."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    cpu = torch.device("cpu")
    with FakeTensorMode():
        model = make_library_model(library, d, H, F, V, L, attn, kv=kv, gradient_checkpointing=gradient_checkpointing,
                                   lora=lora, family=family)
        trainer = Trainer(model, loop, foreach=foreach)
        trainer.init_state()
        ids, targets = _ids(V, batch, seq)
        tracker = _block_tracker()()
        tracker.layer_peaks = {}
        _frozen(tracker, model)
        tracker.track_external(model, *trainer.optimizers, ids, targets, *trainer.masters)
        result, phase_peaks = {}, {}
        phases = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}

        def landmark(name):
            total = tracker.get_tracker_snapshot("current")[cpu]["Total"]
            if name in phases:
                phase_peaks[phases[name]] = max(tracker._peak_mem[cpu], total)
            result[name] = tracker._peak_mem[cpu] = total
        leaves = _leaves(model) if lora and gradient_checkpointing else []
        with tracker:
            trainer.step(ids, targets, lambda name: landmark(name) if name not in AFTER_GRAPH else _without(
                name, result, phase_peaks, landmark, _alive_bytes(leaves)))
        result["peak"] = max(phase_peaks.values())
        result["phase peaks"] = phase_peaks
        result["block peaks"] = dict(sorted(tracker.layer_peaks.items()))
    return result


#: The landmarks after ``del loss`` frees the graph, where MemTracker keeps PEFT's leaf alive (:func:`_leaves`).
AFTER_GRAPH = ("after backward", "after step")


def _leaves(model) -> list:
    """Weak references to what the input embeddings return in the step: under ``enable_input_require_grads``
    (PEFT on a checkpointed model) a leaf that requires grad (``peft_model.py`` l. 243-244,
    ``modeling_utils.py`` ``enable_input_require_grads``: a forward hook ``output.requires_grad_(True)``)."""
    import weakref
    leaves = []
    model.model.get_input_embeddings().register_forward_hook(lambda m, i, out: leaves.append(weakref.ref(out)))
    return leaves


def _alive_bytes(leaves) -> int:
    """The bytes of the leaves still alive and of their ``.grad``."""
    total = 0
    for ref in leaves:
        leaf = ref()
        if leaf is not None:
            total += leaf.untyped_storage().nbytes()
            total += leaf.grad.untyped_storage().nbytes() if leaf.grad is not None else 0
    return total


def _without(name, result, phase_peaks, landmark, artifact: int):
    """``landmark(name)`` less ``artifact``: **a MemTracker artifact, corrected here**. With
    ``gradient_checkpointing_enable()`` PEFT's embedding output is a leaf that requires grad; once ``del loss`` has
    freed the graph, MemTracker's module tracker still holds it (its multi-grad hooks on the modules' inputs,
    ``torch/distributed/_tools/mod_tracker.py`` l. 228, ``register_multi_grad_hook``, keep the leaf's grad node and
    so the leaf) and its ``.grad``, where the same step without MemTracker has freed both by then
    (:func:`leaf_alive_after_step`, ``tests/pytorch/test_peft.py``). Their bytes, read from the live leaf through a
    weak reference, are taken off the landmark and off the optimizer phase's peak (they stay alive through it)."""
    landmark(name)
    result[name] -= artifact
    if name == "after step":
        phase_peaks["optimizer"] -= artifact


def leaf_alive_after_step(tracked: bool, d=256, H=4, F=688, V=1000, L=2, batch=2, seq=48) -> bool:
    """Whether PEFT's embedding-output leaf (LoRA on q_proj and v_proj on transformers' checkpointed model) is still
    alive after a whole training step (``del loss``, the optimizer step, ``zero_grad``), with MemTracker tracking the
    step (``tracked``) or without it: a plain weak reference, no ``gc.collect()``."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        model = make_library_model("hf", d, H, F, V, L, gradient_checkpointing=True,
                                   lora=("q_proj,v_proj", 16, 32, 0.0, True))
        trainer = Trainer(model, "fp32-adamw")
        trainer.init_state()
        ids, targets = _ids(V, batch, seq)
        leaves = _leaves(model)
        if not tracked:
            trainer.step(ids, targets)
            return _alive_bytes(leaves) > 0
        tracker = _block_tracker()()
        tracker.layer_peaks = {}
        _frozen(tracker, model)
        tracker.track_external(model, *trainer.optimizers, ids, targets)
        with tracker:
            trainer.step(ids, targets)
        return _alive_bytes(leaves) > 0
