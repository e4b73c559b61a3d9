"""The framework a step runs under (issue 15), the options each one reads, and the buffers DeepSpeed and
Megatron-LM allocate, read from their sources (they cannot run here: every buffer is labelled "from source").

``plain`` is memledger's own loop (ZeRO's arithmetic on top). ``ddp``: PyTorch's ``DistributedDataParallel``
(its gradient buckets: :mod:`memledger.step.ddp`, measured against PyTorch). ``deepspeed``: DeepSpeed's ZeRO
engine, stages 1-3 (:func:`deepspeed_buffers`). ``megatron``: Megatron-LM's DDP and distributed optimizer
(:func:`megatron_buffers`). ``fsdp2``: PyTorch's ``fully_shard`` (docs/fsdp2.md; its step:
:mod:`memledger.step.fsdp2`, measured against FSDPMemTracker): it shards the model states itself, so ZeRO stages,
offload and tensor parallelism are other setups; HSDP is ``dp_replicate`` replicas of a ``dp / dp_replicate``-rank
shard group; its sharded parameters are the optimizer's (no master copy), ``fp32-adamw`` (FP32 shards, as
torchtitan and torchtune keep them) or ``bf16-pure-adamw``, and ``MixedPrecisionPolicy(param_dtype,
reduce_dtype)`` gives the compute and reduce dtypes. An option of one framework given with another is refused
(``ValueError`` naming the field), never ignored.

Sources: deepspeedai/DeepSpeed at edaa7221 (2026-08-22), NVIDIA/Megatron-LM at d98e8a64 (2026-08-22); files and
lines at each rule below.
"""
from dataclasses import dataclass
from math import ceil
from numbers import Real
from typing import NamedTuple, Optional

from ..core.choices import FRAMEWORKS, FSDP_DTYPES, check_choice, check_flag

__all__ = ["DEEPSPEED_DEFAULTS", "DEEPSPEED_SOURCE", "FRAMEWORKS", "FRAMEWORK_OPTIONS", "FSDP2_RECIPES", "Buffer",
           "DeepSpeedConfig", "MegatronConfig",
           "MEGATRON_SOURCE", "check_framework", "check_fsdp2", "check_reshard", "deepspeed_buffers", "framework_buffers",
           "megatron_buffers", "param_tensor_numels"]

DEEPSPEED_SOURCE = "deepspeedai/DeepSpeed@edaa7221"
MEGATRON_SOURCE = "NVIDIA/Megatron-LM@d98e8a64"
#: DeepSpeed's ZeRO defaults as its engine reads them (deepspeed/runtime/zero/config.py: DeepSpeedZeroConfig,
#: lines 102 contiguous_gradients, 113 reduce_bucket_size, 132 allgather_bucket_size, 138 + 383-386 overlap_comm
#: (None: True at stage 3 only), 175 sub_group_size, 215 stage3_prefetch_bucket_size (5e7; the docs'
#: config-json.md line 576 says 5e8), 221 stage3_param_persistence_threshold, 238 stage3_max_live_parameters).
DEEPSPEED_DEFAULTS = {"reduce_bucket_size": 500_000_000, "allgather_bucket_size": 500_000_000,
                      "contiguous_gradients": True, "overlap_comm": None, "sub_group_size": 1_000_000_000,
                      "stage3_prefetch_bucket_size": 50_000_000, "stage3_param_persistence_threshold": 100_000,
                      "stage3_max_live_parameters": 1_000_000_000}



@dataclass(frozen=True)
class DeepSpeedConfig:
    """DeepSpeed's ZeRO knobs (framework deepspeed; :func:`deepspeed_buffers`), each None where not given:
    DeepSpeed's own default (:data:`DEEPSPEED_DEFAULTS`). The last three are stage 3's (``stage3_...``)."""
    reduce_bucket_size: Optional[int] = None
    contiguous_gradients: Optional[bool] = None
    overlap_comm: Optional[bool] = None
    prefetch_bucket_size: Optional[int] = None
    max_live_parameters: Optional[int] = None
    param_persistence_threshold: Optional[int] = None


@dataclass(frozen=True)
class MegatronConfig:
    """Megatron-LM's knobs (framework megatron; :func:`megatron_buffers`)."""
    gradient_accumulation_fusion: Optional[bool] = None       # None: on, as Megatron-LM's default


