"""A property-based fuzz of the command line, of malformed config.json files and of the Python API (issue 19).

Every command's option space is read off its own parser (a new option is fuzzed without an edit here), each
option drawn from values a careless or curious user would type: valid choices, junk, huge and tiny numbers,
non-ASCII digits, empty text. The contract, for every invocation (run in-process, ``memledger.cli.main.main``):

* exit 0 or 2 (1 only where the output cannot be written, which these runs never hit);
* on exit 2, one line on stderr and nothing on stdout; on exit 0 nothing on stderr;
* ``--json`` output parses; every byte count is a non-negative integer; totals are the sums of their rows;
  a step's landmarks are the sums of the rows live there (each row's ``live`` landmarks) and its peak is at least
  every landmark;
  ``fit``'s answer fits and the next value does not;
* no run over 10 s.

The API raises only ``ValueError`` or ``TypeError`` on bad input, and what it accepts keeps the same
invariants. The neighbours of issue 32's five inputs are drawn too: config paths that are directories (a model
directory whose config.json is one), tiny shapes under tensor and sequence parallelism on every backend, shapes up to
10^18 on every command (each answered in seconds), and ``compare`` against ``ledger --convention`` on the same
options (the same number, or the same refusal). The fast slice (a few examples, paths that need no step
compiled) runs with ``-m "not slow"``; the slow slice draws many more, over every command, and runs with the full
suite.
"""
import contextlib
import io
import json
import os
from pathlib import Path
import tempfile
import time

from hypothesis import HealthCheck, example, given, settings, strategies as st
import pytest

import memledger as ml
from memledger.activations.backends import BACKENDS
from memledger.calculators import CONVENTIONS, ConventionInputs
from memledger.cli.main import _parser, main
from memledger.ledger.hardware import GPU_MEMORY, LINKS
from memledger.states.recipes import ALL_RECIPES

SECONDS = 10
CONFIGS = Path(ml.__file__).parent / "models" / "configs"
#: Model directories a user may point --config at: one whose config.json is itself a directory, one without a
#: config.json, one with a real one (made once per session, left to the system's temporary folder).
FOLDERS = Path(tempfile.mkdtemp(prefix="memledger-fuzz-"))
for _name in ("config-is-a-folder/config.json", "no-config", "real"):
    (FOLDERS / _name).mkdir(parents=True)
(FOLDERS / "real" / "config.json").write_bytes((CONFIGS / "llama3-8b.json").read_bytes())
CONFIG_PATHS = (str(CONFIGS / "llama3-8b.json"), str(CONFIGS), "nope.json", str(CONFIGS / "index.json"), "/dev/null",
                str(FOLDERS / "config-is-a-folder"), str(FOLDERS / "config-is-a-folder/config.json"),
                str(FOLDERS / "no-config"), str(FOLDERS / "real"))
PRESETS = ("gpt2", "llama2-7b", "article-7b", "qwen2.5-0.5b", "gemma-2b", "mixtral-8x7b", "bert-base-uncased")
JUNK = st.sampled_from(("", " ", "x", "-1", "0", "1.5", "nan", "inf", "-inf", "1e999999999", "1e-999999999", "1e19",
                        "\u0663", "1\n2", "9" * 200, "--json"))
