"""The article's numeric claims, section by section, each recomputed from the library.

Every numeric statement of the source article (Chinese; paraphrased here in
English) is a :class:`~memledger.article.claim.Claim`: the value as printed, and a
function that recomputes it with memledger. One function per article section
builds its claims; :data:`CLAIMS` is all of them, in the article's order.

Units are the article's, read as :mod:`memledger.core.units` decides: per-tensor
"MB" are MiB (2^20 bytes), totals "GB" are 10^9 bytes.
"""
from fractions import Fraction

import sympy as sp

from ..activations.inventory import ARTICLE_INVENTORY, closed_form, inventory, per_layer_bytes, quadratic_share
from .claim import ARTICLE, RECIPE, STATUSES, Claim, article_ledger, at_spec, component, gb, ratio_at_spec
from ..models.presets import get_preset
from ..core.dtypes import bf16_spacing, round_to_bf16
from ..activations.flops import recompute_overhead
from ..ledger.hardware import LINKS, NOMINAL_MEMORY
from ..ledger.ledger import DEFAULT_OVERHEAD
from ..core.symbols import B, F, H, S, d
from ..core.units import ARTICLE_TENSOR_UNIT, in_unit

__all__ = ["CLAIMS", "STATUSES", "Claim", "RELABEL_NOTE", "claims_table"]

A100 = NOMINAL_MEMORY["a100-80gb"]      # the article's "80 GB" (decimal), as it computes with it


# --- helpers: every number below comes from the library -----------------------------

def _component_gb(name: str) -> Fraction:
    return gb(component(name).bytes_per_param * article_ledger().params)


def _layer(**kw) -> int:
    """Saved bytes of one layer (the inventory's sum) at the spec, or at ``kw``."""
    return at_spec(per_layer_bytes(inventory()), **kw)


def _activations(**kw) -> int:
    return article_ledger(**kw).group_total("activations")


def _states() -> int:
    return article_ledger().group_total("model_states")


def _weights() -> int:
    return component("BF16 parameters").bytes_per_param * article_ledger().params


def _bsd_bytes(predicate) -> sp.Expr:
    """Bytes per element of B x S x d contributed by the article's rows that satisfy ``predicate``."""
    return sum(r.bytes / (B * S * d) for r in ARTICLE_INVENTORY if not r.quadratic and predicate(r))


# --- one function per article section ----------------------------------------------

def _spec(s="The 7B spec"):
    arch = get_preset(ARTICLE)
    return [
        Claim("spec.params", s, "The spec has about 7 billion parameters", "7", "billion params",
              lambda: Fraction(arch.computed_params, 10**9), "rounded", relation="~",
              note="The spec gives L(12d^2 + 13d) = 6.44e9 in the blocks; with a 32000-token vocabulary "
                   "(tied) the model has 6.58e9 parameters. The article then uses 7e9, and so does article-7b."),
        Claim("spec.d", s, "Hidden size d", "4096", "", lambda: arch.d_model),
        Claim("spec.L", s, "Number of layers L", "32", "", lambda: arch.n_layers),
        Claim("spec.H", s, "Attention heads H", "32", "", lambda: arch.n_heads),
        Claim("spec.d_h", s, "Head size d/H", "128", "", lambda: arch.head_dim),
        Claim("spec.d_ff", s, "MLP width 4d", "16384", "", lambda: arch.d_ff),
        Claim("spec.S", s, "Sequence length S", "2048", "", lambda: article_ledger().seq_len),
        Claim("spec.B", s, "Micro-batch size B", "1", "", lambda: article_ledger().batch_size),
        Claim("spec.weights", s, "BF16 weights: 7e9 x 2 bytes", "14", "GB", lambda: gb(_weights())),
        Claim("intro.headroom", s, "An 80 GB A100 leaves this much room beside the weights", "66", "GB",
              lambda: gb(A100 - _weights())),
    ]


def _model_states(s="Model states"):
    claims = []
    # the article's model-state table: (key, its label, our component, bytes/param, GB for 7B), as printed
    for key, label, name, per_param, printed_gb in [
            ("params", "BF16 parameters", "BF16 parameters", "2", "14"),
            ("grads", "BF16 gradients", "BF16 gradients", "2", "14"),
            ("master", "FP32 master weights", "FP32 master weights", "4", "28"),
            ("adam_m", "FP32 Adam first moment m", "Adam first moment m", "4", "28"),
            ("adam_v", "FP32 Adam second moment v", "Adam second moment v", "4", "28")]:
        claims += [Claim(f"states.{key}.bpp", s, f"{label}: bytes per parameter", per_param, "B/param",
                         lambda n=name: component(n).bytes_per_param),
                   Claim(f"states.{key}.gb", s, f"{label} for 7e9 parameters", printed_gb, "GB",
                         lambda n=name: _component_gb(n))]
    return claims + [
        Claim("states.bpp", s, "Model states per parameter, BF16 + AdamW", "16", "B/param",
              lambda: RECIPE.bytes_per_param),
        Claim("states.total", s, "Model states of the 7B model", "112", "GB", lambda: gb(_states())),
        Claim("states.vs_weights", s, "Model states are this many times the weights", "8", "x",
              lambda: Fraction(_states(), _weights())),
        Claim("states.over_gpu", s, "Model states alone exceed one 80 GB A100", "80", "GB",
              lambda: gb(_states()), relation=">"),
    ]


