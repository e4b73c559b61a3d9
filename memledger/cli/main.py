"""Command line: ``memledger ledger|step|compare|fit|infer|check|presets|recipes|claims [--json]``.

Bad input of any kind prints one line on stderr, nothing on stdout, and exits
with status 2 (the messages are the Python API's); so does a given option the
chosen path does not read (:mod:`memledger.cli.paths`). Output that cannot be
written (a closed or full stdout, a reader gone) prints one line on stderr and
exits with status 1. No traceback, ever (``tests/cli/test_fuzz.py``).
The ledger path imports neither SymPy nor NumPy: rows are evaluated by the
generated :mod:`memledger.core.compiled`, so the command answers about as fast as
Python starts (``benchmarks/bench.py``).
"""
import argparse
import functools
import os
import sys

from ..core.units import format_bytes
from ..ledger.hardware import NVME_LINKS
from ..models.presets import all_presets
from ..states.recipes import ALL_RECIPES
from . import check as cli_check, compare as cli_compare, models as cli_models, step as cli_step
from .options import add, build_ledger, fill_defaults, given_options, gpu_bytes, host_link, ledger_options, one_of
from .options import allocator_options, allocator_spec_of, output_options
from .paths import (FRAMEWORK, IMPLEMENTATION, IN_BACKWARD_WHY, LOSS, MODEL, PIPELINE, WORKLOAD, allocator_reads,
                    in_backward_reads, refuse_unread)
from .verdict import judged_by, measure_data, measure_lines, verdict_line

__all__ = ["COMMANDS", "main"]

COMMANDS = ("ledger", "step", "compare", "fit", "infer", "check", "presets", "recipes", "claims")


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise ValueError(message)


class _Help(argparse.HelpFormatter):
    """Shows each option's default (``action.fallback``, filled in after parsing), where it has one."""

    def _get_help_string(self, action):
        text = action.help or ""
        default = getattr(action, "fallback", None)
        if default is not None and action.option_strings:
            text += f" (default: {default})"
        return text


@functools.cache
def _parser():
    """The top parser and each command's parser, by name (built once per process: parsing never changes them)."""
    top = _Parser(prog="memledger", description="GPU training memory of transformers, every byte derived.",
                  formatter_class=_Help)
    sub = top.add_subparsers(dest="command", metavar="{" + ",".join(COMMANDS) + "}", parser_class=_Parser)
    led = sub.add_parser("ledger", help="the memory ledger of one setup, per GPU", formatter_class=_Help)
    ledger_options(led)
    output_options(led)
    cli_compare.add_options(led)
    cli_compare.add_parser(sub, _Help)
    cli_step.add_parser(sub, _Help)
    allocator_options(led, "what the fits verdict judges: auto (the step's peak, memledger step, where the timeline "
                      "models the setup, else the sum of the rows at the end of the forward pass), peak, total (the "
                      "sum, without evaluating the step)", "auto")
    pipe = led.add_argument_group("pipeline parallelism (Megatron-LM schedules)")
    add(pipe, "--pp", "pipeline stages P (rows per stage: first and last)")
    add(pipe, "--microbatches", "micro-batches per step M (needs --pp; default: P)")
    add(pipe, "--interleave", "model chunks per device V, the interleaved schedule (needs --pp; default: 1)")
    cli_models.add_parsers(sub, _Help)
    cli_check.add_parser(sub, _Help)
    for name, text in (("presets", "list the presets and their architecture"),
                       ("recipes", "list the precision/optimizer recipes"),
                       ("claims", "the article audit: each claim, stated vs computed, status")):
        sub.add_parser(name, help=text).add_argument("--json", action="store_true", help="print JSON")
    return top, sub.choices


