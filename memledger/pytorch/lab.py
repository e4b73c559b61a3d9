"""The lab: predict a training step's memory, then measure it with PyTorch, and print the two side by side.

Run it where a GPU is: ``python -m memledger.pytorch.lab`` (``--help`` for the shape, ``--snapshot
step.pickle`` to record the step for the viewer at pytorch.org/memory_viz). It builds the reference decoder
(:mod:`memledger.pytorch.reference`), creates the optimizer's state and runs one warm-up step, then measures
a second step:

* on CUDA (:func:`measure_cuda`): ``torch.cuda.memory_allocated()`` at each landmark, the largest
  ``max_memory_allocated()`` of each phase (the peak statistics reset at each landmark), the largest
  ``max_memory_reserved()``, and ``torch.cuda.mem_get_info()`` at the end; beside it the step timeline under
  the CUDA backend's conventions (:data:`memledger.activations.backends.BACKENDS` ``"cuda"``: 1-byte dropout
  masks, FP32 norm statistics, foreach AdamW, step counters on the host), with no overhead row;
* without a GPU (:func:`lab` says which it ran), MemTracker on the CPU under ``FakeTensorMode``
  (:func:`memledger.pytorch.measure.memtracker_step`) beside the timeline under the CPU backend's
  conventions: exact bytes on both sides.

What the CUDA measurement adds to the prediction, and why (:mod:`memledger.ledger.allocator`): every live
tensor is a block of at least 512 bytes, rounded up to 512 (or a whole unsplit block of a large segment);
cuBLAS's workspaces, allocated by the caching allocator on the first matrix multiplication, are live from the
warm-up step on (the ledger's overhead row books them with the CUDA context). Reserved adds the cached free
blocks; ``mem_get_info`` and ``nvidia-smi`` add the CUDA context and other libraries' own buffers.
"""
import argparse

import torch

from ..core.table import Table
from ..core.units import format_bytes
from ..step.timeline import LANDMARKS, Step
from .compare import ledger_for
from .measure import memtracker_step
from .reference import LOOPS, RefConfig, Trainer, make_model

__all__ = ["LAB", "LAB_BATCH", "LAB_LOOP", "LAB_SEQ", "lab", "lab_table", "main", "measure_cuda", "prediction"]

#: The lab's decoder: GPT blocks as the article's (dropout 0.1), d = 1024, L = 8, H = 16, F = 4d, V = 32000.
LAB = RefConfig(1024, 8, 16, 4096, 32000, "gpt", dropout=0.1)
LAB_LOOP, LAB_BATCH, LAB_SEQ = "bf16-adamw", 4, 1024


def prediction(c: RefConfig, loop: str, batch: int, seq: int, backend: str = "cuda") -> Step:
    """The step timeline of ``c`` run by ``loop`` (no overhead row) under ``backend``'s conventions, with the
    decoder's RMSNorm and attention kernel; the CPU run's AdamW loops over tensors one by one (MemTracker's
    run), the CUDA run's is foreach (PyTorch's default there)."""
    changes = {"foreach": False} if backend == "cpu" else {}
    if c.style == "llama":
        changes["rmsnorm"] = c.rmsnorm
    if c.attention == "eager":
        changes["attention"] = "eager"
    return Step(ledger_for(c, loop, batch, seq), backend, **changes)


def measure_cuda(c: RefConfig, loop: str, batch: int, seq: int, snapshot: str = None, seed: int = 0) -> dict:
    """One steady-state training step on the current CUDA device, measured by the caching allocator's statistics.

    Returns {landmark: ``memory_allocated()``, "phase peaks": {phase: ``max_memory_allocated()``}, "peak",
    "reserved" (``max_memory_reserved()``), "free", "total" (``mem_get_info()``), "device"}; with
    ``snapshot``, the step's allocations recorded (``torch.cuda.memory._record_memory_history``) and dumped
    there (``_dump_snapshot``) for pytorch.org/memory_viz."""
    if not torch.cuda.is_available():
        raise RuntimeError("measure_cuda needs a CUDA device (torch.cuda.is_available() is False)")
    cuda = torch.device("cuda")
    torch.manual_seed(seed)
    with cuda:
        model = make_model(c, loop)
        trainer = Trainer(model, loop, foreach=True)       # AdamW's default on CUDA: foreach
        trainer.init_state()
        ids = torch.randint(0, c.V, (batch, seq))
        targets = torch.randint(0, c.V, (batch, seq))
        trainer.step(ids, targets)                         # warm-up: cuBLAS workspaces, autotuning
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        result, phase_peaks, reserved = {}, {}, []
        phases = {"after forward": "forward", "after backward": "backward", "after step": "optimizer"}

        def landmark(name):
            result[name] = torch.cuda.memory_allocated()
            if name in phases:
                phase_peaks[phases[name]] = torch.cuda.max_memory_allocated()
            reserved.append(torch.cuda.max_memory_reserved())
            torch.cuda.reset_peak_memory_stats()           # the next phase's peaks start here

        if snapshot:
            torch.cuda.memory._record_memory_history(max_entries=100_000)
        try:
            trainer.step(ids, targets, landmark)
            torch.cuda.synchronize()
        finally:
            if snapshot:
                torch.cuda.memory._dump_snapshot(snapshot)
                torch.cuda.memory._record_memory_history(enabled=None)
        free, total = torch.cuda.mem_get_info()
    result["phase peaks"] = phase_peaks
    result["peak"] = max(phase_peaks.values())
    result["reserved"] = max(reserved)
    result.update(free=free, total=total, device=torch.cuda.get_device_name())
    return result


