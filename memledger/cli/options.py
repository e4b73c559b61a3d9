"""Options every command shares: the model, the workload and strategy, the output; what was given; and the
:class:`~memledger.ledger.ledger.Ledger` they describe.

Every option is declared with no argparse default, so that after parsing the command line knows which
options were *given* (:func:`given_options`); each option's default is kept beside it (``action.fallback``,
shown by ``--help``) and filled in afterwards (:func:`fill_defaults`). :mod:`memledger.cli.paths` then
refuses, in one line, a given option the chosen path does not read.
"""
from ..core.choices import FRAMEWORKS, FSDP_DTYPES, RECOMPUTE, lookup
from ..core.units import format_bytes, parse_bytes, parse_count, shown
from ..ledger.hardware import GPU_MEMORY, HOST_LINKS, NVME_LINKS
from ..states.frameworks import FSDP2_RECIPES
from ..ledger.ledger import Ledger
from ..models.architecture import Architecture
from ..models.hf_config import SUPPORTED
from ..models.presets import get_preset, preset_names
from ..states.frameworks import DEEPSPEED_DEFAULTS
from ..states.placement import OFFLOAD_DEVICES, PLACEMENTS, ZERO_STAGES
from ..states.recipes import ALL_RECIPES

__all__ = ["DEEPSPEED_COUNTS", "MEASURE_HELP", "UNITS", "UNITS_HELP", "add", "allocator_options",
           "allocator_spec_of", "architecture_from_args", "build_ledger", "check_units",
           "fill_defaults", "flag", "framework_fields", "framework_options", "fsdp_dtype", "given_options", "gpu_bytes",
           "host_link", "implementation_options", "ledger_options", "model_options", "one_of", "output_options",
           "parse_mib", "zero_stage"]

UNITS = ("GB", "GiB", "MiB", "TiB")
UNITS_HELP = "GB (10^9 bytes), GiB (2^30), MiB (2^20) or TiB (2^40)"
DEFAULT_OVERHEAD = format_bytes(Ledger.overhead_bytes, digits=0).replace(" ", "")


def one_of(options) -> str:
    return ", ".join(map(str, options))


def flag(dest: str) -> str:
    """An option's flag from its destination: ``gpu_memory`` -> ``--gpu-memory``."""
    return "--" + dest.replace("_", "-")


def add(group, name: str, help: str, default=None, switch: bool = False):
    """Declare ``name`` (a flag) with no argparse default; ``default`` is filled in after parsing where the
    option is not given, and shown by ``--help``. ``switch``: a flag without a value (store_true)."""
    if switch:
        action = group.add_argument(name, action="store_true", help=help)
    else:
        action = group.add_argument(name, help=help, default=None)
    action.fallback = default
    return action


def model_options(parser, params: bool = True):
    arch = parser.add_argument_group("model (a preset, a parameter count, or a shape)")
    add(arch, "--preset", f"one of: {one_of(preset_names())}")
    add(arch, "--config", "a Hugging Face config.json (or its folder), read offline; model types: " + one_of(SUPPORTED))
    if params:
        add(arch, "--params", "parameter count, e.g. 7e9 (alone: model states only)")
    add(arch, "--hidden", "hidden size d")
    add(arch, "--layers", "number of layers L")
    add(arch, "--heads", "attention heads H")
    add(arch, "--ffn", "MLP intermediate size (default: 4d)")
    add(arch, "--vocab", f"vocabulary size (default: {Architecture.vocab_size})")
    add(arch, "--style", f"block style: gpt or llama (default: {Architecture.style})")


