"""One numeric statement of the source article, and the status its recomputation earns.

A :class:`Claim` holds the value and unit as the article prints them, how it
compares (``=``, ``>``, ``<``, ``~``), a function that recomputes it with
memledger, and the status it is expected to earn (checked by
``tests/article/test_claims.py``):

* ``matches``: the computed value equals the stated one (or satisfies ``>``/``<``);
* ``rounded``: equal after the article's rounding to the printed digits
  (half-up, or truncation, which the note then says);
* ``approximate``: the article says "about"/"close to" and the value is within
  the tolerance the claim declares;
* ``erratum``: none of the above; the note gives the arithmetic.

Claims are recomputed in the article's setting: the ``article-7b`` preset
with the ``bf16-adamw`` recipe, B = 1, S = 2048 (:func:`article_ledger`,
:func:`at_spec`). The registry of all claims, section by section, is
:mod:`memledger.article.claims`.
"""
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import lru_cache
import math

import sympy as sp

from ..core.choices import lookup
from ..ledger.ledger import Ledger
from ..states.recipe import Component
from ..states.recipes import get_recipe
from ..core.units import ARTICLE_TOTAL_UNIT, in_unit

__all__ = ["ARTICLE", "RECIPE", "RELATIONS", "STATUSES", "Claim", "article_ledger", "at_spec", "component", "gb",
           "ratio_at_spec"]

STATUSES = ("matches", "rounded", "approximate", "erratum")
RELATIONS = ("=", ">", "<", "~")
ARTICLE = "article-7b"
RECIPE = get_recipe("bf16-adamw")


@lru_cache(maxsize=None)
def article_ledger(**kw) -> Ledger:
    """The article's ledger (``article-7b``, B = 1, S = 2048, the blocks only as the article books them:
    ``scope="layers"``), with any setting changed by ``kw``."""
    return Ledger(ARTICLE, **{"scope": "layers", **kw})


def at_spec(expr, **kw) -> int:
    """``expr`` evaluated exactly at the article's spec (or at the setting ``kw`` changes)."""
    return article_ledger(**kw).evaluate(expr)


def ratio_at_spec(expr) -> Fraction:
    """A ratio of two polynomials in the spec's symbols, evaluated exactly at the spec."""
    return Fraction(at_spec(sp.numer(expr)), at_spec(sp.denom(expr)))


def gb(nbytes) -> Fraction:
    """Bytes in the article's unit for totals (decimal GB)."""
    return in_unit(nbytes, ARTICLE_TOTAL_UNIT)


def component(name: str) -> Component:
    """The article recipe's component called ``name``; ``ValueError`` listing the names otherwise."""
    return lookup({c.name: c for c in RECIPE.components}, name, f"component of {RECIPE.name}")


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
        """The article's figure, exactly as printed."""
        return Fraction(Decimal(self.stated))

    @property
    def digits(self) -> int:
        """Decimals the article printed: 2 for "0.96", 0 for "112"."""
        return max(0, -Decimal(self.stated).as_tuple().exponent)

    @property
    def computed(self) -> Fraction:
        """memledger's value, exactly."""
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
        scaled = got * 10**self.digits
        if want * 10**self.digits in (math.floor(scaled + Fraction(1, 2)), math.trunc(scaled)):
            return "rounded"
        if self.relation == "~" and abs(got - want) <= self.tolerance * want:
            return "approximate"
        return "erratum"

    def to_dict(self) -> dict:
        return {"id": self.id, "section": self.section, "text": self.text, "stated": self.stated,
                "unit": self.unit, "relation": self.relation, "computed": float(self.computed),
                "computed_exact": str(self.computed), "status": self.classify(), "note": self.note}
