"""LitGPT's own LoRA model (``litgpt/lora.py``), measured: what one layer saves, and a step as ``finetune/lora.py``
runs it.

LitGPT 0.5.13's ``litgpt.lora.GPT(Config.from_name(name, lora_r=..., ...))`` is built without weights under
``FakeTensorMode`` (parameters in BF16, as ``precision: bf16-true`` trains them), then
``mark_only_lora_as_trainable(model)`` (``litgpt/lora.py`` l. 417-448: every parameter whose name lacks ``lora_`` is
frozen), as ``finetune/lora.py`` l. 210-212 does. Its defaults (``finetune/lora.py`` l. 56-64): ``lora_r`` 8,
``lora_alpha`` 16, ``lora_dropout`` 0.05, adapters on the query and the value (``LoRAQKVLinear`` on the fused QKV
projection, ``enable_lora=(True, False, True)``), none on the key, the output projection, the MLP or the head.

:func:`lora_layer_saved`: what a layer saves for backward (``saved_tensors_hooks`` deduplicated by storage,
parameters and buffers excluded, attributed to the layer that saved it first), the 2-layer model's total minus the
1-layer model's: a layer whose input requires grad. LitGPT's embedding is frozen and nothing makes its output
require grad (no ``enable_input_require_grads``): the first layer saves less (its own tensors: ``"first"``).

:func:`lora_step`: MemTracker's totals of a steady-state step (the optimizer's state made by a first step) as
``finetune/lora.py``'s ``fit`` runs it (l. 304: ``model.max_seq_length`` set to the longest sequence; l. 354-365):
``logits = model(input_ids, lm_head_chunk_size=128)`` (``litgpt/model.py`` l. 177-179: the head on each
``x.split(128, dim=1)``), ``logits[-1] = logits[-1][..., :-1, :]``, ``loss = chunked_cross_entropy(logits,
targets[..., 1:])`` (``litgpt/utils.py`` l. 313-327), ``fabric.backward(loss / 1)``, ``optimizer.step()``,
``optimizer.zero_grad()``; ``logits`` and ``loss`` are never deleted: they live into the next iteration.
``running_loss.update(loss.detach())`` is left out. The optimizer is ``torch.optim.AdamW`` over
``model.parameters()`` (``instantiate_torch_optimizer``; the frozen ones get no gradient, so no state).
"""
import torch

from .measure import tracker_class
from .record import recorded

__all__ = ["lora_layer_saved", "lora_step", "missing"]

#: finetune/lora.py's defaults (0.5.13, l. 56-64).
DEFAULTS = dict(lora_r=8, lora_alpha=16, lora_dropout=0.05, lora_query=True, lora_key=False, lora_value=True,
                lora_projection=False, lora_mlp=False, lora_head=False)
CHUNK = 128     # finetune/lora.py l. 355: lm_head_chunk_size=128


def missing():
    """Why LitGPT cannot be measured here (not installed), or None."""
    try:
        __import__("litgpt.lora")
    except ImportError as error:
        return f"litgpt is not installed ({error}); pip install -r requirements.txt and requirements-nodeps.txt"
    return None


def build(d: int, L: int, H: int, F: int, V: int, lora: dict, n_kv_heads: int = None, max_seq_len: int = 4096):
    """LitGPT's LoRA ``GPT`` in BF16 (no weights), only its adapters trainable; returns (model, its layers)."""
    from litgpt.lora import GPT, Config, mark_only_lora_as_trainable
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        config = Config.from_name("Llama-2-7b-hf", n_layer=L, n_embd=d, n_head=H, intermediate_size=F,
                                  padded_vocab_size=V, vocab_size=V, block_size=max_seq_len,
                                  n_query_groups=n_kv_heads or H, **(DEFAULTS | dict(lora)))
        model = GPT(config)
    finally:
        torch.set_default_dtype(before)
    mark_only_lora_as_trainable(model)
    return model, list(model.transformer.h)


