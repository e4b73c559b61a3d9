"""A torchtune recipe config (``tune run <recipe> --config <file> key=value ...``) as memledger's options.

torchtune builds each object from a ``_component_`` path and reads the rest with ``cfg.get(key, default)`` in
its recipes (``recipes/full_finetune_single_device.py``, ``recipes/lora_finetune_single_device.py``, pytorch/torchtune
at bd2a0fc7): ``dtype`` (lines 126 and 140), ``enable_activation_checkpointing`` and
``enable_activation_offloading`` (default False, lines 166-171 and 180-185), ``optimizer_in_bwd`` (default False),
``compile`` (default False), ``cfg.batch_size`` and ``tokenizer.max_seq_len`` (the longest sequence the tokenizer
keeps; ``null``: as long as the data's). Its models run on CUDA with PyTorch's defaults there (SDPA's flash
kernel, ``AdamW()``'s ``foreach``) and a composite RMSNorm: ``torchtune/modules/rms_norm.py`` upcasts its input to
FP32 before ``F.rms_norm``, so no fused kernel runs (``--rmsnorm composite``).
"""
from .models import torchtune_model

__all__ = ["IGNORED_PREFIXES", "read_torchtune"]

#: Keys whose whole subtree has no effect on a training step's memory (logging, data sources, checkpoint files,
#: schedules, the profiler's switches, evaluation).
IGNORED_PREFIXES = ("checkpointer.", "metric_logger.", "profiler.", "lr_scheduler.", "dataset_val.", "tokenizer.")
IGNORED = {
    "output_dir", "seed", "shuffle", "epochs", "max_steps_per_epoch", "log_every_n_steps", "log_peak_memory_stats",
    "log_level", "resume_from_checkpoint", "save_adapter_weights_only", "run_val_every_n_steps", "batch_size_val",
    "save_every_n_steps", "collate_fn", "enable_async_checkpointing", "cudnn_deterministic_mode", "low_cpu_ram",
    "optimizer.lr", "optimizer.weight_decay", "optimizer.betas", "optimizer.eps", "optimizer.amsgrad",
    "model.lora_alpha", "dataset._component_", "dataset.split", "dataset.source", "dataset.data_files",
    "dataset.column_map", "dataset.train_on_input", "dataset.new_system_prompt", "dataset.template",
    "dataset.field", "dataset.conversation_column", "dataset.conversation_style", "dataset.partition",
    "profiler", "lr_scheduler", "device",
}
#: torchtune's projection names in ``lora_attn_modules`` -> memledger's (Hugging Face's).
ATTENTION = {"q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj", "output_proj": "o_proj"}
MLP = ("gate_proj", "up_proj", "down_proj")         # apply_lora_to_mlp: w1, w3, w2


def is_torchtune(flat: dict) -> bool:
    return str(flat.get("model._component_", "")).startswith("torchtune.")


def read_torchtune(intake, name: str, flat: dict) -> None:
    """Read a torchtune config's flattened keys into ``intake``'s rows and options."""
    seen = set()

    def take(key):
        seen.add(key)
        return flat.get(key)
    component = take("model._component_")
    preset, adapters, note = torchtune_model(component)
    intake.option(name, "model._component_", component, "--preset", preset, why=note)
    intake.option(name, "device", flat.get("device", "cuda"), "--backend", "cuda", "--rmsnorm", "composite",
                  why="torchtune's models on CUDA: SDPA's flash kernel, AdamW's foreach, a composite RMSNorm "
                      "(torchtune/modules/rms_norm.py upcasts to FP32 before F.rms_norm)")
    seen.add("device")
    if flat.get("device", "cuda") not in ("cuda", None):
        intake.refuse(name, "device", flat["device"], "memledger judges a CUDA GPU")
    _workload(intake, name, flat, take)
    _precision(intake, name, flat, take, adapters)
    if adapters:
        _adapters(intake, name, flat, take, adapters)
    _knobs(intake, name, flat, take, adapters)
    intake.rest(name, flat, seen, lambda key: key in IGNORED or key.startswith(IGNORED_PREFIXES))


