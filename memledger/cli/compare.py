"""The command line's conventions and fine-tuning paths: ``ledger --convention``, ``compare``, ``ledger --lora-rank``.

``memledger ledger ... --convention NAME`` prints one other calculator's
estimate of the setup (its rows, what the tool itself prints, why it differs
from memledger's ledger); ``memledger compare ...`` puts the setup under
every convention side by side, memledger's own ledger first with every
option honoured; ``memledger ledger ... --lora-rank R`` (or ``--qlora``)
gives the LoRA/QLoRA ledger of :mod:`memledger.ledger.lora`. Options a path
would ignore are refused (:mod:`memledger.cli.paths`), as everywhere in the CLI.
"""
from ..core.units import format_bytes, parse_count, shown
from .options import add, build_ledger, check_units, flag, ledger_options, output_options
from .paths import CONVENTION_INPUTS, LORA, MODEL, WORKLOAD, convention_reads, refuse_unread

__all__ = ["add_options", "add_parser", "compare", "convention", "convention_inputs", "lora", "lora_config",
           "lora_dropout", "lora_options", "wants"]


def add_parser(sub, formatter):
    """The ``compare`` command: the ledger's options (overhead 0: the conventions book none) and the inputs
    of other calculators."""
    compare = sub.add_parser("compare", help="one model under every published convention, with memledger's ledger",
                             formatter_class=formatter)
    ledger_options(compare, overhead="0")
    output_options(compare, verdict=False, link=False)
    add_options(compare, compare=True)


def add_options(parser, compare: bool = False):
    """The options of other calculators' inputs (and, for ``ledger``, --convention and LoRA)."""
    conv = parser.add_argument_group("other calculators' inputs (--convention, compare)")
    if not compare:
        add(conv, "--convention", "print this convention's estimate instead (see memledger compare)")
    add(conv, "--largest-layer", "parameters of the largest layer (default: from the architecture)")
    add(conv, "--gpus-per-node", "GPUs per node (default: the GPUs, dp x tp, over --nodes; given without --dp, "
        "it sets dp)")
    add(conv, "--nodes", "nodes", "1")
    add(conv, "--buffer-factor", "DeepSpeed's CPU additional_buffer_factor, from 1 to 1000", "1.5")
    add(conv, "--no-zero-init", "DeepSpeed ZeRO-3 without zero.Init", switch=True)
    if compare:
        return
    lora_options(parser)


def lora_options(parser):
    """The LoRA / QLoRA options (``ledger`` and ``step``)."""
    lora = parser.add_argument_group("LoRA / QLoRA (frozen base, rank-r adapters)")
    add(lora, "--lora-rank", "adapter rank r (LoRA; default 16, QLoRA 64)")
    add(lora, "--lora-targets", "comma-separated projections q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,"
        "down_proj, and lm_head (default q_proj,v_proj; QLoRA: all projections)")
    add(lora, "--qlora", "QLoRA as qlora.py trains it: NF4 base, r 64 on every projection, BF16 adapters under "
        "paged_adamw_32bit, LoRA dropout", switch=True)
    action = lora.add_argument("--lora-dropout", nargs="?", const="0.1", default=None,
                               help="dropout p on each adapter's input (alone: 0.1, QLoRA's for 7B-13B; "
                               "0: none; the bytes do not depend on p)")
    action.fallback = None
    add(lora, "--adapter-recipe", "the adapters' recipe (default fp32-adamw; QLoRA bf16-adamw32-bnb; under "
        "--implementation torchtune or litgpt their recipes' bf16-pure-adamw)")
    add(lora, "--no-double-quant", "QLoRA without double quantization", switch=True)


def lora_dropout(text):
    """``--lora-dropout [p]``: None (not given), or whether the adapters drop out (0 <= p < 1)."""
    if text is None:
        return None
    try:
        p = float(text)
    except ValueError:
        p = -1.0
    if not 0 <= p < 1:
        raise ValueError(f"--lora-dropout must be a probability in [0, 1), got {shown(text)!r}")
    return p > 0


def wants(a) -> str:
    """Which path the ledger arguments ask for: "convention", "lora" or "" (memledger's own ledger)."""
    conv, lora = "convention" in a.given, any(d in a.given for d in LORA)
    if conv and lora:
        raise ValueError("--convention and the LoRA options cannot be combined")
    inputs = [flag(d) for d in CONVENTION_INPUTS if d in a.given]
    if not conv and inputs:
        raise ValueError(f"{', '.join(inputs)} {'is an input' if len(inputs) == 1 else 'are inputs'} of other "
                         "calculators: use with --convention NAME or memledger compare")
    return "convention" if conv else "lora" if lora else ""


def convention_inputs(a):
    """The :class:`~memledger.calculators.base.ConventionInputs` the arguments give."""
    from ..calculators.base import ConventionInputs
    return ConventionInputs(
        largest_layer=parse_count(a.largest_layer, "largest_layer") if a.largest_layer is not None else None,
        gpus_per_node=parse_count(a.gpus_per_node, "gpus_per_node") if a.gpus_per_node is not None else None,
        nodes=parse_count(a.nodes, "nodes"), buffer_factor=a.buffer_factor, zero_init=not a.no_zero_init)


