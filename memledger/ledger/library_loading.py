"""Loading a LoRA/QLoRA model as torchtune's and LitGPT's single-device recipes do it, as a trace of the caching
allocator's mallocs and frees (``--load torchtune``, ``--load litgpt``), replayed before the step
(:func:`memledger.ledger.replay.replay_step`'s ``prelude``) so that ``allocated`` and ``reserved`` are the peaks of the
whole run, loading included, and ``run`` the peak of live bytes over loading and the step.

Each event is ``("alloc", key, bytes)`` or ``("free", key)``. The blocks that survive loading are the model's
parameters: each is tagged with the step tensor it belongs to (:data:`STEP_TENSORS`), and the step then takes them
as already allocated instead of allocating them again (``preloaded``): the replay holds the library's own blocks
for them, one per parameter and NF4 part, in the library's sizes (torchao's BF16 double-quantization factors where
memledger's row books FP32 ones; bitsandbytes' FP32 absmax under ``bnb.nf4``, where the step books the
double-quantized row for both).

**torchtune** (0.6.1, ``recipes/lora_finetune_single_device.py``): the checkpoint is read to the CPU
(``torchtune/training/checkpointing/_utils.py`` lines 251-255, ``torch.load(..., map_location="cpu", mmap=True)``);
the model is built on the GPU in BF16 (``_setup_model``, lines 431-432: ``with training.set_default_dtype(self._dtype),
self._device: model = config.instantiate(cfg_model)``), every parameter allocated where it is constructed; then
``model.load_state_dict(base_model_state_dict, strict=False)`` (line 451) copies the CPU tensors in place (a blocking
host-to-device copy casts on the host). With QLoRA each base projection is built as an ``nn.Linear`` in BF16 and
quantized at once (``torchtune/modules/peft/lora.py`` lines 74-78, ``to_nf4(linear.weight)``; the BF16 weight dies
when ``__init__`` returns, after the adapters, lines 91-92, are made), and loading re-quantizes: torchao's NF4
``copy_`` (``torchao/dtypes/nf4tensor.py`` lines 450-455, torchao 0.14.1) moves the checkpoint's tensor to the GPU
(``copy_in.to(original.device)``), quantizes it into a new NF4 tensor and copies its parts into the parameter's.
``to_nf4`` (``NF4Tensor.from_tensor``, lines 633-701) makes, for a weight of n elements in BF16: in
``double_quantize_scalers`` (705-762) ``abs()`` (2n bytes) and ``max(dim=1)`` (values 2n/64, int64 indices 8n/64),
the centred scalers, their own absmax pass per 256, ``2 * scaler_absmax`` over the expanded view and a full
``quantization_factor`` (2n/64 each, "realizes n_scaler entries"), the scaled, rounded and
clamped scaler blocks (2n/64 each) and their int8 copy (n/64, kept); in ``convert_to_norm_float_weight`` (790-825)
``abs()`` and ``max`` again, ``blocks / scales`` (2n), the uint8 indices (n), per chunk of ``CHUNK_SIZE`` = 2**20
elements (line 82) ``value - nf4`` and its ``abs()`` (32 bytes per element each), ``min`` (values and int64
indices) and a uint8 copy, then ``quantized_blocks[::2] << 4`` (n/2) and its ``|`` with the odd ones (n/2, kept).
So a projection's quantization holds, at its worst, its BF16 weight, ``blocks / scales`` and the indices: 5n bytes,
and leaves behind blocks of many sizes freed into the cache between the NF4 parts it keeps.

**LitGPT** (0.5.13, ``litgpt/finetune/lora.py``, with Lightning 2.6.6's bitsandbytes plugin): the model is built
under ``fabric.init_module(empty_init=(fabric.world_size > 1))`` (line 210): on one GPU, on the device, in the
precision's dtype, every ``torch.nn.Linear`` replaced by the plugin's ``_NF4Linear`` under ``--quantize bnb.nf4``
(``lightning/fabric/plugins/precision/bitsandbytes.py`` lines 130-145). Each such layer allocates its weight in
BF16 (``nn.Linear.__init__``), and since it is on CUDA quantizes it at once (lines 316-320): ``weight.contiguous()
.to(device=device, dtype=torch.half)`` (line 343, an FP16 copy, 2n) and bitsandbytes' ``quantize_4bit`` (the packed
weight, n/2, and the FP32 absmax, 4n/64; with double quantization its 8-bit copy and FP32 constants, the FP32 absmax
then freed); the parameter is replaced, freeing the BF16 weight. ``load_checkpoint`` (``litgpt/utils.py`` lines
383-398: ``lazy_load`` on the CPU, then ``model.load_state_dict``) runs the plugin's pre-hook per quantized layer
(``_quantize_on_load_hook``, lines 160-167): the checkpoint's weight copied to the GPU in FP16 and quantized again,
the new NF4 parameter replacing the old. Under bitsandbytes LitGPT also swaps the embedding for bitsandbytes'
``StableEmbedding`` (``litgpt/finetune/lora.py`` lines 221-229), made on the CPU and moved to the GPU, while
``main`` keeps the old one referenced (``old_embedding``) for the rest of the run: one more V x d BF16 tensor on the
GPU from then on. Without quantization every parameter is allocated in BF16 where it is constructed and loaded in
place. LitGPT fuses q, k and v into one ``qkv`` linear (``litgpt/model.py``); its head is a ``torch.nn.Linear`` and
so quantized too, while memledger's step books the head in BF16: the trace follows the step there.

**Earlier versions**, named by the commit whose published figures they model: ``torchtune-0914d5c`` (the commit of
torchtune's LoRA and QLoRA tutorials, which pins ``torchao==0.1`` in ``pyproject.toml`` line 24): torchao 0.1's
``double_quantize_scalers`` returns its factors as ``quantization_factor[:, 0].view(n_scaler_blocks)``, a view that
keeps the whole n/64-entry BF16 tensor alive (0.14.1 copies them out with ``.contiguous()``), and
``convert_to_norm_float_weight`` quantizes the whole tensor at once (``quantize_tensor_nearest(scaled_blocks.flatten(),
nf4)``: ``value - nf4`` and its ``abs()`` for all n elements, 32n bytes each, ``min`` with int64 indices, 8n, and the
int64 codes shifted and or-ed, 4n each, before ``.to(torch.uint8)``), and torchtune's own NF4 ``copy_``
(``torchtune/utils/_register_nf4_dispatch_ops.py`` lines 22-42 at 0914d5c) quantizes the checkpoint's tensor on the
GPU and *replaces* the parameter's NF4 parts with the new ones; there the BF16 ``nn.Linear`` is local to
``LoRALinear._create_weight_and_bias`` (``torchtune/modules/peft/lora.py`` lines 87-94 at 0914d5c), freed before the
adapters are made. ``litgpt-00af8b0``: LitGPT as its config-hub table
(00af8b0) and resource tables (8641822) were measured: the same quantize-at-init and quantize-on-load path (Lightning
2.1.0's plugin, ``_Linear4bit.__init__`` and ``_quantize_weight``, ``src/lightning/fabric/plugins/precision/
bitsandbytes.py`` lines 212-233 at tag 2.1.0), without the ``StableEmbedding`` swap (``lit_gpt/finetune/lora.py``
lines 127-148 at 8641822, ``litgpt/finetune/lora.py`` lines 197-215 at 00af8b0).

The trace lists every module of every block: up to :data:`memledger.core.choices.LAYERS_ONE_BY_ONE` blocks, past
which ``n_layers`` is refused in one line.

Not modelled: the RoPE caches each library builds (a few MiB), torchao's 16-entry NF4 table per weight and its
scalar mean, and allocations on the CPU.
"""
import math

