"""memledger's predictions beside PyTorch's measurements of the reference decoder, as tables.

* :func:`compare_saved`: every row of the inventory (one block, and outside
  the blocks) beside the storage autograd really saved
  (:func:`memledger.pytorch.measure.saved_tensors`), paired by bytes and dtype;
  q, k and v rows that are views of one storage are paired with it together.
* :func:`ladder`: one block's bytes under the article's conventions, then with
  each switch of :mod:`memledger.activations.backends` turned to what the measured run
  does, one at a time, until nothing is left between memledger and PyTorch.
* :func:`memtracker_comparison`: a whole training step under ``FakeTensorMode``
  and ``MemTracker`` (:func:`memledger.pytorch.measure.memtracker_step`) beside
  the step timeline under the CPU backend's conventions.

The measured runs are CPU runs (PyTorch 2.13): dropout masks in the
activation dtype unless ``native_dropout``, LayerNorm statistics in the
activation dtype, composite ``nn.RMSNorm`` unless ``rmsnorm="fused"``, SDPA's
flash kernel (math with dropout). Imports PyTorch.
"""
from dataclasses import dataclass, field, replace

from ..activations.inventory import inventory, kept_rows
from ..models.architecture import Architecture
from ..activations.backends import BACKENDS, SWITCHES, get_backend
from ..core.table import Table
from ..ledger.ledger import Ledger
from ..activations.outside import outside_inventory
from ..step.timeline import LANDMARKS, Step
from .measure import memtracker_step, saved_tensors
from .reference import RefConfig
from ..core.units import format_bytes

__all__ = ["LADDER", "TORCH_DTYPE", "VIEWS", "SavedComparison", "architecture_of", "compare_saved", "ladder",
           "ladder_table", "ledger_for", "memtracker_comparison", "run_options"]

TORCH_DTYPE = {"bf16": "bfloat16", "fp32": "float32", "fp16": "float16", "bool": "bool", "int64": "int64"}
VIEWS = ("Q", "K", "V")
#: The switches of :mod:`memledger.activations.backends` that change saved activations, in the ladder's order.
LADDER = ("dropout_mask", "norm_stats", "attention", "rmsnorm")


def ledger_for(c: RefConfig, loop: str, batch: int, seq: int) -> Ledger:
    """The ledger of the reference decoder ``c`` run by ``loop`` (no overhead: PyTorch allocates none)."""
    return Ledger(architecture_of(c), batch_size=batch, seq_len=seq, recipe=loop, overhead_bytes=0,
                  dropout=bool(c.dropout), recompute=c.recompute, loss_chunks=c.loss_chunks,
                  loss_impl=c.loss_impl)


def architecture_of(c: RefConfig) -> Architecture:
    """The :class:`~memledger.models.architecture.Architecture` of the reference decoder ``c`` (its refinements of
    LLaMA blocks as the architecture's fields: key/value heads, QKV biases, tied embeddings; and a head size)."""
    return Architecture(c.d, c.L, c.H, c.F, c.V, c.style, n_kv_heads=c.n_kv_heads,
                        qkv_bias=True if c.qkv_bias else None,
                        tied_embeddings=True if c.tied else (False if c.untied else None), head_bias=c.head_bias,
                        head_size=c.head_dim, parallel=c.parallel, shared_norm=c.shared_norm, alibi=c.alibi,
                        input_norm=c.input_norm, n_positions=c.positions, attention_dropout=c.attention_dropout)


def run_options(c: RefConfig, loop: str) -> dict:
    """``inventory`` options for what the CPU run of ``c`` does (see the module docstring)."""
    dtype = "fp32" if loop == "fp32-adamw" else "bf16"
    kernel = "eager" if c.kernel == "eager" else ("math" if c.dropout and c.attention_dropout else "flash")
    return dict(dtype=dtype, mask_dtype="bool" if c.native_dropout else dtype, norm_stats=dtype,
                rmsnorm=c.rmsnorm, attention=kernel)


