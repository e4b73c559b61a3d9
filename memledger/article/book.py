"""What the chapters use to print numbers and equations: glue, and article-vs-ours tables.

A chapter computes every number it prints from the library, in the cell that
glues it (so nbval, which compares glued outputs, guards it)::

    glue_bytes("states.gib", ledger.group_total("model_states"), "GiB", 1)
    glue_value("bf16.spacing", ml.dtypes.bf16_spacing(1), digits=7)

The article's own figures come from the claims registry (:mod:`memledger.article.claims`):
:func:`glue_claims` glues memledger's value of each claim, at the article's
precision unless ``digits`` says otherwise. ``tests/book/test_build.py`` reads the
glued text back and checks it against the article's figure or an independent
recomputation.
"""
import sympy as sp

from .claims import CLAIMS
from ..core.table import Table
from ..core.units import format_bytes, format_quantity

__all__ = ["CLAIM_BY_ID", "HEADER", "Equation", "audit", "claim_text", "compare", "errata", "glue_bytes", "glue_claims",
           "glue_equation", "glue_text", "glue_value", "negatives_last", "sections"]

CLAIM_BY_ID = {c.id: c for c in CLAIMS}


def _glue(key, value):
    from myst_nb import glue
    glue(key, value, display=False)


def claim_text(claim_id: str, digits=None) -> str:
    """memledger's value of a claim in the claim's unit, at the article's precision (or ``digits``)."""
    claim = CLAIM_BY_ID[claim_id]
    return format_quantity(claim.computed, claim.unit, claim.digits if digits is None else digits)


def glue_claims(*ids: str, digits=None) -> None:
    """Glue memledger's value of each claim under its id, for ``{glue:text}`id```."""
    unknown = [i for i in ids if i not in CLAIM_BY_ID]
    if unknown:
        raise ValueError(f"not claims of the article: {', '.join(unknown)}")
    for claim_id in ids:
        _glue(claim_id, claim_text(claim_id, digits))


def glue_value(key: str, value, unit: str = "", digits: int = 0) -> None:
    """Glue a number already in ``unit`` (``"%"``, ``"x"``, ``"s"``, ``"B/param"`` ...) as text."""
    _glue(key, format_quantity(value, unit, digits))


def glue_text(key: str, text: str) -> None:
    """Glue a phrase the library decides (e.g. the measure ``memledger.fit`` judges by), for ``{glue:text}``."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"glue_text needs a non-empty string for {key!r}, got {text!r}")
    _glue(key, text)


def glue_bytes(key: str, nbytes, unit: str = "GB", digits: int = 2) -> None:
    """Glue a byte count in ``unit`` (GB = 10^9 B, GiB = 2^30 B) as text, e.g. ``"30.60 GB"``."""
    _glue(key, format_bytes(nbytes, unit, digits))


class Equation:
    """A derived equation for ``{glue:math}``: LaTeX for the page, the right side as plain SymPy text."""

    def __init__(self, lhs: str, rhs: sp.Expr):
        self.lhs, self.rhs = sp.Symbol(lhs), rhs

    def _repr_latex_(self):
        return "$\\displaystyle " + sp.latex(sp.Eq(self.lhs, self.rhs, evaluate=False), order="none") + "$"

    def __repr__(self):
        return sp.sstr(self.rhs, order="none")


def negatives_last(expr: sp.Expr) -> sp.Expr:
    """``expr`` with the negative numbers of every sum written last, ``p - 1`` rather than ``-1 + p``,
    for display with ``order="none"``; the value is unchanged."""
    if not isinstance(expr, sp.Basic) or expr.is_Atom:
        return expr
    args = [negatives_last(a) for a in expr.args]
    if expr.is_Add:
        return sp.Add(*sorted(args, key=lambda a: bool(a.is_Number and a.is_negative)), evaluate=False)
    try:
        return expr.func(*args, evaluate=False)
    except TypeError:
        return expr.func(*args)


def glue_equation(key: str, lhs: str, rhs: sp.Expr) -> None:
    """Glue ``lhs = rhs`` (``rhs`` as the library derived it) for ``{glue:math}`key``` with a label."""
    _glue(key, Equation(lhs, rhs))


HEADER = ("quantity", "article", "memledger", "status")


def _row(c):
    ours = c.computed
    shown = 0 if ours.denominator == 1 else c.digits + 2
    prefix = {"=": "", "~": "about ", ">": "more than ", "<": "less than "}[c.relation]
    return (c.text, prefix + format_quantity(c.value, c.unit, c.digits), format_quantity(ours, c.unit, shown),
            c.classify())


def compare(*ids: str) -> Table:
    """The article's figure beside memledger's for a few claims, with the status each earns."""
    return Table(HEADER, [_row(CLAIM_BY_ID[i]) for i in ids])


def audit(section: str) -> Table:
    """Every claim of one article section with its id, figures, status and note (the audit appendix)."""
    return Table(("id",) + HEADER + ("note",),
                 [(c.id,) + _row(c) + (c.note,) for c in CLAIMS if c.section == section])


def sections() -> list:
    """The article's sections, in the order the claims registry lists them."""
    return list(dict.fromkeys(c.section for c in CLAIMS))


def errata() -> Table:
    """The article's errata: every claim whose recomputation earns "erratum", with the arithmetic of its note."""
    return Table(("id", "section", "the article says", "memledger computes", "arithmetic"),
                 [(c.id, c.section) + _row(c)[1:3] + (c.note,) for c in CLAIMS if c.classify() == "erratum"])
