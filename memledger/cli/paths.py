"""Which options each path of the command line reads: a given option the chosen path ignores is refused.

A *path* is what one invocation computes: ``ledger`` (memledger's own ledger, with an architecture or
``--params`` alone), ``ledger --pp``, ``ledger --convention NAME``, ``ledger --lora-rank/--qlora``,
``step``, ``fit --vary X``, ``infer``, ``compare``. Each reads a set of options (by argparse destination);
:func:`refuse_unread` turns any other given option into one line that names it and says why, so that an
option is never silently ignored (the output would otherwise be the same with and without it). Some reads
depend on the setup: ``--link`` times offload transfers, so it is read only where there are some;
``--offload-placement`` places offloaded optimizer states; ``--scope`` changes a verdict by the sum, not
the step's peak.
"""
from .options import flag

__all__ = ["ALLOCATOR_OPTIONS", "CONVENTION_INPUTS", "FRAMEWORK", "IMPLEMENTATION", "IN_BACKWARD_WHY",
           "LORA", "LOSS", "MODEL", "OUTPUT",
           "PIPELINE", "STATES", "WORKLOAD", "allocator_reads", "convention_reads", "in_backward_reads",
           "refuse_unread", "unread"]

MODEL = ("preset", "config", "params", "hidden", "layers", "heads", "ffn", "vocab", "style")
#: Options of the activations (an architecture needed), then of the model states and the runtime.
ACTIVATIONS = ("batch", "seq", "recompute", "no_dropout", "flash_attention", "sp", "scope", "compile")
STATES = ("recipe", "tp", "zero", "dp", "offload_optimizer", "offload_params", "offload_placement", "overhead")
WORKLOAD = ACTIVATIONS + STATES
#: The framework and its options (issue 15): read by ledger (not --pp), step and fit; refused elsewhere.
FRAMEWORK = ("framework", "ddp_bucket_mb", "gradient_as_bucket_view", "deepspeed_reduce_bucket_size",
             "deepspeed_prefetch_bucket_size", "deepspeed_max_live_parameters", "deepspeed_param_persistence_threshold",
             "deepspeed_no_contiguous_gradients", "deepspeed_overlap_comm", "megatron_no_gradient_accumulation_fusion",
             "fsdp_param_dtype", "fsdp_reduce_dtype", "no_reshard_after_forward", "dp_replicate",
             "reshard_after_forward", "fsdp_loss_in_root", "fsdp_cpu_offload", "fsdp_offload_no_pin", "fsdp_units")
OUTPUT = ("units", "gpu_memory", "link", "json")
#: The caching allocator's options, read only under ``--measure allocated`` or ``reserved``.
ALLOCATOR_OPTIONS = ("expandable_segments", "max_split_size_mb")
PIPELINE = ("pp", "microbatches", "interleave")
CONVENTION_INPUTS = ("largest_layer", "gpus_per_node", "nodes", "buffer_factor", "no_zero_init")
LORA = ("lora_rank", "lora_targets", "qlora", "lora_dropout", "adapter_recipe", "no_double_quant")
#: A convention's reads (:data:`memledger.calculators.base.READABLE`) -> the option that sets it.
OPTION_OF = {"batch_size": "batch", "seq_len": "seq", "recipe": "recipe", "recompute": "recompute", "tp": "tp",
             "zero_stage": "zero", "dp": "dp", "offload_optimizer": "offload_optimizer",
             "offload_params": "offload_params", "largest_layer": "largest_layer", "gpus_per_node": "gpus_per_node",
             "nodes": "nodes", "buffer_factor": "buffer_factor", "zero_init": "no_zero_init"}