def _block_rows(c, options):
    """The inventory rows of one block of ``c`` (without the attention core's own under selective recomputation)."""
    mlp, norm = ("gelu", "LayerNorm") if c.style == "gpt" else ("swiglu", "RMSNorm")
    rows = inventory(mlp, norm, bool(c.dropout), gqa=c.kv_heads != c.H, head_dim=c.hd * c.H != c.d,
                     parallel=c.parallel, shared_norm=c.shared_norm, attention_dropout=c.attention_dropout, **options)
    return kept_rows(rows, "selective") if c.recompute == "selective" else rows


def _pair(rows, sizes, shapes, measured, views=False):
    """[(label, formula, dtype, predicted, measured entry or None)], and the measured entries left over.
    A row takes a storage of its bytes and dtype, of its own shape if one is left; with ``views``, the q, k
    and v rows take one storage together (views of the fused projection's output)."""
    items = [(r.name, r.bytes, r.dtype, n, shape) for r, n, shape in zip(rows, sizes, shapes)]
    if views:
        group = [i for i in items if i[0] in VIEWS]
        items = [i for i in items if i[0] not in VIEWS]
        at = min(k for k, r in enumerate(rows) if r.name in VIEWS)
        items.insert(at, (" + ".join(VIEWS) + " (views of one storage)", sum(i[1] for i in group), group[0][2],
                          sum(i[3] for i in group), None))
    left, out = list(measured), []
    for name, formula, dtype, size, shape in items:
        fits = [m for m in left if m[0] == size and m[1] == TORCH_DTYPE[dtype]]
        hit = next((m for m in fits if tuple(m[2]) == shape), fits[0] if fits else None)
        if hit:
            left.remove(hit)
        out.append((name, formula, dtype, size, hit))
    return out, left


@dataclass
class SavedComparison:
    """One block's (and the outside's) inventory rows paired with the storages PyTorch saved."""
    config: RefConfig
    loop: str
    batch: int
    seq: int
    block: list = field(default_factory=list)       # (name, formula, dtype, predicted bytes, (bytes, dtype, shape))
    outside: list = field(default_factory=list)
    unbooked: list = field(default_factory=list)    # measured storages no row accounts for

    @property
    def exact(self) -> bool:
        """Every row paired with a storage of its size and dtype, and no storage left unbooked."""
        return not self.unbooked and all(m is not None for part in (self.block, self.outside)
                                         for *_, m in part)

    def bytes(self, part: str = "block", side: str = "measured") -> int:
        rows = self.block if part == "block" else self.outside
        return sum((m[0] if m else 0) if side == "measured" else p for _, _, _, p, m in rows)

    def table(self, part: str = "block") -> Table:
        rows = self.block if part == "block" else self.outside
        body = [(name, formula, dtype, f"{p:,}", f"{m[1]} {tuple(m[2])}" if m else "none",
                 f"{m[0]:,}" if m else "", "yes" if m and m[0] == p else "NO") for name, formula, dtype, p, m in rows]
        total = [("total", "", "", f"{self.bytes(part, 'predicted'):,}", "", f"{self.bytes(part):,}",
                  "yes" if self.bytes(part, "predicted") == self.bytes(part) else "NO")]
        return Table(("row", "formula", "dtype", "memledger bytes", "PyTorch saved (dtype, shape)",
                      "PyTorch bytes", "equal"), body, totals=total, numeric=(3, 5))


def _shape(ledger, row):
    return tuple(ledger.evaluate(n) for n in row.shape)