COUNT = st.one_of(st.sampled_from(("1", "2", "3", "4", "8", "16", "64", "1e3", "2048")), st.integers(1, 10**19).map(str))
SIZE = st.sampled_from(("0", "2GB", "1.5GiB", "80GB", "1000000", "2e9", "1TB", "1e18", "1e19"))
#: What a user would mostly type for each option (drawn most of the time; else :data:`JUNK` or another option's).
VALID = {
    "preset": st.sampled_from(PRESETS + ("nope",)),
    "hidden": st.sampled_from(("64", "128", "4096", "768")), "heads": st.sampled_from(("4", "8", "32", "12")),
    "layers": st.sampled_from(("1", "2", "5", "32")), "ffn": st.sampled_from(("128", "11008", "3072")),
    "vocab": st.sampled_from(("100", "32000", "50257")), "params": st.sampled_from(("7e9", "1e9", "1e12", "124e6")),
    "style": st.sampled_from(("gpt", "llama", "bert")),
    "batch": st.one_of(st.sampled_from(("1", "2", "4", "16")), COUNT), "seq": st.one_of(
        st.sampled_from(("1", "512", "2048", "4096")), COUNT),
    "recipe": st.sampled_from(tuple(ALL_RECIPES) + ("lion",)),
    "adapter_recipe": st.sampled_from(tuple(ALL_RECIPES) + ("lion",)),
    "recompute": st.sampled_from(("none", "selective", "full", "some")),
    "tp": st.sampled_from(("1", "2", "4", "8", "3")), "dp": st.sampled_from(("1", "2", "8", "64", "3", "7")),
    "zero": st.sampled_from(("0", "1", "2", "3", "4")),
    "offload_optimizer": st.sampled_from(("none", "cpu", "nvme", "disk")),
    "offload_params": st.sampled_from(("none", "cpu", "nvme")),
    "offload_placement": st.sampled_from(("article", "zero-offload", "x")),
    "overhead": SIZE, "scope": st.sampled_from(("model", "layers", "x")),
    "units": st.sampled_from(("GB", "GiB", "MiB", "TiB", "PB")),
    "gpu_memory": st.one_of(st.sampled_from(tuple(GPU_MEMORY) + ("h100", "bogus")), SIZE),
    "link": st.sampled_from(tuple(LINKS) + ("usb",)),
    "measure": st.sampled_from(("auto", "peak", "total", "sum")),
    "pp": st.sampled_from(("1", "2", "4", "32")), "microbatches": st.sampled_from(("1", "2", "8")),
    "interleave": st.sampled_from(("1", "2")),
    "convention": st.sampled_from(tuple(CONVENTIONS) + ("ds",)),
    "largest_layer": st.sampled_from(("1e6", "1e8", "1e30")), "gpus_per_node": st.sampled_from(("1", "8")),
    "nodes": st.sampled_from(("1", "2", "3")),
    "buffer_factor": st.sampled_from(("1", "1.5", "2", "3/2", "1000", "1001")),
    "lora_rank": st.sampled_from(("4", "16", "64")),
    "lora_targets": st.sampled_from(("q_proj", "q_proj,v_proj", "q_proj,q_proj", "", "q_proj,", "gate_proj",
                                     "c_attn", "k_proj,o_proj,down_proj")),
    "vary": st.sampled_from(("batch", "seq", "layers", "dp", "zero", "x")),
    "backend": st.sampled_from(("article", "cuda", "cpu", "tpu")),
    "dtype": st.sampled_from(("bf16", "fp16", "fp8", "int8", "fp32", "int4")),
    "kv_dtype": st.sampled_from(("bf16", "fp16", "fp8", "int8", "fp32", "int4")),
    "config": st.sampled_from(CONFIG_PATHS),
}
#: Options a model is given by (one of them, usually a preset).
MODEL = ("preset", "config", "params", "hidden")


def _commands():
    """{command: [(flag, dest, takes a value)]}, read off the parser."""
    _, commands = _parser()
    return {name: [(action.option_strings[-1], action.dest, action.nargs != 0) for action in parser._actions
                   if action.option_strings and action.dest != "help"]
            for name, parser in commands.items()}


COMMANDS = _commands()
WEIGHTED = ("ledger",) * 5 + ("step",) * 3 + ("fit",) * 3 + ("compare", "infer", "infer", "presets", "recipes")


def _one_in(n):
    """True about once in ``n`` draws (hypothesis favours the ends of an integer range; a list it samples evenly)."""
    return st.sampled_from((False,) * (n - 1) + (True,))


CONVENTION_INPUTS = {"largest_layer", "gpus_per_node", "nodes", "buffer_factor", "no_zero_init"}
LORA = {"lora_rank", "lora_targets", "qlora", "lora_dropout", "adapter_recipe", "no_double_quant"}


