"""The golden snapshot of ``memledger step --json`` over a broad grid of setups
(tests/step/test_golden.py).

Each setup is one command line of ``memledger step``; its record is the exit status and, for a step, the peak and
the landmarks in the clear plus a sha256 of the whole JSON output re-dumped canonically (sorted keys, no spaces),
or, for a refusal, its one line on stderr. The snapshot guards a refactoring of memledger/step: every number the
command prints stays the same. It was generated on the code before that refactoring; regenerate it (only where a
change of numbers is meant, and say so in the commit) with::

    python tests/stepgolden.py --write

The grid crosses the families the step models (GPT and LLaMA blocks, GQA/MQA, QKV biases, tied heads, head sizes,
GPT-NeoX's and Phi's parallel blocks, BLOOM's ALiBi, StarCoder's positions) with the backends, every modelled
recipe, recomputation, ZeRO stages and offload, tensor and sequence parallelism, DDP, FSDP2's knobs, LoRA and QLoRA,
FP16 autocast, packing, chunked losses, the optimizer implementations, activation offloading, paged and
in-backward optimizers; a few refused setups guard their one-line messages.
"""
from contextlib import redirect_stderr, redirect_stdout
import hashlib
import io
import json
from pathlib import Path
import sys

__all__ = ["GRID", "SNAPSHOT", "record", "setups"]

SNAPSHOT = Path(__file__).parent / "step" / "golden_step.jsonl"

#: Small shapes of each style (L <= 4: every block its own program) and one with L > 4 (lumped middle blocks).
SMALL = {"gpt2": "--hidden 64 --layers 2 --heads 4 --vocab 128 --style gpt",
         "gpt5": "--hidden 64 --layers 6 --heads 4 --vocab 128 --style gpt",
         "llama2": "--hidden 64 --layers 2 --heads 4 --vocab 128 --ffn 160 --style llama",
         "llama6": "--hidden 64 --layers 6 --heads 4 --vocab 128 --ffn 160 --style llama"}

#: Presets of every family the step models (and three it refuses).
PRESETS = ["article-7b", "llama2-7b", "llama3-8b", "mistral-7b", "qwen2.5-7b", "qwen2.5-0.5b", "gemma-2b",
           "gemma-7b", "pythia-6.9b", "phi-2", "bloom-7b1", "starcoder --no-dropout", "gpt2 --no-dropout"]
REFUSED_PRESETS = ["mixtral-8x7b", "bert-base-uncased", "t5-base"]

BACKENDS = ["article", "cpu", "cuda"]

MODELLED = ["bf16-adamw", "bf16-adamw-fp32-grads", "fp32-adamw", "bf16-pure-adamw", "bf16-sgd", "fp32-sgd",
            "bf16-sgd-momentum", "fp32-sgd-momentum", "bf16-pure-sgd-momentum", "adafactor", "bf16-adam8bit-bnb",
            "bf16-adam8bit-bnb-nomaster", "bf16-adamw32-bnb"]

#: Variants of the workload and strategy, each crossed with a few models and backends below.
STRATEGIES = [
    "", "--batch 2", "--recompute selective", "--recompute full", "--flash-attention", "--no-dropout",
    "--batch 2 --flash-attention --recompute selective",
    "--zero 1 --dp 8", "--zero 2 --dp 8", "--zero 3 --dp 8", "--zero 3 --dp 8 --batch 2",
    "--zero 2 --dp 8 --offload-optimizer cpu", "--zero 2 --dp 8 --offload-optimizer cpu --offload-placement zero-offload",
    "--zero 3 --dp 8 --offload-optimizer nvme --offload-params cpu", "--zero 3 --dp 4 --offload-params cpu",
    "--tp 2", "--tp 4 --sp", "--tp 2 --sp --recompute selective", "--tp 2 --recompute full",
    "--tp 2 --zero 1 --dp 4", "--framework ddp --dp 4", "--framework ddp --dp 4 --gradient-as-bucket-view",
    "--framework ddp --dp 4 --ddp-bucket-mb 1", "--loss-chunks 8", "--loss-chunks 4 --loss-impl litgpt",
    "--optimizer-in-backward", "--recipe fp32-adamw --batch 2", "--recipe bf16-pure-adamw --zero 3 --dp 2",
]
FSDP2 = [
    "--framework fsdp2 --dp 8", "--framework fsdp2 --dp 8 --recipe bf16-pure-adamw",
    "--framework fsdp2 --dp 8 --fsdp-param-dtype none --fsdp-reduce-dtype none",
    "--framework fsdp2 --dp 8 --fsdp-reduce-dtype bf16", "--framework fsdp2 --dp 8 --no-reshard-after-forward",
    "--framework fsdp2 --dp 8 --reshard-after-forward 2", "--framework fsdp2 --dp 8 --dp-replicate 2",
    "--framework fsdp2 --dp 8 --fsdp-loss-in-root", "--framework fsdp2 --dp 8 --fsdp-cpu-offload",
    "--framework fsdp2 --dp 8 --fsdp-cpu-offload --fsdp-offload-no-pin",
    "--framework fsdp2 --dp 4 --tp 2", "--framework fsdp2 --dp 4 --tp 2 --sp",
    "--framework fsdp2 --dp 8 --recompute full", "--framework fsdp2 --dp 8 --batch 2 --recompute selective",
]
IMPLEMENTATIONS = ["--foreach", "--no-foreach", "--fused"]
LORA = ["--lora-rank 8", "--lora-rank 8 --lora-targets q_proj,k_proj,v_proj,o_proj,lm_head", "--qlora",
        "--qlora --no-double-quant", "--lora-rank 16 --lora-dropout", "--lora-rank 8 --adapter-recipe bf16-adamw",
        "--lora-rank 8 --recompute full", "--lora-rank 8 --loss-chunks 8", "--qlora --recompute selective",
        "--lora-rank 8 --optimizer-in-backward"]
