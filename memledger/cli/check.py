"""``memledger check FILE [FILE ...] [key=value ...]``: a training run's own config files, what memledger
understood of each key, and the verdict of the step they describe (:mod:`memledger.intake`)."""
from pathlib import Path
import textwrap

__all__ = ["add_parser", "check"]


def add_parser(sub, formatter):
    from .options import add
    check = sub.add_parser("check", formatter_class=formatter,
                           help="read a torchtune / Hugging Face / DeepSpeed / accelerate / LitGPT / torchtitan config: "
                                "what each key became, then the step's verdict")
    check.add_argument("files", nargs="+", metavar="FILE_OR_KEY=VALUE",
                       help="config files (JSON, YAML, TOML; a model directory), then key=value overrides of the "
                            "first file, as tune run takes them")
    add(check, "--model", "a model directory, config.json or Hugging Face id (read from the local cache only)")
    add(check, "--gpus", "the run's GPU count, where a config leaves it to the launcher (torchrun)")
    add(check, "--strict", "refuse a key memledger cannot express or does not know (exit 2, naming it)", switch=True)
    add(check, "--gpu-memory", "the GPU: a name (memledger step --help) or bytes")
    add(check, "--units", "GB or GiB")
    add(check, "--json", "print one JSON object: the rows, the step command and its JSON", switch=True)


def _split(items):
    files, overrides = [], []
    for item in items:
        (overrides if "=" in item and not Path(item).exists() else files).append(item)
    if not files:
        raise ValueError("give at least one config file")
    return files, overrides


def check(a, run) -> str:
    """The rows, the ``memledger step`` command they became, and that command's output (``run``: the CLI's own
    command runner)."""
    from ..intake import from_config
    from ..intake.rows import NO_EFFECT
    from ..core.units import parse_count
    files, overrides = _split(a.files)
    gpus = parse_count(a.gpus, "gpus") if a.gpus is not None else None
    intake = from_config(*files, overrides=overrides, model=a.model, gpus=gpus)
    problems = intake.problems()
    if a.strict and problems:
        first = problems[0]
        raise ValueError(f"--strict: {first.file}: {first.key} is {first.outcome} ({first.why})"
                         + (f", and {len(problems) - 1} more" if len(problems) > 1 else ""))
    argv = intake.argv() + [x for flag, value in (("--gpu-memory", a.gpu_memory), ("--units", a.units))
                            if value is not None for x in (flag, str(value))]
    command = "memledger step " + " ".join(argv)
    try:
        answer, refusal = run(["step", *argv] + (["--json"] if a.json else [])), None
    except ValueError as e:
        if a.strict:
            raise ValueError(f"--strict: memledger step refuses the run these files describe: {e}") from None
        answer, refusal = None, " ".join(str(e).split())
    if a.json:
        import json
        rows = [{"file": r.file, "key": r.key, "value": r.value, "outcome": r.outcome, "became": r.became}
                for r in intake.rows]
        return json.dumps({"rows": rows, "command": command, "refused": len(problems), "refusal": refusal,
                           "step": None if answer is None else json.loads(answer)}, indent=2, default=str)
    lines = []
    for file in dict.fromkeys(r.file for r in intake.rows):
        rows = [r for r in intake.rows if r.file == file]
        quiet = [r.key for r in rows if r.outcome == "ignored" and r.why == NO_EFFECT]
        shown = [r for r in rows if r.key not in quiet]
        width = max([len(r.key) for r in shown] + [3])
        lines += [file] + [f"  {r.key:<{width}}  {r.became}" for r in shown]
        lines += textwrap.wrap(f"ignored, {NO_EFFECT}: {', '.join(quiet)}", 118, initial_indent="  ",
                               subsequent_indent="    ") if quiet else []
    lines += ["", f"The run, as memledger models it: {command}"]
    if problems:
        lines.append(f"Left out of the verdict: {len(problems)} key(s) above memledger cannot express or does not "
                     "know (--strict refuses them).")
    return "\n".join(lines + ["", answer if refusal is None else f"memledger step refuses this run: {refusal}"])

