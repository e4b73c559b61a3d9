"""Hugging Face files: a model's ``config.json``, a PEFT ``adapter_config.json``, a ``BitsAndBytesConfig`` and the
``TrainingArguments`` (or TRL's ``SFTConfig``) of a ``Trainer`` run, as JSON or YAML.

Defaults are transformers' own (``src/transformers/training_args.py``: ``per_device_train_batch_size`` 8,
``gradient_checkpointing`` False, ``optim`` ``adamw_torch_fused`` with PyTorch >= 2.8, else ``adamw_torch``), TRL's
(``SFTConfig.max_length`` 1024) and PEFT's (adapters in FP32, ``autocast_adapter_dtype=True``). The weights' dtype
is ``from_pretrained``'s ``torch_dtype``, which ``TrainingArguments`` does not hold: give it as
``torch_dtype=bfloat16`` (``model_init_kwargs.torch_dtype`` in an ``SFTConfig``). transformers' own model code
saves other tensors than memledger's reference decoder (its RMSNorm keeps FP32 copies: ``--rmsnorm composite``).
"""


__all__ = ["is_bnb", "is_model_config", "is_peft", "is_training_args", "read_bnb", "read_model_config", "read_peft",
           "read_training_args"]

PEFT_TARGETS = {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
OPTIMIZERS = {"adamw_torch": ("--foreach",), "adamw_torch_fused": ("--fused",), "adamw_hf": ("--no-foreach",),
              "paged_adamw_32bit": ("--recipe", "bf16-adamw32-bnb", "--paged-optimizer"),
              "paged_adamw_8bit": ("--recipe", "bf16-adam8bit-bnb-nomaster", "--paged-optimizer"),
              "adamw_bnb_8bit": ("--recipe", "bf16-adam8bit-bnb-nomaster")}
TRAINING_IGNORED = {
    "output_dir", "overwrite_output_dir", "learning_rate", "num_train_epochs", "max_steps", "lr_scheduler_type",
    "warmup_ratio", "warmup_steps", "weight_decay", "adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm",
    "logging_steps", "logging_dir", "logging_strategy", "logging_first_step", "save_steps", "save_strategy",
    "save_total_limit", "eval_strategy", "evaluation_strategy", "eval_steps", "per_device_eval_batch_size", "seed",
    "report_to", "run_name", "push_to_hub", "hub_model_id", "dataloader_num_workers", "dataloader_pin_memory",
    "remove_unused_columns", "group_by_length", "gradient_accumulation_steps", "do_train", "do_eval",
    "load_best_model_at_end", "metric_for_best_model", "greater_is_better", "dataset_text_field",
    "ddp_find_unused_parameters",
    "label_names", "disable_tqdm", "save_only_model", "tf32", "data_seed", "completion_only_loss", "assistant_only_loss",
    "dataset_num_proc", "neftune_noise_alpha", "use_liger_kernel", "log_level", "lr_scheduler_kwargs",
    "dataset_name", "dataset_config", "dataset_train_split", "dataset_test_split", "env"}


def is_model_config(flat: dict) -> bool:
    return "model_type" in flat and ("hidden_size" in flat or "n_embd" in flat or "d_model" in flat)


def is_peft(flat: dict) -> bool:
    return "peft_type" in flat


def is_bnb(flat: dict) -> bool:
    return flat.get("quant_method") == "bitsandbytes" or "load_in_4bit" in flat or "bnb_4bit_quant_type" in flat


def is_training_args(flat: dict) -> bool:
    return any(k in flat for k in ("per_device_train_batch_size", "gradient_checkpointing", "optim",
                                   "max_seq_length", "max_length", "model_name_or_path", "learning_rate"))


def read_model_config(intake, name: str, flat: dict, path: str) -> None:
    intake.option(name, "model_type", flat.get("model_type"), "--config", path,
                  why="the architecture this config.json describes")
    quant = {k[len("quantization_config."):]: v for k, v in flat.items() if k.startswith("quantization_config.")}
    if quant:
        read_bnb(intake, name + " (quantization_config)", quant)


def read_peft(intake, name: str, flat: dict) -> None:
    seen = {"peft_type", "r", "target_modules", "lora_dropout", "base_model_name_or_path"}
    if flat.get("peft_type") != "LORA":
        intake.refuse(name, "peft_type", flat.get("peft_type"), "memledger models LoRA adapters")
        return
    targets = flat.get("target_modules")
    if targets == "all-linear":
        targets = list(ALL_LINEAR)
    elif targets is None:       # PEFT's default for LLaMA-style models (src/peft/utils/constants.py, line 85)
        targets = ["q_proj", "v_proj"]
    if not isinstance(targets, list) or not targets or any(t not in PEFT_TARGETS for t in targets):
        intake.refuse(name, "target_modules", targets, f"memledger's projections are {', '.join(sorted(PEFT_TARGETS))}")
        targets = None
    rank = flat.get("r", 8)
    if targets:
        intake.option(name, "target_modules", flat.get("target_modules"), "--lora-rank", rank, "--lora-targets",
                      ",".join(targets), why="PEFT's adapters are FP32 by default (autocast_adapter_dtype=True)")
    dropout = flat.get("lora_dropout", 0.0)
    intake.option(name, "lora_dropout", dropout, "--lora-dropout", dropout or 0)
    seen.add("use_rslora")           # rsLoRA only rescales the adapters' output: no bytes
    base = flat.get("base_model_name_or_path")
    if base:
        from .models import local_config
        try:
            flag, value = local_config(base)
        except ValueError as e:
            intake.refuse(name, "base_model_name_or_path", base, str(e))
        else:
            intake.option(name, "base_model_name_or_path", base, flag, value)
    for key, why in (("use_dora", "DoRA's magnitude vectors and its weight norm are not modelled"),
                     ("modules_to_save", "fully trained extra modules are not modelled")):
        if flat.get(key):
            seen.add(key)
            intake.refuse(name, key, flat[key], why)
    intake.rest(name, flat, seen, lambda key: True)


def read_bnb(intake, name: str, flat: dict) -> None:
    if flat.get("load_in_8bit"):
        intake.refuse(name, "load_in_8bit", True, "LLM.int8 training is not modelled (memledger infer models it)")
        return
    if not flat.get("load_in_4bit"):
        intake.ignore(name, "load_in_4bit", flat.get("load_in_4bit"), "no 4-bit base")
        return
    kind = flat.get("bnb_4bit_quant_type", "fp4")
    if kind != "nf4":
        intake.refuse(name, "bnb_4bit_quant_type", kind, "memledger models NF4 (fp4 is bitsandbytes' default)")
        return
    double = flat.get("bnb_4bit_use_double_quant", False)
    intake.option(name, "load_in_4bit", True, "--qlora", *(() if double else ("--no-double-quant",)),
                  why="an NF4 base" + (" with double-quantized absmax" if double else ""))
    compute = flat.get("bnb_4bit_compute_dtype", "float32")
    if compute not in ("bfloat16", "torch.bfloat16"):
        intake.refuse(name, "bnb_4bit_compute_dtype", compute, "memledger models BF16 compute")
    intake.rest(name, flat, {"load_in_4bit", "bnb_4bit_quant_type", "bnb_4bit_use_double_quant",
                             "bnb_4bit_compute_dtype"}, lambda key: True)


def read_training_args(intake, name: str, flat: dict) -> None:
    seen = set()

    def take(key, default=None):
        seen.add(key)
        return flat.get(key, default)
    intake.option(name, "(transformers)", "Trainer", "--backend", "cuda", "--rmsnorm", "composite",
                  why="transformers' models on CUDA (its RMSNorm keeps FP32 copies: no fused kernel)")
    model = take("model_name_or_path")
    if model:
        from .models import local_config
        try:
            intake.option(name, "model_name_or_path", model, *local_config(str(model)))
        except ValueError as e:
            intake.refuse(name, "model_name_or_path", model, str(e))
    batch = take("per_device_train_batch_size")
    if batch is None:
        intake.default(name, "per_device_train_batch_size", "transformers' default, 8", "--batch", 8)
    else:
        intake.option(name, "per_device_train_batch_size", batch, "--batch", batch)
    seq = take("max_seq_length", take("max_length"))
    if seq is None:
        intake.default(name, "max_length", "TRL's SFTConfig default, 1024", "--seq", 1024)
    else:
        intake.option(name, "max_length", seq, "--seq", seq)
    if take("gradient_checkpointing"):
        kwargs = take("gradient_checkpointing_kwargs.use_reentrant")
        if kwargs is False:
            intake.option(name, "gradient_checkpointing", True, "--recompute", "full", why="non-reentrant")
        else:
            intake.refuse(name, "gradient_checkpointing", True, "transformers' reentrant checkpointing (its default "
                          "without gradient_checkpointing_kwargs={'use_reentrant': False}) is not modelled")
    dtype = take("torch_dtype", take("model_init_kwargs.torch_dtype", take("dtype")))
    if dtype in ("bfloat16", "torch.bfloat16", "bf16"):
        intake.option(name, "torch_dtype", dtype, "--recipe", "bf16-pure-adamw", "--adapter-recipe", "fp32-adamw",
                      why="weights loaded in BF16, AdamW's moments in their dtype; PEFT's adapters in FP32")
    elif dtype in ("float32", "torch.float32", "fp32"):
        intake.option(name, "torch_dtype", dtype, "--recipe", "fp32-adamw")
    else:
        intake.refuse(name, "torch_dtype", dtype, "the weights' dtype is from_pretrained's torch_dtype, which "
                      "TrainingArguments does not hold: give torch_dtype=bfloat16 or torch_dtype=float32")
    for key in ("bf16", "fp16"):
        value = take(key)
        if value and dtype not in ("bfloat16", "torch.bfloat16", "bf16"):
            intake.refuse(name, key, value, "autocast over FP32 weights: BF16 autocast is not modelled")
        elif value is not None:
            intake.ignore(name, key, value, "autocast over BF16 weights changes no dtype")
    optim = take("optim")
    if optim is None:
        intake.default(name, "optim", "adamw_torch_fused, transformers' default with PyTorch >= 2.8", "--fused")
    elif optim in OPTIMIZERS:
        intake.option(name, "optim", optim, *OPTIMIZERS[optim])
    else:
        intake.refuse(name, "optim", optim, f"memledger models {', '.join(OPTIMIZERS)}")
    for key, why in (("packing", "packing depends on the data"), ("torch_compile", "compiled graphs' transients are "
                     "not modelled in the step"), ("deepspeed", "give the DeepSpeed JSON itself"),
                     ("fsdp", "give the FSDP settings as an accelerate config")):
        value = take(key)
        if value:
            intake.refuse(name, key, value, why)
        elif value is not None:
            intake.ignore(name, key, value, "off")
    intake.rest(name, flat, seen, lambda key: key in TRAINING_IGNORED)
