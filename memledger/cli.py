"""Command line: ``memledger ledger|presets|recipes|claims [--json]``.

Bad input of any kind prints one line on stderr and exits with status 2; the
messages are the Python API's ``ValueError`` messages.
"""
import argparse
import json
import sys

from .architecture import PRESETS, Architecture, get_preset
from .hardware import GPU_MEMORY
from .ledger import Ledger
from .recipes import DEFAULT_RECIPE, RECIPES
from .transfer import LINKS, link_bandwidth
from .units import format_bytes, parse_bytes, parse_count


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


def _parser():
    top = _Parser(prog="memledger", description="GPU training memory of transformers, every byte derived.")
    sub = top.add_subparsers(dest="command", metavar="{ledger,presets,recipes,claims}", parser_class=_Parser)
    led = sub.add_parser("ledger", help="the memory ledger of one setup, per GPU")
    arch = led.add_argument_group("model (a preset, a parameter count, or a shape)")
    arch.add_argument("--preset", help=f"one of: {', '.join(PRESETS)}")
    arch.add_argument("--params", help="parameter count, e.g. 7e9 (alone: model states only)")
    arch.add_argument("--hidden", help="hidden size d")
    arch.add_argument("--layers", help="number of layers L")
    arch.add_argument("--heads", help="attention heads H")
    arch.add_argument("--ffn", help="MLP intermediate size (default 4d)")
    arch.add_argument("--vocab", help="vocabulary size (default 32000)")
    arch.add_argument("--style", help="block style: gpt (default) or llama")
    run = led.add_argument_group("workload and strategy")
    run.add_argument("--batch", help=f"micro-batch size B (default {Ledger.batch_size})")
    run.add_argument("--seq", help=f"sequence length S (default {Ledger.seq_len})")
    run.add_argument("--recipe", default=DEFAULT_RECIPE, help=f"one of: {', '.join(RECIPES)}")
    run.add_argument("--recompute", default="none", help="none, selective or full")
    run.add_argument("--no-dropout", action="store_true", help="train without dropout")
    run.add_argument("--flash-attention", action="store_true", help="no S x S tensors saved")
    run.add_argument("--tp", default="1", help="tensor-parallel degree")
    run.add_argument("--sp", action="store_true", help="sequence parallelism (needs --tp > 1)")
    run.add_argument("--zero", default="0", help="ZeRO stage 0-3")
    run.add_argument("--dp", default="1", help="data-parallel degree")
    run.add_argument("--offload-optimizer", default="none", help="none, cpu or nvme")
    run.add_argument("--offload-params", default="none", help="none, cpu or nvme (needs --zero 3)")
    run.add_argument("--offload-placement", default="article",
                     help="article (grads stay on the GPU) or zero-offload (only BF16 params stay)")
    run.add_argument("--overhead", help="runtime overhead, e.g. 2GB or 1500000000 "
                     f"(default {format_bytes(Ledger.overhead_bytes, digits=0)})")
    out = led.add_argument_group("output")
    out.add_argument("--units", default="GB", help="GB (10^9 bytes) or GiB (2^30 bytes)")
    out.add_argument("--gpu-memory", default="a100-80gb",
                     help=f"GPU memory for the fits verdict: bytes (80GB) or one of {', '.join(GPU_MEMORY)}")
    out.add_argument("--link", default="pcie4-x16", help=f"host link for offload time: {', '.join(LINKS)}")
    out.add_argument("--json", action="store_true", help="one JSON object with exact integer bytes")
    for name, text in (("presets", "list the presets and their architecture"),
                       ("recipes", "list the precision/optimizer recipes"),
                       ("claims", "the article audit: each claim, stated vs computed, status")):
        sub.add_parser(name, help=text).add_argument("--json", action="store_true", help="print JSON")
    return top


def _architecture(a):
    shape = {"d_model": a.hidden, "n_layers": a.layers, "n_heads": a.heads, "d_ff": a.ffn, "vocab_size": a.vocab}
    given = {k: parse_count(v, k) for k, v in shape.items() if v is not None}
    if a.style is not None:
        given["style"] = a.style
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
    if text.strip() not in ("0", "1", "2", "3"):
        raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {text!r}")
    return int(text)