from ..core.choices import check_layers_one_by_one

__all__ = ["LIBRARY_LOADS", "STEP_TENSORS", "TORCHAO_STEP_TENSORS", "load_trace", "trace_peak"]

#: ``--load`` choices modelled as an allocation trace (by library).
LIBRARY_LOADS = ("torchtune", "torchtune-0914d5c", "litgpt", "litgpt-00af8b0")
#: The step's tensors (:class:`memledger.ledger.lora.LoraLedger`'s rows) that loading allocates.
STEP_TENSORS = {"base": "frozen base weights (bf16; no grads, no states)",
                "packed": "frozen NF4 projections: packed 4-bit weights",
                "scalers": "frozen NF4 projections: absmax (8-bit) and their FP32 constants",
                "absmax": "frozen NF4 projections: absmax (8-bit) and their FP32 constants",
                "adapters": "LoRA adapters: BF16 parameters"}
#: The same parts in torchtune's QLoRA step (:data:`memledger.step.lora.TORCHAO_ROWS`: torchao's NF4Tensor).
TORCHAO_STEP_TENSORS = {"packed": "frozen NF4 projections (torchao): quantized_data (4-bit codes)",
                        "scalers": "frozen NF4 projections (torchao): scalers, BF16 factors, means, tables",
                        "absmax": "frozen NF4 projections (torchao): scalers, BF16 factors, means, tables"}
