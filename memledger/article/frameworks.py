"""Chapter 16's runs: one setup under each framework, what memledger judges each by, and the buffers each keeps.

* :func:`framework_runs`: the setup (default :data:`SEVEN_B`, LLaMA-2 7B on 8 GPUs, B 1, S 4096,
  FlashAttention) as memledger's plain loop under ZeRO-3, PyTorch's DDP, FSDP2 (BF16 compute, FP32 reduce,
  FP32 shards), DeepSpeed ZeRO-3 and Megatron-LM (distributed optimizer, FP32 ``main_grad``).
* :func:`comparison`: one line per run: the measure memledger judges it by (the step's peak where the step
  runs the framework op by op; the sum of the rows, with the transients read from the source beside it, for
  DeepSpeed and Megatron-LM) and the buffers of its own, by name.
* :func:`source_buffers`: DeepSpeed's or Megatron-LM's buffers with the file and lines they are read from.
* :func:`fsdp_comparison`: PyTorch's ``FSDPMemTracker`` beside memledger's FSDP2 step, landmark by landmark
  (a small shape runs in seconds; ``tests/step/test_fsdp2.py`` runs 7B shapes at worlds of 8 to 1,024).
* :func:`tp_saved`: what one rank keeps from the forward under tensor and sequence parallelism, as DTensor runs
  it (the step) and as Megatron-LM does (the ledger's rows, Korthikanti et al.'s inventory).
* :func:`design_grid`: the largest micro-batch each framework and recomputation fits (``memledger.fit``).
"""
import re

from ..answers.fit import fit
from ..core.table import Table
from ..core.units import format_bytes
from ..ledger.ledger import Ledger
from ..step.timeline import LANDMARKS

__all__ = ["FRAMEWORK_SETUPS", "SEVEN_B", "buffer_kinds", "comparison", "design_grid", "framework_runs",
           "fsdp_comparison", "source_buffers", "tp_saved"]

#: The chapter's run: LLaMA-2 7B, 8 GPUs, one sequence of 4,096 tokens, FlashAttention.
SEVEN_B = dict(arch="llama2-7b", batch_size=1, seq_len=4096, dp=8, flash_attention=True)

#: label -> the Ledger fields that make the setup that framework: the book's BF16 loop with FP32 masters (plain,
#: DDP, DeepSpeed), FSDP2's FP32 shards with BF16 compute, Megatron-LM's FP32 ``main_grad``.
FRAMEWORK_SETUPS = {
    "plain loop, ZeRO-3": dict(zero_stage=3),
    "DDP": dict(framework="ddp"),
    "FSDP2": dict(framework="fsdp2", recipe="fp32-adamw"),
    "DeepSpeed ZeRO-3": dict(framework="deepspeed", zero_stage=3),
    "Megatron-LM, distributed optimizer": dict(framework="megatron", recipe="bf16-adamw-fp32-grads", zero_stage=1),
}


def framework_runs(setup: dict = None, frameworks=None) -> dict:
    """{label: Ledger} for each of ``frameworks`` (labels of :data:`FRAMEWORK_SETUPS`; all by default)."""
    setup = SEVEN_B if setup is None else setup
    labels = list(FRAMEWORK_SETUPS) if frameworks is None else list(frameworks)
    unknown = [x for x in labels if x not in FRAMEWORK_SETUPS]
    if unknown:
        raise ValueError(f"frameworks must be labels of FRAMEWORK_SETUPS, got {unknown}")
    return {label: Ledger(**{**setup, **FRAMEWORK_SETUPS[label]}) for label in labels}


def buffer_kinds(ledger) -> list:
    """The names of the buffers ``ledger``'s framework keeps beyond the plain loop's rows, one per kind (a
    step's FSDP2 or DDP rows without their block or bucket number; DeepSpeed's or Megatron-LM's from source)."""
    if ledger.framework in ("fsdp2", "ddp"):
        names = [r["name"] for r in ledger.step().rows if r["name"].startswith(("FSDP2", "DDP"))]
        return list(dict.fromkeys(re.sub(r"(, block \d+|, root|, every unit| \d+)$", "", n) for n in names))
    return [b.name for b in ledger.framework_buffers]


def _judged(ledger):
    """(measure, bytes): the step's peak where the step runs the framework, else the sum of the rows."""
    if ledger.framework in ("deepspeed", "megatron"):
        return "sum of the rows (transients beside it)", ledger.totals["gpu"]
    return "peak of the step", ledger.step().peak.bytes


