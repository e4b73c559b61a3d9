"""The fine-tuner's knobs as a ladder: one model, one workload, each knob turned on top of the ones before,
each rung judged by the step's peak (:meth:`memledger.ledger.ledger.Ledger.step`, LoRA's
:meth:`memledger.ledger.lora.LoraLedger.step`).

A :class:`Rung` is a named change to a setup: :class:`~memledger.ledger.ledger.Ledger` fields
(``loss_chunks``, ``recompute``, ``recipe``, ...), the backend's conventions (``foreach``, ``fused``,
``rmsnorm``: :class:`memledger.activations.backends.Backend`'s fields) or ``lora`` (a
:class:`~memledger.ledger.lora.LoraConfig`, or :func:`~memledger.ledger.lora.qlora`). :func:`ladder` applies
the rungs in turn, each to the setup the rung before it left; a rung with ``start`` changes the setup of the
rung it names instead (``restart``: the baseline's). LoRA starts from "activation checkpointing" (the chunked
loss and every block checkpointed), as torchtune's LoRA config runs it (``7B_lora_single_device.yaml`` l. 68-69,
91-92 at bd2a0fc7: a chunked ``LinearCrossEntropyLoss``, ``enable_activation_checkpointing: True``,
``enable_activation_offloading: False``; its LoRA recipe has no optimizer in backward), so it is compared with
the full fine-tune under the same two knobs. Each row holds the step's peak, its phase, and what the rung saved
at the peak against the rung it was applied to::

    rows = ladder("llama2-7b", 16384)
    rows[1].rung, rows[1].saved          # "chunked cross-entropy", bytes the 8 chunks took off the peak

The knobs are those torchtune's low-memory full fine-tune of LLaMA-2 7B turns on
(``recipes/configs/llama2/7B_full_low_memory.yaml`` at 03317787): ``dtype: bf16`` (BF16 weights, gradients
and optimizer states), ``CEWithChunkedOutputLoss`` (8 output chunks by default),
``enable_activation_checkpointing`` (every layer), ``optimizer_in_bwd``, ``enable_activation_offloading``;
LoRA as its ``7B_lora_single_device.yaml`` (at 2bd69062: rank 8 on Q and V, lines 22 and 25; the chunked loss,
lines 65-66; checkpointing on, offloading off), adapters in the model's BF16; QLoRA as the same adapters on an
NF4 base (one knob; the paper's whole recipe is :func:`~memledger.ledger.lora.qlora`). The
conventions are PyTorch's on CUDA (``backend="cuda"``: SDPA's flash kernel, ``AdamW(foreach)``) with
torchtune's RMSNorm, which is composite (``torchtune/modules/rms_norm.py``: ``x.float()``, ``pow``, ``mean``,
``rsqrt``, ``type_as``; ``rmsnorm="composite"``), as the offloaded step requires. Not rungs: bitsandbytes'
8-bit and paged optimizers (the low-memory config's ``bitsandbytes.optim.PagedAdamW``: 32-bit moments, paged;
the step books them from bitsandbytes' sources, :mod:`memledger.step.bnb`, but no reference run here can
measure them: their kernels run on CUDA only), packed sequences (a throughput knob: on
CUDA, flash-attention's varlen path adds position ids and ``cu_seqlens`` only), ``torch.compile`` (measured
for the blocks' saved tensors, :mod:`memledger.activations.partitioned`, but not in the step's timeline).
"""
from dataclasses import dataclass, field, fields
from typing import NamedTuple, Optional

from ..activations.backends import Backend
from ..core.table import Table
from ..core.units import format_bytes
from ..ledger.ledger import Ledger
from ..ledger.lora import LoraConfig, LoraLedger
from .finetune import fits_on
from ..answers.verdict import MARGIN, leaves_margin
from ..core.choices import check_count

__all__ = ["BASE", "LORA_RANK", "LORA_TARGETS", "RUNGS", "Rung", "RungRow", "knob_table", "ladder", "ladder_table",
           "longest_seq", "setup_step"]

