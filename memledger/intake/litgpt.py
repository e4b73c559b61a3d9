"""A LitGPT fine-tuning config (``litgpt finetune_lora --config config_hub/finetune/<model>/lora.yaml``).

``litgpt/finetune/lora.py`` (Lightning-AI/litgpt at 26857050): ``precision`` ``bf16-true`` keeps weights (and the
adapters, and the optimizer's moments) in BF16; ``quantize: bnb.nf4`` / ``bnb.nf4-dq`` makes the frozen base NF4
(with double quantization for ``-dq``) and swaps the optimizer for bitsandbytes' paged AdamW
(``instantiate_bnb_optimizer``, line 219); the model returns logits in chunks of 128 tokens
(``lm_head_chunk_size=128``, line 355) and ``chunked_cross_entropy`` takes the loss chunk by chunk (line 358).
``lora_query``/``lora_key``/``lora_value`` adapt the fused QKV projection's thirds, ``lora_projection`` the
output projection, ``lora_mlp`` the three MLP projections, ``lora_head`` the LM head. Its RMSNorm upcasts to FP32
(``litgpt/model.py``), so no fused kernel runs (``--rmsnorm composite``).
"""
from .models import local_config

__all__ = ["is_litgpt", "read_litgpt"]

IGNORED_PREFIXES = ("data.", "eval.", "logger", "optimizer.init_args.", "train.save", "train.log", "train.lr",
                    "train.min_lr", "train.epochs", "train.max_tokens", "train.max_steps", "train.max_norm")
IGNORED = {"out_dir", "seed", "num_nodes", "resume", "lora_alpha", "train.global_batch_size", "train.tie_embeddings",
           "access_token", "logger_name"}
TARGETS = (("lora_query", "q_proj"), ("lora_key", "k_proj"), ("lora_value", "v_proj"),
           ("lora_projection", "o_proj"))
CHUNK = 128        # lm_head_chunk_size, litgpt/finetune/lora.py line 355


def is_litgpt(flat: dict) -> bool:
    return "checkpoint_dir" in flat and ("train.micro_batch_size" in flat or "precision" in flat)


def read_litgpt(intake, name: str, flat: dict) -> None:
    seen = set()

    def take(key):
        seen.add(key)
        return flat.get(key)
    checkpoint = str(take("checkpoint_dir"))
    model_id = "/".join(checkpoint.rstrip("/").split("/")[-2:])
    try:
        flag, model = local_config(checkpoint if not checkpoint.startswith("checkpoints/") else model_id)
    except ValueError as e:
        intake.refuse(name, "checkpoint_dir", checkpoint, str(e))
    else:
        intake.option(name, "checkpoint_dir", checkpoint, flag, model)
    intake.option(name, "precision", flat.get("precision"), "--backend", "cuda", "--rmsnorm", "composite",
                  why="LitGPT on CUDA: SDPA's flash kernel, AdamW's foreach, RMSNorm upcast to FP32")
    precision = take("precision")
    quantize = take("quantize")
    lora = any(k.startswith("lora_") for k in flat)
    if precision != "bf16-true":
        intake.refuse(name, "precision", precision, "memledger models LitGPT's bf16-true (bf16-mixed's autocast over "
                      "FP32 weights is not modelled)")
    elif lora:
        intake.option(name, "precision", precision, "--recipe", "bf16-pure-adamw",
                      *(() if quantize else ("--adapter-recipe", "bf16-pure-adamw")),
                      why="the base and the adapters in BF16" + ("" if quantize else ", AdamW's moments too"))
    else:
        intake.option(name, "precision", precision, "--recipe", "bf16-pure-adamw",
                      why="weights, gradients and AdamW's moments in BF16")
    if quantize in ("bnb.nf4", "bnb.nf4-dq"):
        intake.option(name, "quantize", quantize, "--qlora", *(() if quantize.endswith("-dq") else
                                                                ("--no-double-quant",)),
                      why="NF4 base; the adapters' optimizer becomes bitsandbytes' paged AdamW (FP32 moments)")
    elif quantize:
        intake.refuse(name, "quantize", quantize, "memledger models bnb.nf4 and bnb.nf4-dq")
    if lora:
        targets = [t for key, t in TARGETS if take(key)]
        targets += ["gate_proj", "up_proj", "down_proj"] if take("lora_mlp") else []
        targets += ["lm_head"] if take("lora_head") else []
        rank = take("lora_r")
        intake.option(name, "lora_r", rank, "--lora-rank", rank, "--lora-targets", ",".join(targets),
                      why=f"adapters on {', '.join(targets)}")
        dropout = take("lora_dropout")
        intake.option(name, "lora_dropout", dropout, "--lora-dropout", dropout or 0)
    devices = take("devices")
    if devices not in (1, None):
        intake.refuse(name, "devices", devices, "LitGPT shards over several devices with FSDP; memledger's LoRA and "
                      "LitGPT steps run on one GPU")
    batch = take("train.micro_batch_size")
    intake.option(name, "train.micro_batch_size", batch, "--batch", batch)
    seq = take("train.max_seq_length")
    if seq is None:
        intake.default(name, "train.max_seq_length", "null: as long as the data's; judged at memledger's default",
                       "--seq", 2048)
        seq = 2048
    else:
        intake.option(name, "train.max_seq_length", seq, "--seq", seq)
    if seq % CHUNK:
        intake.refuse(name, "train.max_seq_length", seq, f"LitGPT's loss chunks are {CHUNK} tokens; a short last "
                      "chunk is not modelled yet")
    else:
        intake.option(name, "(litgpt/finetune/lora.py)", f"lm_head_chunk_size={CHUNK}", "--loss-chunks", seq // CHUNK,
                      "--loss-impl", "litgpt", why=f"the logits in chunks of {CHUNK} tokens, chunked_cross_entropy")
    optimizer = take("optimizer.class_path") or take("optimizer")
    if optimizer not in ("torch.optim.AdamW", "AdamW", None):
        intake.refuse(name, "optimizer", optimizer, "memledger models torch.optim.AdamW")
    intake.rest(name, flat, seen, lambda key: key in IGNORED or key.startswith(IGNORED_PREFIXES))