def ledger_options(parser, overhead: str = DEFAULT_OVERHEAD, scope: bool = True):
    model_options(parser)
    run = parser.add_argument_group("workload and strategy")
    add(run, "--batch", "micro-batch size B", str(Ledger.batch_size))
    add(run, "--seq", "sequence length S", str(Ledger.seq_len))
    add(run, "--recipe", f"one of: {one_of(ALL_RECIPES)} (under --framework fsdp2: {one_of(FSDP2_RECIPES)}, "
        f"default {FSDP2_RECIPES[0]})", Ledger.recipe)
    add(run, "--recompute", one_of(RECOMPUTE), Ledger.recompute)
    add(run, "--no-dropout", "train without dropout", switch=True)
    add(run, "--flash-attention", "no S x S tensors saved", switch=True)
    add(run, "--tp", "tensor-parallel degree", str(Ledger.tp))
    add(run, "--sp", "sequence parallelism (needs --tp > 1)", switch=True)
    add(run, "--zero", f"ZeRO stage: {one_of(ZERO_STAGES)}", str(Ledger.zero_stage))
    add(run, "--dp", "data-parallel degree", str(Ledger.dp))
    add(run, "--offload-optimizer", one_of(OFFLOAD_DEVICES), Ledger.offload_optimizer)
    add(run, "--offload-params", f"{one_of(OFFLOAD_DEVICES)} (needs --zero 3)", Ledger.offload_params)
    add(run, "--offload-placement", f"{one_of(PLACEMENTS)}: article (grads stay on the GPU) or zero-offload "
        "(only BF16 params stay); needs --offload-optimizer", Ledger.offload_placement)
    add(run, "--overhead", "runtime overhead (CUDA context, workspace), e.g. 2GB or 1500000000", overhead)
    add(run, "--optimizer-in-backward", "one optimizer per parameter, stepped in backward as its gradient is "
        "ready (torchtune's optimizer_in_bwd); judged by the step's peak", switch=True)
    framework_options(parser)
    add(run, "--loss-chunks", "torchtune's chunked cross-entropy in N chunks of the sequence (the step's peak)",
        str(Ledger.loss_chunks))
    add(run, "--loss-impl", "torchtune (each chunk upcast to FP32) or litgpt (LitGPT's chunked_cross_entropy, no "
        "upcast); liger and cce are refused by name", Ledger.loss_impl)
    add(run, "--offload-activations", "the blocks' saved tensors as pinned host copies (save_on_cpu; memledger "
        "step --backend cpu)", switch=True)
    add(run, "--packed", "N documents packed in each row of --seq tokens, attending only to themselves (memledger "
        "step --backend cpu: SDPA's block-causal mask; cuda: flash-attention varlen; article and GPT blocks: the eager "
        "core's masked_fill)", None)
    add(run, "--compile", "the blocks under torch.compile: what AOTAutograd's min-cut partitioner saves (the sum; "
        "the step refuses it)", switch=True)
    implementation_options(run)
    add(run, "--paged-optimizer", "bitsandbytes' paged optimizer (its recipes): Adam's states in CUDA unified memory, "
        "outside the caching allocator (memledger step)", switch=True)
    if scope:
        add(run, "--scope", "model (the blocks and what lies outside them) or layers (the blocks only, as the "
            "article books them)", Ledger.scope)


def implementation_options(group):
    """``--implementation`` and ``--attn-implementation`` (:mod:`memledger.step.implementations`)."""
    from ..step.implementations import ATTN_IMPLEMENTATIONS, IMPLEMENTATIONS
    add(group, "--implementation", f"whose model code runs the step: {one_of(IMPLEMENTATIONS)} (reference: memledger's "
        "reference decoder; hf: transformers' LlamaForCausalLM; torchtune's; LitGPT's GPT): what each saves for "
        "backward and which kernels its code reaches (the step's peak)", Ledger.implementation)
    add(group, "--attn-implementation", f"transformers' attn_implementation: {one_of(ATTN_IMPLEMENTATIONS)} "
        "(--implementation hf only)", Ledger.attn_implementation)


