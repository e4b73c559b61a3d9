"""A DeepSpeed config (``ds_config.json``): its ZeRO stage, offloading, buckets and micro-batch.

Keys and defaults as DeepSpeed reads them (``deepspeed/runtime/zero/config.py``, ``deepspeed/runtime/config.py``):
``train_micro_batch_size_per_gpu``; ``zero_optimization.stage`` (0 when absent); ``offload_optimizer.device`` and
``offload_param.device`` (``none``, ``cpu``, ``nvme``); ``reduce_bucket_size``, ``stage3_prefetch_bucket_size``,
``stage3_max_live_parameters``, ``stage3_param_persistence_threshold``, ``contiguous_gradients``,
``overlap_comm``; ``bf16.enabled`` (BF16 weights with FP32 masters in the optimizer). The value ``"auto"`` is
filled in by the Hugging Face integration from its own arguments, which this file does not hold.
"""


__all__ = ["is_deepspeed", "read_deepspeed"]

BUCKETS = {"zero_optimization.reduce_bucket_size": "--deepspeed-reduce-bucket-size",
           "zero_optimization.stage3_prefetch_bucket_size": "--deepspeed-prefetch-bucket-size",
           "zero_optimization.stage3_max_live_parameters": "--deepspeed-max-live-parameters",
           "zero_optimization.stage3_param_persistence_threshold": "--deepspeed-param-persistence-threshold"}
IGNORED_PREFIXES = ("optimizer.params.", "scheduler.", "tensorboard.", "wandb.", "csv_monitor.", "comms_logger.",
                    "flops_profiler.", "aio.")
IGNORED = {"gradient_accumulation_steps", "train_batch_size", "gradient_clipping", "steps_per_print",
           "wall_clock_breakdown", "zero_optimization.allgather_partitions", "zero_optimization.reduce_scatter",
           "zero_optimization.allgather_bucket_size", "zero_optimization.round_robin_gradients",
           "zero_optimization.stage3_gather_16bit_weights_on_model_save", "zero_optimization.offload_optimizer.pin_memory",
           "zero_optimization.offload_param.pin_memory", "zero_allow_untested_optimizer", "prescale_gradients",
           "optimizer.type", "scheduler.type", "fp16.enabled", "bf16.enabled", "zero_optimization.offload_param.nvme_path",
           "zero_optimization.offload_optimizer.nvme_path", "zero_optimization.offload_param.buffer_count",
           "zero_optimization.offload_param.buffer_size", "zero_optimization.offload_param.max_in_cpu",
           "zero_optimization.offload_optimizer.buffer_count", "zero_optimization.offload_optimizer.fast_init",
           "zero_optimization.offload_optimizer.pipeline_read", "zero_optimization.offload_optimizer.pipeline_write"}


def is_deepspeed(flat: dict) -> bool:
    return any(k.startswith("zero_optimization") or k.startswith("train_micro_batch_size_per_gpu") for k in flat)


#: DeepSpeed's defaults that its buffers, as memledger books them, assume (deepspeed/runtime/zero/config.py).
DEFAULTS = {"zero_optimization.sub_group_size": 1e9, "zero_optimization.stage3_max_reuse_distance": 1e9}


def read_deepspeed(intake, name: str, flat: dict, gpus=None) -> None:
    seen = set()

    def take(key):
        seen.add(key)
        return flat.get(key)
    intake.option(name, "(the file)", "DeepSpeed", "--framework", "deepspeed", *(("--dp", gpus) if gpus else ()),
                  why="DeepSpeed's engine and buffers" + (f", over {gpus} GPUs (--gpus)" if gpus else ""))
    for key, default in DEFAULTS.items():
        value = take(key)
        if value is not None and float(value) != default:
            intake.refuse(name, key, value, f"memledger books DeepSpeed's buffers at its default, {default:g}")
        elif value is not None:
            intake.ignore(name, key, value, "DeepSpeed's default, which memledger's DeepSpeed buffers assume")
    batch = take("train_micro_batch_size_per_gpu")
    if batch == "auto":
        intake.refuse(name, "train_micro_batch_size_per_gpu", batch, '"auto": filled in by the Hugging Face '
                      "Trainer from per_device_train_batch_size; give that file too")
    elif batch is not None:
        intake.option(name, "train_micro_batch_size_per_gpu", batch, "--batch", batch)
    stage = take("zero_optimization.stage")
    intake.option(name, "zero_optimization.stage", stage, "--zero", stage or 0) if stage is not None else \
        intake.default(name, "zero_optimization.stage", "0: DeepSpeed's default", "--zero", 0)
    for part, flag in (("offload_optimizer", "--offload-optimizer"), ("offload_param", "--offload-params")):
        device = take(f"zero_optimization.{part}.device")
        if device in ("cpu", "nvme"):
            intake.option(name, f"zero_optimization.{part}.device", device, flag, device)
        elif device is not None:
            intake.ignore(name, f"zero_optimization.{part}.device", device, "not offloaded")
    for key, flag in BUCKETS.items():
        value = take(key)
        if value == "auto":
            intake.refuse(name, key, value, '"auto": sized by the Hugging Face integration from the model (hidden '
                          "size squared); give a number")
        elif value is not None:
            intake.option(name, key, value, flag, int(float(value)))
    contiguous = take("zero_optimization.contiguous_gradients")
    if contiguous is False:
        intake.option(name, "zero_optimization.contiguous_gradients", False, "--deepspeed-no-contiguous-gradients")
    elif contiguous is not None:
        intake.ignore(name, "zero_optimization.contiguous_gradients", contiguous, "DeepSpeed's default (on)")
    overlap = take("zero_optimization.overlap_comm")
    if overlap is not None:
        intake.option(name, "zero_optimization.overlap_comm", overlap, "--deepspeed-overlap-comm",
                      "true" if overlap else "false")
    bf16, fp16 = flat.get("bf16.enabled"), flat.get("fp16.enabled")
    if fp16 is True:
        intake.refuse(name, "fp16.enabled", fp16, "DeepSpeed's FP16 with loss scaling is not modelled (BF16 is)")
    elif bf16 is True or bf16 == "auto":
        intake.option(name, "bf16.enabled", bf16, "--recipe", "bf16-adamw",
                      why="BF16 weights and gradients, FP32 masters and Adam's moments in the optimizer")
    seen |= {"bf16.enabled", "fp16.enabled"}
    intake.rest(name, flat, seen, lambda key: key in IGNORED or key.startswith(IGNORED_PREFIXES + ("fp16.", "bf16.")))
