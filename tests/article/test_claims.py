"""The article audit: every claim recomputed by the library earns the status it declares."""
from fractions import Fraction
from pathlib import Path

import pytest

from memledger.article.claim import component
from memledger.article.claims import CLAIMS, STATUSES, claims_table

ARTICLE = Path(__file__).resolve().parents[2].parent / "shared" / "source" / "000_63ddbfd834b3ec48.txt"


@pytest.mark.slow
@pytest.mark.parametrize("claim", CLAIMS, ids=[c.id for c in CLAIMS])
def test_claim_earns_its_status(claim):
    assert claim.status in STATUSES
    assert claim.classify() == claim.status, (claim.stated, float(claim.computed), claim.note)


def test_registry_is_complete_and_unique():
    assert len(CLAIMS) >= 60
    assert len({c.id for c in CLAIMS}) == len(CLAIMS)
    sections = {c.section for c in CLAIMS}
    assert {"The 7B spec", "Model states", "Activation inventory", "Batch size and sequence length",
            "The full ledger", "Activation checkpointing", "Offloading"} <= sections


def test_no_claim_unexplained():
    for c in CLAIMS:
        if c.status in ("erratum", "approximate"):
            assert any(ch.isdigit() for ch in c.note), f"{c.id}: a note with the arithmetic is needed"
    assert sum(c.status == "erratum" for c in CLAIMS) >= 2


@pytest.mark.skipif(not ARTICLE.exists(), reason="needs a local copy of the article (../shared/source)")
def test_stated_values_are_quoted_from_the_article():
    text = ARTICLE.read_text(encoding="utf-8")
    missing = [(c.id, c.stated) for c in CLAIMS if c.stated not in text]
    assert missing == []


def test_article_figures_we_know():
    by_id = {c.id: c for c in CLAIMS}
    assert by_id["states.total"].computed == 112
    assert round(float(by_id["act.total"].computed), 1) == 30.6
    assert round(float(by_id["table.both.total"].computed)) == 417
    assert by_id["formula.34"].computed == 34 and by_id["formula.5"].computed == 5


def test_one_overhead_convention_and_the_offloading_erratum():
    by_id = {c.id: c for c in CLAIMS}
    activations = 32 * 2048 * 4096 * 114                       # the article's L x BSd x (34 + 5HS/d)
    # 112 + 30.6 + 2: the 2 GB upper end of the article's 1-2 GB, as in its own 114.5 GB sum
    assert by_id["ledger.total"].computed == Fraction(112 * 10**9 + activations + 2 * 10**9, 10**9)
    # offloading alone: 14 + 14 + 30.6 + 2 GB, under 80 GB, so "both are needed" is an erratum
    assert by_id["together.needed"].computed == Fraction(28 * 10**9 + activations + 2 * 10**9, 10**9)
    assert by_id["together.needed"].classify() == "erratum" and "60.6" in by_id["together.needed"].note


def test_components_are_found_by_name():
    assert component("FP32 master weights").bytes_per_param == 4
    with pytest.raises(ValueError, match="Adam third moment"):
        component("Adam third moment")


@pytest.mark.slow
def test_table_lists_every_claim():
    table = claims_table()
    assert all(c.id in table for c in CLAIMS)
