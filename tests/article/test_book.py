import json

import pytest
import sympy as sp
from IPython.core.formatters import DisplayFormatter

from memledger.article.book import Equation, audit, claim_text, compare, glue_claims, negatives_last, sections
from memledger.article.claims import CLAIMS
from memledger.core.symbols import B, S, d


def test_claims_print_at_the_articles_precision():
    assert claim_text("act.total") == "30.6 GB"          # the article: 30.6 GB
    assert claim_text("act.layer") == "0.96 GB"          # the article: 0.96 GB
    assert claim_text("act.at_least", 1) == "142.6 GB"   # 112 + 30.6, the article's "at least 142"


def test_unknown_claims_are_refused():
    with pytest.raises(ValueError, match="act.totall"):
        glue_claims("act.total", "act.totall")


def test_an_equation_shows_latex_and_gives_back_its_expression():
    rhs = sp.Mul(B * S * d, 34 + 5 * sp.Symbol("H", positive=True, integer=True) * S / d, evaluate=False)
    data, _ = DisplayFormatter().format(Equation(r"M_\text{act/layer}", rhs))
    assert data["text/latex"].startswith("$\\displaystyle M_\\text{act/layer} = ")
    names = {n: symbol for n, symbol in zip("BSdH", (B, S, d, sp.Symbol("H", positive=True, integer=True)))}
    assert sp.expand(sp.sympify(data["text/plain"], locals=names) - sp.sympify("B*S*d*(34 + 5*H*S/d)", locals=names)) == 0
    json.dumps(data)


@pytest.mark.slow
def test_compare_and_audit_tables():
    assert [row[-1] for row in compare("act.total", "offload.moved").rows] == ["rounded", "erratum"]
    assert sum(len(audit(s).rows) for s in sections()) == len(CLAIMS)


@pytest.mark.slow
def test_negatives_last_reorders_for_display_only():
    p, m, v = sp.symbols("p m v", positive=True, integer=True)
    bubble = (p - 1) / (m * v)
    shown = negatives_last(bubble)
    assert Equation("b", shown)._repr_latex_().endswith("\\frac{p - 1}{m v}$")
    assert sp.simplify(shown - bubble) == 0
    assert Equation("a", negatives_last(34 + 5 * p))._repr_latex_().endswith("= 34 + 5 p$")


@pytest.mark.slow
def test_errata_lists_the_claims_that_earn_erratum_with_their_arithmetic():
    from memledger.article.book import errata
    table = errata()
    assert [r[0] for r in table.rows] == [c.id for c in CLAIMS if c.status == "erratum"]
    moved = next(r for r in table.rows if r[0] == "offload.moved")
    assert moved[2] == "84 GB" and moved[3] == "28 GB" and "0.875 s" in moved[4]   # 14 GB down + 14 GB up
