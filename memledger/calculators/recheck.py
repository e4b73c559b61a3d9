"""Every source erratum of :data:`memledger.calculators.ERRATA`, recomputed by the conventions' own code.

An :class:`~memledger.calculators.base.Erratum` records, in words, what a
source publishes and what its own formula or code gives. :func:`rechecks`
recomputes the figures of each one from the library (the convention's
estimate, its formula, memledger's inventory or recipe), so that the book
prints numbers computed here, never the record's text; ``tests/calculators/test_recheck.py``
checks them against arithmetic written in the test and against the record.

Each :class:`Recheck` names its erratum by source and a unique part of its
``where``, and carries its figures as exact values with a unit and the
decimals to print.
"""
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import cache

import sympy as sp

from ..activations.inventory import inventory, per_layer_bytes
from ..states.recipes import get_recipe
from ..ledger.ledger import Ledger
from ..core.symbols import B, L, S, d, t
from ..core.units import format_quantity, in_unit
from . import ERRATA, accelerate, eleuther, megatron, papers
from . import transformer_math as tm
from .base import ConventionInputs, G, p_pp
from .deepspeed import ZERO2, ZERO2_DOCS
from .examples import T5_3B, T5_EMBEDDING, ZERO_GPT2, bert_base_cased_fp32_bytes, bert_base_cased_largest_fp32_bytes


@dataclass(frozen=True)
class Figure:
    """One recomputed number: exact ``value`` in ``unit``, printed with ``digits`` decimals."""
    value: Fraction
    unit: str = ""
    digits: int = 0

    @property
    def text(self) -> str:
        return format_quantity(self.value, self.unit, self.digits)


@dataclass(frozen=True)
class Recheck:
    """The figures memledger recomputes for one erratum, and a sentence built from them."""
    key: str
    source: str
    where: str                  # a part of the erratum's ``where`` that names it alone
    figures: dict
    template: str               # str.format over the figures' texts

    @property
    def shows(self) -> str:
        return self.template.format(**{k: f.text for k, f in self.figures.items()})

    @property
    def erratum(self):
        """The recorded erratum this recheck recomputes (exactly one)."""
        found = [e for e in ERRATA if e.source == self.source and self.where in e.where]
        if len(found) != 1:
            raise ValueError(f"{self.key}: {len(found)} errata of {self.source} match {self.where!r}")
        return found[0]


def _gib(nbytes, digits=2) -> Figure:
    return Figure(in_unit(nbytes, "GiB"), "GiB", digits)


def _per_param(estimate, n_params, device="gpu") -> Fraction:
    return Fraction(estimate.total(device), n_params)


def _deepspeed() -> list:
    t5, t5_inputs = Ledger(n_params=T5_3B, dp=8), ConventionInputs(largest_layer=T5_EMBEDDING)
    table = Recheck("deepspeed-docs-table", "DeepSpeed docs", "lines 29-30 and 45-46",
                    {"docs": _gib(ZERO2_DOCS.estimate(t5, t5_inputs).total("gpu")),
                     "code": _gib(ZERO2.estimate(t5, t5_inputs).total("gpu"))},
                    "t5-3b on 8 GPUs: {docs} per GPU by the docs' formula, {code} by the code")
    p = 8 * 10**9                                     # divisible by 8: no floor() in the per-parameter figures
    one, eight = Ledger(n_params=p), Ledger(n_params=p, dp=8)
    formula = Recheck("deepspeed-docs-formula", "DeepSpeed docs", "line 137",
                      {"one": Figure(_per_param(ZERO2.estimate(one), p), "B/param"),
                       "docs": Figure(_per_param(ZERO2_DOCS.estimate(eight), p), "B/param", 2),
                       "code": Figure(_per_param(ZERO2.estimate(eight), p), "B/param", 2)},
                      "both book {one} on one GPU; on 8 GPUs the docs' formula gives {docs}, the code {code}")
    nodes, two = replace(eight, dp=16, offload_optimizer="cpu"), ConventionInputs(nodes=2)
    code_cpu = Fraction(ZERO2.estimate(nodes, two).total("cpu"), p) / two.buffer_factor
    docs_cpu = Fraction(int(sp.Max(4 * G, 16).subs(G, two.per_node(nodes))))
    cpu = Recheck("deepspeed-docs-cpu", "DeepSpeed docs", "line 205",
                  {"code": Figure(code_cpu, "B/param"), "docs": Figure(docs_cpu, "B/param")},
                  "2 nodes of 8 GPUs with the optimizer offloaded: {code} of CPU memory per node by the code "
                  "(before the buffer factor), {docs} by the docs")
    return [table, formula, cpu]