#: What only the step's peak reads (the sums book the unchunked loss's tensors).
LOSS = ("loss_chunks", "loss_impl")
#: Whose model code runs the step (memledger.step.implementations): read where the step's peak is (its sums book the
#: reference decoder's rows).
IMPLEMENTATION = ("implementation", "attn_implementation")
#: Why a path would not read an option, where one reason covers every path that ignores it.
WHY = {
    "gpu_memory": "it prints no fits verdict",
    "link": "it prints no offload transfer time",
    "loss_chunks": "the chunked loss changes the step's peak (memledger step), not the sums this path prints",
    "loss_impl": "the loss's implementation changes the step's peak (memledger step), not the sums this path prints",
    "measure": "without an architecture there is no step to judge, only the sum of the model states",
    "expandable_segments": "it configures the caching allocator's replay: --measure allocated, reserved or "
                           "nvidia-smi",
    "max_split_size_mb": "it configures the caching allocator's replay: --measure allocated or reserved",
    "cuda_context": "it is a part of what nvidia-smi shows: --measure nvidia-smi",
    "load": "it says how a run loads its weights: --measure run",
    "offload_placement": "it places offloaded optimizer states, and --offload-optimizer is none",
    "offload_activations": "it books the activations on the GPU; memledger step --backend cpu models them offloaded",
    "implementation": "a library's model code changes the step's peak (memledger step), not the sums this path "
                      "prints",
    "attn_implementation": "transformers' attention changes the step's peak (memledger step), not the sums this "
                           "path prints",
    "packed": "packed documents change the attention's masks per backend: memledger step models them",
    "paged_optimizer": "it books the optimizer's states on the GPU; memledger step models them in unified memory",
}


#: Why a path does not read --optimizer-in-backward (``ledger`` and ``fit`` read it where the step's peak judges).
IN_BACKWARD_WHY = {"optimizer_in_backward": "only the step's peak honours it (the sum books every gradient, "
                                            "pipeline stages too): --measure auto or peak, no --pp"}


def in_backward_reads(a) -> set:
    """``{"optimizer_in_backward"}`` where ``ledger``/``fit`` judge the step's peak: not under ``--measure
    total``, not with pipeline stages (``--pp``)."""
    if getattr(a, "measure", "auto") == "total" or getattr(a, "pp", None) is not None:
        return set()
    return {"optimizer_in_backward"}


def allocator_reads(a) -> set:
    """The caching allocator's options where ``--measure`` is allocated, reserved or nvidia-smi (and
    ``--cuda-context`` there); ``--load`` under ``--measure run``; else none."""
    measure = getattr(a, "measure", None)
    if measure == "run":
        return {"load"}
    load = {"load"} if getattr(a, "lora_rank", None) is not None or getattr(a, "qlora", False) else set()
    if measure == "nvidia-smi":
        return set(ALLOCATOR_OPTIONS) | {"cuda_context"} | load
    return set(ALLOCATOR_OPTIONS) | load if measure in ("allocated", "reserved") else set()


def convention_reads(convention) -> set:
    """The options ``ledger --convention NAME`` reads: the model, what the convention reads, the output."""
    reads = set(MODEL) | {"units", "json", "convention"} | {OPTION_OF[r] for r in convention.reads}
    if convention.zero_stage is not None:
        reads.add("zero")                   # read to be checked: an estimator named after a stage
    return reads


def unread(a, reads) -> list:
    """The given options (destinations) not in ``reads``, in the parser's order; ``--units`` too under ``--json``
    (exact integer bytes have no unit)."""
    extra = [d for d in a.given if d not in reads]
    if "units" in a.given and getattr(a, "json", False) and "units" not in extra:
        extra.append("units")
    return extra


def refuse_unread(a, reads, where: str, why: dict = None) -> None:
    """``ValueError`` naming every given option not in ``reads`` (destinations) and why ``where`` ignores the
    first of them (``why``: reasons by option, over :data:`WHY`)."""
    extra = unread(a, reads)
    if not extra:
        return
    reasons = {**WHY, "units": "--json prints exact integer bytes", **(why or {})}
    reason = reasons.get(extra[0], "")
    flags = ", ".join(flag(d) for d in extra)
    raise ValueError(f"{where} does not read {flags}{': ' + reason if reason else ''}")