def framework_options(parser):
    """``--framework`` and each framework's own options (:mod:`memledger.states.frameworks`)."""
    fw = parser.add_argument_group("framework (issue 15)")
    add(fw, "--framework", f"one of: {one_of(FRAMEWORKS)}; plain: memledger's own loop (ZeRO's arithmetic on top); "
        "fsdp2: PyTorch's fully_shard per block and the root over --dp ranks (its shards, all-gather and "
        "reduce-scatter buffers; step and fit)", Ledger.framework)
    dtypes = one_of(d or "none" for d in FSDP_DTYPES)
    add(fw, "--fsdp-param-dtype", f"fsdp2 MixedPrecisionPolicy param_dtype: {dtypes} (none: no cast, "
        "PyTorch's own default; bf16: torchtitan's and torchtune's)", Ledger.fsdp_param_dtype)
    add(fw, "--fsdp-reduce-dtype", f"fsdp2 MixedPrecisionPolicy reduce_dtype: {dtypes} (none: the param dtype)",
        Ledger.fsdp_reduce_dtype)
    add(fw, "--no-reshard-after-forward", "fsdp2: keep every unit's parameters unsharded from forward to "
        "backward (reshard_after_forward=False)", switch=True)
    add(fw, "--dp-replicate", "fsdp2: HSDP, R replicas of a dp/R-rank shard group (a 2-D mesh)",
        str(Ledger.dp_replicate))
    add(fw, "--reshard-after-forward", "fsdp2: reshard_after_forward=K, an int: after forward each unit keeps its "
        "1/K slice of the gathered parameters (K divides the shard group; 1 = --no-reshard-after-forward)")
    add(fw, "--fsdp-loss-in-root", "fsdp2: the loss computed inside the root module's forward (the root's "
        "post-forward after the loss, its pre-backward before the loss's backward; torchtitan and torchtune "
        "compute it outside)", switch=True)
    add(fw, "--fsdp-units", "fsdp2: per-block (fully_shard on each block, then the root) or torchtitan "
        "(apply_fsdp_to_decoder: the embedding alone, the final norm and LM head together and kept unsharded after "
        "forward, each block; an untied LLaMA-style model)", Ledger.fsdp_units)
    add(fw, "--fsdp-cpu-offload", "fsdp2: CPUOffloadPolicy: sharded parameters, gradients and optimizer states on "
        "the host, copied to the GPU before each all-gather", switch=True)
    add(fw, "--fsdp-offload-no-pin", "fsdp2: CPUOffloadPolicy(pin_memory=False) (needs --fsdp-cpu-offload)",
        switch=True)
    add(fw, "--ddp-bucket-mb", "DDP's bucket_cap_mb in MiB (needs --framework ddp; default: PyTorch's 25 MiB, "
        "the first bucket 1 MiB)")
    add(fw, "--gradient-as-bucket-view", "DDP's gradient_as_bucket_view=True: gradients are views into its "
        "buckets (needs --framework ddp)", switch=True)
    for name, what in DEEPSPEED_COUNTS.items():
        add(fw, flag(name), f"DeepSpeed's {what} in elements (needs --framework deepspeed; default: "
            f"{DEEPSPEED_DEFAULTS[what]:.0e})")
    add(fw, "--deepspeed-no-contiguous-gradients", "DeepSpeed's contiguous_gradients=false (needs --framework "
        "deepspeed)", switch=True)
    add(fw, "--deepspeed-overlap-comm", "DeepSpeed's overlap_comm: on or off (needs --framework deepspeed; default: "
        "on at stage 3 only)")
    add(fw, "--megatron-no-gradient-accumulation-fusion", "Megatron-LM's --no-gradient-accumulation-fusion (needs "
        "--framework megatron)", switch=True)


#: The DeepSpeed counts given on the command line: option destination -> DeepSpeed's config key.
DEEPSPEED_COUNTS = {"deepspeed_reduce_bucket_size": "reduce_bucket_size",
                    "deepspeed_prefetch_bucket_size": "stage3_prefetch_bucket_size",
                    "deepspeed_max_live_parameters": "stage3_max_live_parameters",
                    "deepspeed_param_persistence_threshold": "stage3_param_persistence_threshold"}


