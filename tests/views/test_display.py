from memledger.core.table import Table
from memledger.views.display import html_verdict, inventory_table, recipe_table
from memledger.activations.inventory import inventory
from memledger.ledger.ledger import Ledger
from memledger.states.recipes import get_recipe
from memledger.core.units import GB


def test_text_table_shows_rows_and_totals():
    ledger = Ledger("article-7b", recompute="full", offload_optimizer="cpu")
    text = ledger.table().text()
    assert "FP32 master weights" in text and "total on GPU" in text and "total on CPU" in text
    assert "28,000,000,000" in text and "84.00 GB" in text


def test_units_label_every_number():
    text = Ledger("gpt2").table("GiB").text()
    assert "GiB" in text and " GB" not in text


def test_markdown_and_html():
    ledger = Ledger("gpt2")
    assert ledger.table().markdown().startswith("| component |")
    assert ledger._repr_markdown_() == ledger.table().markdown()
    assert "| **total on GPU** |" in ledger.table().markdown()
    assert ledger.table().html().startswith('<table class="memledger">') and "<th" in ledger._repr_html_()


def test_verdict():
    gpt2 = Ledger("gpt2")
    used = gpt2.totals["gpu"]
    assert '<b style="color:green">fits, ' in html_verdict(gpt2, 80 * GB)
    tight = html_verdict(gpt2, used + 10**9 - 1)          # under a gigabyte to spare: no fit (issue 17)
    assert '<b style="color:crimson">no fit: 1.00 GB to spare, under the 1.00 GB margin</b>; ' in tight
    assert '<b style="color:green">fits, 1.00 GB to spare</b>; ' in html_verdict(gpt2, used + 10**9)
    assert '<b style="color:crimson">does not fit: 0.00 GB over</b>; ' in html_verdict(gpt2, used - 1)
    assert "does not fit" in html_verdict(Ledger("article-7b"), 80 * GB)


def test_verdict_says_what_it_judged():
    """By default the sum (as the static calculator, which cannot run the timeline); with ``peak`` the step's
    peak where modelled, marked on the bar, else the sum with the reason."""
    from memledger.answers.verdict import MEASURE, SUM_NOTE, UNMODELLED_NOTE
    from memledger.core.units import format_bytes
    llama = Ledger("llama2-7b", recompute="full", offload_optimizer="cpu")
    by_sum = html_verdict(llama, 80 * GB)
    assert f"{format_bytes(llama.totals['gpu'])} per GPU against 80.00 GB, {MEASURE['total']} ({SUM_NOTE})" in by_sum
    by_peak = html_verdict(llama, 80 * GB, peak=True)
    assert f"{format_bytes(llama.peak)} per GPU against 80.00 GB, {MEASURE['peak']}" in by_peak
    assert "solid black" in by_peak and "solid black" not in by_sum
    moe = html_verdict(Ledger("mixtral-8x7b"), 80 * GB, peak=True)        # experts: not modelled op by op
    assert f"{MEASURE['total']} ({UNMODELLED_NOTE})" in moe
    gqa = html_verdict(Ledger("llama3-8b"), 80 * GB, peak=True)           # grouped-query attention: modelled
    assert f"{format_bytes(Ledger('llama3-8b').peak)} per GPU against 80.00 GB, {MEASURE['peak']}" in gqa
    nominal = Ledger("article-7b")                          # 7x10^9 booked, the spec's tensors in the step
    assert nominal.totals["gpu"] > nominal.peak
    assert f"{format_bytes(nominal.totals['gpu'])} per GPU" in html_verdict(nominal, 80 * GB, peak=True)


def test_table_repr_and_html_escape():
    t = Table(("a", "b"), [("x<y", 1)])
    assert repr(t).splitlines()[1].startswith("x<y")
    assert "x&lt;y" in t._repr_html_()


def test_inventory_and_recipe_tables():
    values = Ledger("article-7b").values
    text = repr(inventory_table(inventory(), values))
    assert "256 MiB" in text and "2·B·H·S^2" in text


def test_inventory_table_decimals_follow_the_unit():
    # 16 MiB is a whole number of MiB but not of GiB: it must not print as "0 GiB"
    text = repr(inventory_table(inventory(), Ledger("article-7b").values, "GiB"))
    assert " 0 GiB" not in text and "0.02 GiB" in text
    assert "14 GB" in repr(recipe_table(get_recipe("bf16-adamw"), 7 * 10**9))