def lab(c: RefConfig = LAB, loop: str = LAB_LOOP, batch: int = LAB_BATCH, seq: int = LAB_SEQ,
        device: str = None, snapshot: str = None) -> dict:
    """Predict, then measure: {"device": "cuda" or "cpu", "measured", "predicted" (a Step), "source" (what
    measured it, in words)}. ``device`` None: CUDA where available, else MemTracker on the CPU."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be cuda or cpu, got {device!r}")
    if device == "cuda":
        measured = measure_cuda(c, loop, batch, seq, snapshot)
        source = f"torch.cuda's allocator statistics on {measured['device']}"
    else:
        if snapshot:
            raise ValueError("a memory snapshot records CUDA allocations: there is no GPU to record")
        measured = memtracker_step(c, loop, batch, seq)
        source = "MemTracker on the CPU under FakeTensorMode (no GPU here)"
    return {"device": device, "measured": measured, "predicted": prediction(c, loop, batch, seq, device),
            "source": source}


def lab_table(result: dict, unit: str = "MiB") -> Table:
    """Each landmark, each phase's largest total and the peak: predicted, measured, measured - predicted."""
    step, measured = result["predicted"], result["measured"]
    pairs = [(name, step.landmarks[name]["gpu"], measured[name]) for name in LANDMARKS]
    pairs += [(f"largest in the {p}", b, measured["phase peaks"][p]) for p, b in step.phase_peaks().items()
              if p in measured["phase peaks"]]
    body = [(name, f"{p:,}", f"{m:,}", f"{m - p:,}", format_bytes(m - p, unit)) for name, p, m in pairs]
    totals = [("peak", f"{step.peak.bytes:,}", f"{measured['peak']:,}", f"{measured['peak'] - step.peak.bytes:,}",
               format_bytes(measured["peak"] - step.peak.bytes, unit))]
    if result["device"] == "cuda":
        used = measured["total"] - measured["free"]
        totals += [("reserved (max)", "", f"{measured['reserved']:,}", "", ""),
                   ("in use on the device (mem_get_info)", "", f"{used:,}", "", "")]
    return Table(("moment", "memledger bytes", "measured bytes", "measured - memledger", unit), body,
                 totals=totals, numeric=(1, 2, 3, 4))


def main(argv=None) -> int:
    """``python -m memledger.pytorch.lab``: the lab's table for a decoder shape given on the command line."""
    parser = argparse.ArgumentParser(prog="python -m memledger.pytorch.lab", description=__doc__.split("\n")[0])
    for flag, default in (("--hidden", LAB.d), ("--layers", LAB.L), ("--heads", LAB.H), ("--ffn", LAB.F),
                          ("--vocab", LAB.V), ("--batch", LAB_BATCH), ("--seq", LAB_SEQ)):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--style", choices=("gpt", "llama"), default=LAB.style)
    parser.add_argument("--dropout", type=float, default=LAB.dropout)
    parser.add_argument("--loop", choices=LOOPS, default=LAB_LOOP)
    parser.add_argument("--device", choices=("cuda", "cpu"), default=None)
    parser.add_argument("--snapshot", default=None, help="dump the CUDA step's memory snapshot to this file")
    a = parser.parse_args(argv)
    try:
        c = RefConfig(a.hidden, a.layers, a.heads, a.ffn, a.vocab, a.style,
                      dropout=a.dropout if a.style == "gpt" else 0.0,
                      rmsnorm="fused" if a.style == "llama" else "composite")
        result = lab(c, a.loop, a.batch, a.seq, a.device, a.snapshot)
    except (ValueError, RuntimeError) as error:
        parser.exit(2, f"{parser.prog}: error: {error}\n")
    print(f"Measured by {result['source']}; predicted by memledger's step timeline "
          f"({result['predicted'].conventions.name} conventions, no overhead row).")
    print(lab_table(result).text())
    if a.snapshot:
        print(f"Snapshot written to {a.snapshot}: open it at pytorch.org/memory_viz.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