def framework_fields(a) -> dict:
    """The Ledger fields of the framework options given (defaults where a command has none)."""
    cap = getattr(a, "ddp_bucket_mb", None)
    fields = dict(framework=getattr(a, "framework", None) or Ledger.framework,
                  ddp_bucket_mb=None if cap is None else parse_mib(cap, "ddp_bucket_mb"),
                  gradient_as_bucket_view=bool(getattr(a, "gradient_as_bucket_view", False)))
    for name in DEEPSPEED_COUNTS:
        value = getattr(a, name, None)
        fields[name] = None if value is None else parse_count(value, name.removeprefix("deepspeed_"))
    if getattr(a, "deepspeed_no_contiguous_gradients", False):
        fields["deepspeed_contiguous_gradients"] = False
    overlap = getattr(a, "deepspeed_overlap_comm", None)
    if overlap is not None:
        if overlap not in ("on", "off"):
            raise ValueError(f"deepspeed_overlap_comm must be on or off, got {shown(overlap)!r}")
        fields["deepspeed_overlap_comm"] = overlap == "on"
    if getattr(a, "megatron_no_gradient_accumulation_fusion", False):
        fields["megatron_gradient_accumulation_fusion"] = False
    if hasattr(a, "fsdp_param_dtype"):
        fields.update(fsdp_param_dtype=fsdp_dtype(a.fsdp_param_dtype, "fsdp_param_dtype"),
                      fsdp_reduce_dtype=fsdp_dtype(a.fsdp_reduce_dtype, "fsdp_reduce_dtype"),
                      reshard_after_forward=_reshard(a),
                      dp_replicate=parse_count(a.dp_replicate, "dp_replicate"),
                      fsdp_loss_in_root=bool(a.fsdp_loss_in_root), fsdp_cpu_offload=bool(a.fsdp_cpu_offload),
                      fsdp_offload_pin_memory=not a.fsdp_offload_no_pin, fsdp_units=a.fsdp_units)
    return fields


def _reshard(a):
    """``--no-reshard-after-forward`` (False) or ``--reshard-after-forward K`` (an int K), else True."""
    if a.reshard_after_forward is None:
        return not a.no_reshard_after_forward
    if a.no_reshard_after_forward:
        raise ValueError("--reshard-after-forward K and --no-reshard-after-forward: give one of them")
    return parse_count(a.reshard_after_forward, "reshard_after_forward")


def parse_mib(text, field: str) -> float:
    """A number of MiB >= 0 (``25``, ``0.5``); one clear line otherwise."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{field} must be a number of MiB, got {shown(text)!r}") from None
    if not 0 <= value <= 2 ** 40:
        raise ValueError(f"{field} must be a number of MiB >= 0, got {shown(text)!r}")
    return int(value) if value.is_integer() else value


#: ``--measure``'s help: what each value judges (:mod:`memledger.answers.verdict`).
MEASURE_HELP = ("allocated (the step replayed twice through PyTorch's caching allocator: max_memory_allocated, "
                "blocks rounded to 512 B), reserved (its segments, free cached blocks included: max_memory_reserved), "
                "nvidia-smi (reserved with cuBLAS's workspaces booked in it, plus the CUDA context: needs a named "
                "--gpu-memory, one rank, and a published context size or --cuda-context), run (the peak over loading "
                "the weights, --load, and the step)")


def allocator_options(parser, measure_help: str, default: str):
    """``--measure`` and the caching allocator's options (``PYTORCH_CUDA_ALLOC_CONF``) its replay reads."""
    add(parser, "--measure", f"{measure_help}, {MEASURE_HELP}", default)
    alloc = parser.add_argument_group("caching allocator (--measure allocated or reserved)")
    add(alloc, "--expandable-segments", "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: one growing segment per "
        "pool and stream", switch=True)
    add(alloc, "--max-split-size-mb", "PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:N: blocks of N MiB or more are "
        "never split (N > 20)")
    add(alloc, "--cuda-context", "--measure nvidia-smi: the CUDA context's size, e.g. 500MiB (what nvidia-smi shows "
        "for your process after one step less torch.cuda.memory_reserved()); default: the published figure for the "
        "GPU, refused where none is published")
    from ..ledger.loading import LOADS
    add(alloc, "--load", f"--measure run: how the weights are loaded: {one_of(LOADS)} (from-pretrained: transformers' "
        "from_pretrained, each tensor materialized in its final dtype; state-dict: torch.load(map_location='cuda') "
        "beside the model, then load_state_dict; torchtune, torchtune-0914d5c (torchao 0.1's unchunked NF4), litgpt, "
        "litgpt-00af8b0 (no StableEmbedding swap): that library's LoRA/QLoRA recipe, also replayed before the step "
        "under --measure allocated, reserved or nvidia-smi)", LOADS[0])


