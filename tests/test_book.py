"""The book as CI sees it: a clean strict build, its glued numbers, the audit page, offline assets.

The build runs once per session (about half a minute): ``jupyter-book build . -W -n --keep-going``
on an empty ``_build``, with every chapter executed (``execute_notebooks: force``).
"""
from html.parser import HTMLParser
import json
from pathlib import Path
import re
import shutil
import subprocess
import sys

import pytest

from memledger.book import CLAIM_BY_ID, EQUATIONS, article_text, equation_latex, split_key, text
from memledger.claims import CLAIMS
from memledger.facts import FACTS

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))
UNITS = r"(?:GB|GiB|MB|MiB|TB|TiB|bytes|B/param|GB/s)"
#: a digit-led quantity with a unit, outside glue roles, math and “article quotations”
TYPED_QUANTITY = re.compile(r"(?<![\w{`.$])\d[\d,.]*\s?" + UNITS + r"\b")


def markdown_cells(path):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]


def strip_allowed(text):
    text = re.sub(r"\{glue:?\w*\}`[^`]*`", "", text)               # glued values
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", "", text, flags=re.S)  # math
    text = re.sub(r"“[^”]*”", "", text)                             # quotations of the article
    text = re.sub(r"```.*?```", "", text, flags=re.S)               # code blocks
    return re.sub(r"`[^`]*`", "", text)                             # inline code


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_hand_typed_quantities_in_prose(path):
    typed = [hit for cell in markdown_cells(path) for hit in TYPED_QUANTITY.findall(strip_allowed(cell))]
    assert typed == [], "glue these from memledger, or quote the article in “…”"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_outputs_are_committed(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert cells and all(c["execution_count"] is not None for c in cells), "run scripts/execute_notebooks.py"


@pytest.mark.parametrize("path", [p for p in CHAPTERS if p.stem[0].isdigit()], ids=lambda p: p.stem)
def test_chapter_shape(path):
    prose = "\n".join(markdown_cells(path))
    for part in ("What you'll learn", "## Takeaways", "## Exercises"):
        assert part in prose
    assert "```{code-cell}" not in prose
    source = path.read_text()
    assert '"name": "fig-' in source, "each chapter has at least one named figure"
    assert "import memledger as ml" in source


@pytest.fixture(scope="session")
def build():
    """A clean strict build; returns the _build folder."""
    out = ROOT / "_build"
    shutil.rmtree(out, ignore_errors=True)
    done = subprocess.run([str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT),
                           "-W", "-n", "--keep-going"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def glue_outputs(build):
    outputs = {}
    for path in (build / "jupyter_execute").rglob("*.glue.json"):
        for key, output in json.loads(path.read_text()).items():
            outputs[(path.stem, key)] = output["data"]
    return outputs


def glued(build):
    """Glued numbers (text) by (chapter, key); equations are checked separately."""
    return {k: data["text/plain"] for k, data in glue_outputs(build).items() if k[1] not in EQUATIONS}


def test_glued_equations_are_the_derived_ones(build):
    equations = {k: data for k, data in glue_outputs(build).items() if k[1] in EQUATIONS}
    assert {key for _, key in equations} == set(EQUATIONS)
    for (chapter, key), data in equations.items():
        assert equation_latex(key) in data["text/latex"], chapter


def test_build_publishes_every_chapter(build):
    for path in CHAPTERS:
        assert (build / "html" / "book" / f"{path.stem}.html").exists()
    assert (build / "html" / "index.html").exists()


def test_every_glued_number_is_the_library_value(build):
    values = glued(build)
    assert len(values) > 100
    for (chapter, key), shown in values.items():
        name, digits = split_key(key)
        assert name in CLAIM_BY_ID or name in FACTS, f"{chapter}: {key} is not a claim or a fact"
        assert shown.strip("'\"") == text(name, digits), f"{chapter}: {key}"


def test_glued_article_figures_agree_with_the_article(build):
    checked = 0
    for (chapter, key) in glued(build):
        name, digits = split_key(key)
        if name not in CLAIM_BY_ID:
            continue
        claim = CLAIM_BY_ID[name]
        assert claim.classify() == claim.status, f"{chapter}: {name}"
        if digits is None and claim.status in ("matches", "rounded") and claim.relation == "=":
            # printed at the article's precision, our number reads as the article's (truncations are flagged)
            assert text(name) == article_text(name) or "truncat" in claim.note, f"{chapter}: {name}"
            checked += 1
    assert checked > 30


def test_audit_lists_every_claim(build):
    page = (build / "html" / "book" / "audit.html").read_text()
    missing = [c.id for c in CLAIMS if c.id not in page]
    assert missing == []


class _Assets(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.urls.append(attrs["src"])
        if tag == "link" and attrs.get("rel") in ("stylesheet", "preload", "modulepreload") and attrs.get("href"):
            self.urls.append(attrs["href"])


def test_site_loads_nothing_from_the_network(build):
    for page in (build / "html").rglob("*.html"):
        parser = _Assets()
        parser.feed(page.read_text())
        remote = [u for u in parser.urls if re.match(r"^(https?:)?//", u)]
        assert remote == [], page.name
    for asset in ("vendor/require.js", "vendor/html-manager/embed-amd.js", "vendor/mathjax/tex-mml-chtml.js"):
        assert (build / "html" / asset).exists()


def test_math_and_widgets_use_the_vendored_copies(build):
    page = (build / "html" / "book" / "09_together.html").read_text()
    assert 'src="../_static/../vendor/require.js' in page
    assert 'src="../_static/../vendor/html-manager/embed-amd.js' in page
    assert "application/vnd.jupyter.widget-state+json" in page      # the explorer's state is embedded
    assert "needs a running" in page or "running Jupyter kernel" in page
    assert "../vendor/mathjax/tex-mml-chtml.js" in (build / "html" / "book" / "04_activations.html").read_text()


def test_static_calculator_is_in_the_page(build):
    page = (build / "html" / "book" / "09_together.html").read_text()
    assert 'id="memledger-calculator"' in page and "function memledgerLedger" in page