#: The baseline's fields: a full fine-tune in BF16 (torchtune's ``dtype: bf16``: BF16 weights, gradients and
#: AdamW states), one sequence, the flash kernel (SDPA), torchtune's composite RMSNorm, no other knob.
BASE = {"recipe": "bf16-pure-adamw", "batch_size": 1, "flash_attention": True, "rmsnorm": "composite"}
#: torchtune's LoRA rank and targets in its single-device LoRA recipe for LLaMA-2 7B.
LORA_RANK, LORA_TARGETS = 8, ("q_proj", "v_proj")
_CONVENTIONS = {f.name for f in fields(Backend)} - {"name"}
_LORA_FIELDS = {"batch_size", "seq_len", "recompute", "flash_attention", "overhead_bytes", "loss_chunks", "loss_impl",
                "optimizer_in_backward"}


@dataclass(frozen=True)
class Rung:
    """One knob: ``name``, the ``changes`` it makes (Ledger fields, Backend conventions, ``lora``), what it does
    in one line (``why``); ``restart``: apply the changes to the baseline, not to the rung before; ``start``:
    to the setup of the rung of that name (one before this one)."""
    name: str
    changes: dict = field(default_factory=dict)
    why: str = ""
    restart: bool = False
    start: Optional[str] = None

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"a rung needs a name, got {self.name!r}")
        if not isinstance(self.changes, dict):
            raise TypeError(f"changes must be a dict of fields, got {self.changes!r}")
        known = set(Ledger.keywords()) | _CONVENTIONS | {"lora"}
        unknown = sorted(set(self.changes) - known)
        if unknown:
            raise ValueError(f"rung {self.name!r} changes {', '.join(unknown)}: not a Ledger field, a backend "
                             "convention or lora")


class RungRow(NamedTuple):
    """One rung's step: its peak (bytes), what it saved at the peak against ``against`` (the rung it was
    applied to; 0 for the baseline), the phase and op of the peak, and the step itself (for figures)."""
    rung: str
    peak: int
    saved: int
    phase: str
    detail: str
    against: str
    step: object


def setup_step(model, seq_len: int, setup: dict, backend="cuda"):
    """The step of one setup: a LoRA/QLoRA step where ``setup["lora"]`` is a config, else a Ledger's."""
    setup = dict(setup)
    lora = setup.pop("lora", None)
    conventions = {k: setup.pop(k) for k in list(setup) if k in _CONVENTIONS}
    if lora is None:
        return Ledger(model, seq_len=seq_len, **setup).step(backend, **conventions)
    if not isinstance(lora, LoraConfig):
        raise TypeError(f"lora must be a LoraConfig (or qlora()), got {lora!r}")
    defaults = Ledger.keywords()
    unmodelled = sorted(k for k, v in setup.items() if k not in _LORA_FIELDS | {"recipe"} and v != defaults.get(k))
    if unmodelled:
        raise ValueError(f"the LoRA step does not model {', '.join(unmodelled)}: restart from the baseline "
                         "(Rung(..., restart=True))")
    return LoraLedger(model, lora, seq_len=seq_len,
                      **{k: v for k, v in setup.items() if k in _LORA_FIELDS}).step(backend, **conventions)


def ladder(model="llama2-7b", seq_len: int = 16384, rungs=None, backend="cuda", base: Optional[dict] = None) -> list:
    """:class:`RungRow` per rung (default :data:`RUNGS`, the first the baseline): each rung's changes applied to
    the setup the rung before left (or, with ``restart``, to the baseline), its step's peak, what it saved."""
    rungs = list(RUNGS if rungs is None else rungs)
    if not rungs:
        raise ValueError("a ladder needs at least one rung (the baseline)")
    baseline = {**BASE, **(base or {}), **rungs[0].changes}
    setup, rows, setups = baseline, [], {}
    for rung in rungs:
        if rung.start is not None and rung.start not in setups:
            raise ValueError(f"rung {rung.name!r} starts from {rung.start!r}: no rung before it has that name")
        name = rungs[0].name if rung.restart else rung.start
        start = setups[name] if name is not None else setup
        before = next(r for r in rows if r.rung == name) if name is not None and rows else (
            rows[-1] if rows else None)
        setup = {**start, **rung.changes} if rows else baseline
        setups[rung.name] = setup
        step = setup_step(model, seq_len, setup, backend)
        peak = step.peak
        rows.append(RungRow(rung.name, peak.bytes, before.peak - peak.bytes if before else 0, peak.phase,
                            peak.detail, before.rung if before else "", step))
    return rows