#: The Ledger fields each framework reads beyond the plain loop's (None, or False: not given).
FRAMEWORK_OPTIONS = {"ddp": ("ddp_bucket_mb", "gradient_as_bucket_view"),
                     "deepspeed": ("deepspeed_reduce_bucket_size", "deepspeed_contiguous_gradients",
                                   "deepspeed_overlap_comm", "deepspeed_prefetch_bucket_size",
                                   "deepspeed_max_live_parameters", "deepspeed_param_persistence_threshold"),
                     "megatron": ("megatron_gradient_accumulation_fusion",),
                     "fsdp2": ("fsdp_param_dtype", "fsdp_reduce_dtype", "reshard_after_forward", "dp_replicate",
                               "fsdp_loss_in_root", "fsdp_cpu_offload", "fsdp_offload_pin_memory", "fsdp_units")}
_DEFAULTS = {"gradient_as_bucket_view": False, "fsdp_param_dtype": "bf16", "fsdp_reduce_dtype": "fp32",
             "reshard_after_forward": True, "dp_replicate": 1, "fsdp_loss_in_root": False, "fsdp_cpu_offload": False,
             "fsdp_offload_pin_memory": True, "fsdp_units": "per-block"}
#: FSDP2's units: ``per-block`` (``fully_shard`` on each block, then on the root: embedding, final norm and LM head
#: one unit) or ``torchtitan`` (``apply_fsdp_to_decoder``, torchtitan/distributed/fsdp.py, 0.3.0: the embedding
#: alone, the final norm and LM head together and never resharded after forward, each block, a root without
#: parameters; :mod:`memledger.step.fsdp2`).
FSDP2_UNITS = ("per-block", "torchtitan")
#: The recipes each framework is modelled with: DeepSpeed's bf16 ZeRO (BF16 parameters and gradients, FP32
#: master partition, Adam); Megatron-LM's bf16 (FP32 main_grad: arguments.py lines 1204-1217 force
#: accumulate_allreduce_grads_in_fp32 with --bf16) and fp32 (distrib_optimizer docs: 18 and 16 bytes/param).
RECIPES_OF = {"deepspeed": ("bf16-adamw",), "megatron": ("bf16-adamw-fp32-grads", "fp32-adamw")}


class Buffer(NamedTuple):
    """One buffer a framework allocates: its bytes per rank, the formula, when it is live ("whole step": a ledger
    row; "backward", "forward and backward", "optimizer step": a transient, beside the sum), the source line, and
    the ledger row it already is (``booked``), if any."""
    name: str
    bytes: int
    formula: str
    live: str
    source: str
    booked: str = ""
    role: str = "mixed"     # the ZeRO role of a whole-step buffer's ledger row


def check_framework(ledger, recipe) -> None:
    """``ValueError`` (``TypeError`` for a wrong type) naming the field, unless ``ledger``'s framework and its
    options fit together and with the rest of the setup."""
    check_choice("framework", ledger.framework, FRAMEWORKS)
    check_flag("gradient_as_bucket_view", ledger.gradient_as_bucket_view)
    cap = ledger.ddp_bucket_mb
    if cap is not None and (isinstance(cap, bool) or not isinstance(cap, Real)):
        raise TypeError(f"ddp_bucket_mb must be a number of MiB, got {cap!r}")
    if cap is not None and not 0 <= cap <= 2 ** 40:         # 0: every gradient its own bucket, as in PyTorch
        raise ValueError(f"ddp_bucket_mb must be a number of MiB >= 0, got {cap!r}")
    for framework, fields in FRAMEWORK_OPTIONS.items():
        for field in fields:
            if ledger.framework != framework and getattr(ledger, field) != _DEFAULTS.get(field):
                raise ValueError(f"{field} is an option of framework {framework}, not of {ledger.framework}")
    for field in FRAMEWORK_OPTIONS["deepspeed"][1:3] + FRAMEWORK_OPTIONS["megatron"]:
        check_flag(field, getattr(ledger, field), allow_none=True)
    for field in FRAMEWORK_OPTIONS["deepspeed"][:1] + FRAMEWORK_OPTIONS["deepspeed"][3:]:
        value = getattr(ledger, field)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"{field} must be a whole number of elements >= 0, got {value!r}")
    if ledger.framework == "ddp":
        _check_ddp(ledger, recipe)
    if ledger.framework == "fsdp2":
        check_fsdp2(ledger)
    if ledger.framework in RECIPES_OF:
        _check_from_source(ledger)
    if ledger.framework == "deepspeed" and ledger.zero_stage != 3:
        for field in FRAMEWORK_OPTIONS["deepspeed"][3:]:
            if getattr(ledger, field) is not None:
                raise ValueError(f"{field} is a ZeRO stage 3 option (stage3_...), and zero_stage is "
                                 f"{ledger.zero_stage}")