FEATURES = [
    "--backend cpu --recipe fp16-amp-adamw", "--backend cuda --recipe fp16-amp-adamw",
    "--backend cuda --recipe fp16-amp-adamw --recompute full", "--backend cpu --recipe fp16-amp-adamw --batch 2",
    "--backend cpu --packed 4", "--backend cuda --packed 4", "--packed 4", "--backend cpu --packed 2 --recompute full",
    "--backend cuda --packed 4 --recompute selective", "--backend cpu --offload-activations",
    "--backend cpu --offload-activations --recompute full", "--backend cpu --offload-activations --batch 2",
    "--recipe bf16-adam8bit-bnb --paged-optimizer", "--recipe bf16-adamw32-bnb --paged-optimizer --backend cuda",
    "--recipe adafactor --backend cuda", "--recipe adafactor --no-foreach",
]
REFUSALS = ["--compile", "--recipe fp8-nanotron", "--recipe bf16-adamw-fp32-accum",
            "--framework deepspeed --zero 2 --dp 2", "--framework megatron --recipe fp32-adamw",
            "--recipe adafactor --zero 1 --dp 2", "--recipe adafactor --fused",
            "--packed 4 --tp 2", "--backend cpu --offload-activations --recompute selective",
            "--loss-chunks 100", "--tp 2 --loss-chunks 4", "--sp --tp 2 --recompute full",
            "--recipe fp16-amp-adamw", "--recipe bf16-adamw --paged-optimizer", "--lora-rank 8 --zero 1 --dp 2"]


def setups() -> list:
    """Every command line of the grid (after ``memledger step --json``), each once, in a fixed order."""
    grid = []
    for preset in PRESETS + REFUSED_PRESETS:
        for backend in BACKENDS:
            grid.append(f"--preset {preset} --backend {backend}")
    for name, shape in SMALL.items():
        for backend in BACKENDS:
            for strategy in STRATEGIES:
                grid.append(f"{shape} --backend {backend} {strategy}")
        for recipe in MODELLED:
            grid.append(f"{shape} --recipe {recipe}")
            grid.append(f"{shape} --recipe {recipe} --backend cuda --flash-attention --zero 1 --dp 2")
        for fsdp in FSDP2:
            grid.append(f"{shape} {fsdp}")
            grid.append(f"{shape} --backend cuda --flash-attention {fsdp}")
        for features in FEATURES + REFUSALS:
            grid.append(f"{shape} {features}")
        for implementation in IMPLEMENTATIONS:
            grid.append(f"{shape} --backend cpu {implementation}")
            grid.append(f"{shape} --backend cuda --recipe bf16-sgd-momentum {implementation}")
        if name.startswith("llama"):
            for lora in LORA:
                grid.append(f"{shape} --backend cpu {lora}")
                grid.append(f"{shape} --backend cuda --flash-attention {lora}")
    for preset in ["gemma-7b", "qwen2.5-0.5b", "pythia-6.9b", "phi-2", "bloom-7b1", "starcoder --no-dropout",
                   "llama3-8b", "gemma-2b"]:
        for strategy in ["--recompute selective", "--recompute full", "--batch 2", "--zero 3 --dp 8", "--tp 2",
                         "--flash-attention --backend cuda", "--backend cpu --recipe fp32-adamw",
                         "--framework ddp --dp 2", "--framework fsdp2 --dp 4", "--loss-chunks 4"]:
            grid.append(f"--preset {preset} {strategy}")
    for preset in ["llama2-7b", "qwen2.5-0.5b", "gemma-2b"]:
        for lora in LORA[:4]:
            grid.append(f"--preset {preset} --backend cpu {lora}")
    return list(dict.fromkeys(" ".join(line.split()) for line in grid))


GRID = setups()
#: Inputs ``memledger step --json`` echoes that were added after the snapshot was written (issue 28), with their
#: defaults: a setup at the default digests as before, so the snapshot still proves the numbers unchanged.
LATER_INPUTS = {"implementation": "reference", "attn_implementation": "sdpa"}


def record(line: str) -> dict:
    """The digest of ``memledger step --json <line>`` (run in-process)."""
    from memledger.cli.main import main
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        code = main(["step", "--json", *line.split()])
    if code != 0:
        return {"args": line, "exit": code, "error": err.getvalue().strip()}
    data = json.loads(out.getvalue())
    for key, default in LATER_INPUTS.items():        # inputs added after the snapshot: left out at their defaults
        if data["inputs"].get(key) == default:
            del data["inputs"][key]
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    peak = data["peak"]
    return {"args": line, "exit": 0, "peak": [peak["gpu"], peak["phase"], peak["layer"], peak["detail"]],
            "landmarks": {name: [d["gpu"], d["cpu"], d["nvme"]] for name, d in data["landmarks"].items()},
            "sha256": hashlib.sha256(canonical.encode()).hexdigest()}


def load() -> dict:
    """The committed snapshot: command line -> record."""
    return {r["args"]: r for r in map(json.loads, SNAPSHOT.read_text().splitlines())}


def write() -> None:
    lines = []
    for i, line in enumerate(GRID):
        lines.append(json.dumps(record(line), separators=(",", ":")))
        if i % 50 == 0:
            print(f"{i}/{len(GRID)}", file=sys.stderr)
    SNAPSHOT.write_text("\n".join(lines) + "\n")
    print(f"wrote {len(lines)} setups to {SNAPSHOT}", file=sys.stderr)


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/stepgolden.py --write")
    write()
