"""The step timeline against the PyTorch run it reproduces: how much faster? Prints a Markdown table.

    python benchmarks/bench_step.py

For each configuration: one MemTracker step of the reference decoder under
FakeTensorMode (memledger.pytorch.measure.memtracker_step, the optimizer state
created first), and the timeline's evaluation of the same configuration
(``Step(Ledger(...), "cpu")``: landmarks and peak, from a new Ledger, the
compiled programs cached), median of many. The two must agree to the byte
(tests/step/test_timeline.py); here they are timed. The issue asks for >= 10,000x.
"""

from memledger.models.architecture import Architecture
from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step

from bench import median_seconds  # benchmarks/bench.py, beside this script

CONFIGS = [("article 7B (GPT, counted)", Architecture(4096, 32, 32, 16384, 32000, "gpt"), "bf16-pure-adamw", 1, 2048),
           ("LLaMA-2 7B", Architecture(4096, 32, 32, 11008, 32000, "llama"), "bf16-adamw", 4, 4096)]


def main():
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    print("| configuration | MemTracker step (s) | timeline (µs) | speed-up |")
    print("|---|---:|---:|---:|")
    for label, arch, loop, B, S in CONFIGS:
        ref = RefConfig(arch.d_model, arch.n_layers, arch.n_heads, arch.d_ff, arch.vocab_size, arch.style)
        measured = median_seconds(lambda: memtracker_step(ref, loop, B, S), 3)  # noqa: B023 (called here)
        batches = iter(range(1, 10**9))

        def timeline(arch=arch, loop=loop, S=S, batches=batches):
            step = Step(Ledger(arch, batch_size=next(batches) % 8 + 1, seq_len=S, recipe=loop, overhead_bytes=0),
                        "cpu")
            return step.peak.bytes, step.landmarks
        timeline()                                          # compile once (cached per structure)
        evaluated = median_seconds(timeline, 2000)
        print(f"| {label}, {loop}, B={B}, S={S} | {measured:.2f} | {evaluated * 1e6:.0f} | "
              f"{measured / evaluated:,.0f}x |")


if __name__ == "__main__":
    main()