def _workload(intake, name, flat, take):
    batch = take("batch_size")
    if batch is not None:
        intake.option(name, "batch_size", batch, "--batch", batch)
    seq = take("tokenizer.max_seq_len")
    if seq is not None:
        intake.option(name, "tokenizer.max_seq_len", seq, "--seq", seq)
    else:
        intake.default(name, "tokenizer.max_seq_len", "null: as long as the data's; judged at memledger's default, "
                       "give tokenizer.max_seq_len=N for your longest sequence", "--seq", 2048)
    packed = take("dataset.packed")
    if packed:
        intake.refuse(name, "dataset.packed", packed, "packing's documents per row depend on the data (give "
                      "--packed N to memledger step); on CUDA torchtune masks them with a FlexAttention BlockMask, "
                      "which memledger does not model")
    elif packed is not None:
        intake.ignore(name, "dataset.packed", packed, "not packed: one sequence per row")


def _precision(intake, name, flat, take, adapters):
    dtype = take("dtype")
    optimizer = take("optimizer._component_")
    fused = take("optimizer.fused")
    foreach = take("optimizer.foreach")
    if dtype not in ("bf16", "fp32"):
        intake.refuse(name, "dtype", dtype, "memledger models torchtune's bf16 and fp32 runs")
        return
    pure = "bf16-pure-adamw" if dtype == "bf16" else "fp32-adamw"
    if adapters:
        intake.option(name, "dtype", dtype, "--recipe", pure, "--adapter-recipe", pure,
                      why="the frozen base and the adapters in the model's dtype, AdamW's moments too")
    elif optimizer in ("torch.optim.AdamW", "torch.optim.Adam", None):
        intake.option(name, "dtype", dtype, "--recipe", pure, why="weights, gradients and AdamW's moments all in "
                      f"{dtype.upper()}: torchtune keeps no FP32 master copy")
    if optimizer in ("torch.optim.AdamW", "torch.optim.Adam"):
        why = "Adam's state is AdamW's; weight decay adds none"
        if fused and not adapters:
            intake.option(name, "optimizer._component_", optimizer, "--fused", why=why + "; fused=True: one kernel")
        elif fused:
            intake.option(name, "optimizer._component_", optimizer, why=why + "; the adapters' fused step keeps no "
                          "temporaries, and the LoRA step books foreach's over the adapters' few megabytes")
        else:
            intake.option(name, "optimizer._component_", optimizer, why=why + "; foreach, AdamW()'s default on CUDA")
        for key, value in (("optimizer.fused", fused), ("optimizer.foreach", foreach)):
            if value is not None:
                intake.ignore(name, key, value, "read with optimizer._component_ above")
    elif optimizer in ("bitsandbytes.optim.PagedAdamW", "bitsandbytes.optim.PagedAdamW8bit",
                       "bitsandbytes.optim.AdamW8bit") and not adapters:
        eight = optimizer.endswith("8bit")
        flags = ["--recipe", "bf16-adam8bit-bnb-nomaster" if eight else "bf16-adamw32-bnb"]
        flags += ["--paged-optimizer"] if ".Paged" in optimizer else []
        intake.option(name, "optimizer._component_", optimizer, *flags,
                      why=f"bitsandbytes' {'8-bit' if eight else '32-bit'} AdamW on BF16 weights"
                          + (", its states paged (CUDA unified memory)" if ".Paged" in optimizer else ""))
        if dtype != "bf16":
            intake.refuse(name, "dtype", dtype, "bitsandbytes' optimizers are modelled on BF16 weights")
    else:
        intake.refuse(name, "optimizer._component_", optimizer, "memledger models torch.optim.AdamW/Adam and, for "
                      "full fine-tunes, bitsandbytes' PagedAdamW, PagedAdamW8bit and AdamW8bit")