#: The article's per-layer table at B = 1, S = 2048 ("MB", meaning MiB), keyed by (block, label).
PRINTED_MIB = {
    ("attention", "LayerNorm input"): "16", ("attention", "Q projection output"): "16",
    ("attention", "K projection output"): "16", ("attention", "V projection output"): "16",
    ("attention", "attention scores QK^T/sqrt(d_h)"): "256", ("attention", "softmax output"): "256",
    ("attention", "attention dropout mask"): "128", ("attention", "attention output softmax x V"): "16",
    ("attention", "output projection output"): "16", ("attention", "residual dropout mask"): "8",
    ("mlp", "LayerNorm input"): "16", ("mlp", "up projection output"): "64", ("mlp", "GeLU output"): "64",
    ("mlp", "down projection output"): "16", ("mlp", "residual dropout mask"): "8",
}

RELABEL_NOTE = {
    "attention scores QK^T/sqrt(d_h)": "softmax backward needs its output, not the scores; the same-size "
                                       "tensor kept is the attention-dropout output.",
    "output projection output": "no backward reads it; the same-size tensor kept is the LayerNorm output "
                                "that feeds Q, K and V.",
    "down projection output": "no backward reads it; the same-size tensor kept is the LayerNorm output "
                              "that feeds the MLP.",
}


def _inventory(s="Activation inventory"):
    def mib(rows):
        return sum(in_unit(at_spec(r.bytes), ARTICLE_TENSOR_UNIT) for r in rows)

    claims = []
    for i, r in enumerate(ARTICLE_INVENTORY):
        claims.append(Claim(
            f"act.row{i + 1:02d}", s, f"{r.block} block, '{r.name}' ({r.dtype}), per layer",
            PRINTED_MIB[(r.block, r.name)], ARTICLE_TENSOR_UNIT, lambda r=r: mib([r]),
            note="The article writes MB for MiB (2^20 bytes)." + (
                f" Size right, label not: {RELABEL_NOTE[r.name]}" if r.name in RELABEL_NOTE else "")))
    def expanded():
        return sp.expand(per_layer_bytes(inventory()).subs(F, 4 * d))
    quadratic = [r for r in ARTICLE_INVENTORY if r.quadratic]
    row = {(r.block, r.name): r for r in ARTICLE_INVENTORY}
    scores, q = row[("attention", "attention scores QK^T/sqrt(d_h)")], row[("attention", "Q projection output")]
    return claims + [
        Claim("act.score_vs_bsd", s, "One S x S score tensor is this many times a B x S x d tensor", "16", "x",
              lambda: Fraction(at_spec(scores.bytes), at_spec(q.bytes))),
        Claim("act.three_quadratic", s, "The three S x S tensors together", "640", ARTICLE_TENSOR_UNIT,
              lambda: mib(quadratic)),
        Claim("act.quadratic_share", s, "...are more than 70% of the layer", "70", "%",
              lambda: 100 * mib(quadratic) / mib(ARTICLE_INVENTORY), relation=">"),
        Claim("formula.bf16_bsd", s, "Eight BF16 B x S x d tensors contribute 8 x 2", "16", "B/(BSd)",
              lambda: _bsd_bytes(lambda r: r.dtype == "bf16" and 4 * d not in r.shape)),
        Claim("formula.masks", s, "Two dropout masks contribute 2 x 1", "2", "B/(BSd)",
              lambda: _bsd_bytes(lambda r: r.dtype == "bool")),
        Claim("formula.ffn", s, "Two B x S x 4d FFN tensors contribute 2 x 2 x 4", "16", "B/(BSd)",
              lambda: _bsd_bytes(lambda r: 4 * d in r.shape)),
        Claim("formula.34", s, "Coefficient of BSd in the per-layer formula", "34", "",
              lambda: expanded().coeff(B * S * d)),
        Claim("formula.5", s, "Coefficient of BHS^2 in the per-layer formula", "5", "",
              lambda: expanded().coeff(B * H * S**2)),
        Claim("formula.80", s, "5HS/d at the spec", "80", "", lambda: at_spec(5 * H * S / d)),
        Claim("formula.114", s, "34 + 5HS/d at the spec", "114", "", lambda: at_spec(closed_form() / (B * S * d))),
        Claim("act.layer", s, "Saved activations per layer", "0.96", "GB", lambda: gb(_layer()), "rounded"),
        Claim("act.total", s, "32 layers: 32 x 0.96", "30.6", "GB", lambda: gb(_activations()), "rounded",
              note="32 x 0.96 = 30.72; the printed 30.6 is 32 x 0.956 = 30.60, the unrounded per-layer value."),
        Claim("act.about30", s, "Activations alone are about 30 GB", "30", "GB", lambda: gb(_activations()),
              "rounded", note="30.60 truncated."),
        Claim("act.at_least", s, "Model states + activations: at least 142 GB", "142", "GB",
              lambda: gb(_states() + _activations()), relation=">"),
        Claim("act.twice_gpu", s, "...close to twice an 80 GB A100", "2", "x",
              lambda: Fraction(_states() + _activations(), A100), "rounded", relation="~",
              note="142.6 / 80 = 1.78, which rounds to 2: 'close to twice' is generous."),
    ]


