"""The command line's conventions and fine-tuning paths: ``ledger --convention``, ``compare``, ``ledger --lora-rank``.

``memledger ledger ... --convention NAME`` prints one other calculator's
estimate of the setup (its rows, what the tool itself prints, why it differs
from memledger's ledger); ``memledger compare ...`` puts the setup under
every convention side by side; ``memledger ledger ... --lora-rank R`` (or
``--qlora``) gives the LoRA/QLoRA ledger of :mod:`memledger.ledger.lora`. Options a
path would ignore are refused, as everywhere in the CLI.
"""
from fractions import Fraction

from ..core.units import format_bytes, parse_count

CONVENTION_INPUTS = ("largest_layer", "gpus_per_node", "nodes", "buffer_factor", "no_zero_init")
LORA_INPUTS = ("lora_rank", "lora_targets", "qlora", "lora_dropout", "adapter_recipe", "no_double_quant")


def add_parsers(sub, ledger_parser, ledger_options, formatter):
    """``ledger``'s extra options, and the ``compare`` command with the ledger's options."""
    add_options(ledger_parser)
    compare = sub.add_parser("compare", help="one model under every published convention, with memledger's ledger",
                             formatter_class=formatter)
    ledger_options(compare)
    add_options(compare, compare=True)


def add_options(parser, compare: bool = False):
    """The options of other calculators' inputs (and, for ``ledger``, --convention and LoRA)."""
    conv = parser.add_argument_group("other calculators' inputs (--convention, compare)")
    if not compare:
        conv.add_argument("--convention", help="print this convention's estimate instead (see memledger compare)")
    conv.add_argument("--largest-layer", help="parameters of the largest layer (default: from the architecture)")
    conv.add_argument("--gpus-per-node", help="GPUs per node (default: --dp / --nodes)")
    conv.add_argument("--nodes", help="nodes (default: 1)")
    conv.add_argument("--buffer-factor", help="DeepSpeed's CPU additional_buffer_factor (default: 1.5)")
    conv.add_argument("--no-zero-init", action="store_true", help="DeepSpeed ZeRO-3 without zero.Init")
    if compare:
        return
    lora = parser.add_argument_group("LoRA / QLoRA (frozen base, rank-r adapters)")
    lora.add_argument("--lora-rank", help="adapter rank r (LoRA)")
    lora.add_argument("--lora-targets", help="comma-separated projections (default q_proj,v_proj; QLoRA: all)")
    lora.add_argument("--qlora", action="store_true", help="NF4 base, BF16 adapters, paged 8-bit AdamW (r 64)")
    lora.add_argument("--lora-dropout", action="store_true", help="adapters with dropout on their input")
    lora.add_argument("--adapter-recipe", help="the adapters' recipe (default fp32-adamw; QLoRA "
                      "bf16-adam8bit-bnb-nomaster)")
    lora.add_argument("--no-double-quant", action="store_true", help="QLoRA without double quantization")


def _given(a, names) -> list:
    return ["--" + n.replace("_", "-") for n in names if getattr(a, n, None) not in (None, False)]


def wants(a) -> str:
    """Which path the ledger arguments ask for: "convention", "lora" or "" (memledger's own ledger)."""
    conv, lora = getattr(a, "convention", None) is not None, bool(_given(a, LORA_INPUTS))
    if conv and lora:
        raise ValueError("--convention and the LoRA options cannot be combined")
    if not conv and _given(a, CONVENTION_INPUTS) and a.command == "ledger":
        flags = _given(a, CONVENTION_INPUTS)
        raise ValueError(f"{', '.join(flags)} {'is an input' if len(flags) == 1 else 'are inputs'} of other "
                         "calculators: use with --convention NAME or memledger compare")
    return "convention" if conv else "lora" if lora else ""