@recorded
def lora_layer_saved(d: int, H: int, F: int, V: int, batch: int, seq: int, lora: tuple = (),
                     n_kv_heads: int = None) -> dict:
    """{"layer": what a layer whose input requires grad saves (2-layer total minus 1-layer total), "first": what the
    first layer saves, "outside": what the 2-layer model saves outside its layers, "tensors": the second layer's saved
    storages, sorted [(bytes, dtype, shape)]}, one forward pass with the head in 128-token chunks, under
    ``FakeTensorMode``; ``lora``: (field, value) pairs over finetune/lora.py's defaults."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    totals, out = {}, {}
    for L in (1, 2):
        with FakeTensorMode():
            model, layers = build(d, L, H, F, V, dict(lora), n_kv_heads, max(4096, seq))
            skip = {id(t.untyped_storage()) for t in (*model.parameters(), *model.buffers())}
            seen, where = {}, ["outside"]
            for i, layer in enumerate(layers):
                layer.register_forward_pre_hook(lambda m, a, i=i, w=where: w.__setitem__(0, i))
                layer.register_forward_hook(lambda m, a, o, w=where: w.__setitem__(0, "outside"))
            ids = torch.randint(0, V, (batch, seq))

            def pack(t, skip=skip, seen=seen, where=where):
                st = t.untyped_storage()
                if id(st) not in skip and id(st) not in seen:
                    seen[id(st)] = (st, where[0], st.nbytes(), str(t.dtype).replace("torch.", ""), tuple(t.shape))
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                logits = model(ids, lm_head_chunk_size=CHUNK)
            del logits
        totals[L] = sum(v[2] for v in seen.values())
        if L == 2:
            out = {"tensors": sorted(v[2:] for v in seen.values() if v[1] == 1),
                   "first": sum(v[2] for v in seen.values() if v[1] == 0),
                   "outside": sum(v[2] for v in seen.values() if v[1] == "outside")}
    return {"layer": totals[2] - totals[1]} | out


def _frozen_as_buffers(model):
    """The frozen parameters held as buffers: the same bytes (MemTracker hooks every parameter's gradient, which a
    frozen one cannot take)."""
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and not p.requires_grad:
                del module._parameters[name]
                module.register_buffer(name, p.detach())


def _iteration(model, opt, batch, landmark, kept):
    """One iteration of ``finetune/lora.py``'s ``fit`` (0.5.13, l. 354-365); ``kept``: ``logits`` and ``loss``, which
    the loop never deletes (rebound by the next iteration)."""
    from litgpt.utils import chunked_cross_entropy
    landmark("before forward")
    ids, targets = batch["input_ids"], batch["labels"]
    kept["logits"] = logits = model(ids, lm_head_chunk_size=CHUNK)
    logits[-1] = logits[-1][..., :-1, :]
    kept["loss"] = value = chunked_cross_entropy(logits, targets[..., 1:])
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
def lora_step(d: int, L: int, H: int, F: int, V: int, batch: int, seq: int, lora: tuple = (),
              n_kv_heads: int = None) -> dict:
    """MemTracker's totals of a steady-state step of LitGPT's LoRA model as ``finetune/lora.py`` runs it, under
    ``FakeTensorMode`` (the CPU backend: exact storage bytes): {landmark: bytes, "peak": int, "phase peaks":
    {"forward", "backward", "optimizer"}}."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    cpu = torch.device("cpu")
    with FakeTensorMode():
        model, _ = build(d, L, H, F, V, dict(lora), n_kv_heads, max(4096, seq))
        _frozen_as_buffers(model)
        model.max_seq_length = seq          # finetune/lora.py l. 304: the RoPE cache rebuilt for the longest sequence
        opt = torch.optim.AdamW(model.parameters())
        result, phase_peaks = {}, {}
        phases = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}
        tracker = tracker_class()()

        def landmark(name):
            total = tracker.get_tracker_snapshot("current")[cpu]["Total"]
            if name in phases:
                phase_peaks[phases[name]] = max(tracker._peak_mem[cpu], total)
            result[name] = tracker._peak_mem[cpu] = total

        def new_batch():
            return {name: torch.randint(0, V, (batch, seq)) for name in ("input_ids", "labels")}
        kept = {"batch": new_batch()}
        _iteration(model, opt, kept["batch"], lambda name: None, kept)   # makes AdamW's state, LitGPT's lora_ind
        kept["batch"] = new_batch()
        leftovers = [t for v in kept.values() for t in (v if isinstance(v, list) else
                                                        v.values() if isinstance(v, dict) else [v])]
        tracker.track_external(model, opt, *leftovers)
        del leftovers
        with tracker:
            _iteration(model, opt, kept["batch"], landmark, kept)
        del kept
        result["peak"] = max(phase_peaks.values())
        result["phase peaks"] = phase_peaks
    return result