#: The recipes FSDP2's step models: the sharded parameters are the masters, AdamW's moments in their dtype.
FSDP2_RECIPES = ("fp32-adamw", "bf16-pure-adamw")


def check_reshard(value, shard_group: int) -> None:
    """``reshard_after_forward``: True, False, None (PyTorch's default: True, the root False) or an int k, the
    size of the post-forward shard group (``_fully_shard/_fsdp_init.py``: ``_get_post_forward_mesh_info``: 1 is
    False, the shard group's size is True, else k must divide it)."""
    if value is None or isinstance(value, bool):
        return
    if not isinstance(value, int):
        raise TypeError(f"reshard_after_forward must be True, False, None or an int, got {value!r}")
    if value < 1 or shard_group % value:
        raise ValueError(f"reshard_after_forward ({value}) must be a positive divisor of the shard group "
                         f"({shard_group} ranks): FSDP2 reshards to a sub-group of it after forward")


def check_fsdp2(ledger) -> None:
    """``ValueError``/``TypeError`` unless ``ledger`` is a setup the FSDP2 step models."""
    check_choice("fsdp_param_dtype", ledger.fsdp_param_dtype, FSDP_DTYPES)
    check_choice("fsdp_reduce_dtype", ledger.fsdp_reduce_dtype, FSDP_DTYPES)
    check_reshard(ledger.reshard_after_forward, ledger.dp // max(ledger.dp_replicate, 1))
    check_choice("fsdp_units", ledger.fsdp_units, FSDP2_UNITS)
    for name in ("fsdp_loss_in_root", "fsdp_cpu_offload", "fsdp_offload_pin_memory"):
        check_flag(name, getattr(ledger, name))
    if not ledger.fsdp_offload_pin_memory and not ledger.fsdp_cpu_offload:
        raise ValueError("fsdp_offload_pin_memory is an option of fsdp_cpu_offload (CPUOffloadPolicy(pin_memory)); "
                         "it is False without fsdp_cpu_offload")
    if ledger.arch is None:
        raise ValueError("framework fsdp2 needs an architecture (a preset or --hidden/--layers/--heads)")
    if ledger.zero_stage != 0:
        raise ValueError(f"framework fsdp2 shards the model states itself: zero_stage must be 0, got "
                         f"{ledger.zero_stage}")
    if ledger.offload_optimizer != "none" or ledger.offload_params != "none":
        raise ValueError("framework fsdp2: FSDP2 offloads with CPUOffloadPolicy (fsdp_cpu_offload, "
                         "--fsdp-cpu-offload); offload_optimizer and offload_params must be none")
    if ledger.fsdp_cpu_offload and ledger.dp_replicate > 1:
        raise ValueError("framework fsdp2: fsdp_cpu_offload with HSDP (dp_replicate > 1) is not modelled")
    if ledger.tp != 1 and ledger.dp_replicate > 1:
        raise ValueError("framework fsdp2: HSDP x tensor parallelism (a 3-D mesh) is not modelled: dp_replicate "
                         "must be 1 with tp > 1")
    if ledger.tp != 1 and ledger.fsdp_cpu_offload:
        raise ValueError("framework fsdp2: fsdp_cpu_offload with tensor parallelism is not modelled: tp must be 1")
    k = ledger.reshard_after_forward
    if ledger.tp != 1 and isinstance(k, int) and not isinstance(k, bool) and 1 < k < ledger.dp:
        raise ValueError(f"framework fsdp2: reshard_after_forward {k} with tensor parallelism: FSDP2 does not reshard "
                         "DTensor parameters to a smaller mesh (_fsdp_param.py:710, to_sharded_post_forward); give "
                         "True, False or None with tp > 1")
    if ledger.dp % ledger.dp_replicate:
        raise ValueError(f"framework fsdp2: dp_replicate ({ledger.dp_replicate}) must divide dp ({ledger.dp})")
    if ledger.dp // ledger.dp_replicate < 2:
        raise ValueError("framework fsdp2 shards over dp ranks (dp / dp_replicate under HSDP): dp must be at least 2"
                         + (f" x dp_replicate ({ledger.dp_replicate})" if ledger.dp_replicate > 1 else ""))
    if ledger.fsdp_units == "torchtitan":
        _check_titan_units(ledger)
    if ledger.recipe not in FSDP2_RECIPES:
        raise ValueError(f"framework fsdp2: recipe must be one of {', '.join(FSDP2_RECIPES)} (the sharded "
                         f"parameters are the masters; fsdp_param_dtype is the compute dtype), got {ledger.recipe}")


def _check_titan_units(ledger) -> None:
    """``fsdp_units="torchtitan"`` is modelled for an untied LLaMA-style decoder on a 1-D mesh, resharding on or off
    (torchtitan's "default" and "never" policies), the loss outside the model, no CPU offload."""
    arch = ledger.arch
    k = ledger.reshard_after_forward
    plain_llama = (arch.style == "llama" and not arch.n_positions and not arch.head_bias and not arch.input_norm
                   and not arch.alibi and not arch.parallel and not arch.n_experts and not arch.n_decoder_layers)
    why = ("a model other than a plain LLaMA-style decoder" if not plain_llama else
           "a tied LM head (torchtitan puts embedding, norm and head in one unit)" if arch.tied_embeddings else
           "tensor parallelism" if ledger.tp != 1 else "HSDP (dp_replicate > 1)" if ledger.dp_replicate > 1 else
           "fsdp_cpu_offload" if ledger.fsdp_cpu_offload else "fsdp_loss_in_root (torchtitan computes the loss "
           "outside the model)" if ledger.fsdp_loss_in_root else
           f"reshard_after_forward {k!r} (torchtitan passes True or False)" if not isinstance(k, bool) else None)
    if why:
        raise ValueError(f"fsdp_units torchtitan is not modelled with {why}")


def _check_from_source(ledger) -> None:
    fw, recipes = ledger.framework, RECIPES_OF[ledger.framework]
    if ledger.recipe not in recipes:
        raise ValueError(f"framework {fw} is modelled with recipe {' or '.join(recipes)}, got {ledger.recipe}")
    stages = (1, 2, 3) if fw == "deepspeed" else (0, 1)
    if ledger.zero_stage not in stages:
        raise ValueError(f"framework {fw} runs zero_stage {' or '.join(map(str, stages))}"
                         + (" (1: --use-distributed-optimizer)" if fw == "megatron" else " (its ZeRO engine)")
                         + f", got {ledger.zero_stage}")
    if ledger.offload_optimizer != "none" or ledger.offload_params != "none":
        raise ValueError(f"framework {fw}'s offloaded buffers are not modelled: offload_optimizer and "
                         "offload_params must be none")
    if fw == "deepspeed" and ledger.tp != 1:
        raise ValueError("framework deepspeed is modelled on data parallelism alone: tp must be 1")


def _check_ddp(ledger, recipe) -> None:
    if ledger.zero_stage != 0:
        raise ValueError("framework ddp replicates every model state: zero_stage must be 0 (ZeRO sharding is "
                         "DeepSpeed's or FSDP's)")
    if ledger.tp != 1:
        raise ValueError("framework ddp is modelled on data parallelism alone: tp must be 1")
    if ledger.offload_optimizer != "none" or ledger.offload_params != "none":
        raise ValueError("framework ddp keeps every state on the GPU: offload_optimizer and offload_params must "
                         "be none")
    param = next(c for c in recipe.components if c.role == "param")
    if recipe.grad_component.dtype != param.dtype or not param.plain:
        raise ValueError(f"framework ddp needs gradients in the parameters' dtype (its buckets take the "
                         f"parameters' dtype): recipe {ledger.recipe} keeps {recipe.grad_component.dtype} gradients "
                         f"of {param.dtype} parameters")


# ---- buffers read from the sources ---------------------------------------------------------------------------------

def param_tensor_numels(arch) -> list:
    """[(elements, how many tensors of that size)] for every parameter tensor of ``arch`` (the reference decoder's
    tensors: embedding, per block the norms, fused QKV (and its bias), output projection, MLP, biases of GPT blocks,
    each L times; final norm; untied head). Counted, not listed one by one: L goes up to 10^18."""
    f = arch.features
    if f.moe or f.pooler or f.token_types or f.embedding_norm:
        raise ValueError("DeepSpeed's persistent parameters are counted for GPT and LLaMA decoders (no MoE, BERT "
                         "parts)")
    d, F, V = arch.d_model, arch.d_ff, arch.vocab_size
    q, kv = arch.n_heads * arch.head_dim, arch.kv_heads * arch.head_dim
    norm = [d, d] if f.gpt else [d]
    block = norm + norm + [(q + 2 * kv) * d] + ([q + 2 * kv] if f.has_qkv_bias else []) + [q * d]
    block += [d, d * F, F, d * F, d] if f.gpt else [d * F, d * F, d * F]
    head = [] if f.is_tied else [V * d]
    L = arch.n_layers
    return ([(V * d, 1)] + ([(arch.n_positions * d, 1)] if f.positions else []) + [(n, L) for n in block]
            + [(n, 1) for n in norm + head])


def _ds(ledger, field, key):
    value = getattr(ledger, f"deepspeed_{field}")
    return DEEPSPEED_DEFAULTS[key] if value is None else value


def deepspeed_buffers(ledger) -> list:
    """The buffers DeepSpeed's ZeRO engine allocates beyond memledger's ZeRO rows, per rank (BF16 model).

    Stages 1 and 2 (deepspeed/runtime/zero/stage_1_and_2.py): the BF16 parameters are flattened into one buffer
    aligned to 2 x dp elements (lines 391-393, 438-442) and the FP32 master partition is a slice of it
    (lines 498-509): A = 2 N ceil(P / 2N) elements, A/N a rank's partition; with contiguous_gradients each
    backward fills one IPG bucket of reduce_bucket_size elements (two with overlap_comm; setup_buckets, lines
    2496-2514, released at the end of backward, line 960); the step makes each rank's FP32 gradient partition
    from a flattened BF16 copy (lines 2356-2362). DeepSpeed's own estimate_zero2_model_states_mem_needs (lines
    3081-3098): 2P + 18P/N bytes without offload. Stage 3 (stage3.py): one IPG bucket kept from init (lines
    731-735); the BF16 gradient partitions in one flat buffer (line 742: memledger's gradient row); the FP32
    gradient of one sub-group at the step (lines 1256, 1288: at most sub_group_size elements); parameters of at
    most stage3_param_persistence_threshold elements stay gathered on every rank (parameter_offload.py lines
    311-323); while modules run, at most stage3_max_live_parameters gathered elements (and
    stage3_prefetch_bucket_size more prefetched). allgather_bucket_size allocates nothing of its own (the
    gather writes into the flat buffer in place).
    """
    P, N, stage = ledger.params, ledger.dp, ledger.zero_stage
    src = f"{DEEPSPEED_SOURCE}:deepspeed/runtime/zero/"
    rbs = _ds(ledger, "reduce_bucket_size", "reduce_bucket_size")
    contiguous = _ds(ledger, "contiguous_gradients", "contiguous_gradients")
    overlap = ledger.deepspeed_overlap_comm if ledger.deepspeed_overlap_comm is not None else stage == 3
    out = []
    if stage in (1, 2):
        A = 2 * N * ceil(P / (2 * N))
        pad = 2 * (A - P) + 12 * (A // N - ceil(P / N))
        out.append(Buffer("DeepSpeed flat-buffer alignment padding (to 2 x dp elements)", pad,
                          "2*(A - P) + 12*(A/N_d - ceiling(P/N_d)), A = 2*N_d*ceiling(P/(2*N_d))", "whole step",
                          src + "stage_1_and_2.py:391-393,438-442,498-509"))
        if contiguous:
            copies = 2 if overlap else 1
            out.append(Buffer(f"DeepSpeed IPG bucket{'s' if copies == 2 else ''} (reduce_bucket_size, BF16)",
                              copies * 2 * rbs, f"{copies}*2*reduce_bucket_size", "backward",
                              src + "stage_1_and_2.py:2496-2514"))
        out.append(Buffer("DeepSpeed FP32 gradient partition", 4 * (A // N), "4*A/N_d", "optimizer step",
                          src + "stage_1_and_2.py:2356-2361"))
        out.append(Buffer("DeepSpeed flattened BF16 gradient partition (freed after the FP32 copy)", 2 * (A // N),
                          "2*A/N_d", "optimizer step", src + "stage_1_and_2.py:2356-2362"))
        return out
    threshold = _ds(ledger, "param_persistence_threshold", "stage3_param_persistence_threshold")
    if contiguous:
        out.append(Buffer("DeepSpeed IPG bucket (reduce_bucket_size, BF16)", 2 * rbs, "2*reduce_bucket_size",
                          "whole step", src + "stage3.py:731-735", role="grad"))
    if ledger.arch is not None:
        small = sum(n * count for n, count in param_tensor_numels(ledger.arch) if n <= threshold)
        out.append(Buffer("DeepSpeed persistent parameters (at most stage3_param_persistence_threshold elements "
                          "each, kept gathered)", 2 * small, "2*(elements of the tensors under the threshold)",
                          "whole step", f"{DEEPSPEED_SOURCE}:deepspeed/runtime/zero/parameter_offload.py:311-323",
                          role="param"))
    live = _ds(ledger, "max_live_parameters", "stage3_max_live_parameters")
    prefetch = _ds(ledger, "prefetch_bucket_size", "stage3_prefetch_bucket_size")
    out.append(Buffer("DeepSpeed gathered parameters (at most stage3_max_live_parameters, BF16)",
                      2 * min(live, P), "2*min(stage3_max_live_parameters, P)", "forward and backward",
                      src + "config.py:238"))
    out.append(Buffer("DeepSpeed prefetched parameters (stage3_prefetch_bucket_size, BF16)", 2 * min(prefetch, P),
                      "2*min(stage3_prefetch_bucket_size, P)", "forward and backward", src + "config.py:215"))
    out.append(Buffer("DeepSpeed FP32 gradient of one sub-group", 4 * min(DEEPSPEED_DEFAULTS["sub_group_size"],
                                                                         ceil(P / N)),
                      "4*min(sub_group_size, ceiling(P/N_d))", "optimizer step", src + "stage3.py:1256,1288"))
    return out


def megatron_buffers(ledger) -> list:
    """Megatron-LM's buffers, per rank. Its DDP keeps every gradient in one contiguous main_grad buffer
    (megatron/core/distributed/param_and_grad_buffer.py lines 1190-1195: grad_data, FP32 with --bf16) and, with
    the distributed optimizer, the BF16 parameters in one contiguous buffer (lines 1182-1189: param_data); the
    optimizer's FP32 main parameters and Adam's states are sharded over the data-parallel ranks
    (megatron/core/optimizer/distrib_optimizer.py; docs/user-guide/features/dist_optimizer.md: 18 bytes per
    parameter, 6 + 12/d distributed, for BF16 parameters and FP32 gradients). Those are memledger's recipe rows
    (``booked``). Gradient-accumulation fusion (on unless --no-gradient-accumulation-fusion, arguments.py line
    2944) makes each linear layer's weight-gradient GEMM accumulate into main_grad; without it the GEMM first
    writes a BF16 weight gradient, added into main_grad and freed: a transient of the largest weight. Bucket
    padding (64-element parameter starts, bucket ends to a multiple of dp) is not modelled."""
    src = f"{MEGATRON_SOURCE}:megatron/core/distributed/param_and_grad_buffer.py"
    P, t = ledger.params, ledger.tp
    grad = 4
    out = [Buffer("Megatron main_grad buffer (contiguous, FP32)", grad * ceil(P / t), "4*ceiling(P/t)",
                  "whole step", src + ":1190-1195", booked="FP32 gradients")]
    if ledger.zero_stage == 1:
        pb = 2 if ledger.recipe.startswith("bf16") else 4
        out.append(Buffer("Megatron param buffer (contiguous; distributed optimizer)", pb * ceil(P / t),
                          f"{pb}*ceiling(P/t)", "whole step", src + ":1182-1189",
                          booked="BF16 parameters" if pb == 2 else "FP32 parameters"))
    if ledger.megatron_gradient_accumulation_fusion is False and ledger.arch is not None:
        pb = 2 if ledger.recipe.startswith("bf16") else 4
        largest = max(n for n, _ in param_tensor_numels(ledger.arch))
        out.append(Buffer("Megatron weight gradient before main_grad accumulation (largest weight; "
                          "--no-gradient-accumulation-fusion)", pb * ceil(largest / t), f"{pb}*ceiling(max weight/t)",
                          "backward", f"{MEGATRON_SOURCE}:megatron/training/arguments.py:2944"))
    return out


def framework_buffers(ledger) -> list:
    """:class:`Buffer` s of ``ledger``'s framework read from its source ([] for plain and ddp)."""
    if ledger.framework == "deepspeed":
        return deepspeed_buffers(ledger)
    if ledger.framework == "megatron":
        return megatron_buffers(ledger)
    return []
