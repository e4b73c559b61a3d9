"""The caching allocator's replay (``--measure allocated|reserved|nvidia-smi``): how long, against an earlier
revision of it in the same run? Prints a Markdown table.

    python benchmarks/bench_replay.py [REV] [LAYERS ...]

``REV`` (default ``4914e57``, the replay that took ``snapshot()`` at every new reserved peak) is a git revision
of this repository: its ``memledger/ledger/replay.py`` and ``caching.py`` are loaded beside the checkout's (the rest
of the package is the checkout's), and each setup is replayed by both, alternately, the median of a few. The two
must agree to the byte (the peaks, where they are, the series after every op and the segments at the peak): the
script stops otherwise. The setups are a QLoRA step (r 8, all projections) of a LLaMA-2 7B shape with
``L`` blocks after torchtune's loading (``memledger ledger --lora-rank 8 --qlora --load torchtune --measure
reserved``), with and without expandable segments; LoRA (r 8, q and v) after LitGPT's loading; and the step of a
``Ledger`` (``--preset llama2-7b --measure reserved``) and under FSDP2 on 8 ranks. The machine is shared: the
ratio is what counts.
"""
import importlib.util
from pathlib import Path
import statistics
import subprocess
import sys
import time
import types

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from memledger.ledger.ledger import Ledger  # noqa: E402 (the checkout's memledger)
from memledger.ledger.lora import LoraConfig, LoraLedger, qlora  # noqa: E402
from memledger.ledger import replay as current  # noqa: E402
from memledger.models.architecture import Architecture  # noqa: E402


def load_revision(rev: str):
    """``replay.py`` (with ``caching.py``) of revision ``rev``, as modules of the package ``memledger.ledger``."""
    modules = {}
    for name in ("caching", "replay"):
        source = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:memledger/ledger/{name}.py"], check=True,
                                capture_output=True, text=True).stdout
        spec = importlib.util.spec_from_loader(f"memledger.ledger._{name}_{rev}", loader=None)
        module = types.ModuleType(spec.name)
        module.__package__ = "memledger.ledger"
        if name == "replay":            # its ``from .caching import`` gets the same revision's allocator
            source = source.replace("from .caching import", f"from ._caching_{rev} import")
        sys.modules[spec.name] = module
        exec(compile(source, f"{rev}:memledger/ledger/{name}.py", "exec"), module.__dict__)
        modules[name] = module
    return modules["replay"]


def outcome(r):
    return (r.allocated, r.reserved, r.outside, r.allocated_at, r.reserved_at, r.segments, r.series)


def timed(fn, repeat):
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def setups(n_layers):
    arch = Architecture(4096, n_layers, 32, 11008, 32000, "llama")
    quantized = LoraLedger(arch, qlora(8), 1, 2048).step("cuda")
    plain = LoraLedger(arch, LoraConfig(rank=8), 1, 2048).step("cuda")
    ledger = Ledger(arch=arch, batch_size=1)
    fsdp2 = Ledger(arch=arch, batch_size=1, framework="fsdp2", dp=8, recipe="fp32-adamw")
    return [(f"QLoRA r 8, torchtune's loading, L {n_layers}",
             lambda m: m.replay_step(quantized, load="torchtune")),
            (f"the same, expandable segments, L {n_layers}",
             lambda m: m.replay_step(quantized, True, load="torchtune")),
            (f"LoRA r 8, LitGPT's loading, L {n_layers}", lambda m: m.replay_step(plain, load="litgpt")),
            (f"`ledger --measure reserved`, L {n_layers}", lambda m: m.replay(ledger)),
            (f"the same, FSDP2 on 8 ranks, L {n_layers}", lambda m: m.replay(fsdp2))]


def main():
    rev = sys.argv[1] if len(sys.argv) > 1 else "4914e57"
    layers = [int(n) for n in sys.argv[2:]] or [32, 128, 256]
    before = load_revision(rev)
    print(f"| replay (LLaMA-2 7B shape, B 1, S 2048) | {rev} | this checkout | speed-up |")
    print("|---|---:|---:|---:|")
    for n_layers in layers:
        for label, fn in setups(n_layers):
            repeat = 3 if n_layers <= 128 else 1
            new, ours = timed(lambda: fn(current), repeat)        # noqa: B023 (called here)
            old, theirs = timed(lambda: fn(before), repeat)       # noqa: B023
            if outcome(ours) != outcome(theirs):
                raise SystemExit(f"{label}: the replays differ")
            print(f"| {label} | {old * 1e3:,.0f} ms | {new * 1e3:,.0f} ms | {old / new:.1f}x |", flush=True)


if __name__ == "__main__":
    main()