def allocator_spec_of(a):
    """The :class:`~memledger.answers.verdict.AllocatorSpec` ``--measure allocated|reserved`` asks for, else None
    (``--measure nvidia-smi``/``run`` refused in one line)."""
    from ..answers.verdict import SPECS, allocator_spec, check_measure
    check_measure(a.measure)
    if a.measure not in SPECS:
        return None                 # the allocator's options are refused by the command's reads
    if a.measure == "run":
        return allocator_spec(a.measure, load=getattr(a, "load", None))
    split = getattr(a, "max_split_size_mb", None)
    if split is not None:
        split = parse_count(split, "max_split_size_mb")
        if split <= 20:
            raise ValueError(f"max_split_size_mb must be above 20 (PyTorch's minimum), got {split}")
    gpu = context = None
    if a.measure == "nvidia-smi":
        gpu = getattr(a, "gpu_memory", None)
        context = getattr(a, "cuda_context", None)
        context = None if context is None else parse_bytes(context, "cuda_context")
    from ..ledger.loading import LIBRARY
    load = getattr(a, "load", None) if "load" in getattr(a, "given", ()) else None
    load = load if load in LIBRARY else None    # another --load is refused by the command's reads
    return allocator_spec(a.measure, bool(getattr(a, "expandable_segments", False)), split, gpu, context, load)


def output_options(parser, verdict: bool = True, link: bool = True):
    out = parser.add_argument_group("output")
    add(out, "--units", UNITS_HELP, UNITS[0])
    if verdict:
        add(out, "--gpu-memory", f"GPU memory for the fits verdict: bytes (80GB) or one of {one_of(GPU_MEMORY)}",
            next(iter(GPU_MEMORY)))
    if link:
        add(out, "--link", f"host link for offload time: {one_of(HOST_LINKS)}", "pcie4-x16")
    add(out, "--json", "one JSON object with exact integer bytes", switch=True)


def given_options(parser, a) -> tuple:
    """The destinations of the options given on the command line, in the parser's order."""
    return tuple(action.dest for action in parser._actions
                 if hasattr(action, "fallback") and getattr(a, action.dest, None) not in (None, False))


def fill_defaults(parser, a) -> None:
    """Each option not given takes its default (``action.fallback``)."""
    for action in parser._actions:
        if hasattr(action, "fallback") and getattr(a, action.dest, None) is None:
            setattr(a, action.dest, action.fallback)


def architecture_from_args(a):
    shape = {"d_model": a.hidden, "n_layers": a.layers, "n_heads": a.heads, "d_ff": a.ffn, "vocab_size": a.vocab}
    given = {k: parse_count(v, k) for k, v in shape.items() if v is not None}
    if a.style is not None:
        given["style"] = a.style
    if a.preset is not None and a.config is not None:
        raise ValueError("give --preset or --config, not both")
    if a.config is not None:
        base = Architecture.from_hf_config(a.config, description=f"from {shown(a.config)}")
        return base.with_changes(**given) if given else base
    if a.preset is not None:
        return get_preset(a.preset).with_changes(**given) if given else get_preset(a.preset)
    if not given:
        return None
    missing = [flag for flag, key in (("--hidden", "d_model"), ("--layers", "n_layers"), ("--heads", "n_heads"))
               if key not in given]
    if missing:
        raise ValueError(f"a custom architecture needs --hidden, --layers and --heads (missing {', '.join(missing)})")
    return Architecture(**given)


def zero_stage(text):
    stages = {str(s): s for s in ZERO_STAGES}
    if text.strip() not in stages:
        raise ValueError(f"zero_stage must be one of {one_of(ZERO_STAGES)}, got {shown(text)!r}")
    return stages[text.strip()]


def check_units(a) -> str:
    if a.units not in UNITS:
        raise ValueError(f"units must be one of {one_of(UNITS)}, got {shown(a.units)!r}")
    return a.units


