"""The built site in a real browser: every page loads cleanly, its prose holds no raw markup, and the
static calculator shows what the Python ledger computes, judges the step's peak as `memledger ledger --json`
does (its own `data-cli` command, run here), and refuses what the CLI refuses.

Needs Chromium at /usr/bin/chromium (Debian: ``apt-get install -y chromium``; ``.ci/run`` installs
it) and the ``playwright`` package (requirements.txt). Playwright's own browser download
(``playwright install``) is not used. The site is the clean strict build of conftest.py's
``build``, served from 127.0.0.1; any request to another host is blocked and fails the test.
"""
from contextlib import redirect_stderr, redirect_stdout
import functools
import http.server
import io
import json
from pathlib import Path
import random
import re
import shlex
import threading
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

from memledger.cli.main import main as cli
from memledger.views.controls import BY_FIELD, CONTROLS, cli_command, defaults, ledger_settings, option_text
from memledger.views.display import html_verdict
from memledger.ledger.hardware import GPU_MEMORY
from memledger.ledger.ledger import Ledger
from memledger.core.units import LIMIT

pytestmark = pytest.mark.slow

CALCULATOR_PAGE = "book/09_together.html"
#: Text that must never reach a reader: unrendered glue, math delimiters, Markdown table rules.
RAW = re.compile(r"\{glue|\$|\\\(|\\\[|\|")