@st.composite
def invocations(draw, commands=WEIGHTED, fast=False):
    """An argv: a command, a model (usually a preset), a few options with drawn values (now and then junk or
    a value meant for another option), sometimes an unknown option. ``ledger`` runs one of its paths: its own
    ledger, a convention, LoRA (their options are drawn for that path, mostly)."""
    command = draw(st.sampled_from(commands))
    dests = {dest for _, dest, _ in COMMANDS[command]}
    path = draw(st.sampled_from(("own",) * 4 + ("convention", "lora"))) if command == "ledger" else "own"
    if fast and path == "convention":
        path = "own"
    excluded = set(MODEL) | {"vary", "convention"} | (CONVENTION_INPUTS if path != "convention" else set()) | (
        LORA if path != "lora" else set())
    options = [o for o in COMMANDS[command] if o[1] not in excluded or draw(_one_in(20))]
    argv = [command]
    if "preset" in dests:
        model = draw(st.sampled_from(("preset",) * 6 + ("config", "params", "hidden", "none")))
        if model == "hidden":
            argv += ["--hidden", draw(VALID["hidden"]), "--layers", draw(VALID["layers"]), "--heads",
                     draw(VALID["heads"])]
        elif model in VALID and model in dests:
            argv += [f"--{model}", draw(VALID[model])]
    if command == "fit":
        argv += ["--vary", draw(VALID["vary"])]
    if path == "convention":
        argv += ["--convention", draw(VALID["convention"])]
    if path == "lora":
        argv += draw(st.sampled_from((["--qlora"], ["--lora-rank", "8"], ["--lora-targets", "q_proj"])))
    chosen = draw(st.lists(st.sampled_from(options), max_size=4, unique=True)) if options else []
    for flag, dest, valued in chosen:
        argv.append(flag)
        if valued:
            kind = draw(st.sampled_from(("valid",) * 8 + ("junk", "count")))
            argv.append(draw(JUNK if kind == "junk" else COUNT if kind == "count" else VALID.get(dest, COUNT)))
    if "json" in dests and "--json" not in argv and draw(st.booleans()):
        argv.append("--json")                # the invariants are checked on the JSON output
    if fast and "measure" in dests:          # no step compiled in the fast slice: the sum judges
        argv = [x for i, x in enumerate(argv) if x != "--measure" and (i == 0 or argv[i - 1] != "--measure")]
        argv += ["--measure", "total"]
    if draw(_one_in(30)):
        argv.append(draw(st.sampled_from(("--nonsense", "--json", "-x", "extra"))))
    return argv


