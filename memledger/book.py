"""What the chapters use to publish library numbers: glue, and article-vs-ours tables.

Every number a chapter prints in prose is glued by :func:`publish` from an
article claim (:mod:`memledger.claims`) or a fact (:mod:`memledger.facts`),
under its id (``"act.total"``) or, with other digits, ``"act.total@3"``.
``tests/test_book.py`` reads the build's glue files back and recomputes each.
"""
from decimal import Decimal

import sympy as sp

from .claims import CLAIMS
from .display import Table
from .facts import FACTS
from .units import format_quantity

CLAIM_BY_ID = {c.id: c for c in CLAIMS}


def stated_digits(claim) -> int:
    """Decimals the article printed: 2 for "0.96", 0 for "112"."""
    return max(0, -Decimal(claim.stated).as_tuple().exponent)


def glue_key(name: str, digits=None) -> str:
    return name if digits is None else f"{name}@{digits}"


def split_key(key: str):
    """Inverse of :func:`glue_key`: ("act.total", 3) from "act.total@3"."""
    name, _, digits = key.partition("@")
    return name, (int(digits) if digits else None)


def text(name: str, digits=None) -> str:
    """The library's value of a claim or fact, formatted in its unit."""
    if name in CLAIM_BY_ID:
        claim = CLAIM_BY_ID[name]
        return format_quantity(claim.computed, claim.unit, stated_digits(claim) if digits is None else digits)
    if name in FACTS:
        fact = FACTS[name]
        return format_quantity(fact.value, fact.unit, fact.digits if digits is None else digits)
    raise ValueError(f"{name!r} is neither a claim of the article nor a registered fact")


def article_text(name: str) -> str:
    """The article's own figure for a claim, as it prints it."""
    claim = CLAIM_BY_ID[name]
    return format_quantity(claim.value, claim.unit, stated_digits(claim))


def publish(*names: str, digits=None) -> None:
    """Glue each claim or fact as text (``{glue:text}`name```), without displaying it."""
    from myst_nb import glue
    for name in names:
        glue(glue_key(name, digits), text(name, digits), display=False)


HEADER = ("quantity", "article", "memledger", "status")


def _row(c):
    ours = c.computed
    shown = 0 if ours.denominator == 1 else stated_digits(c) + 2
    prefix = {"=": "", "~": "about ", ">": "more than ", "<": "less than "}[c.relation]
    return (c.text, prefix + article_text(c.id), format_quantity(ours, c.unit, shown), c.classify())


def compare(*ids: str, section: str = None) -> Table:
    """The claims with these ids, or all claims of one article ``section``."""
    claims = [c for c in CLAIMS if c.section == section] if section else [CLAIM_BY_ID[i] for i in ids]
    return Table(HEADER, [_row(c) for c in claims])


def audit(section: str) -> Table:
    """Every claim of one article section with its id, figures, status and note (the audit appendix)."""
    return Table(("id",) + HEADER + ("note",),
                 [(c.id,) + _row(c) + (c.note,) for c in CLAIMS if c.section == section])


def sections() -> list:
    """The article's sections, in the order the claims registry lists them."""
    return list(dict.fromkeys(c.section for c in CLAIMS))


def _activation_equation():
    """Eq. 1 of Korthikanti et al., *derived*: the inventory's sum with F = 4d, written per B*S*d."""
    from .activations import inventory, per_layer_bytes
    from .symbols import B, F, S, d
    per_layer = per_layer_bytes(inventory()).subs(F, 4 * d)
    return sp.Eq(sp.Symbol(r"M_\text{act/layer}"), sp.Mul(B * S * d, sp.expand(per_layer / (B * S * d)),
                                                               evaluate=False), evaluate=False)


def _states_equation():
    """Model states of the article's recipe: the sum of its components, per parameter, times P."""
    from .recipes import get_recipe
    from .symbols import P
    recipe = get_recipe("bf16-adamw")
    return sp.Eq(sp.Symbol(r"M_\text{states}"), sp.Mul(recipe.bytes_per_param_sum(), P, evaluate=False),
                 evaluate=False)


def _checkpoint_equation():
    """Full checkpointing: one BF16 layer input per layer."""
    from .activations import activation_bytes, inventory
    return sp.Eq(sp.Symbol(r"M_\text{act, ckpt}"), activation_bytes(inventory(), "full"), evaluate=False)


#: Display equations the chapters show, each built from the library's derivation.
EQUATIONS = {"eq.activations": _activation_equation, "eq.states": _states_equation,
             "eq.checkpoint": _checkpoint_equation}


def equation_latex(name: str) -> str:
    return sp.latex(EQUATIONS[name](), order="none")


def publish_equation(name: str) -> None:
    """Glue a derived equation as math, for ``{glue:math}`` with a ``:label:``."""
    from IPython.display import Math
    from myst_nb import glue
    glue(name, Math(equation_latex(name)), display=False)
