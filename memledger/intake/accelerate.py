"""An accelerate config (``accelerate launch --config_file <file>``; ``examples/config_yaml_templates`` in
huggingface/accelerate at 16cb6eb8): the distributed type, the process count and, for FSDP, its plugin's keys.

``distributed_type``: ``NO`` (one GPU), ``MULTI_GPU`` (DDP), ``FSDP`` (``fsdp_config``; ``fsdp_version: 2`` is
PyTorch's ``fully_shard``, which memledger models; version 1's flat parameters are not), ``DEEPSPEED``
(``deepspeed_config.deepspeed_config_file``: give that JSON file too). ``mixed_precision: bf16`` is autocast over
FP32 weights outside FSDP (not modelled), and under FSDP2 a ``MixedPrecisionPolicy`` with BF16 compute.
"""


__all__ = ["is_accelerate", "read_accelerate"]

IGNORED = {"compute_environment", "debug", "machine_rank", "main_training_function", "rdzv_backend",
           "same_network", "tpu_env", "tpu_use_cluster", "tpu_use_sudo", "use_cpu", "downcast_bf16", "gpu_ids",
           "main_process_ip", "main_process_port", "enable_cpu_affinity", "num_machines",
           "fsdp_config.fsdp_state_dict_type", "fsdp_config.fsdp_sync_module_states", "fsdp_config.fsdp_use_orig_params",
           "fsdp_config.fsdp_cpu_ram_efficient_loading", "fsdp_config.fsdp_forward_prefetch",
           "fsdp_config.fsdp_backward_prefetch", "fsdp_config.fsdp_auto_wrap_policy",
           "fsdp_config.fsdp_transformer_layer_cls_to_wrap", "deepspeed_config.zero3_init_flag",
           "deepspeed_config.deepspeed_config_file"}


def is_accelerate(flat: dict) -> bool:
    return "distributed_type" in flat


def read_accelerate(intake, name: str, flat: dict) -> None:
    seen = {"distributed_type", "num_processes", "mixed_precision"}
    kind = str(flat["distributed_type"]).upper()
    processes = flat.get("num_processes", 1)
    precision = flat.get("mixed_precision", "no")
    if kind == "FSDP":
        version = flat.get("fsdp_config.fsdp_version", 1)
        seen.add("fsdp_config.fsdp_version")
        if version != 2:
            intake.refuse(name, "fsdp_config.fsdp_version", version, "FSDP1's flat parameters are not modelled; "
                          "fsdp_version: 2 is PyTorch's fully_shard, which is")
        else:
            intake.option(name, "distributed_type", kind, "--framework", "fsdp2", "--recipe", "fp32-adamw",
                          why="fully_shard on every block and the root, FP32 shards")
        intake.option(name, "num_processes", processes, "--dp", processes)
        if precision == "bf16":
            intake.option(name, "mixed_precision", precision, "--fsdp-param-dtype", "bf16")
        elif precision in ("no", None):
            intake.option(name, "mixed_precision", precision, "--fsdp-param-dtype", "fp32")
        else:
            intake.refuse(name, "mixed_precision", precision, "memledger models bf16 and no under FSDP2")
        for key, flag in (("fsdp_config.fsdp_offload_params", "--fsdp-cpu-offload"),
                          ("fsdp_config.fsdp_activation_checkpointing", None),
                          ("fsdp_config.fsdp_reshard_after_forward", None)):
            seen.add(key)
            value = flat.get(key)
            if value is None:
                continue
            if key.endswith("activation_checkpointing"):
                intake.option(name, key, value, "--recompute", "full" if value else "none")
            elif key.endswith("reshard_after_forward"):
                if value in (False, "false", "NO_SHARD", "SHARD_GRAD_OP"):
                    intake.option(name, key, value, "--no-reshard-after-forward")
                else:
                    intake.ignore(name, key, value, "resharded after forward, memledger's default")
            elif value:
                intake.option(name, key, value, flag)
            else:
                intake.ignore(name, key, value, "off")
        strategy = flat.get("fsdp_config.fsdp_sharding_strategy")
        seen.add("fsdp_config.fsdp_sharding_strategy")
        if strategy not in (None, "FULL_SHARD", 1):
            intake.refuse(name, "fsdp_config.fsdp_sharding_strategy", strategy, "memledger models FULL_SHARD")
    elif kind in ("NO", "MULTI_GPU"):
        if kind == "MULTI_GPU":
            intake.option(name, "distributed_type", kind, "--framework", "ddp",
                          why="DistributedDataParallel on every process")
            intake.option(name, "num_processes", processes, "--dp", processes)
        else:
            intake.ignore(name, "distributed_type", kind, "one process, one GPU")
            if "num_processes" in flat:
                intake.ignore(name, "num_processes", processes, "one process")
        if precision in ("bf16", "fp16"):
            intake.refuse(name, "mixed_precision", precision, "accelerate's autocast over FP32 weights: BF16 autocast "
                          "is not modelled (memledger models FP16 autocast only as fp16-amp-adamw)")
        else:
            intake.option(name, "mixed_precision", precision, "--recipe", "fp32-adamw")
    elif kind == "DEEPSPEED":
        intake.option(name, "distributed_type", kind, why="the ZeRO stage and buffers come from DeepSpeed's own JSON "
                      "(deepspeed_config.deepspeed_config_file): give that file too")
        intake.option(name, "num_processes", processes, "--dp", processes)
        if "mixed_precision" in flat:
            intake.ignore(name, "mixed_precision", precision, "DeepSpeed's JSON sets its precision")
    else:
        intake.refuse(name, "distributed_type", kind, "memledger models NO, MULTI_GPU, FSDP (version 2) and DEEPSPEED")
    intake.rest(name, flat, seen, lambda key: key in IGNORED or key.startswith(("tpu_", "dynamo_config.")))