def longest_seq(model, setup: dict, gpu_bytes: int, multiple: int = 1024, backend="cuda",
                margin: int = MARGIN) -> int:
    """The longest sequence, a multiple of ``multiple``, whose step's peak under ``setup`` leaves ``margin`` bytes
    of ``gpu_bytes`` free (0 if not even ``multiple`` tokens do): doubling, then bisection (the peak grows with
    the sequence)."""
    multiple = check_count("multiple", multiple)
    def fits(n):
        return leaves_margin(setup_step(model, n * multiple, setup, backend).peak.bytes, gpu_bytes, margin)
    if not fits(1):
        return 0
    low, high = 1, 2
    while fits(high):
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low * multiple


def _rungs() -> list:
    return [
        Rung("baseline", {}, "full fine-tune in BF16 (weights, gradients, AdamW's moments), AdamW(foreach) as "
                             "PyTorch picks it on CUDA, torchtune's composite RMSNorm, every activation kept"),
        Rung("chunked cross-entropy", {"loss_chunks": 8}, "torchtune's CEWithChunkedOutputLoss: the LM head and the "
                                                          "FP32 loss over 8 chunks of the sequence"),
        Rung("activation checkpointing", {"recompute": "full"}, "every block keeps its input only and runs its "
                                                                "forward again in backward"),
        Rung("optimizer in backward", {"optimizer_in_backward": True},
             "one AdamW per parameter, stepped in its post-accumulate-grad hook: each gradient dies as soon as "
             "backward has written it"),
        Rung("activation offloading", {"offload_activations": True},
             "each block's saved tensors (here its checkpointed input) copied to pinned host memory in forward "
             "and back before its backward (save_on_cpu)"),
        Rung("LoRA", {"lora": LoraConfig(rank=LORA_RANK, targets=LORA_TARGETS, adapter_recipe="bf16-pure-adamw")},
             f"a frozen BF16 base, rank-{LORA_RANK} BF16 adapters on Q and V, the chunked loss and checkpointing "
             "(torchtune's LoRA config)", start="activation checkpointing"),
        Rung("QLoRA", {"lora": LoraConfig(rank=LORA_RANK, targets=LORA_TARGETS, base="nf4",
                                          adapter_recipe="bf16-pure-adamw")},
             "the same adapters on a base whose projections are 4-bit NormalFloat, double-quantized (Dettmers et al. "
             "2023), dequantized layer by layer"),
    ]


#: The ladder of the chapter "Turn the fine-tuner's knobs", in torchtune's order.
RUNGS = _rungs()


def ladder_table(rows: list, unit: str = "GB", rungs=None, gpus: dict = None) -> Table:
    """One line per rung: the peak, what the rung saved at it (against which rung), where the step peaks, and
    the GPUs of :data:`memledger.article.finetune.ONE_GPU` (or ``gpus``) that hold the peak with the margin."""
    whys = {r.name: r.why for r in (RUNGS if rungs is None else rungs)}
    body = [(r.rung, format_bytes(r.peak, unit), format_bytes(r.saved, unit) if r.against else "", r.against,
             r.detail, fits_on(r.peak, gpus), whys.get(r.rung, "")) for r in rows]
    return Table(("rung", "peak", "saved at the peak", "against", "where the step peaks", "fits on", "the knob"),
                 body, numeric=(1, 2))


def knob_table(model="llama2-7b", seq_len: int = 16384, unit: str = "GB") -> Table:
    """The README's table: each knob of :data:`RUNGS` and the bytes it saves at the peak for one model."""
    rows = ladder(model, seq_len)
    body = [(r.rung, format_bytes(r.peak, unit), format_bytes(r.saved, unit) if r.against else "—",
             f"{r.saved:,}" if r.against else "—", r.against or "—", r.phase) for r in rows]
    return Table(("knob", "peak", "saved at the peak", "saved (bytes)", "against", "phase of the peak"), body,
                 numeric=(1, 2, 3))