def _bytes_ok(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _check_rows(rows, totals):
    assert all(_bytes_ok(r["bytes"]) for r in rows), rows
    for device, total in totals.items():
        assert total == sum(r["bytes"] for r in rows if r.get("device", "gpu") == device), (device, total)


STEP_LIVE = {"whole step": ("before forward", "after forward", "after backward", "after step"),
             "forward to backward": ("after forward",), "backward to optimizer step": ("after backward",)}


def _check_json(command, argv, data):
    """The invariants of one command's JSON object."""
    if command == "ledger" and "conventions" not in data and "rows" in data:
        _check_rows(data["rows"], data["totals"])
        if "judged_bytes" in data:
            assert data["fits"] == (data["judged_bytes"] + data["margin"] <= data["gpu_memory"])
            if data["measure"] == "peak":
                assert data["judged_bytes"] == data["peak"]
        for stage in data.get("pipeline", {}).get("stages", ()):
            _check_rows(stage["rows"], stage["totals"])
    elif command == "compare":
        for c in data["conventions"]:
            gpu = c["gpu"]
            assert all(_bytes_ok(gpu[k]) for k in ("model_states", "activations", "other", "total")), c
            assert gpu["total"] == gpu["model_states"] + gpu["activations"] + gpu["other"] and _bytes_ok(c["cpu"])
    elif command == "infer":
        _check_rows(data["rows"], data["totals"])
    elif command == "step":
        rows, peak = data["rows"], data["peak"]["gpu"]
        assert all(_bytes_ok(r["bytes"]) for r in rows)
        for mark, devices in data["landmarks"].items():
            for device, total in devices.items():
                live = sum(r["bytes"] for r in rows if r["device"] == device and mark in r.get(
                    "live", STEP_LIVE.get(r["phase"], ())))
                assert total == live, (mark, device, total, live)
            assert peak >= devices["gpu"], (mark, peak, devices)
    elif command == "fit":
        if data["answer"] is not None:
            assert data["judged_at_answer"] + data["margin"] <= data["gpu_memory"]
        if data["next"] is not None and data["vary"] in ("batch", "seq", "layers"):
            assert data["next"]["judged"] + data["margin"] > data["gpu_memory"], data


def check_contract(argv):
    """Run ``argv`` in-process and assert the contract; returns (status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(argv)
        except SystemExit as e:              # --help, -h: argparse prints and exits 0
            status = e.code
    seconds = time.perf_counter() - start
    out, err = out.getvalue(), err.getvalue()
    assert seconds < SECONDS, (argv, seconds)
    assert status in (0, 2), (argv, status, err)
    if status == 2:
        assert out == "" and err.count("\n") == 1 and err.startswith("memledger: error: "), (argv, out[:300], err)
        assert "Traceback" not in err
        return status, out, err
    assert err == "", (argv, err)
    if "--json" in argv and "-h" not in argv and "--help" not in argv:
        data = json.loads(out)
        _check_json(argv[0], argv, data)
    return status, out, err


FAST = ("ledger",) * 4 + ("infer", "fit", "fit", "presets", "recipes")


@pytest.mark.slow
@settings(max_examples=20, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(invocations(commands=FAST, fast=True))
def test_cli_fast(argv):
    check_contract(argv)


@pytest.mark.slow
@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(invocations())
def test_cli_slow(argv):
    check_contract(argv)


@st.composite
def steps(draw):
    """``step --json`` over the strategy space the timeline models: a small decoder, ZeRO, dp, tp, offload,
    recomputation, kernels, backends (the landmark and peak invariants hold for every one)."""
    style = draw(st.sampled_from(("gpt", "llama")))
    heads = draw(st.sampled_from((2, 4)))
    argv = ["step", "--hidden", str(8 * heads * draw(st.sampled_from((1, 3)))), "--heads", str(heads), "--layers",
            draw(st.sampled_from(("1", "2", "6"))), "--style", style, "--vocab", draw(st.sampled_from(("24", "100"))),
            "--recipe", draw(st.sampled_from(("bf16-adamw", "fp32-adamw", "bf16-pure-adamw", "bf16-adamw-fp32-grads",
                                              "fp32-sgd", "bf16-sgd-momentum", "bf16-pure-sgd-momentum"))),
            "--zero", draw(st.sampled_from(("0", "1", "2", "3"))), "--dp", draw(st.sampled_from(("1", "3", "8"))),
            "--batch", draw(st.sampled_from(("1", "3"))), "--seq", draw(st.sampled_from(("4", "6"))),
            "--backend", draw(st.sampled_from(("article", "cuda", "cpu"))), "--json"]
    if draw(st.booleans()):
        argv += ["--tp", "2"] + (["--sp"] if draw(st.booleans()) else [])
    for flag in ("--flash-attention", "--no-dropout"):
        if draw(st.booleans()):
            argv.append(flag)
    argv += draw(st.sampled_from(([], ["--foreach"], ["--no-foreach"], ["--fused"])))
    argv += ["--recompute", draw(st.sampled_from(("none", "selective", "full")))]
    offload = draw(st.sampled_from(("none", "cpu", "nvme")))
    if offload != "none":
        argv += ["--offload-optimizer", offload] + (["--offload-placement", "zero-offload"] if draw(st.booleans())
                                                      else [])
    if "3" == argv[argv.index("--zero") + 1] and draw(st.booleans()):
        argv += ["--offload-params", "cpu"]
    return argv


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(steps())
def test_step_slow(argv):
    check_contract(argv)


MODEL_COMMANDS = (["ledger"], ["ledger", "--measure", "total"], ["step"], ["fit", "--vary", "batch"],
                  ["fit", "--vary", "seq"], ["compare"], ["infer"])
#: The paths that are not a config.json file: each refused in one line by every command, before any model is built.
NOT_FILES = tuple(p for p in CONFIG_PATHS if not p.endswith("llama3-8b.json") and not p.endswith("real"))


@settings(max_examples=8, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(MODEL_COMMANDS), st.sampled_from(NOT_FILES), st.booleans())
def test_config_paths_that_are_not_files_fast(command, path, as_json):
    status, _, err = check_contract([*command, "--config", path] + ["--json"] * as_json)
    assert status == 2 and "config" in err


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(MODEL_COMMANDS), st.sampled_from(CONFIG_PATHS), st.booleans())
def test_config_paths_slow(command, path, as_json):
    check_contract([*command, "--config", path] + ["--json"] * as_json)


@st.composite
def tiny_parallel_steps(draw):
    """``step --json`` at the smallest shapes under tensor and sequence parallelism, on every backend: B x S of 1
    to 3 tokens over tp up to 8 (a split that is not whole bytes per rank is refused in one line naming it)."""
    heads = draw(st.sampled_from((2, 4, 8)))
    tp = draw(st.sampled_from([t for t in (2, 4, 8) if heads % t == 0]))
    argv = ["step", "--hidden", str(heads * draw(st.sampled_from((1, 2, 16)))), "--heads", str(heads), "--layers",
            draw(st.sampled_from(("1", "2", "5", "24"))), "--style", draw(st.sampled_from(("gpt", "llama"))),
            "--vocab", draw(st.sampled_from(("8", "24", "100"))), "--batch", draw(st.sampled_from(("1", "2", "3"))),
            "--seq", draw(st.sampled_from(("1", "2", "3"))), "--tp", str(tp),
            "--backend", draw(st.sampled_from(tuple(BACKENDS))), "--json"]
    if draw(st.booleans()):
        argv.append("--sp")
    argv += draw(st.sampled_from(([], ["--foreach"], ["--no-foreach"], ["--fused"], ["--flash-attention"],
                                  ["--recompute", "selective"], ["--recompute", "full"], ["--no-dropout"])))
    argv += draw(st.sampled_from(([], ["--zero", "1", "--dp", "2"], ["--zero", "3", "--dp", "3"])))
    return argv


@pytest.mark.slow
@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(tiny_parallel_steps())
def test_tiny_parallel_steps_slow(argv):
    check_contract(argv)


HUGE = st.sampled_from((1, 2, 3, 64, 10**9, 10**18))


@st.composite
def huge_invocations(draw, commands=("ledger", "step", "fit", "compare", "infer")):
    """Every command that takes a model, on a LLaMA or GPT-2 config.json whose sizes go up to 10^18 (or a shape
    given by --hidden/--layers/--heads up to 10^18): answered in seconds, or refused in one line. Quantized weights,
    the allocator's replay and DDP's buckets too, which once listed every layer (tests/test_layers_one_by_one.py)."""
    command = draw(st.sampled_from(commands))
    if draw(st.booleans()):
        config = {"model_type": "llama", "hidden_size": draw(HUGE), "num_hidden_layers": draw(HUGE),
                  "num_attention_heads": draw(st.sampled_from((1, 2))), "num_key_value_heads": 1,
                  "intermediate_size": draw(HUGE), "vocab_size": draw(HUGE), "tie_word_embeddings": draw(st.booleans())}
        model = ["--config", json.dumps(config)]
    else:
        model = ["--hidden", str(draw(HUGE)), "--layers", str(draw(HUGE)), "--heads", "1", "--style",
                 draw(st.sampled_from(("gpt", "llama"))), "--ffn", str(draw(HUGE)), "--vocab", str(draw(HUGE))]
    argv = [command, *model]
    if command == "fit":
        argv += ["--vary", draw(st.sampled_from(("batch", "seq", "layers", "zero")))]
    if command == "infer":
        argv += draw(st.sampled_from(([], ["--attention", "eager"], ["--batch", "4", "--seq", "4096"],
                                      ["--logits-to-keep", "0"], ["--weights", "nf4"], ["--weights", "int8"],
                                      ["--seq", "1e18"])))
    elif command != "compare":                   # (fit: a replay per value searched would take more than seconds)
        argv += draw(st.sampled_from(([], ["--batch", "1", "--seq", "1"], ["--measure", "total"],
                                      ["--seq", "1e18"], ["--recompute", "full"], ["--framework", "ddp", "--dp", "2"])
                                     + ((["--measure", "allocated"],) if command != "fit" else ())))
    return argv + ["--json"]


def _huge_run(argv):
    """``argv`` with a config given as JSON text written to a config.json first."""
    if "--config" not in argv:
        return check_contract(argv)
    with tempfile.TemporaryDirectory() as folder:
        i = argv.index("--config") + 1
        (Path(folder) / "config.json").write_text(argv[i])
        return check_contract(argv[:i] + [folder] + argv[i + 1:])


@pytest.mark.slow
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(huge_invocations(commands=("infer", "compare")))
def test_huge_shapes_fast(argv):
    _huge_run(argv)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(huge_invocations())
def test_huge_shapes_slow(argv):
    _huge_run(argv)


# --- compare against ledger --convention on the same options

#: flag -> values, for the options compare and the conventions read.
CONVENTION_OPTIONS = {
    "--zero": ("0", "1", "2", "3"), "--dp": ("1", "2", "8", "64"), "--tp": ("1", "2", "8"), "--nodes": ("1", "2", "3"),
    "--gpus-per-node": ("1", "8"), "--largest-layer": ("1e6", "1e8"), "--buffer-factor": ("1", "1.5", "3"),
    "--offload-optimizer": ("none", "cpu", "nvme"), "--offload-params": ("none", "cpu"), "--batch": ("1", "4"),
    "--seq": ("1", "512", "2048"), "--recipe": ("bf16-adamw", "fp32-adamw", "bf16-adamw-fp32-grads"),
    "--recompute": ("none", "selective", "full"), "--no-zero-init": None, "--sp": None}


@st.composite
def convention_setups(draw):
    """compare's options: a model (--params alone, or a preset) and a few of :data:`CONVENTION_OPTIONS`."""
    argv = draw(st.sampled_from((["--params", "175e9"], ["--params", "7e9"], ["--preset", "gpt2"],
                                 ["--preset", "llama2-7b"])))
    for flag in draw(st.lists(st.sampled_from(sorted(CONVENTION_OPTIONS)), max_size=5, unique=True)):
        values = CONVENTION_OPTIONS[flag]
        argv += [flag] if values is None else [flag, draw(st.sampled_from(values))]
    return argv


def _dest(flag):
    return flag[2:].replace("-", "_")


def _convention_argv(name, options):
    """``ledger --convention NAME`` with those of ``options`` the convention reads (it refuses the others); where
    --gpus-per-node x --nodes sets the GPUs (no --dp) but the convention does not read them, the --dp they set."""
    from memledger.cli.paths import convention_reads
    reads, argv, i = convention_reads(CONVENTIONS[name]), [], 0
    given = dict(zip(options, options[1:] + [""]))
    if "--gpus-per-node" in given and "--dp" not in given and "gpus_per_node" not in reads and "dp" in reads:
        gpus = int(given["--gpus-per-node"]) * int(given.get("--nodes", "1"))
        argv += ["--dp", str(gpus // int(given.get("--tp", "1")))]
    while i < len(options):
        flag = options[i]
        valued = i + 1 < len(options) and not options[i + 1].startswith("--")
        if _dest(flag) in reads:
            argv += options[i:i + 1 + valued]
        i += 1 + valued
    return ["ledger", *argv, "--convention", name, "--json"]


def check_compare_against_conventions(options):
    """Each convention's row of ``compare`` is what ``ledger --convention`` gives on the same options (those it
    reads): the same GPU and CPU totals, or the same refusal as its error."""
    status, out, _ = check_contract(["compare", *options, "--json"])
    if status != 0:
        return
    for row in json.loads(out)["conventions"][1:]:
        argv = _convention_argv(row["name"], options)
        status, out, err = check_contract(argv)
        if status == 2:
            assert row.get("error") == err.removeprefix("memledger: error: ").rstrip("\n"), (argv, row, err)
        else:
            totals = json.loads(out)["totals"]
            assert "error" not in row, (argv, row)
            assert (row["gpu"]["total"], row["cpu"]) == (totals["gpu"], totals.get("cpu", 0)), (argv, row, totals)


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(convention_setups())
@example(["--params", "175e9", "--zero", "0", "--dp", "8", "--nodes", "2"])      # issue 32's
def test_compare_against_ledger_convention_fast(options):
    check_compare_against_conventions(options)


@pytest.mark.slow
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(convention_setups())
def test_compare_against_ledger_convention_slow(options):
    check_compare_against_conventions(options)


# --- malformed config.json files, through the command line

BASE = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False}
GPT2 = {"model_type": "gpt2", "n_embd": 64, "n_layer": 2, "n_head": 4, "n_inner": None, "vocab_size": 100,
        "n_positions": 64}
JSON_VALUES = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-10, 10**25), st.sampled_from(
    (0.5, 64.0, float("nan"), float("inf"), 1e300)), st.text(max_size=8)),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=6)