@pytest.fixture(scope="module")
def site(build):
    """The built HTML, served on 127.0.0.1; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=str(build / "html"))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Watched:
    """A page whose console errors, page errors, failed requests and foreign requests are recorded."""

    def __init__(self, browser, base):
        self.base, self.problems = base, []
        self.context = browser.new_context()
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and self.problems.append(f"console: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"page error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(f"failed: {r.url} {r.failure}"))
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))

    def _route(self, route):
        url = route.request.url
        if urlsplit(url).netloc == urlsplit(self.base).netloc or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            self.problems.append(f"request to another host: {url}")
            route.abort()

    def open(self, path):
        self.page.goto(self.base + path, wait_until="networkidle")
        self.page.evaluate("() => window.MathJax && MathJax.startup && MathJax.startup.promise "
                           "? MathJax.startup.promise.then(() => true) : true")
        if self.page.locator('script[type="application/vnd.jupyter.widget-state+json"]').count():
            self.page.wait_for_selector(".widget-dropdown", timeout=15000)    # the widgets did render
        self.page.wait_for_timeout(300)                                       # late asynchronous errors
        return self.page

    def close(self):
        self.context.close()


def pages(build):
    html = build / "html"
    return sorted(str(p.relative_to(html)) for p in html.rglob("*.html")
                  if p.relative_to(html).parts[0] not in ("_static", "vendor", "_sources"))


_PROSE = """() => {
  const article = (document.querySelector("article.bd-article") || document.body).cloneNode(true);
  article.querySelectorAll("pre, code, script, style, mjx-container, math, .MathJax, input, select, textarea")
    .forEach(e => e.remove());
  return article.textContent;
}"""

_LAYOUT = """() => ({
  pageWidth: document.documentElement.scrollWidth, viewport: window.innerWidth,
  overflowing: [...document.querySelectorAll("article pre")].filter(p => p.scrollWidth > p.clientWidth + 1)
    .map(p => p.textContent.slice(0, 60)),
  notes: [...document.querySelectorAll("article table")].flatMap(t => {
    const head = [...t.querySelectorAll("thead th")].map(th => th.textContent.trim()), i = head.indexOf("note");
    if (i < 0) return [];
    const cells = [...t.querySelectorAll("tbody tr")].map(tr => tr.cells[i]);
    const width = Math.round(t.querySelectorAll("thead th")[i].getBoundingClientRect().width);
    return cells.some(c => c && c.textContent.trim()) ? [width] : [];
  }),
  favicon: !!document.querySelector('link[rel="icon"]'),
})"""


def test_every_page_loads_cleanly(build, site, browser):
    found = {}
    for path in pages(build):
        watched = Watched(browser, site)
        page = watched.open(path)
        raw = sorted({m.group() for m in RAW.finditer(page.evaluate(_PROSE))})
        layout = page.evaluate(_LAYOUT)
        problems = watched.problems + [f"raw text in prose: {raw}"] * bool(raw)
        if layout["pageWidth"] > layout["viewport"]:
            problems.append(f"page is {layout['pageWidth']} px wide in a {layout['viewport']} px window")
        problems += [f"code runs off to the right: {text!r}" for text in layout["overflowing"]]
        problems += [f"note column only {w} px wide" for w in layout["notes"] if w < 150]
        if not layout["favicon"]:
            problems.append("no favicon link")
        watched.close()
        if problems:
            found[path] = problems
    assert len(pages(build)) > 12
    assert found == {}


def test_theme_fragments_are_not_published(build):
    assert sorted(p.name for p in (build / "html" / "_static").glob("*macros.html")) == []


def test_calculator_script_only_on_the_calculator_page(build):
    with_script = [p for p in pages(build) if "memledger-calculator.js" in (build / "html" / p).read_text()]
    assert with_script == [CALCULATOR_PAGE]


# --- the static calculator --------------------------------------------------------------------


class _Cells(HTMLParser):
    """Text of every table cell, row by row, and of every paragraph."""

    def __init__(self, html):
        super().__init__()
        self.rows, self.paragraphs, self._text = [], [], None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th", "p"):
            self._text = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._text is not None:
            self.rows[-1].append(self._text)
        elif tag == "p" and self._text is not None:
            self.paragraphs.append(self._text)
        if tag in ("td", "th", "p"):
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text += data


def python_view(values):
    """What the library's own HTML view of this setup shows (the explorer's, judging the step's peak where
    modelled): verdict line and table cells."""
    ledger = Ledger(**ledger_settings(values))
    verdict = _Cells(html_verdict(ledger, GPU_MEMORY[values["gpu"]], peak=True)).paragraphs[0]
    return verdict, _Cells(ledger.table().html()).rows


_SHOWN = """root => ({
  verdict: [...root.querySelectorAll(".memledger-calculator-verdict")].map(p => p.textContent),
  judged: [...root.querySelectorAll("[data-judged-bytes]")].map(p => [p.dataset.judgedBytes, p.dataset.measure]),
  cli: [...root.querySelectorAll("[data-cli]")].map(e => [e.dataset.cli, e.textContent]),
  timeline: root.querySelectorAll("svg.memledger-calculator-timeline polyline").length,
  rows: [...root.querySelectorAll(".memledger-calculator-out tr")].map(tr => [...tr.cells].map(c => c.textContent)),
  errors: [...root.querySelectorAll(".memledger-calculator-error")].map(p => p.textContent),
  invalid: [...root.querySelectorAll('[aria-invalid="true"]')].map(e => e.name),
  text: root.querySelector(".memledger-calculator-out").textContent,
})"""


def fill(calculator, field, value):
    control = BY_FIELD[field]
    target = calculator.locator(f'[name="{field}"]')
    if control.is_count:
        target.fill(value if isinstance(value, str) else str(value))
    else:
        target.select_option(option_text(value))


def shown(calculator):
    return calculator.evaluate(_SHOWN)


#: Long enough for the first structure the site does not carry: Pyodide and SymPy load, then memledger builds it.
JUDGED_TIMEOUT_MS = 240_000


def judged(calculator, values):
    """What the calculator shows once it has judged ``values``: its verdict carries the exact bytes and its
    command is ``values``'s."""
    command = cli_command(values)
    calculator.page.wait_for_function(
        """([root, command]) => {
          const v = root.querySelector("[data-judged-bytes]"), c = root.querySelector("[data-cli]");
          return v && c && c.dataset.cli === command;
        }""", arg=[calculator.element_handle(), command], timeout=JUDGED_TIMEOUT_MS)
    return shown(calculator)


def cli_json(command):
    """What ``command`` (a ``memledger ledger ...`` line) prints with ``--json``."""
    argv = shlex.split(command)
    assert argv[:2] == ["memledger", "ledger"]
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli(argv[1:] + ["--json"]) == 0, command
    return json.loads(out.getvalue())