def _accelerate() -> list:
    size, largest = bert_base_cased_fp32_bytes(), bert_base_cased_largest_fp32_bytes()
    docs = accelerate.table(size, largest, docs=True)
    now = accelerate.table(size, largest)
    mib = lambda text: Figure(Fraction(text.split()[0]), "MiB", 2)
    typo = Recheck("accelerate-typo", "accelerate docs", "line 74",
                   {"fp32": mib(docs[0][2]), "fp16": mib(docs[1][2])},
                   "bert-base-cased in float32: {fp32} (twice the float16 row's {fp16})")
    assert now[2][3] == now[3][3] == "N/A"
    int8 = Recheck("accelerate-int", "accelerate docs", "lines 76-77",
                   {"int8": mib(docs[2][3]), "int4": mib(docs[3][3])},
                   "the current code prints N/A for int8 and int4; {int8} and {int4} are the first version's "
                   "4 x the size at that dtype")
    return [typo, int8]


def _eleuther() -> list:
    adam8 = get_recipe("bf16-adam-8bit")
    parts = [c for c in adam8.components if c.role == "optimizer"]
    eight = Recheck("eleuther-8bit", "EleutherAI cookbook", "line 313",
                    {"master": Figure(parts[0].bytes_per_param, "B/param"),
                     "moments": Figure(sum(c.bytes_per_param for c in parts[1:]), "B/param"),
                     "total": Figure(adam8.role_bytes("optimizer"), "B/param")},
                    "memledger's 8-bit Adam: FP32 master {master} + 8-bit m and v {moments} = {total}")
    per = lambda expr: Fraction(int(sp.expand(expr / (S * B * d * L))))
    ckpt = Recheck("eleuther-checkpoint", "EleutherAI cookbook", "lines 348-349",
                   {"cookbook": Figure(per(eleuther.activation_bytes("full"))),
                    "full": Figure(per(L * per_layer_bytes(inventory(), "full")))},
                   "with checkpointing the cookbook books {cookbook} S B d L bytes; full recomputation keeps "
                   "{full} S B d L")
    positions = eleuther.cookbook_params() - eleuther.cookbook_params().subs(S, 0)
    pos = Recheck("eleuther-positions", "EleutherAI cookbook", "line 268",
                  {"extra": Figure(int(positions.subs({d: 4096, S: 4096})), "parameters")},
                  "its LLaMA-7B example (d = S = 4096) gains {extra} that a rotary model does not have")
    n, gpus = 7 * 10**9, Ledger(n_params=7 * 10**9, dp=8, tp=8, zero_stage=3)       # 64 GPUs
    model = next(r.bytes for r in eleuther.TRANSFORMER_MATH.estimate(gpus, ConventionInputs(nodes=8)).rows
                 if r.role == "param")
    only_weights = {tm.Model: 2 * n, tm.Optimizer: 0, tm.Gradient: 0, tm.Activation: 0, tm.Live: 0}
    blog = tm.RULES["zero3"].subs(only_weights)
    zero3 = Recheck("eleuther-zero3-model", "EleutherAI cookbook", "lines 286-294",
                    {"cookbook": Figure(model, "bytes"), "blog": Figure(blog.subs(tm.N, gpus.dp * gpus.tp), "bytes"),
                     "ledger": Figure(Ledger(n_params=n, tp=8, dp=8, zero_stage=3).by_role()["param"], "bytes")},
                    "7x10^9 parameters on 64 GPUs (tp = 8, dp = 8), ZeRO-3: the cookbook books {cookbook} of "
                    "weights per GPU; the blog's rule gives {blog}, memledger's ledger {ledger}")
    return [eight, ckpt, pos, zero3]


