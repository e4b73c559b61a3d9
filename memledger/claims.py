"""The article's numeric claims, each recomputed from the library.

Every numeric statement of the source article (Chinese; paraphrased here in
English) is a :class:`Claim`: the printed value and unit, how it compares
(``=``, ``>``, ``<``, ``~``), a function that recomputes it with memledger,
and the status it earns:

* ``matches``: the computed value equals the stated one (or satisfies ``>``/``<``);
* ``rounded``: equal after the article's rounding to the printed digits
  (half-up, or truncation, which the note then says);
* ``approximate``: the article says "about"/"close to" and the value is within
  the tolerance the claim declares;
* ``erratum``: none of the above; the note gives the arithmetic.

Units are the article's, read as :mod:`memledger.units` decides: per-tensor
"MB" are MiB (2^20 bytes), totals "GB" are 10^9 bytes.
"""
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
import math

import sympy as sp

from .activations import ARTICLE_INVENTORY, closed_form, inventory, per_layer_bytes, quadratic_share
from .architecture import get_preset
from .dtypes import bf16_spacing, round_to_bf16
from .flops import recompute_overhead
from .ledger import DEFAULT_OVERHEAD, Ledger
from .recipes import get_recipe
from .symbols import B, F, H, S, d
from .hardware import GPU_MEMORY, LINKS
from .units import ARTICLE_TENSOR_UNIT, ARTICLE_TOTAL_UNIT, in_unit

STATUSES = ("matches", "rounded", "approximate", "erratum")
A100 = GPU_MEMORY["a100-80gb"]
ARTICLE = "article-7b"


@dataclass(frozen=True)
class Claim:
    """One numeric statement of the article and how memledger recomputes it."""
    id: str
    section: str
    text: str
    stated: str                 # the value as the article prints it
    unit: str
    compute: callable = field(repr=False, compare=False)
    status: str = "matches"     # the status we expect; tests check it against :meth:`classify`
    note: str = ""
    relation: str = "="
    tolerance: Fraction = Fraction(0)

    @property
    def value(self) -> Fraction:
        return Fraction(Decimal(self.stated))

    @property
    def computed(self) -> Fraction:
        return Fraction(self.compute())

    def classify(self) -> str:
        """The status the numbers earn (independent of :attr:`status`)."""
        got, want = self.computed, self.value
        if self.relation == ">":
            return "matches" if got > want else "erratum"
        if self.relation == "<":
            return "matches" if got < want else "erratum"
        if got == want:
            return "matches"
        digits = max(0, -Decimal(self.stated).as_tuple().exponent)
        scaled = got * 10**digits
        if want * 10**digits in (math.floor(scaled + Fraction(1, 2)), math.trunc(scaled)):
            return "rounded"
        if self.relation == "~" and abs(got - want) <= self.tolerance * want:
            return "approximate"
        return "erratum"

    def to_dict(self) -> dict:
        return {"id": self.id, "section": self.section, "text": self.text, "stated": self.stated,
                "unit": self.unit, "relation": self.relation, "computed": float(self.computed),
                "computed_exact": str(self.computed), "status": self.classify(), "note": self.note}


# --- helpers: every number below comes from the library -----------------------------

@lru_cache(maxsize=None)
def _ledger(**kw) -> Ledger:
    return Ledger(ARTICLE, **kw)


def _at(expr, batch=1, seq=2048) -> int:
    """Exact bytes of ``expr`` at the article's spec (F = 4d)."""
    return _ledger(batch_size=batch, seq_len=seq).evaluate(expr)


def _gb(nbytes) -> Fraction:
    return in_unit(nbytes, ARTICLE_TOTAL_UNIT)


_RECIPE = get_recipe("bf16-adamw")
_P = get_preset(ARTICLE).params
_LAYER = per_layer_bytes(inventory())
_EXPANDED = sp.expand(_LAYER.subs(F, 4 * d))


def _component_gb(i):
    return _gb(_RECIPE.components[i].bytes_per_param * _P)