def host_link(text: str) -> str:
    """A host link's name (``pcie4-x16``); an NVMe drive or an unknown name is refused."""
    if text in NVME_LINKS:
        raise ValueError(f"link {text!r} is an NVMe drive, not a host link; use one of {one_of(HOST_LINKS)}")
    lookup(HOST_LINKS, text, "link")
    return text


def fsdp_dtype(text, field: str):
    """``--fsdp-param-dtype``/``--fsdp-reduce-dtype``: a dtype name, ``none`` for None (no cast)."""
    value = None if text == "none" else text
    if value not in FSDP_DTYPES:
        raise ValueError(f"{field} must be one of {one_of(d or 'none' for d in FSDP_DTYPES)}, got {shown(text)!r}")
    return value


def build_ledger(a) -> Ledger:
    """The :class:`Ledger` that parsed ``ledger`` arguments describe; refuses options it would ignore."""
    arch = architecture_from_args(a)
    if a.params is not None and arch is not None:
        raise ValueError("--params is the whole model; it cannot be combined with --preset, --config or a shape "
                         "(--hidden/--layers/--heads/--ffn/--vocab/--style)")
    if arch is None and a.params is None:
        raise ValueError("give a model: --preset NAME, --config FILE, --params N, or --hidden D --layers L --heads H")
    if arch is None:
        needs = [flag(d) for d in ("batch", "seq", "recompute", "flash_attention", "no_dropout", "sp", "scope",
                                   "offload_activations", "packed", "compile") if d in a.given]
        if needs:
            raise ValueError(f"{', '.join(needs)} need an architecture (activations); --params alone gives "
                             "model states only")
    check_units(a)
    fsdp = [flag(d) for d in ("fsdp_param_dtype", "fsdp_reduce_dtype", "no_reshard_after_forward", "dp_replicate",
                              "reshard_after_forward", "fsdp_loss_in_root", "fsdp_cpu_offload", "fsdp_offload_no_pin",
                              "fsdp_units")
            if d in a.given]
    if fsdp and a.framework != "fsdp2":
        raise ValueError(f"{', '.join(fsdp)}: an option of --framework fsdp2, not of --framework {a.framework}")
    return Ledger(
        arch=arch,
        n_params=None if a.params is None else parse_count(a.params, "n_params"),
        batch_size=parse_count(a.batch, "batch_size"), seq_len=parse_count(a.seq, "seq_len"),
        recipe=a.recipe if "recipe" in a.given or a.framework != "fsdp2" else FSDP2_RECIPES[0],
        recompute=a.recompute, tp=parse_count(a.tp, "tp"), sequence_parallel=a.sp,
        zero_stage=zero_stage(a.zero), dp=parse_count(a.dp, "dp"),
        offload_optimizer=a.offload_optimizer, offload_params=a.offload_params,
        offload_placement=a.offload_placement, overhead_bytes=parse_bytes(a.overhead, "overhead"),
        dropout=False if a.no_dropout else None, flash_attention=a.flash_attention,
        scope=getattr(a, "scope", Ledger.scope), loss_chunks=parse_count(a.loss_chunks, "loss_chunks"),
        loss_impl=a.loss_impl, offload_activations=bool(getattr(a, "offload_activations", False)),
        optimizer_in_backward=bool(getattr(a, "optimizer_in_backward", False)),
        packed=0 if getattr(a, "packed", None) is None else parse_count(a.packed, "packed"),
        compile=bool(getattr(a, "compile", False)),
        paged_optimizer=bool(getattr(a, "paged_optimizer", False)),
        implementation=getattr(a, "implementation", None) or Ledger.implementation,
        attn_implementation=getattr(a, "attn_implementation", None) or Ledger.attn_implementation,
        **framework_fields(a))


def gpu_bytes(text: str) -> int:
    """A GPU's memory from its name or a size: ``a100-80gb`` or ``80GB``."""
    if text in GPU_MEMORY:
        return GPU_MEMORY[text]
    try:
        return parse_bytes(text, "gpu_memory")
    except ValueError:
        raise ValueError(f"gpu_memory must be a size such as 80GB or one of {one_of(GPU_MEMORY)}, "
                         f"got {shown(text)!r}") from None
