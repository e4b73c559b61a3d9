"""Command line: ``memledger ledger|step|fit|infer|presets|recipes|claims [--json]``.

Bad input of any kind prints one line on stderr and exits with status 2 (the
messages are the Python API's); output that cannot be written (a closed pipe,
a full disk) prints one line and exits with status 1. No traceback, ever.
The ledger path imports neither SymPy nor NumPy: rows are evaluated by the
generated :mod:`memledger.compiled`, so the command answers about as fast as
Python starts (``benchmarks/bench.py``).
"""
import argparse
import os
import sys

from .architecture import Architecture, all_presets, get_preset, preset_names
from .choices import RECOMPUTE, lookup
from .hardware import GPU_MEMORY, HOST_LINKS, NVME_LINKS
from .hf_config import SUPPORTED
from .ledger import Ledger
from .model_states import OFFLOAD_DEVICES, PLACEMENTS, ZERO_STAGES
from .recipes import ALL_RECIPES
from .units import format_bytes, parse_bytes, parse_count

COMMANDS = ("ledger", "step", "compare", "fit", "infer", "presets", "recipes", "claims")
UNITS = ("GB", "GiB", "MiB", "TiB")
UNITS_HELP = "GB (10^9 bytes), GiB (2^30), MiB (2^20) or TiB (2^40)"


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