def _layer_gb(batch, seq):
    return _gb(_at(_LAYER, batch, seq))


def _total_activations_gb(batch, seq):
    return _gb(_ledger(batch_size=batch, seq_len=seq).group_total("activations"))


def _bsd_bytes_count(predicate):
    """Bytes per element of B x S x d contributed by the article's rows that satisfy ``predicate``."""
    return sum(r.bytes / (B * S * d) for r in ARTICLE_INVENTORY if not r.quadratic and predicate(r))


_ACTIVATIONS = _ledger().group_total("activations")
_STATES = _ledger().group_total("model_states")
_CKPT = _ledger(recompute="full").group_total("activations")
_OFFLOAD = _ledger(recompute="full", offload_optimizer="cpu")
_ZERO_OFFLOAD = _ledger(recompute="full", offload_optimizer="cpu", offload_placement="zero-offload")
_WEIGHTS = _RECIPE.components[0].bytes_per_param * _P
_QUAD_MIB = sum(in_unit(_at(r.bytes), ARTICLE_TENSOR_UNIT) for r in ARTICLE_INVENTORY if r.quadratic)
_LAYER_MIB = sum(in_unit(_at(r.bytes), ARTICLE_TENSOR_UNIT) for r in ARTICLE_INVENTORY)


def _claims():
    arch = get_preset(ARTICLE)
    c = []
    add = lambda *a, **k: c.append(Claim(*a, **k))

    s = "The 7B spec"
    add("spec.params", s, "The spec has about 7 billion parameters", "7", "billion params",
        lambda: Fraction(arch.computed_params, 10**9), "rounded", relation="~",
        note="The spec gives L(12d^2 + 13d) = 6.44e9 in the blocks; with a 32000-token vocabulary "
             "(tied) the model has 6.58e9 parameters. The article then uses 7e9, and so does article-7b.")
    add("spec.d", s, "Hidden size d", "4096", "", lambda: arch.d_model)
    add("spec.L", s, "Number of layers L", "32", "", lambda: arch.n_layers)
    add("spec.H", s, "Attention heads H", "32", "", lambda: arch.n_heads)
    add("spec.d_h", s, "Head size d/H", "128", "", lambda: arch.head_dim)
    add("spec.d_ff", s, "MLP width 4d", "16384", "", lambda: arch.d_ff)
    add("spec.S", s, "Sequence length S", "2048", "", lambda: _ledger().seq_len)
    add("spec.B", s, "Micro-batch size B", "1", "", lambda: _ledger().batch_size)
    add("spec.weights", s, "BF16 weights: 7e9 x 2 bytes", "14", "GB", lambda: _gb(_WEIGHTS))
    add("intro.headroom", s, "An 80 GB A100 leaves this much room beside the weights", "66", "GB",
        lambda: _gb(A100 - _WEIGHTS))

    s = "Model states"
    # the article's model-state table: (key, component, bytes/param, GB for 7B), as printed
    for i, (key, text, per_param, gb) in enumerate([
            ("params", "BF16 parameters", "2", "14"), ("grads", "BF16 gradients", "2", "14"),
            ("master", "FP32 master weights", "4", "28"), ("adam_m", "FP32 Adam first moment m", "4", "28"),
            ("adam_v", "FP32 Adam second moment v", "4", "28")]):
        add(f"states.{key}.bpp", s, f"{text}: bytes per parameter", per_param, "B/param",
            lambda i=i: _RECIPE.components[i].bytes_per_param)
        add(f"states.{key}.gb", s, f"{text} for 7e9 parameters", gb, "GB", lambda i=i: _component_gb(i))
    add("states.bpp", s, "Model states per parameter, BF16 + AdamW", "16", "B/param",
        lambda: _RECIPE.bytes_per_param)
    add("states.total", s, "Model states of the 7B model", "112", "GB", lambda: _gb(_STATES))
    add("states.vs_weights", s, "Model states are this many times the weights", "8", "x",
        lambda: Fraction(_STATES, _WEIGHTS))
    add("states.over_gpu", s, "Model states alone exceed one 80 GB A100", "80", "GB", lambda: _gb(_STATES),
        relation=">")

    s = "Activation inventory"
    # the article's per-layer table at B=1, S=2048, as printed ("MB", meaning MiB), row by row
    printed = ["16", "16", "16", "16", "256", "256", "128", "16", "16", "8", "16", "64", "64", "16", "8"]
    for i, (r, mib) in enumerate(zip(ARTICLE_INVENTORY, printed)):
        add(f"act.row{i + 1:02d}", s, f"{r.block} block, '{r.name}' ({r.dtype}), per layer", mib, ARTICLE_TENSOR_UNIT,
            lambda r=r: in_unit(_at(r.bytes), ARTICLE_TENSOR_UNIT),
            note="The article writes MB for MiB (2^20 bytes)." + (
                f" Size right, label not: {RELABEL_NOTE[r.name]}" if r.name in RELABEL_NOTE else ""))
    add("act.score_vs_bsd", s, "One S x S score tensor is this many times a B x S x d tensor", "16", "x",
        lambda: Fraction(_at(ARTICLE_INVENTORY[4].bytes), _at(ARTICLE_INVENTORY[1].bytes)))
    add("act.three_quadratic", s, "The three S x S tensors together", "640", ARTICLE_TENSOR_UNIT, lambda: _QUAD_MIB)
    add("act.quadratic_share", s, "...are more than 70% of the layer", "70", "%",
        lambda: 100 * _QUAD_MIB / _LAYER_MIB, relation=">")
    add("formula.bf16_bsd", s, "Eight BF16 B x S x d tensors contribute 8 x 2", "16", "B/(BSd)",
        lambda: _bsd_bytes_count(lambda r: r.dtype == "bf16" and sp.degree(sp.prod(r.shape), d) == 1
                                 and 4 * d not in r.shape))
    add("formula.masks", s, "Two dropout masks contribute 2 x 1", "2", "B/(BSd)",
        lambda: _bsd_bytes_count(lambda r: r.dtype == "bool"))
    add("formula.ffn", s, "Two B x S x 4d FFN tensors contribute 2 x 2 x 4", "16", "B/(BSd)",
        lambda: _bsd_bytes_count(lambda r: 4 * d in r.shape))
    add("formula.34", s, "Coefficient of BSd in the per-layer formula", "34", "", lambda: _EXPANDED.coeff(B * S * d))
    add("formula.5", s, "Coefficient of BHS^2 in the per-layer formula", "5", "",
        lambda: _EXPANDED.coeff(B * H * S**2))
    add("formula.80", s, "5HS/d at the spec", "80", "", lambda: _at(5 * H * S / d))
    add("formula.114", s, "34 + 5HS/d at the spec", "114", "", lambda: _at(closed_form() / (B * S * d)))
    add("act.layer", s, "Saved activations per layer", "0.96", "GB", lambda: _layer_gb(1, 2048), "rounded")
    add("act.total", s, "32 layers: 32 x 0.96", "30.6", "GB", lambda: _gb(_ACTIVATIONS), "rounded",
        note="32 x 0.96 = 30.72; the printed 30.6 is 32 x 0.956 = 30.60, the unrounded per-layer value.")
    add("act.about30", s, "Activations alone are about 30 GB", "30", "GB", lambda: _gb(_ACTIVATIONS), "rounded",
        note="30.60 truncated.")
    add("act.at_least", s, "Model states + activations: at least 142 GB", "142", "GB",
        lambda: _gb(_STATES + _ACTIVATIONS), relation=">")
    add("act.twice_gpu", s, "...close to twice an 80 GB A100", "2", "x",
        lambda: Fraction(_STATES + _ACTIVATIONS, A100), "rounded", relation="~",
        note="142.6 / 80 = 1.78, which rounds to 2: 'close to twice' is generous.")

    s = "Batch size and sequence length"
    for name, batch, seq, layer, total, notes in [
            ("base", 1, 2048, "0.96", "30.6", ("", "")),
            ("batch4", 4, 2048, "3.82", "122", ("4 x 0.9563 = 3.8252: truncated to 3.82 (rounding gives 3.83).", "")),
            ("seq4096", 1, 4096, "3.25", "104", ("", "")),
            ("both", 4, 4096, "13.0", "417", ("", ""))]:
        add(f"table.{name}.layer", s, f"B={batch}, S={seq}: activations per layer", layer, "GB",
            lambda b=batch, q=seq: _layer_gb(b, q), "rounded", note=notes[0])
        add(f"table.{name}.total", s, f"B={batch}, S={seq}: activations, 32 layers", total, "GB",
            lambda b=batch, q=seq: _total_activations_gb(b, q), "rounded", note=notes[1])
    add("growth.batch", s, "Doubling B doubles activations", "2", "x",
        lambda: Fraction(_at(_LAYER.subs(F, 4 * d), 2), _at(_LAYER.subs(F, 4 * d), 1)))
    add("growth.seq", s, "Doubling S multiplies activations by 3.4", "3.4", "x",
        lambda: Fraction(_at(_LAYER, 1, 4096), _at(_LAYER, 1, 2048)), "rounded")
    add("growth.quadratic_share", s, "At S = 2048 the S^2 terms are 70% of a layer", "70", "%",
        lambda: 100 * _quadratic_share_at_spec(), "rounded")

    s = "The full ledger"
    add("ledger.adam", s, "FP32 Adam m + v", "56", "GB", lambda: _component_gb(3) + _component_gb(4))
    add("ledger.overhead", s, "CUDA context + workspace, upper end of 1-2 GB (used in the sums)", "2", "GB",
        lambda: _gb(DEFAULT_OVERHEAD))
    add("ledger.total", s, "Full ledger at B=1, S=2048", "144", "GB",
        lambda: _gb(_ledger(overhead_bytes=3 * DEFAULT_OVERHEAD // 4).totals["gpu"]), "rounded",
        relation="~", note="With the midpoint 1.5 GB of the article's 1-2 GB overhead: 144.10 GB "
                           "(143.6 to 144.6 over the range).")
    add("ledger.extra", s, "Gradients + master + Adam + activations on top of the weights", "128", "GB",
        lambda: _gb(_STATES - _WEIGHTS + _ACTIVATIONS), "rounded",
        note="14 + 28 + 56 + 30.6 = 128.6; the article adds 30 for the activations (truncation).")
    add("ledger.at_least", s, "Single-GPU training needs more than 140 GB", "140", "GB",
        lambda: _gb(_STATES + _ACTIVATIONS), relation=">")

    s = "Activation checkpointing"
    add("ckpt.total", s, "Full checkpointing: L x BSd x 2", "0.5", "GB", lambda: _gb(_CKPT), "rounded",
        note="32 x 2048 x 4096 x 2 = 536,870,912 bytes = 0.54 GB, exactly 0.5 GiB.")
    add("ckpt.saving", s, "Activation memory falls by 98%", "98", "%",
        lambda: 100 * (1 - Fraction(_CKPT, _ACTIVATIONS)), "rounded")
    add("ckpt.flops", s, "At the price of about 33% more FLOPs", "33", "%",
        lambda: 100 * _flops_overhead_at_spec(), "rounded",
        note="One extra forward of each layer: Narayanan et al. (2021) give 96/72 of the model FLOPs "
             "with the logits not recomputed, i.e. +32.7% at the spec.")
    add("ckpt.ledger", s, "112 + 0.5 + 2 GB with checkpointing", "114.5", "GB",
        lambda: _gb(_ledger(recompute="full").totals["gpu"]), "rounded")
    add("ckpt.vs_gpu", s, "...still 1.4 times an 80 GB GPU", "1.4", "x",
        lambda: Fraction(_ledger(recompute="full").totals["gpu"], A100), "rounded")

    s = "Offloading"
    add("offload.cpu", s, "FP32 master + Adam states moved to the CPU", "84", "GB",
        lambda: _gb(_OFFLOAD.totals["cpu"]))
    add("offload.gpu", s, "GPU resident: 14 + 14 + 0.5 + 2", "30.5", "GB", lambda: _gb(_OFFLOAD.totals["gpu"]),
        "rounded")
    add("offload.fits", s, "Checkpointing + offloading together fit in 80 GB", "80", "GB",
        lambda: _gb(_OFFLOAD.totals["gpu"]), relation="<")
    add("offload.zero_offload_gpu", s, "Keeping BF16 params and grads on the GPU is ZeRO-Offload's scheme",
        "28", "GB", lambda: _gb(_ZERO_OFFLOAD.group_total("model_states", "gpu")), "erratum",
        note="ZeRO-Offload (Ren et al. 2021) streams the gradients to the CPU during backward and keeps "
             "only the BF16 parameters: 2P = 14 GB of model states on the GPU, not 28 GB. The article's "
             "28 GB placement is valid, just not ZeRO-Offload's.")
    add("offload.pcie4", s, "PCIe 4.0 x16 bandwidth, one direction", "32", "GB/s",
        lambda: _gb(LINKS["pcie4-x16"]))
    add("offload.moved", s, "84 GB cross PCIe each step, taking seconds", "84", "GB",
        lambda: _gb(_OFFLOAD.traffic.pcie_bytes), "erratum",
        note="The FP32 states stay where the optimizer runs. Per step the 14 GB of BF16 gradients go down and "
             "14 GB of updated BF16 parameters come back: 28 GB, 0.875 s at 32 GB/s one after the other "
             "(0.44 s overlapped), not 84 GB in 2.6 s.")
    add("offload.nvme_low", s, "NVMe bandwidth, low end", "3", "GB/s", lambda: _gb(LINKS["nvme-3"]))
    add("offload.nvme_high", s, "NVMe bandwidth, high end", "7", "GB/s", lambda: _gb(LINKS["nvme-7"]))

    s = "Mixed precision"
    add("bf16.bits", s, "BF16 has 7 fraction bits (spacing 2^-7 between 1 and 2)", "7", "bits",
        lambda: bf16_spacing(Fraction(5, 4)).denominator.bit_length() - 1)
    add("bf16.lost_update", s, "w = 1.25 updated by -0.001 in BF16 stays 1.25", "1.25", "",
        lambda: round_to_bf16(Fraction(5, 4) - Fraction(1, 1000)))
    return c


RELABEL_NOTE = {
    "attention scores QK^T/sqrt(d_h)": "softmax backward needs its output, not the scores; the same-size "
                                       "tensor kept is the attention-dropout output.",
    "output projection output": "no backward reads it; the same-size tensor kept is the LayerNorm output "
                                "that feeds Q, K and V.",
    "down projection output": "no backward reads it; the same-size tensor kept is the LayerNorm output "
                              "that feeds the MLP.",
}


def _quadratic_share_at_spec():
    return Fraction(_at(sp.numer(quadratic_share(inventory()))), _at(sp.denom(quadratic_share(inventory()))))


def _flops_overhead_at_spec():
    e = recompute_overhead("full")
    return Fraction(_at(sp.numer(e)), _at(sp.denom(e)))


CLAIMS = _claims()


def claims_table() -> str:
    """A plain-text audit: id, stated, computed, status, note."""
    lines = [f"{'claim':<26} {'stated':>10} {'computed':>12} {'unit':<14} {'status':<11} note"]
    for c in CLAIMS:
        computed = f"{float(c.computed):.6g}"
        lines.append(f"{c.id:<26} {c.relation.replace('=', '') + c.stated:>10} {computed:>12} {c.unit:<14} "
                     f"{c.classify():<11} {c.note}")
    return "\n".join(lines)
