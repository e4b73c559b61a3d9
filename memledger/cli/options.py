"""Options every command shares: the model, the workload and strategy, the output; and the
:class:`~memledger.ledger.ledger.Ledger` they describe (refusing options it would ignore)."""
from ..core.choices import RECOMPUTE, lookup
from ..core.units import format_bytes, parse_bytes, parse_count
from ..ledger.hardware import GPU_MEMORY, HOST_LINKS, NVME_LINKS
from ..ledger.ledger import Ledger
from ..models.architecture import Architecture
from ..models.hf_config import SUPPORTED
from ..models.presets import get_preset, preset_names
from ..states.placement import OFFLOAD_DEVICES, PLACEMENTS, ZERO_STAGES
from ..states.recipes import ALL_RECIPES

__all__ = ["UNITS", "UNITS_HELP", "architecture_from_args", "build_ledger", "gpu_bytes", "ledger_options",
           "model_options", "one_of", "zero_stage"]

UNITS = ("GB", "GiB", "MiB", "TiB")
UNITS_HELP = "GB (10^9 bytes), GiB (2^30), MiB (2^20) or TiB (2^40)"


def one_of(options) -> str:
    return ", ".join(map(str, options))


def model_options(parser):
    arch = parser.add_argument_group("model (a preset, a parameter count, or a shape)")
    arch.add_argument("--preset", help=f"one of: {one_of(preset_names())}")
    arch.add_argument("--config", help="a Hugging Face config.json (or its folder), read offline; model types: "
                      + one_of(SUPPORTED))
    arch.add_argument("--params", help="parameter count, e.g. 7e9 (alone: model states only)")
    arch.add_argument("--hidden", help="hidden size d")
    arch.add_argument("--layers", help="number of layers L")
    arch.add_argument("--heads", help="attention heads H")
    arch.add_argument("--ffn", help="MLP intermediate size (default: 4d)")
    arch.add_argument("--vocab", help=f"vocabulary size (default: {Architecture.vocab_size})")
    arch.add_argument("--style", help=f"block style: gpt or llama (default: {Architecture.style})")


def ledger_options(parser):
    model_options(parser)
    run = parser.add_argument_group("workload and strategy")
    run.add_argument("--batch", help=f"micro-batch size B (default: {Ledger.batch_size})")
    run.add_argument("--seq", help=f"sequence length S (default: {Ledger.seq_len})")
    run.add_argument("--recipe", default=Ledger.recipe, help=f"one of: {one_of(ALL_RECIPES)}")
    run.add_argument("--recompute", default=Ledger.recompute, help=one_of(RECOMPUTE))
    run.add_argument("--no-dropout", action="store_true", help="train without dropout")
    run.add_argument("--flash-attention", action="store_true", help="no S x S tensors saved")
    run.add_argument("--tp", default=str(Ledger.tp), help="tensor-parallel degree")
    run.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    run.add_argument("--zero", default=str(Ledger.zero_stage), help=f"ZeRO stage: {one_of(ZERO_STAGES)}")
    run.add_argument("--dp", default=str(Ledger.dp), help="data-parallel degree")
    run.add_argument("--offload-optimizer", default=Ledger.offload_optimizer, help=one_of(OFFLOAD_DEVICES))
    run.add_argument("--offload-params", default=Ledger.offload_params,
                     help=f"{one_of(OFFLOAD_DEVICES)} (needs --zero 3)")
    run.add_argument("--offload-placement", default=Ledger.offload_placement,
                     help=f"{one_of(PLACEMENTS)}: article (grads stay on the GPU) or zero-offload "
                          "(only BF16 params stay)")
    run.add_argument("--overhead", default=format_bytes(Ledger.overhead_bytes, digits=0).replace(" ", ""),
                     help="runtime overhead (CUDA context, workspace), e.g. 2GB or 1500000000")
    run.add_argument("--scope", default=Ledger.scope, help="model (the blocks and what lies outside them) or "
                     "layers (the blocks only, as the article books them)")
    out = parser.add_argument_group("output")
    out.add_argument("--units", default=UNITS[0], help=UNITS_HELP)
    out.add_argument("--gpu-memory", default=next(iter(GPU_MEMORY)),
                     help=f"GPU memory for the fits verdict: bytes (80GB) or one of {one_of(GPU_MEMORY)}")
    out.add_argument("--link", default="pcie4-x16", help=f"host link for offload time: {one_of(HOST_LINKS)}")
    out.add_argument("--json", action="store_true", help="one JSON object with exact integer bytes")