def _conventions_ledger(a):
    """The ledger and inputs of the conventions' paths; ``--gpus-per-node`` x ``--nodes`` without ``--dp`` sets
    the GPUs (dp x tp)."""
    inputs = convention_inputs(a)
    if inputs.gpus_per_node is not None and "dp" not in a.given:
        gpus, tp = inputs.gpus_per_node * inputs.nodes, parse_count(a.tp, "tp")
        if gpus % tp:
            raise ValueError(f"gpus_per_node x nodes ({inputs.gpus_per_node} x {inputs.nodes}) must be a multiple "
                             f"of tp ({tp})")
        a.dp = str(gpus // tp)
    return build_ledger(a), inputs


def _placement(reads, ledger):
    """``--offload-placement`` is read only where the optimizer states are offloaded."""
    return reads if ledger.offload_optimizer != "none" else reads - {"offload_placement"}


def _stated_zero(a, ledger):
    """The ZeRO stage ``--zero`` states, or None where it is not given (a DeepSpeed estimator then runs at its own)."""
    return ledger.zero_stage if "zero" in a.given else None


def convention(a) -> str:
    """``ledger --convention NAME``: that convention's rows, its own printed text, why it differs."""
    from ..calculators import get_convention
    c = get_convention(a.convention)
    reads = convention_reads(c)
    options = [flag(d) for d in sorted(reads & set(WORKLOAD + CONVENTION_INPUTS))]
    refuse_unread(a, reads, f"--convention {c.name}", dict.fromkeys(a.given, "it reads the model" + (
        f" and {', '.join(options)}" if options else " only")))
    ledger, inputs = _conventions_ledger(a)
    conflict = c.stage_conflict(_stated_zero(a, ledger))
    if conflict:
        raise ValueError(conflict)
    estimate = c.estimate(ledger, inputs)
    if a.json:
        import json
        data = estimate.to_dict()
        data.update({"title": c.title, "source": c.source, "differs": c.differs,
                     "errata": [vars(e) for e in c.errata]})
        return json.dumps(data, indent=2)
    width = max(len(r.name) for r in estimate.rows)
    lines = [f"{c.name}: {c.title}", f"source: {c.source}", ""]
    lines += [f"{r.name:<{width}}  {r.device:<4} {r.bytes:>18,}  {format_bytes(r.bytes, a.units):>12}"
              for r in estimate.rows]
    for dev in ("gpu", "cpu"):
        lines.append(f"{'total on ' + dev.upper():<{width}}  {dev:<4} {estimate.total(dev):>18,}  "
                     f"{format_bytes(estimate.total(dev), a.units):>12}")
    if estimate.printed:
        lines += ["", f"the tool prints: {estimate.printed}"]
    lines += ["", f"differs from memledger: {c.differs}"]
    return "\n".join(lines)


def compare(a) -> str:
    """``memledger compare``: memledger's ledger and every convention, side by side."""
    from ..calculators.compare import compare as run, compare_table
    check_units(a)
    ledger, inputs = _conventions_ledger(a)
    if ledger.framework == "fsdp2":
        raise ValueError("memledger compare sets other tools' sums beside memledger's; --framework fsdp2 is booked "
                         "by memledger step only")
    reads = set(MODEL) | set(WORKLOAD) | set(CONVENTION_INPUTS) | {"units", "json"}
    refuse_unread(a, _placement(reads, ledger), "memledger compare")
    rows = run(ledger, inputs, stated_zero=_stated_zero(a, ledger))
    if a.json:
        import json
        return json.dumps({"conventions": [r.to_dict(rows[0]) for r in rows]}, indent=2)
    return compare_table(rows, a.units)


def lora_targets(text):
    """``--lora-targets``: comma-separated projection names, none empty, none twice."""
    if text is None:
        return None
    targets = tuple(t.strip() for t in text.split(","))
    if not any(targets):
        raise ValueError(f"--lora-targets names no projection, got {shown(text)!r}")
    if not all(targets):
        raise ValueError(f"--lora-targets has an empty name, got {shown(text)!r}")
    return targets


#: What the LoRA ledger reads: the model, one GPU's workload without a recipe (the adapters have theirs).
LORA_READS = set(MODEL) | {"batch", "seq", "recompute", "flash_attention", "overhead", "units", "json",
                           "gpu_memory", "measure", "loss_chunks", "loss_impl", "implementation"} | set(LORA)


#: The adapters' recipe where --adapter-recipe is not given, by implementation: torchtune's and LitGPT's LoRA recipes
#: train the adapters in the model's dtype (torchtune 0.6.1 ``recipes/lora_finetune_single_device.py`` builds the
#: model in ``dtype: bf16``; LitGPT 0.5.13 ``finetune/lora.py`` runs ``precision="bf16-true"``).
ADAPTER_RECIPE = {"torchtune": "bf16-pure-adamw", "litgpt": "bf16-pure-adamw"}


def lora_config(a, arch, base: str = "bf16", implementation: str = "reference"):
    """The :class:`memledger.ledger.lora.LoraConfig` the LoRA options give (``base``: the frozen base's dtype
    without --qlora; the adapters' recipe, where not given, the ``implementation``'s own: :data:`ADAPTER_RECIPE`)."""
    from ..ledger.lora import LoraConfig, qlora
    targets = lora_targets(a.lora_targets)
    options = {}
    dropout = lora_dropout(a.lora_dropout)
    if dropout is not None:
        options["dropout"] = dropout
    if a.adapter_recipe or (implementation in ADAPTER_RECIPE and not a.qlora):
        options["adapter_recipe"] = a.adapter_recipe or ADAPTER_RECIPE[implementation]
    rank = parse_count(a.lora_rank, "lora_rank") if a.lora_rank else None
    if a.qlora:
        return qlora(rank or 64, targets, arch.style, double_quant=not a.no_double_quant, **options)
    if a.no_double_quant:
        raise ValueError("--no-double-quant needs --qlora")
    return LoraConfig(rank or 16, targets or ("q_proj", "v_proj"), base=base, **options)


def lora_implementation(ledger) -> None:
    """``ValueError`` unless the LoRA step models ``ledger``'s implementation: the reference decoder, transformers'
    model with SDPA (PEFT's LoRA, :mod:`memledger.step.hf_lora`), torchtune's ``lora_llama2`` or LitGPT's GPT."""
    from ..step.implementations import lora_not_modelled
    if ledger.implementation not in ("reference", "hf", "torchtune", "litgpt"):
        raise ValueError(f"--implementation {ledger.implementation}: {lora_not_modelled(ledger.implementation)}")
    if ledger.attn_implementation != "sdpa":
        raise ValueError(f"--attn-implementation {ledger.attn_implementation}: PEFT's LoRA on transformers' model "
                         "is modelled with SDPA (attn_implementation sdpa, its default)")


def lora(a, ledger, by_step=None) -> str:
    """``ledger --lora-rank R`` / ``--qlora``: the LoRA or QLoRA ledger; under ``--measure allocated|reserved|
    nvidia-smi|run`` judged by its step as ``by_step`` (:func:`memledger.cli.step.lora_step`) judges it."""
    from ..ledger.lora import LoraLedger
    from .paths import allocator_reads
    lora_implementation(ledger)
    reads = LORA_READS | {"implementation", "attn_implementation"} | allocator_reads(a) | (
        {"load"} if getattr(a, "measure", "auto") == "run" else set())
    if "load" in a.given and "load" not in reads:
        from ..ledger.loading import LIBRARY
        raise ValueError("--load says how a run loads its weights: --measure run, or allocated, reserved or "
                         f"nvidia-smi with a library's loading ({', '.join(LIBRARY)})")
    refused = [d for d in a.given if d not in reads]
    if refused:
        flags = [flag(d) for d in refused]
        raise ValueError(f"{', '.join(flags)} {'is' if len(flags) == 1 else 'are'} not modelled with LoRA (one GPU, "
                         "the base's dropout, the blocks' activations only; the adapters' recipe is "
                         "--adapter-recipe)")
    if ledger.arch is None:
        raise ValueError("LoRA needs an architecture: --preset, --config or a shape")
    refuse_unread(a, reads, "the LoRA ledger")
    config = lora_config(a, ledger.arch, implementation=ledger.implementation)
    result = LoraLedger(ledger.arch, config, ledger.batch_size, ledger.seq_len, ledger.recompute,
                        ledger.flash_attention, ledger.overhead_bytes, ledger.loss_chunks, ledger.loss_impl,
                        implementation=ledger.implementation)
    from ..answers.verdict import CHOICES, MARGIN, MEASURE, SPECS, leaves_margin, sentence
    from ..core.choices import check_choice
    from .options import gpu_bytes
    check_choice("measure", getattr(a, "measure", "auto"), CHOICES)
    memory = gpu_bytes(a.gpu_memory)
    if getattr(a, "measure", "auto") in SPECS:      # the step under CUDA's conventions, as the peak below
        from argparse import Namespace
        return by_step(Namespace(**(vars(a) | {"backend": "cuda", "foreach": False, "rmsnorm": None,
                                               "optimizer_in_backward": False})), ledger, result)
    peak = None if getattr(a, "measure", "auto") == "total" else result.peak     # total: no step evaluated
    judged = result.totals["gpu"] if peak is None else peak
    if a.json:
        import json
        return json.dumps(result.to_dict() | {"peak": peak, "judged_bytes": judged, "gpu_memory": memory,
                                              "measure": "total" if peak is None else "peak",
                                              "fits": leaves_margin(judged, memory), "margin": MARGIN}, indent=2)
    clause = (f", {MEASURE['peak']} (memledger step --backend cuda with these options)" if peak is not None else
              f", {MEASURE['total']}" + ("" if a.measure == "total" else " (the step does not model this run)"))
    return result.table(a.units).text() + f"\n\n{sentence(judged, memory, clause, a.units)}."
