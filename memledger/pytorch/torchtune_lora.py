"""torchtune's own LoRA and QLoRA, measured: what one layer saves, and a whole step as its recipe runs it.

The model is torchtune 0.6.1's ``lora_llama2`` (``torchtune/models/llama2/_component_builders.py`` l. 154-293), built
from its arguments without weights under ``FakeTensorMode``, in BF16 (``training.set_default_dtype(self._dtype)``,
``recipes/lora_finetune_single_device.py`` l. 431), its adapters ``LoRALinear`` (``torchtune/modules/peft/lora.py``
l. 120-139: ``F.linear(x, weight)`` or, with ``quantize_base``, torchao's ``linear_nf4``; ``lora_a(dropout(x))``,
``(alpha / rank) * lora_b(...)``, ``out + lora_out``; ``nn.Identity`` for dropout 0, l. 90), ``lora_attn_modules``
among ``q_proj``, ``k_proj``, ``v_proj``, ``output_proj``, ``apply_lora_to_mlp`` (``w1``, ``w2``, ``w3``) and
``apply_lora_to_output``. ``quantize_base=True`` is ``qlora_llama2_*`` (``_model_builders.py`` l. 119): every block
projection a torchao ``NF4Tensor`` (``to_nf4``: blocks of 64, scalers double-quantized in blocks of 256; the number
of a projection's weights must be a multiple of 64 x 256), the output projection unquantized (l. 263). torchao
0.14.1's ``NF4Tensor`` runs under ``FakeTensorMode`` (built, forward and backward).

The recipe's model setup (l. 431-449): ``set_trainable_params(model, get_adapter_params(model))`` (only
``lora_a``/``lora_b`` train: the embedding's output does not require grad, so the first layer computes no input
gradient), then ``training.set_activation_checkpointing(model, auto_wrap_policy={TransformerSelfAttentionLayer})``
where ``enable_activation_checkpointing``. Frozen parameters are moved to buffers here (the same storages):
MemTracker registers a gradient hook on every parameter of a module it enters, which a frozen one cannot take.
The optimizer: ``torch.optim.AdamW(model.parameters())`` (the recipe passes every parameter, l. 502; the frozen ones
get no gradient, so no state), its for-loop on these CPU tensors.

The loop is :func:`memledger.pytorch.torchtune_litgpt._torchtune_step`: ``lora_finetune_single_device.py``'s
l. 694-752 and ``_loss_step`` (l. 639-661) are ``full_finetune_single_device.py``'s lines, one optimizer step per
batch (``gradient_accumulation_steps: 1``).
"""
import torch

from .measure import tracker_class
from .record import recorded
from .torchtune_litgpt import _layer_tags, _torchtune_step

__all__ = ["LOSSES", "build_lora", "lora_layer_saved", "lora_step", "nf4_linear_peaks"]

LOSSES = ("ce", "chunked")


def build_lora(d: int, L: int, H: int, F: int, V: int, rank: int, alpha: float, attn: tuple, mlp: bool,
               output: bool, quantize: bool = False, dropout: float = 0.0, n_kv_heads: int = None,
               max_seq_len: int = 4096):
    """``lora_llama2`` in BF16 (no weights), its adapters trainable and everything else frozen, as the recipe sets
    it up; the frozen parameters held as buffers. Returns (model, its layers)."""
    from torchtune.models.llama2 import lora_llama2
    from torchtune.modules.peft import get_adapter_params, set_trainable_params
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        if quantize:
            kv = d // H * (n_kv_heads or H)
            _warm_nf4({(d, d), (d, kv), (d, F), (F, d)})
        model = lora_llama2(lora_attn_modules=list(attn), apply_lora_to_mlp=mlp, apply_lora_to_output=output,
                            vocab_size=V, num_layers=L, num_heads=H, num_kv_heads=n_kv_heads or H, embed_dim=d,
                            max_seq_len=max_seq_len, intermediate_dim=F, lora_rank=rank, lora_alpha=alpha,
                            lora_dropout=dropout, quantize_base=quantize)
    finally:
        torch.set_default_dtype(before)
    set_trainable_params(model, get_adapter_params(model))
    for module in model.modules():
        for name, p in list(module._parameters.items()):
            if p is not None and not p.requires_grad:
                del module._parameters[name]
                module.register_buffer(name, p.detach())
    return model, list(model.layers)


def _warm_nf4(shapes):
    """A process's first ``FrozenNF4Linear`` of each (in, out) under ``FakeTensorMode`` fails (``torch.utils.
    swap_tensors``: "Cannot swap t1 because it has weakref associated with it", torchtune 0.6.1
    ``modules/low_precision/nf4_linear.py`` l. 51, torch 2.13); later ones of that shape build. One throwaway build
    of each shape first, outside any measurement."""
    from torchtune.modules.low_precision import FrozenNF4Linear
    for inp, out in shapes:
        try:
            FrozenNF4Linear(inp, out)
        except RuntimeError:
            pass


def _check(loss):
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {', '.join(LOSSES)}, got {loss!r}")