def _batch_and_sequence(s="Batch size and sequence length"):
    claims = []
    for name, batch, seq, layer, total, note in [
            ("base", 1, 2048, "0.96", "30.6", ""),
            ("batch4", 4, 2048, "3.82", "122", "4 x 0.9563 = 3.8252: truncated to 3.82 (rounding gives 3.83)."),
            ("seq4096", 1, 4096, "3.25", "104", ""),
            ("both", 4, 4096, "13.0", "417", "")]:
        claims += [
            Claim(f"table.{name}.layer", s, f"B={batch}, S={seq}: activations per layer", layer, "GB",
                  lambda b=batch, q=seq: gb(_layer(batch_size=b, seq_len=q)), "rounded", note=note),
            Claim(f"table.{name}.total", s, f"B={batch}, S={seq}: activations, 32 layers", total, "GB",
                  lambda b=batch, q=seq: gb(_activations(batch_size=b, seq_len=q)), "rounded")]
    return claims + [
        Claim("growth.batch", s, "Doubling B doubles activations", "2", "x",
              lambda: Fraction(_layer(batch_size=2), _layer())),
        Claim("growth.seq", s, "Doubling S multiplies activations by 3.4", "3.4", "x",
              lambda: Fraction(_layer(seq_len=4096), _layer()), "rounded"),
        Claim("growth.quadratic_share", s, "At S = 2048 the S^2 terms are 70% of a layer", "70", "%",
              lambda: 100 * ratio_at_spec(quadratic_share(inventory())), "rounded"),
    ]


def _full_ledger(s="The full ledger"):
    return [
        Claim("ledger.adam", s, "FP32 Adam m + v", "56", "GB",
              lambda: _component_gb("Adam first moment m") + _component_gb("Adam second moment v")),
        Claim("ledger.overhead", s, "CUDA context + workspace, upper end of 1-2 GB (used in the sums)", "2", "GB",
              lambda: gb(DEFAULT_OVERHEAD)),
        Claim("ledger.total", s, "Full ledger at B=1, S=2048", "144", "GB",
              lambda: gb(article_ledger().totals["gpu"]), "rounded", relation="~",
              note="With the 2 GB overhead this book uses throughout (the upper end of the article's 1-2 GB, "
                   "as in its own 114.5 GB sum): 144.60 GB, which the article's ~144 truncates."),
        Claim("ledger.extra", s, "Gradients + master + Adam + activations on top of the weights", "128", "GB",
              lambda: gb(_states() - _weights() + _activations()), "rounded",
              note="14 + 28 + 56 + 30.6 = 128.6; the article adds 30 for the activations (truncation)."),
        Claim("ledger.at_least", s, "Single-GPU training needs more than 140 GB", "140", "GB",
              lambda: gb(_states() + _activations()), relation=">"),
    ]


def _checkpointing(s="Activation checkpointing"):
    def full():
        return article_ledger(recompute="full")
    return [
        Claim("ckpt.total", s, "Full checkpointing: L x BSd x 2", "0.5", "GB",
              lambda: gb(_activations(recompute="full")), "rounded",
              note="32 x 2048 x 4096 x 2 = 536,870,912 bytes = 0.54 GB, exactly 0.5 GiB."),
        Claim("ckpt.saving", s, "Activation memory falls by 98%", "98", "%",
              lambda: 100 * (1 - Fraction(_activations(recompute="full"), _activations())), "rounded"),
        Claim("ckpt.flops", s, "At the price of about 33% more FLOPs", "33", "%",
              lambda: 100 * ratio_at_spec(recompute_overhead("full")), "rounded",
              note="One extra forward of each layer: Narayanan et al. (2021) give 96/72 of the model FLOPs "
                   "with the logits not recomputed, i.e. +32.7% at the spec."),
        Claim("ckpt.ledger", s, "112 + 0.5 + 2 GB with checkpointing", "114.5", "GB",
              lambda: gb(full().totals["gpu"]), "rounded"),
        Claim("ckpt.vs_gpu", s, "...still 1.4 times an 80 GB GPU", "1.4", "x",
              lambda: Fraction(full().totals["gpu"], A100), "rounded"),
    ]


