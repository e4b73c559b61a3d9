"""A torchtitan training config (``train_configs/*.toml``): FSDP2 over the data-parallel ranks, its precision,
recomputation and optimizer.

Defaults as torchtitan's own config classes give them (pytorch/torchtitan at b5bcd76c,
``torchtitan/config/configs.py``: ``mixed_precision_param`` bfloat16 (line 94), ``mixed_precision_reduce`` float32
(line 102), ``fsdp_reshard_after_forward`` "default" (line 145); ``torchtitan/components/optimizer/optimizer.py``
lines 109-111: ``implementation`` "fused"). ``data_parallel_shard_degree = -1`` takes every GPU the others leave,
so the world size (``torchrun``'s ``--nproc_per_node`` times the nodes) is needed: ``memledger check --gpus N``.
FSDP2 keeps FP32 shards and gathers BF16 copies: memledger's ``--framework fsdp2`` (``fp32-adamw`` states).
"""


__all__ = ["is_torchtitan", "read_torchtitan"]

FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama2", "7B"): "llama2-7b", ("llama2", "13B"): "llama2-13b"}
IGNORED_PREFIXES = ("job.", "profiling.", "metrics.", "lr_scheduler.", "checkpoint.", "float8.", "comm.",
                    "experimental.", "validation.", "memory_estimation.", "fault_tolerance.")
IGNORED = {"optimizer.lr", "optimizer.eps", "optimizer.weight_decay", "optimizer.beta1", "optimizer.beta2",
           "training.steps", "training.max_norm", "training.dataset", "training.dataset_path", "training.seed",
           "training.deterministic", "training.warmup_steps", "model.tokenizer_path", "model.hf_assets_path",
           "training.gc_freq", "parallelism.pipeline_parallel_schedule", "training.global_batch_size"}


def is_torchtitan(flat: dict) -> bool:
    return "model.name" in flat and "model.flavor" in flat


def read_torchtitan(intake, name: str, flat: dict, gpus) -> None:
    seen = set()

    def take(key, default=None):
        seen.add(key)
        return flat.get(key, default)
    model = (take("model.name"), str(take("model.flavor")))
    if model in FLAVORS:
        intake.option(name, "model.flavor", "/".join(model), "--preset", FLAVORS[model])
    else:
        intake.refuse(name, "model.flavor", "/".join(model), f"no preset holds torchtitan's {'/'.join(model)}; "
                      f"presets for {', '.join('/'.join(k) for k in FLAVORS)}")
    intake.option(name, "(torchtitan)", "CUDA", "--backend", "cuda", "--framework", "fsdp2", "--recipe", "fp32-adamw",
                  why="FSDP2 on every block and the root: FP32 shards, AdamW on them; torchtitan's RMSNorm is "
                      "torch.nn.RMSNorm, fused on CUDA")
    batch = take("training.local_batch_size", take("training.batch_size"))
    if batch is not None:
        intake.option(name, "training.batch_size", batch, "--batch", batch)
    seq = take("training.seq_len")
    intake.option(name, "training.seq_len", seq, "--seq", seq) if seq is not None else \
        intake.default(name, "training.seq_len", "torchtitan's default", "--seq", 2048)
    param, reduce = take("training.mixed_precision_param", "bfloat16"), take("training.mixed_precision_reduce",
                                                                            "float32")
    short = {"bfloat16": "bf16", "float32": "fp32"}
    if param in short and reduce in short:
        intake.option(name, "training.mixed_precision_param", param, "--fsdp-param-dtype", short[param],
                      "--fsdp-reduce-dtype", short[reduce])
    else:
        intake.refuse(name, "training.mixed_precision_param", param, "expected bfloat16 or float32")
    _parallel(intake, name, take, gpus)
    mode = take("activation_checkpoint.mode", "selective")
    option = str(take("activation_checkpoint.selective_ac_option", "2"))
    if mode == "full":
        intake.option(name, "activation_checkpoint.mode", mode, "--recompute", "full")
    elif mode == "none":
        intake.option(name, "activation_checkpoint.mode", mode, "--recompute", "none")
    else:
        intake.refuse(name, "activation_checkpoint.mode", f"{mode} ({option})", "torchtitan's selective "
                      "checkpointing (an op policy, or every k-th layer) is not memledger's selective recomputation "
                      "(the attention core); not modelled yet")
    implementation = take("optimizer.implementation", "fused")
    optimizer = take("optimizer.name", "AdamW")
    if optimizer not in ("AdamW", "Adam"):
        intake.refuse(name, "optimizer.name", optimizer, "memledger models AdamW")
    flag = {"fused": "--fused", "foreach": "--foreach", "for-loop": "--no-foreach"}.get(implementation)
    if flag:
        intake.option(name, "optimizer.implementation", implementation, flag,
                      why="torchtitan's default is fused" if "optimizer.implementation" not in flat else "")
    else:
        intake.refuse(name, "optimizer.implementation", implementation, "not modelled")
    if take("training.compile"):
        intake.refuse(name, "training.compile", True, "compiled graphs' transients are not modelled in the step")
    intake.rest(name, flat, seen, lambda key: key in IGNORED or key.startswith(IGNORED_PREFIXES))


def _parallel(intake, name, take, gpus):
    shard = take("parallelism.data_parallel_shard_degree", -1)
    replicate = take("parallelism.data_parallel_replicate_degree", 1)
    tp = take("parallelism.tensor_parallel_degree", 1)
    pp, cp = take("parallelism.pipeline_parallel_degree", 1), take("parallelism.context_parallel_degree", 1)
    for key, value in (("pipeline_parallel_degree", pp), ("context_parallel_degree", cp)):
        if value != 1:
            intake.refuse(name, f"parallelism.{key}", value, "not modelled with FSDP2 in the step")
    if shard == -1:
        if gpus is None:
            intake.refuse(name, "parallelism.data_parallel_shard_degree", -1, "-1: every GPU the other degrees "
                          "leave; give the run's GPU count, memledger check --gpus N")
            return
        shard = gpus // (replicate * tp * pp * cp)
    if replicate != 1:
        intake.refuse(name, "parallelism.data_parallel_replicate_degree", replicate, "HSDP from torchtitan's config "
                      "is not read yet (memledger step --dp-replicate R models it)")
    intake.option(name, "parallelism.data_parallel_shard_degree", shard, "--dp", shard,
                  *(("--tp", tp) if tp > 1 else ()))
    reshard = take("parallelism.fsdp_reshard_after_forward", "default")
    if reshard == "never":
        intake.option(name, "parallelism.fsdp_reshard_after_forward", reshard, "--no-reshard-after-forward")
    else:
        intake.option(name, "parallelism.fsdp_reshard_after_forward", reshard,
                      why="every unit resharded (torchtitan's default keeps the last block gathered, a few hundred "
                          "megabytes memledger does not book yet)")