@st.composite
def config_files(draw):
    """The bytes of a config.json: a real one with fields replaced, removed or added, or junk."""
    kind = draw(st.integers(0, 9))
    if kind == 0:
        return draw(st.binary(max_size=64))
    if kind == 1:
        depth = draw(st.sampled_from((31, 32, 33, 5000)))
        return ("[" * depth + "]" * depth).encode()
    config = dict(draw(st.sampled_from((BASE, GPT2))))
    for key in draw(st.lists(st.sampled_from(sorted(config) + ["head_dim", "attention_bias", "num_local_experts"]),
                             max_size=3, unique=True)):
        if draw(st.booleans()):
            config[key] = draw(JSON_VALUES)
        else:
            config.pop(key, None)
    text = json.dumps(config, allow_nan=True)
    encoding = draw(st.sampled_from(("utf-8", "utf-8", "utf-8", "utf-16", "latin-1")))
    return text.encode(encoding, errors="replace")


def _config_run(content, extra):
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "config.json"
        path.write_bytes(content)
        return check_contract(["ledger", "--config", str(path), "--measure", "total", *extra])


@pytest.mark.slow
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(config_files(), st.sampled_from(([], ["--json"], ["--batch", "2", "--json"])))
def test_malformed_configs_fast(content, extra):
    _config_run(content, extra)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(config_files(), st.sampled_from(([], ["--json"], ["--zero", "3", "--dp", "4", "--json"])))
