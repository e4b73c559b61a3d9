from memledger.display import Table, html_table, html_verdict, inventory_table, markdown_table, recipe_table, text_table
from memledger.activations import inventory
from memledger.ledger import Ledger
from memledger.recipes import get_recipe
from memledger.units import GB


def test_text_table_shows_rows_and_totals():
    ledger = Ledger("article-7b", recompute="full", offload_optimizer="cpu")
    text = text_table(ledger)
    assert "FP32 master weights" in text and "total on GPU" in text and "total on CPU" in text
    assert "28,000,000,000" in text and "84.00 GB" in text


def test_units_label_every_number():
    text = text_table(Ledger("gpt2"), "GiB")
    assert "GiB" in text and " GB" not in text


def test_markdown_and_html():
    ledger = Ledger("gpt2")
    assert markdown_table(ledger).startswith("| component |")
    assert ledger._repr_markdown_() == markdown_table(ledger)
    assert html_table(ledger).startswith('<table class="memledger">') and "<th>" in ledger._repr_html_()


def test_verdict():
    fits = html_verdict(Ledger("gpt2"), 80 * GB)
    assert ">fits<" in fits
    assert "does not fit" in html_verdict(Ledger("article-7b"), 80 * GB)


def test_table_repr_and_html_escape():
    t = Table(("a", "b"), [("x<y", 1)])
    assert repr(t).splitlines()[1].startswith("x<y")
    assert "x&lt;y" in t._repr_html_()


def test_inventory_and_recipe_tables():
    values = Ledger("article-7b").values()
    text = repr(inventory_table(inventory(), values))
    assert "256 MiB" in text and "2·B·H·S^2" in text
    assert "14 GB" in repr(recipe_table(get_recipe("bf16-adamw"), 7 * 10**9))