def _offloading(s="Offloading"):
    def offload(**kw):
        return article_ledger(recompute="full", offload_optimizer="cpu", **kw)
    return [
        Claim("offload.cpu", s, "FP32 master + Adam states moved to the CPU", "84", "GB",
              lambda: gb(offload().totals["cpu"])),
        Claim("offload.gpu", s, "GPU resident: 14 + 14 + 0.5 + 2", "30.5", "GB",
              lambda: gb(offload().totals["gpu"]), "rounded"),
        Claim("offload.fits", s, "Checkpointing + offloading together fit in 80 GB", "80", "GB",
              lambda: gb(offload().totals["gpu"]), relation="<"),
        Claim("offload.zero_offload_gpu", s, "Keeping BF16 params and grads on the GPU is ZeRO-Offload's scheme",
              "28", "GB", lambda: gb(offload(offload_placement="zero-offload").group_total("model_states", "gpu")),
              "erratum",
              note="ZeRO-Offload (Ren et al. 2021) streams the gradients to the CPU during backward and keeps "
                   "only the BF16 parameters: 2P = 14 GB of model states on the GPU, not 28 GB. The article's "
                   "28 GB placement is valid, just not ZeRO-Offload's."),
        Claim("offload.pcie4", s, "PCIe 4.0 x16 bandwidth, one direction", "32", "GB/s",
              lambda: gb(LINKS["pcie4-x16"])),
        Claim("offload.moved", s, "84 GB cross PCIe each step, taking seconds", "84", "GB",
              lambda: gb(offload().traffic.pcie_bytes), "erratum",
              note="The FP32 states stay where the optimizer runs. Per step the 14 GB of BF16 gradients go down "
                   "and 14 GB of updated BF16 parameters come back: 28 GB, 0.875 s at 32 GB/s one after the "
                   "other (0.44 s overlapped), not 84 GB in 2.6 s."),
        Claim("offload.nvme_low", s, "NVMe bandwidth, low end", "3", "GB/s", lambda: gb(LINKS["nvme-3"])),
        Claim("offload.nvme_high", s, "NVMe bandwidth, high end", "7", "GB/s", lambda: gb(LINKS["nvme-7"])),
    ]


def _conclusion(s="Conclusion"):
    return [
        Claim("together.needed", s, "Offloading alone leaves more than 80 GB on the GPU (both are needed)", "80",
              "GB", lambda: gb(article_ledger(offload_optimizer="cpu").totals["gpu"]), "erratum", relation=">",
              note="Offloading the FP32 states without checkpointing leaves 14 + 14 + 30.6 + 2 = 60.6 GB on "
                   "the GPU, under 80 GB: at B = 1, S = 2048 offloading alone fits, and checkpointing is "
                   "needed only for larger batches or longer sequences."),
    ]


def _mixed_precision(s="Mixed precision"):
    return [
        Claim("bf16.bits", s, "BF16 has 7 fraction bits (spacing 2^-7 between 1 and 2)", "7", "bits",
              lambda: bf16_spacing(Fraction(5, 4)).denominator.bit_length() - 1),
        Claim("bf16.lost_update", s, "w = 1.25 updated by -0.001 in BF16 stays 1.25", "1.25", "",
              lambda: round_to_bf16(Fraction(5, 4) - Fraction(1, 1000))),
    ]


SECTIONS = (_spec, _model_states, _inventory, _batch_and_sequence, _full_ledger, _checkpointing, _offloading,
            _conclusion, _mixed_precision)
CLAIMS = [claim for section in SECTIONS for claim in section()]


def claims_table() -> str:
    """A plain-text audit: id, stated, computed, status, note."""
    lines = [f"{'claim':<26} {'stated':>10} {'computed':>12} {'unit':<14} {'status':<11} note"]
    for c in CLAIMS:
        computed = f"{float(c.computed):.6g}"
        lines.append(f"{c.id:<26} {c.relation.replace('=', '') + c.stated:>10} {computed:>12} {c.unit:<14} "
                     f"{c.classify():<11} {c.note}")
    return "\n".join(lines)
