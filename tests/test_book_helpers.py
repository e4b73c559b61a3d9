import pytest

from memledger.book import article_text, audit, compare, glue_key, sections, split_key, text
from memledger.claims import CLAIMS


def test_glue_keys_round_trip():
    assert split_key(glue_key("act.total", 3)) == ("act.total", 3)
    assert split_key(glue_key("act.total")) == ("act.total", None)


def test_text_uses_the_articles_precision():
    assert text("act.total") == article_text("act.total") == "30.6 GB"
    assert text("act.total", 3) == f"{32 * 2048 * 4096 * 114 / 1e9:.3f} GB"     # the article's L x BSd x 114
    assert text("offload.traffic") == "28 GB"


def test_unknown_names_are_refused():
    with pytest.raises(ValueError, match="neither a claim"):
        text("act.totall")


def test_compare_and_audit_tables():
    assert "erratum" in repr(compare(section="Offloading"))
    assert len(sum((audit(s).rows for s in sections()), [])) == len(CLAIMS)