def compare_saved(c: RefConfig, loop: str, batch: int, seq: int, layer: int = 1) -> SavedComparison:
    """Block ``layer`` and the outside of one forward pass of ``c``, row by row (see the module docstring)."""
    measured = saved_tensors(c, loop, batch, seq)
    ledger, options = ledger_for(c, loop, batch, seq), run_options(c, loop)
    rows = _block_rows(c, options)
    views = c.recompute == "selective" or options["attention"] == "flash" or (
        batch == 1 and options["attention"] == "eager" and c.kv_heads == c.H)     # the grouped core copies them
    block, left = _pair(rows, [ledger.evaluate(r.bytes) for r in rows], [_shape(ledger, r) for r in rows],
                        measured[layer], views)
    outer = [r for r in outside_inventory(c.style, input_norm=c.input_norm, **{k: options[k] for k in (
        "dtype", "norm_stats", "rmsnorm", "attention")}) if r.name != "loss"]
    outside, left_out = _pair(outer, [ledger.evaluate(r.bytes) for r in outer], [_shape(ledger, r) for r in outer],
                              measured["outside"])
    return SavedComparison(c, loop, batch, seq, block, outside, left + left_out)


def ladder(c: RefConfig, loop: str, batch: int, seq: int, layer: int = 1) -> list:
    """[{"step", "what", "predicted", "measured", "gap"}]: one block's bytes under the article's conventions,
    then with each switch of :data:`LADDER` turned, in that order, to the measured run's value (only
    switches that change this block)."""
    measured = sum(b for b, _, _ in saved_tensors(c, loop, batch, seq)[layer])
    ledger, dtype = ledger_for(c, loop, batch, seq), run_options(c, loop)["dtype"]
    target = get_backend("cpu", dropout_mask="bool" if c.native_dropout else "activation", rmsnorm=c.rmsnorm)

    def predicted(conv):
        options = conv.inventory_options(c.style, dtype, bool(c.dropout))
        return ledger.evaluate(sum(r.bytes for r in _block_rows(c, options)))
    conv = BACKENDS["article"]
    out = [{"step": "the article's conventions", "what": "Korthikanti et al. (2022): 1-byte masks, no norm "
            "statistics, eager attention, fused norms", "predicted": predicted(conv)}]
    for name in LADDER:
        turned = replace(conv, **{name: getattr(target, name)})
        if predicted(turned) != predicted(conv):
            conv = turned
            out.append({"step": f"+ {name} = {getattr(target, name)}", "what": SWITCHES[name],
                        "predicted": predicted(conv)})
    for rung in out:
        rung.update(measured=measured, gap=measured - rung["predicted"])
    return out


def ladder_table(ladders: dict) -> Table:
    """``{block label: ladder(...)}`` as one table."""
    return Table(("block", "conventions", "memledger bytes", "PyTorch bytes", "PyTorch - memledger"),
                 [(label, r["step"], f"{r['predicted']:,}", f"{r['measured']:,}", f"{r['gap']:,}")
                  for label, rungs in ladders.items() for r in rungs], numeric=(2, 3, 4))


def memtracker_comparison(c: RefConfig, loop: str, batch: int, seq: int, unit: str = "GB") -> dict:
    """{"measured": MemTracker's totals, "step": the timeline (CPU conventions), "table": both side by side}."""
    measured = memtracker_step(c, loop, batch, seq)
    eager = {"attention": "eager"} if c.style == "llama" and c.kernel == "eager" else {}
    step = Step(ledger_for(c, loop, batch, seq), "cpu", dropout_mask="bool" if c.native_dropout else "activation",
                **eager)
    pairs = [(name, measured[name], step.landmarks[name]["gpu"]) for name in LANDMARKS]
    pairs += [(f"largest in the {p}", measured["phase peaks"][p], b) for p, b in step.phase_peaks().items()]
    body = [(name, f"{m:,}", f"{t:,}", f"{t - m:,}", format_bytes(t, unit)) for name, m, t in pairs]
    total = [("peak", f"{measured['peak']:,}", f"{step.peak.bytes:,}", f"{step.peak.bytes - measured['peak']:,}",
              format_bytes(step.peak.bytes, unit))]
    table = Table(("moment", "MemTracker bytes", "memledger bytes", "difference", unit), body, totals=total,
                  numeric=(1, 2, 3, 4))
    return {"measured": measured, "step": step, "table": table}
