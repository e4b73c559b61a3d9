"""The peak of a whole run: loading the weights, then the steps (``--measure run``).

A run's peak can come before the first step: a checkpoint loaded beside the model, a full model loaded on every
rank before FSDP2 shards it. :func:`run_phases` books each loading phase in live bytes (what MemTracker counts,
the ledger's overhead row beside them, as in the step) and the step's peak; the run's peak is the largest, and the
verdict names its phase. The loading path is an option (``--load``); its default is what the real tool does:

* ``from-pretrained`` (the default; transformers 5.25 ``from_pretrained``): the model is built on the meta device
  (``modeling_utils.py`` lines 3844-3849, ``init_contexts`` with ``torch.device("meta")``) and each checkpoint
  tensor is materialized once, moved and cast in one ``tensor.to(device=device, dtype=dtype)``
  (``core_model_loading.py`` lines 1462-1467, ``_materialize_copy``; the dtype chosen at lines 1919-1928, the
  checkpoint's own with ``dtype="auto"``, the default since 5.0, ``modeling_utils.py`` lines 4236-4237). A
  blocking host-to-device copy with a cast casts on the host ("For blocking transfers conversions are performed on
  CPU to avoid allocating extra GPU memory", ``copy_kernel_cuda()`` in ``aten/src/ATen/native/cuda/Copy.cu``, PyTorch
  ``007aa8aee7ee70454229698ca4b2e45283f15239``), so the GPU only ever holds the weights in their final dtype: the
  loading phase is the model's weights (the step's ``param`` rows), never above the step's start. Measured on the CPU
  (transformers 5.25, PyTorch 2.13.0; a 6-layer LLaMA of 5,258,496 parameters saved in FP32, loaded with
  ``dtype=torch.bfloat16`` under a dispatch mode): 57 ``aten._to_copy`` FP32 -> BF16, one per parameter, covering
  exactly the 5,258,496 elements, and no other copy of a weight. With
  on-the-fly quantization (bitsandbytes NF4) transformers loads one tensor at a time ("to avoid worker threads loading
  full-precision tensors to GPU faster than the main thread can quantize them", lines 1862-1872): each projection's
  weight is materialized in BF16 on the GPU (the dtype asked for, lines 1911-1928) and quantized there
  (``integrations/bitsandbytes.py`` line 58, ``Params4bit(value, ...).to(value.device)``); bitsandbytes'
  ``quantize_4bit`` keeps the FP32 absmax (one per 64 weights) until its 8-bit copy is made (``compress_statistics``:
  ``offset = absmax.mean(); absmax -= offset; qabsmax, state2 = quantize_blockwise(...); del absmax``). So
  :func:`lora_run_phases` books, for the LoRA/QLoRA step, the frozen base as loaded (its ``frozen`` rows) plus the
  BF16 weight and FP32 absmax of the largest quantized projection: an upper bound by at most the weights loaded
  after it (transformers loads in natural key order, the last block's attention projections after its MLP's).
* ``state-dict``: ``model.load_state_dict(torch.load(path, map_location="cuda"))``: the whole state dict is on the
  GPU beside the model, whose parameters it is copied into in place (``torch/nn/modules/module.py`` line 2495,
  ``param.copy_(input_param)``, PyTorch 2.13.0): twice the weights until the state dict is dropped.

Under ``--framework fsdp2`` either path loads the full (unsharded) model on every rank first; ``fully_shard`` then
copies each parameter's shard into a new padded tensor (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py`` line
307, ``param_data.new_zeros(padded_sharded_size)``, PyTorch 2.13.0) and swaps it in (line 331), freeing the full
parameter: the phase's peak is the full model, in the parameters' dtype (FP32 under ``fp32-adamw``, BF16 under
``bf16-pure-adamw``), plus the shard being made (at most a rank's share of one parameter, not booked). torchtitan
avoids this (meta init, then a distributed checkpoint); ``--load`` describes a script that loads the whole model.

Refused in one line: ZeRO stage 3 and tensor parallelism (each loads and partitions in its own way, not modelled),
and frameworks other than plain and fsdp2.
"""
__all__ = ["LOADS", "RunPeak", "lora_run_phases", "run_phases"]

#: ``--load``: the loading paths, the default first; the libraries' (a LoRA/QLoRA step's, as an allocation trace:
#: :mod:`memledger.ledger.library_loading`) after them.
LOADS = ("from-pretrained", "state-dict", "torchtune", "torchtune-0914d5c", "litgpt", "litgpt-00af8b0")
LIBRARY = LOADS[2:]
#: Bytes per parameter of the model FSDP2 shards, by its recipe.
FSDP2_PARAM_BYTES = {"fp32-adamw": 4, "bf16-pure-adamw": 2}