CHUNK = 2**20           # torchao/dtypes/nf4tensor.py line 82: CHUNK_SIZE = 1024**2
BLOCK, SCALER_BLOCK = 64, 256


class _Trace:
    def __init__(self):
        self.events, self.n = [], 0

    def alloc(self, size, tag=None) -> str:
        self.n += 1
        key = f"{self.n}" if tag is None else f"{self.n}:{tag}"
        self.events.append(("alloc", key, int(size)))
        return key

    def free(self, *keys):
        for key in keys:
            self.events.append(("free", key))


def _to_nf4(t: _Trace, n: int, keep: bool, chunked: bool = True) -> list:
    """torchao's ``NF4Tensor.from_tensor`` of a BF16 weight of ``n`` elements (see the module docstring); the keys of
    the NF4 parts it keeps, tagged ``packed``/``scalers`` when ``keep``."""
    tag = (lambda name: name) if keep else (lambda name: None)
    nb = n // BLOCK
    a = t.alloc(2 * n)                                   # double_quantize_scalers: input.abs()
    v, i = t.alloc(2 * nb), t.alloc(8 * nb)              # .max(dim=1): values, indices
    t.free(a, i)
    s1 = t.alloc(2 * nb)                                 # scalers_1 - mean
    t.free(v)
    nsb = nb // SCALER_BLOCK
    a2 = t.alloc(2 * nb)                                 # get_block_absmax(scalers_1, 256): abs()
    v2, i2 = t.alloc(2 * nsb), t.alloc(8 * nsb)          # .max(dim=1)
    t.free(a2, i2)
    twice = t.alloc(2 * nb)                              # 2 * scaler_absmax.expand(...): n_blocks entries
    qf = t.alloc(2 * nb, None if chunked else tag("scalers"))   # 256 / (...), n_blocks entries; 0.1 keeps it: its
    t.free(twice, v2)                                    # factors are a view, quantization_factor[:, 0]
    q1 = t.alloc(2 * nb)                                 # scaler_blocks * quantization_factor
    q2 = t.alloc(2 * nb)                                 # .round()
    t.free(q1)
    q3 = t.alloc(2 * nb)                                 # .clamp(-128, 127)
    t.free(q2)
    if chunked:
        scalers = t.alloc(nb + 2 * (nb // SCALER_BLOCK), tag("scalers"))   # .to(int8) and .contiguous() factors
        t.free(q3, qf, s1)
    else:
        scalers = t.alloc(nb, tag("scalers"))            # .to(int8); the factors stay a view of qf
        t.free(q3, s1)
    a = t.alloc(2 * n)                                   # convert_to_norm_float_weight: get_block_absmax again
    v, i = t.alloc(2 * nb), t.alloc(8 * nb)
    t.free(a, i)
    scaled = t.alloc(2 * n)                              # blocks / scales
    if not chunked:                                      # torchao 0.1: the whole tensor at once, int64 indices
        diff = t.alloc(32 * n)                           # (value - nf4): n x 16 in BF16
        absd = t.alloc(32 * n)                           # .abs()
        t.free(diff)
        mv, mi = t.alloc(2 * n), t.alloc(8 * n)          # .min(dim=-1): values, indices (the int64 codes)
        t.free(absd, mv)
        shifted = t.alloc(4 * n)                         # quantized_blocks[::2] << 4, int64
        ored = t.alloc(4 * n)                            # ... | quantized_blocks[1::2]
        t.free(shifted)
        packed = t.alloc(n // 2, tag("packed"))          # .to(torch.uint8), kept
        t.free(ored, mi, scaled, v)
        return [packed, scalers, qf]
    indices = t.alloc(n)                                 # quantized_blocks, uint8
    c = min(n, CHUNK)                                    # one chunk: the others reuse the same cached blocks
    diff = t.alloc(32 * c)
    absd = t.alloc(32 * c)
    t.free(diff)
    mv, mi = t.alloc(2 * c), t.alloc(8 * c)
    t.free(absd)
    u = t.alloc(c)
    t.free(mv, mi, u)
    shifted = t.alloc(n // 2)                            # quantized_blocks[::2] << 4
    packed = t.alloc(n // 2, tag("packed"))              # ... | quantized_blocks[1::2], kept
    t.free(shifted, scaled, indices, v)
    return [packed, scalers]


def _quantize_4bit(t: _Trace, n: int, double_quant: bool) -> list:
    """bitsandbytes' ``quantize_4bit`` of an FP16 weight of ``n`` elements: the packed weight and the FP32 absmax
    (double quantization: its 8-bit copy and FP32 constants, the FP32 absmax freed)."""
    packed = t.alloc(n // 2, "packed")
    absmax = t.alloc(4 * math.ceil(n / BLOCK))
    if not double_quant:                                 # the FP32 absmax is kept
        return [packed, _retag(t, absmax, "absmax")]
    q8 = t.alloc(math.ceil(n / BLOCK) + 4 * math.ceil(n / BLOCK / SCALER_BLOCK), "scalers")
    t.free(absmax)
    return [packed, q8]


def _retag(t: _Trace, key: str, tag: str) -> str:
    """Tag the block ``key`` (the last alloc) as ``tag``."""
    kind, old, size = t.events[-1]
    assert old == key
    new = f"{key}:{tag}"
    t.events[-1] = (kind, new, size)
    return new


def _modules(arch, config, library: str) -> list:
    """(kind, name, elements, extra) in construction order: kind "embed", "norm", "proj" (extra: its adapter
    shapes (r, in, out) or None) or "head"."""
    from ..models.tensors import PROJECTIONS
    from .lora import HEAD
    d, F, V, L = (int(arch.evaluate(x)) for x in _symbols())
    shapes = {name: tuple(int(arch.evaluate(s)) for s in shape) for name, shape in PROJECTIONS[arch.style].items()}
    r = config.rank

    def proj(names):
        out = sum(shapes[k][0] for k in names)
        inp = shapes[names[0]][1]
        targeted = [k for k in names if k in config.targets]
        adapters = [(r, shapes[k][1], shapes[k][0]) for k in targeted]
        return ("proj", "+".join(names), out * inp, adapters)
    attn = [k for k in ("q_proj", "k_proj", "v_proj", "o_proj") if k in shapes]
    mlp = [k for k in ("gate_proj", "down_proj", "up_proj") if k in shapes] if library == "torchtune" else \
        [k for k in ("gate_proj", "up_proj", "down_proj") if k in shapes]
    head = ("head", "lm_head", V * d, [(r, d, V)] if HEAD in config.targets else [])
    block = []
    if library == "litgpt":             # litgpt/model.py: the fused qkv, then proj; fc_1, fc_2, proj
        block = [("norm", "norm_1", d, None), proj(["q_proj", "k_proj", "v_proj"]), proj(["o_proj"]),
                 ("norm", "norm_2", d, None)] + [proj([k]) for k in mlp]
        return [head, ("embed", "wte", V * d, None)] + block * L + [("norm", "ln_f", d, None)]
    block = [proj([k]) for k in attn] + [proj([k]) for k in mlp] + [("norm", "sa_norm", d, None),
                                                                     ("norm", "mlp_norm", d, None)]
    return [("embed", "tok_embeddings", V * d, None)] + block * L + [("norm", "norm", d, None), head]


def _symbols():
    from ..core.symbols import F, L, V, d
    return d, F, V, L


def load_trace(lora_ledger, library: str) -> tuple:
    """(events, {step tensor name: its bytes}) of loading ``lora_ledger``'s model as ``library`` (one of
    :data:`LIBRARY_LOADS`) does; the kept blocks are tagged by :data:`STEP_TENSORS` key and their parts sum to the
    step's rows. ``ValueError`` in one line for a setup the trace does not model."""
    if library not in LIBRARY_LOADS:
        raise ValueError(f"load must be one of {', '.join(LIBRARY_LOADS)}, got {library!r}")
    arch, config = lora_ledger.arch, lora_ledger.config
    check_layers_one_by_one(arch.n_layers, f"--load {library}'s trace (module by module)")
    if arch.style != "llama":
        raise ValueError(f"--load {library}: the trace models LLaMA-style models (both libraries' LLaMA builders), "
                         f"got a {arch.style} block")
    if config.base not in ("bf16", "nf4"):
        raise ValueError(f"--load {library}: the trace models a BF16 or NF4 base, got {config.base}")
    nf4 = config.base == "nf4"
    chunked = library != "torchtune-0914d5c"
    swap = library == "litgpt"
    library = "torchtune" if library.startswith("torchtune") else "litgpt"
    t = _Trace()
    kept = []                                       # (tag, key)
    for kind, _, n, adapters in _modules(arch, config, library):
        if kind == "proj" and nf4:
            w = t.alloc(2 * n)                      # the BF16 weight, built on the device
            if library == "torchtune":
                parts = _to_nf4(t, n, keep=True, chunked=chunked)
                if not chunked:                     # 0914d5c: the nn.Linear is local to _create_weight_and_bias
                    t.free(w)
            else:
                half = t.alloc(2 * n)               # .to(device, dtype=torch.half)
                parts = _quantize_4bit(t, n, config.double_quant)
                t.free(half)
                t.free(w)
            kept += [(key.split(":")[1], key) for key in parts]
            kept += [("adapters", t.alloc(2 * r * (i + o), "adapters")) for r, i, o in adapters]
            if library == "torchtune" and chunked:
                t.free(w)                           # the nn.Linear dies when LoRALinear.__init__ returns
        else:
            kept.append(("base", t.alloc(2 * n, "base")))
            kept += [("adapters", t.alloc(2 * r * (i + o), "adapters")) for r, i, o in adapters or ()]
    if swap and nf4:                                # StableEmbedding: a second embedding, the old one kept
        t.alloc(2 * int(arch.evaluate(_symbols()[2] * _symbols()[0])))
    if nf4:                                         # load_state_dict: each NF4 weight quantized again
        for kind, _, n, _ in _modules(arch, config, library):
            if kind != "proj":
                continue
            if library == "torchtune" and chunked:
                copy_in = t.alloc(2 * n)            # copy_in.to(original.device)
                new = _to_nf4(t, n, keep=False)
                t.free(*new, copy_in)               # copied into the parameter's parts, then dropped
            elif library == "torchtune":            # 0914d5c's copy_: the new parts replace the parameter's
                copy_in = t.alloc(2 * n)
                new = _to_nf4(t, n, keep=True, chunked=False)
                old = [k for tag, k in kept if tag in ("packed", "scalers")][:len(new)]
                t.free(copy_in, *old)
                kept = [(tag, k) for tag, k in kept if k not in old] + [(k.split(":")[1], k) for k in new]
            else:
                half = t.alloc(2 * n)
                new = _quantize_4bit(t, n, config.double_quant)
                old = [k for tag, k in kept if tag in ("packed", "scalers", "absmax")][:len(new)]
                t.free(half)
                t.free(*old)                        # the new parameter replaces the old
                kept = [(tag, k) for tag, k in kept if k not in old] + [(k.split(":")[1], k) for k in new]
    return t.events, kept


def trace_peak(events) -> int:
    """The largest live total of a trace (bytes, unrounded)."""
    live, sizes, peak = 0, {}, 0
    for event in events:
        if event[0] == "alloc":
            sizes[event[1]] = event[2]
            live += event[2]
            peak = max(peak, live)
        else:
            live -= sizes.pop(event[1])
    return peak