def _adapters(intake, name, flat, take, adapters):
    modules = take("model.lora_attn_modules") or []
    if not isinstance(modules, list) or any(m not in ATTENTION for m in modules):
        intake.refuse(name, "model.lora_attn_modules", modules, f"expected a list of {', '.join(ATTENTION)}")
        modules = []
    targets = list(dict.fromkeys(ATTENTION[m] for m in modules))
    mlp, output = take("model.apply_lora_to_mlp"), take("model.apply_lora_to_output")
    targets += list(MLP) if mlp else []
    targets += ["lm_head"] if output else []
    rank = take("model.lora_rank")
    flags = (["--qlora"] if adapters == "qlora" else []) + ["--lora-rank", rank, "--lora-targets", ",".join(targets)]
    intake.option(name, "model.lora_attn_modules", modules, *flags,
                  why=f"{'QLoRA' if adapters == 'qlora' else 'LoRA'} adapters of rank {rank} on {', '.join(targets)}"
                      + ("; the base's projections in NF4 with double quantization" if adapters == "qlora" else ""))
    for key, value in (("model.apply_lora_to_mlp", mlp), ("model.apply_lora_to_output", output),
                       ("model.lora_rank", rank)):
        if value is not None:
            intake.ignore(name, key, value, "read with model.lora_attn_modules above")
    dropout = take("model.lora_dropout")
    if dropout:
        intake.option(name, "model.lora_dropout", dropout, "--lora-dropout", dropout)
    elif adapters == "qlora" or dropout is not None:
        intake.option(name, "model.lora_dropout", dropout, "--lora-dropout", 0,
                      why="no dropout on the adapters' input")


def _knobs(intake, name, flat, take, adapters):
    if take("enable_activation_checkpointing"):
        intake.option(name, "enable_activation_checkpointing", True, "--recompute", "full",
                      why="every layer checkpointed, non-reentrant")
    else:
        intake.default(name, "enable_activation_checkpointing", "off (False)", "--recompute", "none")
    offload = take("enable_activation_offloading")
    if offload and adapters:
        intake.refuse(name, "enable_activation_offloading", offload, "offloading a LoRA block's saved tensors (its "
                      "frozen and NF4 ones too) is not modelled")
    elif offload:
        intake.option(name, "enable_activation_offloading", offload, "--offload-activations")
    elif offload is not None:
        intake.ignore(name, "enable_activation_offloading", offload, "off")
    if take("optimizer_in_bwd"):
        intake.option(name, "optimizer_in_bwd", True, "--optimizer-in-backward")
    elif "optimizer_in_bwd" in flat:
        intake.ignore(name, "optimizer_in_bwd", False, "off")
    loss = take("loss._component_")
    chunks = take("loss.num_output_chunks")
    if loss == "torchtune.modules.loss.CEWithChunkedOutputLoss":
        intake.option(name, "loss._component_", loss, "--loss-chunks", chunks or 8,
                      why="the logits in chunks, each upcast to FP32 (num_output_chunks, default 8)")
    elif loss in ("torch.nn.CrossEntropyLoss", None):
        intake.ignore(name, "loss._component_", loss, "the plain cross-entropy, memledger's default")
    else:
        intake.refuse(name, "loss._component_", loss, "not modelled (memledger models torch.nn.CrossEntropyLoss "
                      "and CEWithChunkedOutputLoss)")
    compile_ = take("compile")
    if compile_:
        intake.refuse(name, "compile", compile_, "memledger's step does not model compiled graphs' transients (the "
                      "ledger's sum books what compiled blocks save: memledger ledger --compile)")
    elif compile_ is not None:
        intake.ignore(name, "compile", compile_, "off")
    for key, why in (("gradient_accumulation_steps", "gradients accumulate in place: the same peak"),
                     ("clip_grad_norm", "a norm per tensor and in-place scaling: bytes, not megabytes")):
        if key in flat:
            intake.ignore(name, key, take(key), why)