class RunPeak:
    """The phases of a run and their live bytes (the overhead row included): ``phases`` [(phase, bytes, what)];
    ``judged`` the largest, ``phase`` its name."""

    def __init__(self, phases: list, load: str):
        self.phases, self.load = phases, load

    @property
    def judged(self) -> int:
        return max(b for _, b, _ in self.phases)

    @property
    def phase(self) -> str:
        return max(self.phases, key=lambda p: p[1])[0]

    def to_dict(self) -> dict:
        return {"load": self.load, "phase_of_peak": self.phase, "run_peak": self.judged,
                "phases": [{"phase": p, "bytes": b, "what": w} for p, b, w in self.phases]}


def _weights(ledger) -> int:
    """The model's weights as the step holds them on one GPU (its ``param`` rows)."""
    return sum(r.bytes for r in ledger.rows if r.role == "param" and r.device == "gpu")


def run_phases(ledger, load: str = LOADS[0], step_peak: int = None) -> RunPeak:
    """The loading phases of ``ledger``'s run by ``load`` (:data:`LOADS`), then the step (``step_peak``, the step's
    peak with the overhead row; ``ledger.peak`` where not given). ``ValueError`` in one line for a setup whose loading
    is not modelled."""
    if load not in LOADS:
        raise ValueError(f"load must be one of {', '.join(LOADS)}, got {load!r}")
    if load in LIBRARY:
        raise ValueError(f"--load {load} models that library's LoRA/QLoRA recipe: give --lora-rank or --qlora")
    if ledger.arch is None:
        raise ValueError("--measure run needs an architecture: the step is one of the run's phases")
    if ledger.framework not in ("plain", "fsdp2"):
        raise ValueError(f"--measure run is not modelled under --framework {ledger.framework}: how it loads and "
                         "partitions the weights is its own; use --measure peak")
    if ledger.tp > 1 or ledger.zero_stage == 3:
        raise ValueError("--measure run is not modelled with tensor parallelism or ZeRO stage 3: they partition the "
                         "weights as they load them, not modelled; use --measure peak")
    overhead = ledger.overhead_bytes
    if ledger.framework == "fsdp2":
        if ledger.recipe not in FSDP2_PARAM_BYTES:
            raise ValueError(f"--measure run: recipe {ledger.recipe} under fsdp2 is not modelled")
        weights = ledger.params * FSDP2_PARAM_BYTES[ledger.recipe]
        where = "the full model on this rank before fully_shard"
    else:
        weights = _weights(ledger)
        where = "the model's weights on the GPU, in their dtype"
    phases = [("load", weights + overhead, where)]
    if load == "state-dict":
        phases.append(("load state dict", 2 * weights + overhead,
                       "the model and the state dict torch.load put on the GPU (load_state_dict copies in place)"))
    peak = ledger.peak if step_peak is None else step_peak
    if peak is None:
        raise ValueError("--measure run: the step timeline does not model this setup")
    phases.append(("step", peak, "the training step's peak (the overhead row included)"))
    return RunPeak(phases, load)


def lora_run_phases(lora_ledger, step_peak: int, load: str = LOADS[0]) -> RunPeak:
    """The run of a LoRA or QLoRA step (:class:`memledger.ledger.lora.LoraLedger`) loaded by transformers'
    ``from_pretrained`` (only that path: PEFT wraps a model from_pretrained loaded): the frozen base as loaded, with
    NF4 the moment its largest projection is quantized, then the step (``step_peak``). The adapters come after
    loading (``get_peft_model``) and are the step's."""
    from ..models.tensors import PROJECTIONS, parameter_tensors
    from ..states.bnb import BLOCKSIZE
    if load not in LOADS:
        raise ValueError(f"load must be one of {', '.join(LOADS)}, got {load!r}")
    if load == "state-dict":
        raise ValueError(f"--measure run with LoRA models --load {', '.join(LOADS[:1] + LIBRARY)} (PEFT wraps a "
                         "from_pretrained model)")
    arch, config = lora_ledger.arch, lora_ledger.config
    overhead = lora_ledger.overhead_bytes
    if load in LIBRARY:
        from .library_loading import load_trace, trace_peak
        events, _ = load_trace(lora_ledger, load)
        return RunPeak([("load", trace_peak(events) + overhead, f"building and loading the model as {load} does, "
                         "its largest live total (memledger.ledger.library_loading)"),
                        ("step", step_peak, "the training step's peak (the overhead row included)")], load)
    base = sum(r.bytes for r in lora_ledger.rows if r.name.startswith("frozen"))
    phases = [("load", base + overhead, "the frozen base as loaded (from_pretrained)")]
    if config.base == "nf4":
        n = max(arch.evaluate(_prod(t.shape)) for t in parameter_tensors(arch.features)
                if t.module in PROJECTIONS[arch.style] and t.name == "weight")
        absmax = 4 * -(-n // BLOCKSIZE) if config.double_quant else 0
        phases.insert(0, ("quantize at load", base + 2 * n + absmax + overhead,
                          f"the base as loaded, and the largest projection ({n:,} weights) in BF16 beside its NF4 "
                          "copy" + (" and its FP32 absmax" if absmax else "")))
    phases.append(("step", step_peak, "the training step's peak (the overhead row included)"))
    return RunPeak(phases, load)


def _prod(shape):
    import sympy as sp
    return sp.prod(shape)
