"""Where memledger is used interactively, how fast is it? Prints a Markdown table for the README.

    python benchmarks/bench.py

1. CLI latency: ``memledger ledger --preset llama2-7b`` as a fresh process, against ``python -c pass``
   run alternately in the same loop (the machine is shared and noisy: the ratio is what counts). Its verdict
   judges the step's peak from the step compiled once per structure (:mod:`memledger.step.cache`): measured
   with that record cached, and with an empty cache (the first run of a structure loads SymPy to compile it).
   ``memledger infer --preset llama2-7b`` (its rows and the prefill op by op) in the same loop, and with
   ``--weights nf4`` (bitsandbytes' NF4 rows, the projections' shapes compiled too: no SymPy either).
2. One ledger evaluation: the generated plain-Python formulas vs ``expr.subs`` on the same expressions.
3. A sweep of 10^6 configurations through the vectorized (NumPy) path: the sum of the rows, and the step's
   exact peak over the same arrays (``sweep(..., measure="peak")``, :mod:`memledger.step.sweep`), with their
   ratio measured in the same run (the issue's bound: 10x).
4. One widget update (ledger, the step's peak, HTML), as the explorer does on every control change; and one
   that meets a structure for the first time (a recipe, recompute mode or ZeRO stage not set before), which
   builds that step's programs once.
"""
from itertools import product
import os
from pathlib import Path
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

from memledger.ledger.ledger import Ledger, row_specs, sweep
from memledger.views.widgets import controls, render


def median_seconds(fn, repeat):
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def cli_and_floor(repeat=21):
    """Medians of the CLI with its compiled step cached, of the CLI with an empty cache, of a bare
    interpreter, of ``memledger infer`` and of ``memledger infer --weights nf4``, measured alternately."""
    script = str(Path(sys.executable).with_name("memledger"))
    command = [script, "ledger", "--preset", "llama2-7b"]
    infer = [script, "infer", "--preset", "llama2-7b"]
    warm, cold, floor, served, quantized = [], [], [], [], []
    with tempfile.TemporaryDirectory() as cached:
        subprocess.run(command, check=True, capture_output=True, env={**os.environ, "MEMLEDGER_CACHE_DIR": cached})
        for _ in range(repeat):
            with tempfile.TemporaryDirectory() as empty:
                for cache, times in ((cached, warm), (empty, cold), (None, floor)):
                    start = time.perf_counter()
                    subprocess.run(command if cache else [sys.executable, "-c", "pass"], check=True,
                                   capture_output=True, env={**os.environ, "MEMLEDGER_CACHE_DIR": cache or empty})
                    times.append(time.perf_counter() - start)
                start = time.perf_counter()
                subprocess.run(infer, check=True, capture_output=True)
                served.append(time.perf_counter() - start)
                start = time.perf_counter()
                subprocess.run(infer + ["--weights", "nf4"], check=True, capture_output=True)
                quantized.append(time.perf_counter() - start)
    return tuple(statistics.median(times) for times in (warm, cold, floor, served, quantized))


def main():
    os.environ["MEMLEDGER_CACHE_DIR"] = tempfile.mkdtemp()          # every structure is new to this run
    cli, cold, floor, infer, nf4 = cli_and_floor()

    template = Ledger("llama2-7b", zero_stage=2, dp=8, offload_optimizer="cpu")
    exprs = [spec.expr for spec in row_specs(template.structure)]
    batches = iter(range(1, 10**9))
    lambdified = median_seconds(lambda: Ledger("llama2-7b", batch_size=next(batches), zero_stage=2, dp=8,
                                               offload_optimizer="cpu").totals, 2000)
    values = template.bindings
    subs = median_seconds(lambda: [int(e.subs(values)) for e in exprs], 50)

    rng = np.random.default_rng(0)
    n = 10**6
    arrays = dict(batch_size=rng.integers(1, 64, n), seq_len=rng.integers(128, 32768, n), dp=rng.integers(1, 512, n))
    swept = median_seconds(lambda: sweep(template, **arrays), 5)
    sweep(template, measure="peak", **arrays)                 # the step's record, built once per structure
    peaked = median_seconds(lambda: sweep(template, measure="peak", **arrays), 5)

    state = {k: c.value for k, c in controls().items()}
    render(state)                                            # SymPy's import and the first build, once
    fresh = iter(dict(recipe=r, recompute=c, zero_stage=z, dp=8) for r, c, z in product(
        ("bf16-adamw", "fp32-adamw", "bf16-pure-adamw"), ("none", "full"), (1, 2, 3)))
    new_structure = median_seconds(lambda: render({**state, **next(fresh)}), 18)
    sizes = iter(range(1, 10**9))
    widget = median_seconds(lambda: render({**state, "batch_size": next(sizes) % 4096 + 1}), 500)

    print("| measurement | median |")
    print("|---|---:|")
    print(f"| `memledger ledger --preset llama2-7b` (verdict by the step's peak), fresh process | {cli * 1e3:.0f} ms "
          f"({cli / floor:.1f}x `python -c pass`, {floor * 1e3:.0f} ms) |")
    print(f"| the same, first run of that step structure (compiled with SymPy, then cached) | {cold * 1e3:.0f} ms "
          f"({cold / floor:.1f}x) |")
    print(f"| `memledger infer --preset llama2-7b` (rows and the prefill op by op), fresh process | {infer * 1e3:.0f} ms "
          f"({infer / floor:.1f}x) |")
    print(f"| `memledger infer --preset llama2-7b --weights nf4`, fresh process | {nf4 * 1e3:.0f} ms ({nf4 / floor:.1f}x) |")
    print(f"| one ledger, generated plain-Python formulas | {lambdified * 1e6:.0f} µs |")
    print(f"| the same rows with `expr.subs` | {subs * 1e6:.0f} µs ({subs / lambdified:.0f}x slower) |")
    print(f"| sweep of 10^6 configurations (NumPy), the sum of the rows | {swept * 1e3:.0f} ms |")
    print(f"| the same 10^6 configurations, the step's exact peak | {peaked * 1e3:.0f} ms ({peaked / swept:.1f}x the sum) |")
    print(f"| one widget update (ledger + the step's peak + HTML) | {widget * 1e6:.0f} µs |")
    print(f"| one widget update that compiles a step structure seen for the first time | {new_structure * 1e3:.0f} ms |")


if __name__ == "__main__":
    main()