def build_ledger(a) -> Ledger:
    """The :class:`Ledger` that parsed ``ledger`` arguments describe."""
    arch = _architecture(a)
    if arch is None and a.params is None:
        raise ValueError("give a model: --preset NAME, --params N, or --hidden D --layers L --heads H")
    if arch is None and (a.batch or a.seq or a.recompute != "none" or a.flash_attention):
        raise ValueError("--batch, --seq, --recompute and --flash-attention need an architecture; "
                         "--params alone gives model states only")
    if a.units not in ("GB", "GiB"):
        raise ValueError(f"units must be GB or GiB, got {a.units!r}")
    link_bandwidth(a.link)
    return Ledger(
        arch=arch,
        n_params=None if a.params is None else parse_count(a.params, "n_params"),
        batch_size=Ledger.batch_size if a.batch is None else parse_count(a.batch, "batch_size"),
        seq_len=Ledger.seq_len if a.seq is None else parse_count(a.seq, "seq_len"),
        recipe=a.recipe, recompute=a.recompute, tp=parse_count(a.tp, "tp"), sequence_parallel=a.sp,
        zero_stage=_zero_stage(a.zero), dp=parse_count(a.dp, "dp"),
        offload_optimizer=a.offload_optimizer, offload_params=a.offload_params,
        offload_placement=a.offload_placement,
        overhead_bytes=Ledger.overhead_bytes if a.overhead is None else parse_bytes(a.overhead, "overhead"),
        dropout=False if a.no_dropout else None, flash_attention=a.flash_attention)


def _ledger(a):
    ledger = build_ledger(a)
    gpu_memory = GPU_MEMORY.get(a.gpu_memory) or parse_bytes(a.gpu_memory, "gpu_memory")
    traffic = ledger.traffic
    if a.json:
        data = ledger.to_dict()
        data["gpu_memory"] = gpu_memory
        data["fits"] = ledger.fits(gpu_memory)
        data["traffic"]["link"] = a.link
        data["traffic"]["pcie_seconds"] = float(traffic.pcie_seconds(a.link))
        return json.dumps(data, indent=2)
    lines = [ledger.table(a.units), ""]
    used = ledger.totals["gpu"]
    verdict = "fits" if ledger.fits(gpu_memory) else "does NOT fit"
    lines.append(f"{format_bytes(used, a.units)} per GPU {verdict} in {format_bytes(gpu_memory, a.units)}.")
    if traffic.pcie_bytes:
        lines.append(f"Per step over {a.link}: GPU->CPU {format_bytes(traffic.gpu_to_cpu, a.units)}, "
                     f"CPU->GPU {format_bytes(traffic.cpu_to_gpu, a.units)}: "
                     f"{float(traffic.pcie_seconds(a.link)):.2f} s one after the other, "
                     f"{float(traffic.pcie_seconds(a.link, duplex=True)):.2f} s overlapped.")
    if traffic.nvme_read:
        lines.append(f"NVMe per step: read {format_bytes(traffic.nvme_read, a.units)}, write "
                     f"{format_bytes(traffic.nvme_write, a.units)}: {float(traffic.nvme_seconds('nvme-3')):.1f} s "
                     f"at 3 GB/s, {float(traffic.nvme_seconds('nvme-7')):.1f} s at 7 GB/s.")
    return "\n".join(lines)


def _presets(a):
    data = {name: {"d_model": p.d_model, "n_layers": p.n_layers, "n_heads": p.n_heads, "d_ff": p.d_ff,
                   "vocab_size": p.vocab_size, "style": p.style, "n_params": p.params,
                   "computed_params": p.computed_params, "description": p.description}
            for name, p in PRESETS.items()}
    if a.json:
        return json.dumps(data, indent=2)
    head = f"{'preset':<13} {'style':<6} {'d':>6} {'L':>4} {'H':>4} {'d_ff':>7} {'vocab':>6} {'params':>17}"
    rows = [f"{n:<13} {p['style']:<6} {p['d_model']:>6} {p['n_layers']:>4} {p['n_heads']:>4} {p['d_ff']:>7} "
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
            for name, r in RECIPES.items()}
    if a.json:
        return json.dumps(data, indent=2)
    return "\n".join(f"{n:<26} {r['exact_bytes_per_param']:>11} B/param = "
                     + " + ".join(f"{c['exact_bytes_per_param'] if not c.get('factored') else 'rows+cols'} "
                                  f"({c['name']})" for c in r["components"])
                     for n, r in data.items())


def _claims(a):
    from .claims import CLAIMS, claims_table
    if a.json:
        return json.dumps([c.to_dict() for c in CLAIMS], indent=2)
    return claims_table()


def main(argv=None) -> int:
    parser = _parser()
    try:
        a = parser.parse_args(argv)
        if a.command is None:
            raise ValueError("choose a command: ledger, presets, recipes or claims (see memledger --help)")
        text = {"ledger": _ledger, "presets": _presets, "recipes": _recipes, "claims": _claims}[a.command](a)
    except ValueError as e:
        print(f"memledger: error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0