SETUPS = [
    {},
    dict(recompute="full", offload_optimizer="cpu"),
    dict(recompute="full", offload_optimizer="cpu", offload_placement="zero-offload", gpu="rtx-4090"),
    dict(arch="llama2-7b", batch_size=4, seq_len=4096, zero_stage=2, dp=8, offload_optimizer="nvme"),
    dict(arch="gpt2", batch_size=61, seq_len=1024, recipe="fp32-adamw", flash_attention=True),
    dict(arch="llama2-13b", recipe="bf16-adam-8bit", recompute="selective", zero_stage=1, dp=7, gpu="h200"),
    dict(arch="megatron-1t", seq_len=32768, zero_stage=3, dp=1000, recipe="bf16-adamw-fp32-accum"),
    dict(arch="gpt3-175b", recipe="bf16-sgd-momentum", zero_stage=3, dp=64, offload_optimizer="cpu",
         offload_placement="zero-offload", recompute="full", flash_attention=True, gpu="a100-40gb"),
    dict(batch_size=LIMIT),                                 # the CLI's largest count, still exact
    dict(dp=LIMIT, zero_stage=3),
]


@pytest.fixture(scope="module")
def calculator(site, browser):
    watched = Watched(browser, site)
    page = watched.open(CALCULATOR_PAGE)
    yield page.locator(".memledger-calculator")
    assert watched.problems == []
    watched.close()


@pytest.mark.parametrize("changes", SETUPS, ids=lambda c: ",".join(f"{k}={v}" for k, v in c.items()) or "default")
def test_calculator_shows_the_python_ledger(calculator, changes):
    values = {**defaults(), **changes}
    for control in CONTROLS:
        fill(calculator, control.field, values[control.field])
    verdict, rows = python_view(values)
    result = judged(calculator, values)
    assert result["errors"] == [] and result["invalid"] == []
    assert result["verdict"] == [verdict]
    assert result["rows"] == rows                            # every name, device, byte count and size
    assert not re.search(r"\de[+-]?\d", result["text"], re.I)   # never exponent notation


def random_states(count, seed=18):
    rng = random.Random(seed)
    for _ in range(count):
        yield {c.field: rng.choice([1, 1, 2, 5, 64, 4096, LIMIT]) if c.is_count else rng.choice(c.options)
               for c in CONTROLS}


@pytest.mark.parametrize("values", list(random_states(12)), ids=lambda v: cli_command(v).split("ledger ")[1])
def test_calculator_judges_as_its_command(calculator, values):
    """The page's data-judged-bytes and data-measure are what its data-cli command prints with --json; structures
    the site does not carry are built in the browser (Pyodide)."""
    for control in CONTROLS:
        fill(calculator, control.field, values[control.field])
    result = judged(calculator, values)
    [(command, text)] = result["cli"]
    assert command == text == cli_command(values)
    printed = cli_json(command)
    assert result["judged"] == [[str(printed["judged_bytes"]), printed["measure"]]]
    assert result["timeline"] == (printed["measure"] != "total")
    assert result["verdict"] == [python_view(values)[0]]


def cli_message(field, text):
    """The CLI's one-line error for ``text`` given to ``field``'s flag, without the prefix."""
    flag = {"batch_size": "--batch", "dp": "--dp"}[field]
    err = io.StringIO()
    with redirect_stderr(err):
        status = cli(["ledger", "--preset", "article-7b", f"{flag}={text}"])
    assert status == 2, (field, text)
    return err.getvalue().removesuffix("\n").removeprefix("memledger: error: ")


BAD = ["1e30", "1e19", str(LIMIT + 1), "1e999999999", "0", "-1", "1.5", "abc", "", "7 x", "1,000", "0x10"]


@pytest.mark.parametrize("field", ["batch_size", "dp"])
@pytest.mark.parametrize("text", BAD)
def test_calculator_refuses_what_the_cli_refuses(calculator, field, text):
    for control in CONTROLS:
        fill(calculator, control.field, control.default)
    fill(calculator, field, text)
    result = shown(calculator)
    assert result["errors"] == [cli_message(field, text)]
    assert result["invalid"] == [field]
    assert result["rows"] == [] and result["verdict"] == []       # nothing half-written
    fill(calculator, field, "1")
    after = shown(calculator)
    assert after["errors"] == [] and after["rows"] == python_view(defaults())[1]


def test_calculator_names_every_bad_field(calculator):
    for control in CONTROLS:
        fill(calculator, control.field, control.default)
    fill(calculator, "batch_size", "٣")                           # ASCII digits only
    fill(calculator, "dp", "1e30")
    result = shown(calculator)
    assert result["errors"] == [cli_message("batch_size", "٣"), cli_message("dp", "1e30")]
    assert result["invalid"] == ["batch_size", "dp"] and result["rows"] == []