def setup(a, ledger):
    """The :class:`~memledger.calculators.Setup` the arguments describe (its GPUs are the ledger's dp)."""
    from ..calculators import Setup
    nodes = parse_count(a.nodes, "nodes") if a.nodes is not None else 1
    if a.gpus_per_node is not None:
        per_node = parse_count(a.gpus_per_node, "gpus_per_node")
        if a.dp != "1" and per_node * nodes != ledger.dp:
            raise ValueError(f"gpus_per_node x nodes ({per_node} x {nodes}) must equal dp ({ledger.dp})")
    elif ledger.dp % nodes:
        raise ValueError(f"dp ({ledger.dp}) must be a multiple of nodes ({nodes})")
    else:
        per_node = ledger.dp // nodes
    try:
        factor = Fraction(a.buffer_factor) if a.buffer_factor is not None else Fraction(3, 2)
    except (ValueError, ZeroDivisionError):
        raise ValueError(f"buffer_factor must be a number >= 1 such as 1.5, got {a.buffer_factor!r}") from None
    return Setup(ledger.params, arch=ledger.arch,
                 largest_layer=parse_count(a.largest_layer, "largest_layer") if a.largest_layer else None,
                 batch_size=ledger.batch_size, seq_len=ledger.seq_len, gpus_per_node=per_node, nodes=nodes,
                 buffer_factor=factor, zero_stage=ledger.zero_stage,
                 offload_optimizer=ledger.offload_optimizer != "none", offload_params=ledger.offload_params != "none",
                 zero_init=not a.no_zero_init, recompute=ledger.recompute, tp=ledger.tp,
                 dtype="fp32" if ledger.recipe.startswith("fp32") else "bf16", flash_attention=ledger.flash_attention,
                 dropout=ledger.dropout)


def convention(a, ledger) -> str:
    """``ledger --convention NAME``: that convention's rows, its own printed text, why it differs."""
    from ..calculators import get_convention
    c = get_convention(a.convention)
    estimate = c.estimate(setup(a, ledger))
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
    from .options import UNITS, build_ledger, one_of
    from ..calculators.compare import compare as run, compare_table
    if a.units not in UNITS:
        raise ValueError(f"units must be one of {one_of(UNITS)}, got {a.units!r}")
    rows = run(setup(a, build_ledger(a)))
    if a.json:
        import json
        return json.dumps({"conventions": [r.to_dict(rows[0]) for r in rows]}, indent=2)
    return compare_table(rows, a.units)


def lora(a, ledger) -> str:
    """``ledger --lora-rank R`` / ``--qlora``: the LoRA or QLoRA ledger."""
    from ..ledger.lora import LoraConfig, LoraLedger, qlora
    refused = [flag for flag, used in (("--zero", ledger.zero_stage), ("--dp", ledger.dp > 1), ("--tp", ledger.tp > 1),
                                       ("--offload-optimizer", ledger.offload_optimizer != "none"),
                                       ("--pp", a.pp is not None), ("--recipe", a.recipe != "bf16-adamw"))
               if used]
    if refused:
        raise ValueError(f"{', '.join(refused)} {'is' if len(refused) == 1 else 'are'} not modelled with LoRA "
                         "(one GPU; the adapters' recipe is --adapter-recipe)")
    if ledger.arch is None:
        raise ValueError("LoRA needs an architecture: --preset, --config or a shape")
    targets = tuple(t.strip() for t in a.lora_targets.split(",")) if a.lora_targets else None
    options = {"dropout": a.lora_dropout}
    if a.adapter_recipe:
        options["adapter_recipe"] = a.adapter_recipe
    rank = parse_count(a.lora_rank, "lora_rank") if a.lora_rank else None
    if a.qlora:
        config = qlora(rank or 64, targets, ledger.arch.style, double_quant=not a.no_double_quant, **options)
    else:
        if a.no_double_quant:
            raise ValueError("--no-double-quant needs --qlora")
        config = LoraConfig(rank or 16, targets or ("q_proj", "v_proj"), **options)
    result = LoraLedger(ledger.arch, config, ledger.batch_size, ledger.seq_len, ledger.recompute,
                        ledger.flash_attention, ledger.overhead_bytes)
    if a.json:
        import json
        return json.dumps(result.to_dict(), indent=2)
    return result.table(a.units).text()