def architecture_from_args(a):
    shape = {"d_model": a.hidden, "n_layers": a.layers, "n_heads": a.heads, "d_ff": a.ffn, "vocab_size": a.vocab}
    given = {k: parse_count(v, k) for k, v in shape.items() if v is not None}
    if a.style is not None:
        given["style"] = a.style
    if a.preset is not None and a.config is not None:
        raise ValueError("give --preset or --config, not both")
    if a.config is not None:
        base = Architecture.from_hf_config(a.config, description=f"from {a.config}")
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
        raise ValueError(f"zero_stage must be one of {one_of(ZERO_STAGES)}, got {text!r}")
    return stages[text.strip()]


def build_ledger(a) -> Ledger:
    """The :class:`Ledger` that parsed ``ledger`` arguments describe; refuses options it would ignore."""
    arch = architecture_from_args(a)
    if a.params is not None and arch is not None:
        raise ValueError("--params is the whole model; it cannot be combined with --preset, --config or a shape "
                         "(--hidden/--layers/--heads/--ffn/--vocab/--style)")
    if arch is None and a.params is None:
        raise ValueError("give a model: --preset NAME, --config FILE, --params N, or --hidden D --layers L --heads H")
    if arch is None:
        needs = [flag for flag, used in (("--batch", a.batch), ("--seq", a.seq), ("--recompute", a.recompute != "none"),
                                         ("--flash-attention", a.flash_attention), ("--no-dropout", a.no_dropout),
                                         ("--sp", a.sp)) if used]
        if needs:
            raise ValueError(f"{', '.join(needs)} need an architecture (activations); --params alone gives "
                             "model states only")
    if a.units not in UNITS:
        raise ValueError(f"units must be one of {one_of(UNITS)}, got {a.units!r}")
    if a.link in NVME_LINKS:
        raise ValueError(f"link {a.link!r} is an NVMe drive, not a host link; use one of {one_of(HOST_LINKS)}")
    lookup(HOST_LINKS, a.link, "link")
    return Ledger(
        arch=arch,
        n_params=None if a.params is None else parse_count(a.params, "n_params"),
        batch_size=Ledger.batch_size if a.batch is None else parse_count(a.batch, "batch_size"),
        seq_len=Ledger.seq_len if a.seq is None else parse_count(a.seq, "seq_len"),
        recipe=a.recipe, recompute=a.recompute, tp=parse_count(a.tp, "tp"), sequence_parallel=a.sp,
        zero_stage=zero_stage(a.zero), dp=parse_count(a.dp, "dp"),
        offload_optimizer=a.offload_optimizer, offload_params=a.offload_params,
        offload_placement=a.offload_placement, overhead_bytes=parse_bytes(a.overhead, "overhead"),
        dropout=False if a.no_dropout else None, flash_attention=a.flash_attention, scope=a.scope)


def gpu_bytes(text: str) -> int:
    """A GPU's memory from its name or a size: ``a100-80gb`` or ``80GB``."""
    if text in GPU_MEMORY:
        return GPU_MEMORY[text]
    try:
        return parse_bytes(text, "gpu_memory")
    except ValueError:
        raise ValueError(f"gpu_memory must be a size such as 80GB or one of {one_of(GPU_MEMORY)}, "
                         f"got {text!r}") from None