def test_malformed_configs_slow(content, extra):
    _config_run(content, extra)


# --- the Python API

ANY = st.one_of(st.none(), st.booleans(), st.integers(-2, 10**20), st.floats(allow_nan=True), st.text(max_size=6),
                st.just([1]), st.just(2.0))


def _field(valid):
    return st.one_of(valid, ANY)


LEDGER_FIELDS = {
    "arch": _field(st.sampled_from(PRESETS)), "n_params": _field(st.sampled_from((None, 10**9, 7e9))),
    "batch_size": _field(st.integers(1, 64)), "seq_len": _field(st.integers(1, 8192)),
    "recipe": _field(st.sampled_from(tuple(ALL_RECIPES))), "recompute": _field(st.sampled_from(("none", "full"))),
    "tp": _field(st.sampled_from((1, 2, 4))), "sequence_parallel": _field(st.booleans()),
    "zero_stage": _field(st.sampled_from((0, 1, 2, 3))), "dp": _field(st.sampled_from((1, 8, 64))),
    "offload_optimizer": _field(st.sampled_from(("none", "cpu"))), "offload_params": _field(st.just("none")),
    "overhead_bytes": _field(st.sampled_from((0, 2 * 10**9))), "dropout": _field(st.sampled_from((None, False))),
    "flash_attention": _field(st.booleans()), "scope": _field(st.sampled_from(("model", "layers"))),
}