@recorded
def lora_layer_saved(d: int, H: int, F: int, V: int, batch: int, seq: int, rank: int = 8, alpha: float = 16.0,
                     attn: tuple = ("q_proj", "v_proj"), mlp: bool = False, output: bool = False,
                     quantize: bool = False, dropout: float = 0.0) -> dict:
    """{"layer": what one middle layer saves (the 3-layer model's total minus the 2-layer's), "first": what the
    first layer saves, "outside": the 3-layer model's saved bytes outside its layers}, one forward pass (the logits)
    of :func:`build_lora`'s model under ``FakeTensorMode``; saved-tensor hooks deduplicated by storage, parameters
    and buffers excluded (an ``NF4Tensor`` weight saved by ``linear_nf4`` is a buffer here)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    totals, first, outside = {}, 0, 0
    for L in (2, 3):
        with FakeTensorMode():
            model, layers = build_lora(d, L, H, F, V, rank, alpha, attn, mlp, output, quantize, dropout)
            skip = {id(t) for t in (*model.parameters(), *model.buffers())}
            skip |= {id(t.untyped_storage()) for t in (*model.parameters(), *model.buffers())
                     if type(t) is not torch.Tensor and not hasattr(t, "quantized_data")}
            seen = {}
            ids = torch.randint(0, V, (batch, seq))
            with _layer_tags(layers) as where:
                def pack(t, skip=skip, seen=seen, where=where):
                    if id(t) in skip or hasattr(t, "quantized_data"):
                        return t
                    st = t.untyped_storage()
                    if id(st) not in skip and id(st) not in seen:
                        seen[id(st)] = (st, where[0], st.nbytes())
                    return t
                with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                    out = model(ids)
            del out
        totals[L] = sum(v[2] for v in seen.values())
        if L == 3:
            first = sum(v[2] for v in seen.values() if v[1] == 0)
            outside = sum(v[2] for v in seen.values() if v[1] == "outside")
    return {"layer": totals[3] - totals[2], "first": first, "outside": outside}


@recorded
def lora_step(d: int, L: int, H: int, F: int, V: int, batch: int, seq: int, loss: str = "ce", chunks: int = 8,
              rank: int = 8, alpha: float = 16.0, attn: tuple = ("q_proj", "v_proj"), mlp: bool = False,
              output: bool = False, quantize: bool = False, checkpointed: bool = False, dropout: float = 0.0) -> dict:
    """MemTracker's totals of a steady-state step of torchtune's LoRA model as ``lora_finetune_single_device`` runs
    it, under ``FakeTensorMode`` (the CPU backend): {landmark: bytes, "peak": int, "phase peaks": {"forward",
    "backward", "optimizer"}}; ``checkpointed``: ``enable_activation_checkpointing: True``."""
    _check(loss)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchtune import modules, training
    from torchtune.modules.loss import CEWithChunkedOutputLoss

    cpu = torch.device("cpu")
    with FakeTensorMode():
        model, _ = build_lora(d, L, H, F, V, rank, alpha, attn, mlp, output, quantize, dropout,
                              max_seq_len=max(4096, seq))
        if checkpointed:
            training.set_activation_checkpointing(model, auto_wrap_policy={modules.TransformerSelfAttentionLayer})
        opt = torch.optim.AdamW(model.parameters())
        loss_fn = torch.nn.CrossEntropyLoss() if loss == "ce" else CEWithChunkedOutputLoss(chunks)
        if loss == "chunked":
            model.set_num_output_chunks(loss_fn.num_output_chunks)
        cache = torch.full((batch, 1), loss_fn.ignore_index)
        result, phase_peaks = {}, {}
        phases = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}
        tracker = tracker_class()()

        def landmark(name):
            total = tracker.get_tracker_snapshot("current")[cpu]["Total"]
            if name in phases:
                phase_peaks[phases[name]] = max(tracker._peak_mem[cpu], total)
            result[name] = tracker._peak_mem[cpu] = total

        def new_batch():
            return {name: torch.randint(0, V, (batch, seq)) for name in ("tokens", "labels")}

        kept = {"batch": new_batch()}
        _torchtune_step(model, opt, loss_fn, kept.pop("batch"), cache, lambda name: None, kept)
        kept["batch"] = new_batch()
        leftovers = [t for v in kept.values() for t in (v.values() if isinstance(v, dict) else [v])]
        tracker.track_external(model, opt, cache, *leftovers)
        del leftovers
        with tracker:
            _torchtune_step(model, opt, loss_fn, kept.pop("batch"), cache, landmark, kept)
        del kept
        result["peak"] = max(phase_peaks.values())
        result["phase peaks"] = phase_peaks
    return result


@recorded
def nf4_linear_peaks(out: int, inp: int, batch: int, seq: int) -> dict:
    """MemTracker around torchao's ``linear_nf4`` (what ``LoRALinear(quantize_base=True)`` runs on its frozen base)
    on a BF16 input of (batch, seq, inp) requiring grad, under ``FakeTensorMode``: {"forward": the peak above what
    was live before (the weight, ``to_nf4`` of an out x in BF16 weight, tracked as held), "after forward": what
    stays (the output), "backward": the backward's peak above what was live before it, "after backward": what its
    call leaves (the input's gradient)}."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torchao.dtypes.nf4tensor import linear_nf4, to_nf4
    cpu = torch.device("cpu")
    with FakeTensorMode():
        weight = to_nf4(torch.empty(out, inp, dtype=torch.bfloat16))
        x = torch.empty(batch, seq, inp, dtype=torch.bfloat16, requires_grad=True)
        tracker = tracker_class()()
        tracker.track_external(x, weight)
        with tracker:
            def now():
                return tracker.get_tracker_snapshot("current")[cpu]["Total"]
            before = now()
            y = linear_nf4(x, weight)
            result = {"forward": tracker._peak_mem[cpu] - before, "after forward": now() - before}
            grad = torch.empty_like(y)
            before = tracker._peak_mem[cpu] = now()
            y.backward(grad)
            result |= {"backward": tracker._peak_mem[cpu] - before, "after backward": now() - before}
    return result