def _transformer_math() -> list:
    """The blog post's errata (:mod:`memledger.calculators.transformer_math`)."""
    n, gb = 7 * 10**9, lambda b: Figure(in_unit(b, "GB"), "GB", 2)
    by_rule = tm.RULES["gradients_3d"].subs({tm.Gradient: 2 * n, p_pp: 1})
    grads = Recheck("transformer-math-gradients", tm.BLOG, "'3D Parallelism'",
                    {"post": gb(int(by_rule)), "held": gb(Ledger(n_params=n, tp=8).by_role()["grad"])},
                    "7x10^9 parameters, 2-byte gradients, tp = 8, pp = 1: {post} per GPU by the post's rule; a "
                    "tensor-parallel rank holds {held}")
    kept = Ledger("article-7b", recompute="full", scope="layers", dp=8, zero_stage=1).group_total("activations")
    zero_r = Recheck("transformer-math-zero-r", tm.BLOG, "ZeRO-R",
                     {"kept": Figure(kept, "bytes"), "over_dp": Figure(Fraction(kept, 8), "bytes")},
                     "the article's 7B, full recomputation, 8 data-parallel GPUs, tp = 1: each keeps {kept} of "
                     "checkpoints; partitioned over the data-parallel ranks it would be {over_dp}")
    return [grads, zero_r]


def _per_sbd(expr, preset: str) -> Fraction:
    """``expr`` / (S B d) at ``preset``'s spec (B = 1, S = 2048), exactly."""
    value = sp.nsimplify(sp.expand(expr / (S * B * d)).subs(Ledger(preset).bindings))
    return Fraction(int(value.p), int(value.q))


def _megatron() -> list:
    layers = sp.expand(megatron.activations(False).subs(t, 1) / sp.Rational(105, 100)).coeff(L)
    kept = per_layer_bytes(inventory(), "none")
    no_s2 = Recheck("megatron-no-s2", "Megatron-LM", "lines 386-453",
                    {"megatron": Figure(_per_sbd(layers, "article-7b")), "kept": Figure(_per_sbd(kept, "article-7b"))},
                    "at the article's spec a layer keeps {kept} S B d bytes without recomputation; Megatron's "
                    "function books {megatron} (before its 5% margin)")
    mlp = sp.expand(megatron.activations(True).subs(t, 1)).coeff(L)
    swiglu = per_layer_bytes(inventory("swiglu", "LayerNorm", dropout=True), "selective")
    gated = Recheck("megatron-swiglu", "Megatron-LM", "lines 317-319",
                    {"megatron": Figure(_per_sbd(mlp, "llama2-7b"), "", 2),
                     "kept": Figure(_per_sbd(swiglu, "llama2-7b"), "", 2)},
                    "LLaMA-2 7B (F = 11008, d = 4096), sequence parallel + selective at t = 1: Megatron books "
                    "{megatron} S B d per layer, a SwiGLU block with dropout keeps {kept}")
    return [no_s2, gated]


def _zero_paper() -> list:
    values = {d: ZERO_GPT2["d"], L: ZERO_GPT2["L"], S: ZERO_GPT2["S"], B: ZERO_GPT2["B"]}
    total = int(papers.zero_paper_activations().subs(values))
    checkpoints = int((L * per_layer_bytes(inventory(), "full")).subs(values))
    one_layer = Fraction(total, ZERO_GPT2["L"])
    gb = lambda n: Figure(in_unit(n, "GB"), "GB", 2)
    return [Recheck("zero-paper-8gb", "ZeRO paper", "Sec. 3.2",
                    {"total": gb(total), "checkpoints": gb(checkpoints), "layer": gb(one_layer),
                     "with": gb(checkpoints + one_layer)},
                    "its own rule gives {total} without checkpointing; one 2-byte checkpoint per layer is "
                    "{checkpoints}, plus one layer recomputed ({layer}): {with}")]


@cache
def rechecks() -> tuple:
    """One :class:`Recheck` per erratum of :data:`ERRATA`, in the same order."""
    found = _deepspeed() + _accelerate() + _eleuther() + _transformer_math() + _megatron() + _zero_paper()
    order = {id(e): i for i, e in enumerate(ERRATA)}
    return tuple(sorted(found, key=lambda r: order[id(r.erratum)]))


def get_recheck(key: str) -> Recheck:
    """The recheck called ``key``; ``ValueError`` listing the keys otherwise."""
    from ..core.choices import lookup
    return lookup({r.key: r for r in rechecks()}, key, "erratum")


__all__ = ["Figure", "Recheck", "get_recheck", "recheck_table", "rechecks"]


def recheck_table(recheck: Recheck):
    """One source erratum as a two-column table: where, what the source says, what its own code or formula
    gives (as recorded), what memledger recomputes, the arithmetic, and the kind of error."""
    from ..core.table import Table
    e = recheck.erratum
    return Table(("", e.source), [("where", e.where), ("the source says", e.stated), ("its own formula or code", e.computed),
                                  ("memledger recomputes", recheck.shows), ("arithmetic", e.arithmetic),
                                  ("kind", e.kind)])