@st.composite
def ledger_kwargs(draw):
    names = draw(st.lists(st.sampled_from(sorted(LEDGER_FIELDS)), max_size=4, unique=True))
    kwargs = {"arch": draw(st.sampled_from(PRESETS))}
    kwargs.update({name: draw(LEDGER_FIELDS[name]) for name in names})
    return kwargs


def _api(call):
    """The call's result, or None where it raised ValueError or TypeError (anything else fails the test)."""
    try:
        return call()
    except (ValueError, TypeError):
        return None


def check_api(kwargs, convention, inputs, vary):
    ledger = _api(lambda: ml.Ledger(**kwargs))
    if ledger is not None:
        rows = [{"device": r.device, "bytes": r.bytes} for r in ledger.rows]
        _check_rows(rows, ledger.totals)
        result = _api(lambda: ml.fit(ledger, vary, 80 * 10**9, measure="total"))
        if result is not None and result["answer"] is not None:
            assert result["judged_at_answer"] + result["margin"] <= 80 * 10**9
        conv_inputs = _api(lambda: ConventionInputs(**inputs))
        if conv_inputs is not None:
            estimate = _api(lambda: CONVENTIONS[convention].estimate(ledger, conv_inputs))
            if estimate is not None:
                assert all(_bytes_ok(r.bytes) for r in estimate.rows)
    else:
        _api(lambda: ml.fit(kwargs.get("arch"), vary, 80 * 10**9))
    _api(lambda: ml.LoraLedger(kwargs.get("arch"), ml.LoraConfig(rank=kwargs.get("batch_size", 8)),
                               overhead_bytes=kwargs.get("overhead_bytes", 0)))
    _api(lambda: ml.Inference(kwargs.get("arch"), batch_size=kwargs.get("batch_size", 1), tp=kwargs.get("tp", 1)))


INPUTS = st.fixed_dictionaries({}, optional={"largest_layer": _field(st.sampled_from((10**6, 10**8))),
                                             "gpus_per_node": _field(st.sampled_from((1, 8))),
                                             "nodes": _field(st.sampled_from((1, 2))),
                                             "buffer_factor": _field(st.sampled_from(("1.5", 2, "1e999999999"))),
                                             "zero_init": _field(st.booleans())})


@pytest.mark.slow
@settings(max_examples=15, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(ledger_kwargs(), st.sampled_from(tuple(CONVENTIONS)), INPUTS, st.sampled_from(("batch", "dp", "x")))
def test_api_fast(kwargs, convention, inputs, vary):
    check_api(kwargs, convention, inputs, vary)


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(ledger_kwargs(), st.sampled_from(tuple(CONVENTIONS)), INPUTS, st.sampled_from(("batch", "seq", "layers",
                                                                                      "dp", "zero", "x")))
def test_api_slow(kwargs, convention, inputs, vary):
    check_api(kwargs, convention, inputs, vary)


@pytest.mark.slow
@settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.dictionaries(st.sampled_from(sorted(BASE) + sorted(GPT2)), JSON_VALUES, max_size=6))
def test_config_dicts_raise_only_value_or_type_errors(changes):
    for base in (BASE, GPT2):
        _api(lambda base=base: ml.Architecture.from_hf_config({**base, **changes}))


def test_the_fuzz_sees_every_command():
    assert set(COMMANDS) == {"ledger", "step", "compare", "fit", "infer", "check", "presets", "recipes", "claims"}
    assert os.path.exists(CONFIGS / "llama3-8b.json")


# --- memledger check: users' own config files, real and malformed (issue 30) ------------------------------------

USER_CONFIGS = sorted(str(p) for p in (Path(__file__).resolve().parents[1] / "intake" / "configs").iterdir()
                      if p.suffix in (".yaml", ".json", ".toml"))