def comparison(runs: dict, unit: str = "GB") -> Table:
    """One line per run: framework, what memledger judges it by, the bytes, the largest transient read from
    the source (DeepSpeed, Megatron-LM), the buffers of its own."""
    body = []
    for label, ledger in runs.items():
        measure, nbytes = _judged(ledger)
        transients = [b.bytes for b in ledger.framework_buffers if b.live != "whole step"]
        body.append((label, measure, format_bytes(nbytes, unit),
                     format_bytes(max(transients), unit) if transients else "",
                     "; ".join(buffer_kinds(ledger)) or "none (memledger's own loop)"))
    return Table(("framework", "judged by", unit, f"largest transient from source ({unit})", "buffers of its own"),
                 body, numeric=(2, 3))


def source_buffers(ledger, unit: str = "GB") -> Table:
    """DeepSpeed's or Megatron-LM's buffers as memledger reads them from the sources: bytes, when live, file
    and lines (``repository@commit:path:lines``), and the ledger row a buffer already is."""
    buffers = ledger.framework_buffers
    if not buffers:
        raise ValueError(f"framework {ledger.framework} has no buffers read from a source (deepspeed, megatron)")
    return Table(("buffer", unit, "live", "read from source", "already booked as"),
                 [(b.name, format_bytes(b.bytes, unit), b.live, b.source, b.booked or "a row of its own"
                   if b.live == "whole step" else "a transient") for b in buffers], numeric=(1,))


def fsdp_comparison(c, loop: str = "fp32-adamw", batch: int = 2, seq: int = 16, world: int = 8, **options) -> dict:
    """PyTorch's FSDP2 (``fully_shard`` per block and the root, ``FSDPMemTracker``, a fake process group of
    ``world`` ranks) beside memledger's FSDP2 step of the same setup, CPU conventions.
    ``options``: ``param_dtype``, ``reduce_dtype`` (default bf16, fp32), ``reshard``.
    Returns {"measured", "step", "table"} (bytes; a difference column)."""
    from ..pytorch.compare import architecture_of
    from ..pytorch.distributed import fsdp_step
    param, reduce = options.pop("param_dtype", "bf16"), options.pop("reduce_dtype", "fp32")
    reshard = options.pop("reshard", True)
    if options:
        raise ValueError(f"unknown options: {', '.join(options)} (param_dtype, reduce_dtype, reshard)")
    measured = fsdp_step(c, loop, batch=batch, seq=seq, world=world, param_dtype=param, reduce_dtype=reduce,
                         reshard=reshard, track_first=False)
    ledger = Ledger(architecture_of(c), batch_size=batch, seq_len=seq, recipe=loop, overhead_bytes=0,
                    dropout=c.dropout > 0, recompute=c.recompute, framework="fsdp2", dp=world,
                    fsdp_param_dtype=param, fsdp_reduce_dtype=reduce, reshard_after_forward=reshard)
    step = ledger.step("cpu")
    pairs = [(k, measured[k], step.landmarks[k]["gpu"]) for k in LANDMARKS]
    pairs += [(f"largest in the {p}", measured["phase peaks"][p], b) for p, b in step.phase_peaks().items()]
    pairs.append(("peak", measured["peak"], step.peak.bytes))
    table = Table(("moment", "FSDPMemTracker bytes", "memledger bytes", "difference"),
                  [(name, f"{m:,}", f"{t:,}", f"{t - m:,}") for name, m, t in pairs], numeric=(1, 2, 3))
    return {"measured": measured, "step": step, "table": table}


def tp_saved(ledger) -> dict:
    """What one rank keeps from the forward (bytes): ``"dtensor"``, the step's after forward minus before
    forward (DTensor's ``parallelize_module``, checked against PyTorch), and ``"megatron"``, the ledger's
    activation rows (Korthikanti et al.'s inventory, which Megatron-LM's sequence parallelism keeps)."""
    if ledger.tp == 1:
        raise ValueError("tp_saved needs tensor parallelism: tp must be > 1")
    marks = ledger.step().landmarks
    return {"dtensor": marks["after forward"]["gpu"] - marks["before forward"]["gpu"],
            "megatron": ledger.group_total("activations")}


def design_grid(setup: dict, gpu_bytes: int, frameworks, recomputes=("none", "selective", "full")) -> Table:
    """The largest micro-batch of ``setup`` each framework (labels of :data:`FRAMEWORK_SETUPS`) fits on a GPU
    of ``gpu_bytes`` under each recomputation (``memledger.fit``, leaving its margin), with the bytes judged
    there and at one more."""
    body = []
    for label in frameworks:
        for recompute in recomputes:
            ledger = framework_runs({**setup, "recompute": recompute}, [label])[label]
            r = fit(ledger, "batch", gpu_bytes)
            body.append((label, recompute, r["measure"], "none fits" if r["answer"] is None else str(r["answer"]),
                         format_bytes(r["judged_at_answer"], "GB") if r["answer"] else "",
                         format_bytes(r["next"]["judged"], "GB") if r["next"] else ""))
    return Table(("framework", "recomputation", "judged by", "largest micro-batch", "GB there", "GB at one more"),
                 body, numeric=(3, 4, 5))
