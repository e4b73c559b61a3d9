"""The step timeline against the PyTorch run it reproduces: how much faster? Prints a Markdown table.

    python benchmarks/bench_step.py

For each configuration: one MemTracker step of the reference decoder under
FakeTensorMode (memledger.pytorch.measure.memtracker_step, the optimizer state
created first), and the timeline's evaluation of the same configuration
(``Step(Ledger(...), "cpu")``: landmarks and peak, from a new Ledger, the
compiled programs cached), median of many. The two must agree to the byte
(tests/step/test_timeline.py); here they are timed. The issue asks for >= 10,000x.
The sharded step: FSDPMemTracker's run of the reference under FSDP2 on a fake
process group (memledger.pytorch.distributed.fsdp_step), against the timeline of
``Ledger(..., framework="fsdp2", dp=N)`` (tests/step/test_fsdp2.py).
"""

from memledger.models.architecture import Architecture
from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step

from bench import median_seconds  # benchmarks/bench.py, beside this script

CONFIGS = [("article 7B (GPT, counted)", Architecture(4096, 32, 32, 16384, 32000, "gpt"), "bf16-pure-adamw", 1, 2048),
           ("LLaMA-2 7B", Architecture(4096, 32, 32, 11008, 32000, "llama"), "bf16-adamw", 4, 4096)]
#: (label, architecture, B, S, ranks): FSDP2, MixedPrecisionPolicy(bf16, fp32), FP32 shards + AdamW.
SHARDED = [("LLaMA-2 7B, FSDP2", Architecture(4096, 32, 32, 11008, 32000, "llama"), 1, 4096, 8)]


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
    sharded()


def sharded():
    """The FSDP2 rows: FSDPMemTracker's step (one run: tens of seconds) against the timeline."""
    from memledger.pytorch.distributed import fsdp_step
    from memledger.pytorch.reference import RefConfig
    for label, arch, B, S, N in SHARDED:
        ref = RefConfig(arch.d_model, arch.n_layers, arch.n_heads, arch.d_ff, arch.vocab_size, arch.style)
        measured = median_seconds(lambda: fsdp_step(ref, batch=B, seq=S, world=N, track_first=False), 1)  # noqa: B023
        seqs = iter(range(1, 10**9))

        def timeline(arch=arch, B=B, N=N, seqs=seqs):
            step = Step(Ledger(arch, batch_size=B, seq_len=1024 * (next(seqs) % 8 + 1), recipe="fp32-adamw",
                               overhead_bytes=0, framework="fsdp2", dp=N), "cpu")
            return step.peak.bytes, step.landmarks
        timeline()
        evaluated = median_seconds(timeline, 2000)
        print(f"| {label} over {N} ranks, fp32-adamw, B={B}, S={S} (FSDPMemTracker) | {measured:.2f} | "
              f"{evaluated * 1e6:.0f} | {measured / evaluated:,.0f}x |")


if __name__ == "__main__":
    main()