for _name, _bytes in (("bad.yaml", b"model: [unclosed\n"), ("list.yaml", b"- a\n- b\n"), ("bin.json", b"\xff\xfe{}"),
                      ("empty.toml", b""), ("deep.json", b"[" * 5000 + b"]" * 5000), ("notes.txt", b"hello"),
                      ("other.yaml", b"model:\n  _component_: torchtune.models.llama2.llama2_999b\nbatch_size: 2\n")):
    (FOLDERS / _name).write_bytes(_bytes)
(FOLDERS / "folder.yaml").mkdir(exist_ok=True)
BAD_CONFIGS = tuple(str(FOLDERS / n) for n in ("bad.yaml", "list.yaml", "bin.json", "empty.toml", "deep.json",
                                               "notes.txt", "other.yaml", "folder.yaml", "missing.yaml"))
OVERRIDES = st.sampled_from(("batch_size=4", "batch_size=0", "batch_size=x", "tokenizer.max_seq_len=4096",
                             "tokenizer.max_seq_len=null", "tokenizer.max_seq_len=1e99", "dtype=fp16", "dtype=bf16",
                             "enable_activation_checkpointing=true", "optimizer_in_bwd=true", "compile=true",
                             "model.lora_rank=-3", "=1", "a..b=1", "~loss", "~model", "loss._component_=x",
                             "torch_dtype=bfloat16", "per_device_train_batch_size=2"))


@st.composite
def checks(draw):
    """``memledger check`` with one or two config files (mostly the committed real ones, now and then a malformed
    one), a few key=value overrides, and its options drawn with junk now and then."""
    files = draw(st.lists(st.sampled_from(USER_CONFIGS * 4 + list(BAD_CONFIGS)), min_size=1, max_size=2))
    argv = ["check", *files, *draw(st.lists(OVERRIDES, max_size=2))]
    if draw(_one_in(3)):
        argv += ["--model", draw(st.sampled_from(("meta-llama/Llama-2-7b-hf", "Qwen/Qwen2.5-0.5B", "nobody/nothing",
                                                   str(FOLDERS / "real"), str(FOLDERS / "no-config"), "x")))]
    if draw(_one_in(3)):
        argv += ["--gpus", draw(st.sampled_from(("8", "64", "0", "x", "1e19")))]
    for flag in ("--strict", "--json"):
        if draw(_one_in(3)):
            argv.append(flag)
    return argv


def _check_check(argv):
    status, out, _ = check_contract(argv)
    if status == 0 and "--json" in argv:
        data = json.loads(out)
        assert all(r["outcome"] in ("option", "default", "ignored", "refused", "unknown") for r in data["rows"])
        assert data["command"].startswith("memledger step ")
        assert (data["step"] is None) == (data["refusal"] is not None)
        if data["step"] is not None and not LORA_COMPOSITE_ROWS_BUG(data["command"]):
            _check_json("step", argv, data["step"])
        assert "--strict" not in argv or (data["refused"] == 0 and data["refusal"] is None)


def LORA_COMPOSITE_ROWS_BUG(command: str) -> bool:
    """A known defect this fuzz found (:func:`test_lora_composite_rmsnorm_rows_sum_to_the_landmarks`): without
    recomputation, the LoRA step with a composite RMSNorm lists a block input the caller still holds at the end of
    forward as a forward transient, so its rows miss B x S x d x 2 bytes at "after forward" (its landmarks are
    MemTracker's: tests/step/test_lora.py, the CPU backend's composite norm). Such a check's other invariants (its
    rows' outcomes, the refusal, the one-line contract) are still checked."""
    return ("--lora-rank" in command or "--qlora" in command) and "--rmsnorm composite" in command and (
        "--recompute full" not in command)


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="known: the LoRA step's rows with a composite RMSNorm miss the block input "
                                       "held at the end of forward (found by test_check_slow); list it as a row of "
                                       "'after forward' where no checkpoint row already books it, then drop the "
                                       "marker and LORA_COMPOSITE_ROWS_BUG")
def test_lora_composite_rmsnorm_rows_sum_to_the_landmarks():
    check_contract(["step", "--preset", "llama2-7b", "--backend", "cuda", "--rmsnorm", "composite", "--lora-rank", "8",
                    "--lora-targets", "q_proj,v_proj", "--batch", "2", "--seq", "512", "--json"])


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(checks())
@example(["check", USER_CONFIGS[0], "--json"])
@example(["check", str(FOLDERS / "folder.yaml")])
def test_check_fast(argv):
    _check_check(argv)


@pytest.mark.slow
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck))
@given(checks())
def test_check_slow(argv):
    _check_check(argv)