class _Help(argparse.HelpFormatter):
    """Shows each option's default, except where there is none (None, or a flag's False)."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.default not in (None, False, argparse.SUPPRESS) and action.option_strings:
            text += f" (default: {action.default})"
        return text


def one_of(options) -> str:
    return ", ".join(map(str, options))


def _parser():
    top = _Parser(prog="memledger", description="GPU training memory of transformers, every byte derived.",
                  formatter_class=_Help)
    sub = top.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", parser_class=_Parser)
    led = sub.add_parser("ledger", help="the memory ledger of one setup, per GPU",
                         formatter_class=_Help)
    _ledger_options(led)
    from .cli_conventions import add_parsers
    add_parsers(sub, led, _ledger_options, _Help)
    from .cli_step import add_parser
    add_parser(sub, _ledger_options, _Help)
    led.add_argument("--measure", default="auto", help="what the fits verdict judges: auto (the step's peak, "
                     "memledger step, where the timeline models the setup, else the sum of the rows at the end of "
                     "the forward pass), peak, or total (the sum, without evaluating the step)")
    pipe = led.add_argument_group("pipeline parallelism (Megatron-LM schedules)")
    pipe.add_argument("--pp", help="pipeline stages P (rows per stage: first and last)")
    pipe.add_argument("--microbatches", help="micro-batches per step M (needs --pp)")
    pipe.add_argument("--interleave", help="model chunks per device V, the interleaved schedule (needs --pp)")
    fit = sub.add_parser("fit", help="the largest batch, sequence or model that fits (or the smallest dp/ZeRO)",
                         formatter_class=_Help)
    fit.add_argument("--vary", required=True, help="batch, seq or layers (largest that fits); dp or zero "
                     "(smallest that fits)")
    fit.add_argument("--measure", default="auto", help="what a candidate is judged by: auto (the step's peak "
                     "where the timeline models the setup, else the sum of the rows at the end of the forward "
                     "pass), peak, or total (the sum)")
    _ledger_options(fit)
    inf = sub.add_parser("infer", help="inference for contrast: weights + KV cache + working buffer",
                         formatter_class=_Help)
    _model_options(inf)
    inf.add_argument("--batch", help="sequences served at once B (default: 1)")
    inf.add_argument("--seq", help="tokens per sequence, prompt + generated (default: 2048)")
    inf.add_argument("--dtype", default="bf16", help="weight dtype: bf16, fp16, fp8, int8, fp32")
    inf.add_argument("--kv-dtype", default="bf16", help="KV-cache dtype")
    inf.add_argument("--tp", default="1", help="tensor-parallel degree")
    inf.add_argument("--overhead", default=format_bytes(Ledger.overhead_bytes, digits=0).replace(" ", ""),
                     help="runtime overhead (CUDA context, workspace)")
    inf.add_argument("--units", default=UNITS[0], help=UNITS_HELP)
    inf.add_argument("--gpu-memory", default=next(iter(GPU_MEMORY)),
                     help=f"GPU memory for the fits verdict: bytes (80GB) or one of {one_of(GPU_MEMORY)}")
    inf.add_argument("--json", action="store_true", help="one JSON object with exact integer bytes")
    for name, text in (("presets", "list the presets and their architecture"),
                       ("recipes", "list the precision/optimizer recipes"),
                       ("claims", "the article audit: each claim, stated vs computed, status")):
        sub.add_parser(name, help=text).add_argument("--json", action="store_true", help="print JSON")
    return top


def _model_options(parser):
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


def _ledger_options(parser):
    _model_options(parser)
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


def _zero_stage(text):
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
        zero_stage=_zero_stage(a.zero), dp=parse_count(a.dp, "dp"),
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


def _ledger(a):
    from . import cli_conventions
    path = cli_conventions.wants(a)
    ledger = build_ledger(a)
    if path:
        return getattr(cli_conventions, path)(a, ledger)
    memory = gpu_bytes(a.gpu_memory)
    from .cli_models import pipeline_section, pipeline_text
    pipe = pipeline_section(a, ledger, memory)
    traffic = ledger.traffic
    if a.json:
        import json
        data = ledger.to_dict()
        if pipe is not None:
            data["pipeline"] = pipe
        data["gpu_memory"] = memory
        judged = _judged(ledger, a.measure)
        data["fits"] = judged.bytes <= memory
        data["measure"] = judged.key
        data["judged_bytes"] = judged.bytes
        data["peak"] = None if a.measure == "total" else ledger.peak      # total: the step is not evaluated
        data["traffic"]["link"] = a.link
        data["traffic"]["pcie_seconds"] = float(traffic.pcie_seconds(a.link))
        return json.dumps(data, indent=2)
    lines = [ledger.table(a.units).text(), "", _verdict(ledger, memory, a.measure, a.units)]
    if traffic.pcie_bytes:
        lines.append(f"Per step over {a.link}: GPU->CPU {format_bytes(traffic.gpu_to_cpu, a.units)}, "
                     f"CPU->GPU {format_bytes(traffic.cpu_to_gpu, a.units)}: "
                     f"{float(traffic.pcie_seconds(a.link)):.2f} s one after the other, "
                     f"{float(traffic.pcie_seconds(a.link, duplex=True)):.2f} s overlapped.")
    if pipe is not None:
        lines += ["", pipeline_text(pipe, a.units)]
    if traffic.nvme_read:
        slow, fast = NVME_LINKS
        lines.append(f"NVMe per step: read {format_bytes(traffic.nvme_read, a.units)}, write "
                     f"{format_bytes(traffic.nvme_write, a.units)}: {float(traffic.nvme_seconds(slow)):.1f} s "
                     f"at {format_bytes(NVME_LINKS[slow], digits=0)}/s, {float(traffic.nvme_seconds(fast)):.1f} s "
                     f"at {format_bytes(NVME_LINKS[fast], digits=0)}/s.")
    return "\n".join(lines)


def _judged(ledger, measure: str):
    """What the verdict compares with the GPU (:mod:`memledger.measure`); the sum without an architecture."""
    from .measure import judge, uses_peak
    return judge(ledger, ledger.arch is not None and uses_peak(ledger, measure))


def _verdict(ledger, memory: int, measure: str, units: str) -> str:
    """The fits line, in the explorer's words: the step's peak where the timeline models the setup (``--measure
    auto``), else the sum of the rows at the end of the forward pass, and the other one for comparison."""
    from .measure import describe
    judged = _judged(ledger, measure)
    head = (f"{'fits' if judged.bytes <= memory else 'does NOT fit'}: {format_bytes(judged.bytes, units)} per GPU "
            f"against {format_bytes(memory, units)}")
    if not ledger.arch:
        return f"{head}, the model states (without an architecture no activations are booked)."
    note = None
    if measure == "total":              # the sum was asked for: the step is not evaluated
        note = "as asked; a run fits or fails by its peak: --measure auto, or see memledger step"
    return f"{head}{describe(ledger, judged, units, note)}."


def _presets(a):
    data = {name: {"d_model": p.d_model, "n_layers": p.n_layers, "n_heads": p.n_heads, "d_ff": p.d_ff,
                   "vocab_size": p.vocab_size, "style": p.style, "n_params": p.params,
                   "computed_params": p.computed_params, "n_kv_heads": p.kv_heads, "head_dim": p.head_dim,
                   "n_experts": p.n_experts, "top_k": p.top_k, "active_params": p.active_params,
                   "description": p.description}
            for name, p in all_presets().items()}
    if a.json:
        import json
        return json.dumps(data, indent=2)
    head = f"{'preset':<17} {'style':<6} {'d':>6} {'L':>4} {'H':>4} {'d_ff':>7} {'vocab':>6} {'params':>17}"
    rows = [f"{n:<17} {p['style']:<6} {p['d_model']:>6} {p['n_layers']:>4} {p['n_heads']:>4} {p['d_ff']:>7} "
            f"{p['vocab_size']:>6} {p['n_params']:>17,}  {p['description']}" for n, p in data.items()]
    return "\n".join([head] + rows)


def _number(value):
    """An int stays an int; an exact fraction (block constants) becomes a float for JSON."""
    return value if isinstance(value, int) else float(value)


def _recipes(a):
    data = {name: {"title": r.title, "bytes_per_param": _number(r.bytes_per_param), "source": r.source,
                   "exact_bytes_per_param": str(r.bytes_per_param),
                   "components": [{"name": c.name, "dtype": c.dtype, "role": c.role,
                                   "bytes_per_param": _number(c.bytes_per_param),
                                   "exact_bytes_per_param": str(c.bytes_per_param),
                                   **({"factored": True} if c.factored else {}),
                                   **({"block_constants": [list(b) for b in c.constants]} if c.constants else {})}
                                  for c in r.components]}
            for name, r in ALL_RECIPES.items()}
    if a.json:
        import json
        return json.dumps(data, indent=2)
    return "\n".join(f"{n:<26} {r['exact_bytes_per_param']:>11} B/param = "
                     + " + ".join(f"{c['exact_bytes_per_param'] if not c.get('factored') else 'rows+cols'} "
                                  f"({c['name']})" for c in r["components"])
                     for n, r in data.items())


def _claims(a):
    from .claims import CLAIMS, claims_table
    if a.json:
        import json
        return json.dumps([c.to_dict() for c in CLAIMS], indent=2)
    return claims_table()


def _one_line(error) -> str:
    return " ".join(str(error).split("\n"))


def main(argv=None) -> int:
    try:
        a = _parser().parse_args(argv)
        if a.command is None:
            raise ValueError(f"choose a command: {one_of(COMMANDS)} (see memledger --help)")
        if a.command in ("fit", "infer"):
            from . import cli_models
            text = getattr(cli_models, a.command)(a)
        elif a.command == "step":
            from .cli_step import step
            text = step(a, build_ledger, gpu_bytes)
        elif a.command == "compare":
            from .cli_conventions import compare
            text = compare(a)
        else:
            text = {"ledger": _ledger, "presets": _presets, "recipes": _recipes, "claims": _claims}[a.command](a)
    except (ValueError, TypeError) as e:
        print(f"memledger: error: {_one_line(e)}", file=sys.stderr)
        return 2
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # the reader (e.g. `head`) is gone: not an error worth a message; keep Python from
        # complaining again when it flushes stdout at exit
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except OSError as e:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        print(f"memledger: error: cannot write the output: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0