def _ledger(a):
    path = cli_compare.wants(a)
    if path == "convention":
        return cli_compare.convention(a)
    ledger = build_ledger(a)
    if ledger.framework == "fsdp2":
        raise ValueError("memledger ledger sums rows; --framework fsdp2 has shards and buffers of its own that only "
                         "the step books: use memledger step (or fit)")
    if path == "lora":
        return cli_compare.lora(a, ledger, cli_step.lora_step)
    reads = set(MODEL) | set(WORKLOAD) | {"units", "gpu_memory", "link", "json", "measure"} | set(PIPELINE)
    reads |= set(FRAMEWORK) if a.pp is None else set()      # issue 15: pipeline stages book no framework's buffers
    where = "memledger ledger"
    if ledger.arch is None:
        reads -= {"measure"} | set(PIPELINE)
        where = "a ledger without an architecture (--params alone)"
    else:
        reads |= allocator_reads(a)
    if ledger.offload_optimizer == "none":
        reads.discard("offload_placement")
    from ..answers.verdict import uses_peak
    spec = allocator_spec_of(a) if ledger.arch is not None else None
    if ledger.arch is not None and a.measure != "total" and uses_peak(ledger, a.measure):
        reads |= set(LOSS) | set(IMPLEMENTATION)    # they change the verdict by the peak, not the sum
    traffic = ledger.traffic
    if not traffic.pcie_bytes:
        reads.discard("link")
    reads |= in_backward_reads(a)
    refuse_unread(a, reads, where, {"pp": "pipeline stages split the layers: give an architecture",
                                    "framework": "pipeline stages book no framework's buffers",
                                    "link": "there is no offload transfer to time", **IN_BACKWARD_WHY})
    from ..answers.verdict import CHOICES, MARGIN, leaves_margin
    from ..core.choices import check_choice
    check_choice("measure", a.measure, CHOICES)
    link = host_link(a.link)
    memory = gpu_bytes(a.gpu_memory)
    pipe = cli_models.pipeline_section(a, ledger, memory)
    if a.json:
        import json
        data = ledger.to_dict()
        if pipe is not None:
            data["pipeline"] = pipe
        data["gpu_memory"] = memory
        judged = judged_by(ledger, a.measure, spec)
        data["fits"] = leaves_margin(judged.bytes, memory)         # with the margin free (answers.verdict)
        data["margin"] = MARGIN
        data["measure"] = judged.key
        data["judged_bytes"] = judged.bytes
        data["peak"] = None if a.measure == "total" else ledger.peak      # total: the step is not evaluated
        data.update(measure_data(ledger, spec))
        data["traffic"]["link"] = link
        data["traffic"]["pcie_seconds"] = float(traffic.pcie_seconds(link))
        return json.dumps(data, indent=2)
    lines = [ledger.table(a.units).text(), "", verdict_line(ledger, memory, a.measure, a.units, spec)]
    lines += measure_lines(ledger, spec, a.units)
    lines += framework_lines(ledger, a.units)
    if traffic.pcie_bytes:
        lines.append(f"Per step over {link}: GPU->CPU {format_bytes(traffic.gpu_to_cpu, a.units)}, "
                     f"CPU->GPU {format_bytes(traffic.cpu_to_gpu, a.units)}: "
                     f"{float(traffic.pcie_seconds(link)):.2f} s one after the other, "
                     f"{float(traffic.pcie_seconds(link, duplex=True)):.2f} s overlapped.")
    if pipe is not None:
        lines += ["", cli_models.pipeline_text(pipe, a.units)]
    if traffic.nvme_read:
        slow, fast = NVME_LINKS
        lines.append(f"NVMe per step: read {format_bytes(traffic.nvme_read, a.units)}, write "
                     f"{format_bytes(traffic.nvme_write, a.units)}: {float(traffic.nvme_seconds(slow)):.1f} s "
                     f"at {format_bytes(NVME_LINKS[slow], digits=0)}/s, {float(traffic.nvme_seconds(fast)):.1f} s "
                     f"at {format_bytes(NVME_LINKS[fast], digits=0)}/s.")
    return "\n".join(lines)


def framework_lines(ledger, unit: str) -> list:
    """DeepSpeed's or Megatron-LM's buffers beyond the rows (transients, or rows already booked), from source."""
    extra = [b for b in ledger.framework_buffers if b.live != "whole step" or b.booked]
    if not extra:
        return []
    lines = ["", f"{ledger.framework} buffers read from its source, beside the sum (live when; row already booked):"]
    return lines + [f"  {format_bytes(b.bytes, unit):>12}  {b.name} ({b.live}{'; = ' + b.booked if b.booked else ''})"
                    for b in extra]


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
    from ..article.claims import CLAIMS, claims_table
    if a.json:
        import json
        return json.dumps([c.to_dict() for c in CLAIMS], indent=2)
    return claims_table()


def _one_line(error) -> str:
    return " ".join(str(error).split())


def _complain(message: str) -> None:
    """One line on stderr, if there is a stderr to write to (never on stdout)."""
    try:
        if sys.stderr is not None:
            sys.stderr.write(f"memledger: error: {message}\n")
            sys.stderr.flush()
    except (OSError, ValueError):
        pass


def _run(argv) -> str:
    top, commands = _parser()
    a = top.parse_args(argv)
    if a.command is None:
        raise ValueError(f"choose a command: {one_of(COMMANDS)} (see memledger --help)")
    parser = commands[a.command]
    a.given = given_options(parser, a)
    fill_defaults(parser, a)
    handlers = {"ledger": _ledger, "step": cli_step.step, "compare": cli_compare.compare, "fit": cli_models.fit,
                "infer": cli_models.infer, "check": lambda a: cli_check.check(a, _run),
                "presets": _presets, "recipes": _recipes, "claims": _claims}
    return handlers[a.command](a)


def _silence_stdout() -> None:
    """Point fd 1 at /dev/null, so that Python's flush at exit does not complain a second time."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


def main(argv=None) -> int:
    """Run one command: 0 with the output on stdout; 2 with one line on stderr for bad input (nothing on
    stdout); 1 with one line on stderr when the output cannot be written (a closed or full stdout)."""
    try:
        text = _run(argv)
    except (ValueError, TypeError) as e:
        _complain(_one_line(e))
        return 2
    if sys.stdout is None:                  # started with fd 1 closed (memledger ... >&-)
        _complain("cannot write the output: standard output is closed")
        return 1
    try:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        _silence_stdout()
        _complain("cannot write the output: the reader closed the pipe")
        return 1
    except (OSError, ValueError) as e:      # a full disk; a closed file (ValueError: I/O on a closed file)
        _silence_stdout()
        _complain(f"cannot write the output: {getattr(e, 'strerror', None) or e}")
        return 1
    return 0
