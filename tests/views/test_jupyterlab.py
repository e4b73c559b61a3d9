"""The chapters as a reader opens them with the README's command (c): ``python scripts/lab.py`` writes the
chapters as JupyterLab shows them, ``jupyter lab`` serves them, JupyterLab with jupyterlab-myst renders them.

The module's server runs command (c) as a reader would, except that ``scripts/lab.py`` writes to a temporary
folder (``--out``) rather than the checkout's ``notebooks/``, which may hold the developer's own edited copies:
then JupyterLab on that folder on 127.0.0.1, on a free port and with a token, with the Jupyter config, data and
runtime folders and the IPython folder in a temporary folder (the user's own are not read or written; the
checkout comes first on the kernel's ``PYTHONPATH``). Debian's Chromium (``/usr/bin/chromium``, driven by
Playwright, never ``playwright install``) opens the pages. Any console error, page error, failed request, HTTP
error or request to another host fails a test.

Two tests:

- every page (each chapter, appendix, the introduction and the references) is opened and each of its markdown
  cells scrolled into view until jupyterlab-myst has rendered it; its rendered prose may hold no raw MyST
  (``{glue``, a role such as ``{ref}``, ``{cite}`` or ``{eq}``, a ``:::{`` or ``````{`` directive), no reference
  or citation jupyterlab-myst could not resolve, no empty cell; and every number the chapter glues stands in its
  sentence: for each ``{glue:text}`` of the chapter in ``book/``, the plain words before it followed by the value
  its committed glue output holds. A few sentences are checked against numbers from their sources (``KNOWN``).
- each chapter that holds an explorer is cleared and run from JupyterLab's Run menu, then four of each
  explorer's controls moved: no cell may have written to stderr or raised, every explorer must render, and each
  control moved must make its explorer show what the library computes for the new setting: the verdict
  (``memledger ledger --json``'s judged bytes and measure for the command the explorer prints, and the library's
  own verdict line) and the ledger's rows.

Three user settings, written to the temporary config folder, keep the run deterministic: every cell stays
in the page (``windowingMode: none``, so the test sees every output), no autosave (no copy is ever written;
checked), and JupyterLab does not ask about fetching news. Checkpoints go to the temporary folder too, so
neither ``book/`` nor the copies gain a file (checked). Each page is opened on a reset workspace (``?reset``),
and its kernel shut down after its test.
"""
from ast import literal_eval
import json
import os
from pathlib import Path
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest

from memledger.cli.main import main as cli
from memledger.ledger.hardware import GPU_MEMORY
from memledger.ledger.ledger import Ledger
from memledger.views.controls import BY_FIELD, cli_command, defaults, ledger_settings
from memledger.views.display import html_verdict

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
SETTINGS = {
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
}
#: Each explorer's controls are moved one after the other; after each move it must show the library's answer.
MOVES = [("recompute", "full"), ("offload_optimizer", "cpu"), ("batch_size", 4), ("gpu", "h200")]
START_S, OPEN_S, RUN_S, MOVE_S, STOP_S = 90, 90, 360, 60, 20


def widget_chapters():
    """The chapters whose code builds an ipywidgets explorer, and how many explorers each shows."""
    found = {}
    for path in sorted(BOOK.glob("*.ipynb")):
        code = [''.join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
        if any("memledger.views.widgets" in source for source in code):
            found[path.name] = sum(source.count("explorer(") for source in code)
    return found


CHAPTERS = widget_chapters()
#: Every page scripts/lab.py writes: each notebook of book/, and book/intro.md and book/references.md as notebooks.
PAGES = sorted(p.with_suffix(".ipynb").name for p in [*BOOK.glob("*.ipynb"), *BOOK.glob("*.md")])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab():
    """The README's command (c): the reader's copies written by ``scripts/lab.py`` (to a temporary folder) and
    a JupyterLab server on them; yields (base URL, token, log file, the copies' folder). Stopped at the end."""
    home = Path(tempfile.mkdtemp(prefix="memledger-jupyterlab-"))
    copies = home / "notebooks"
    written = subprocess.run([sys.executable, "scripts/lab.py", "--out", str(copies)], cwd=ROOT, capture_output=True,
                             text=True)
    assert written.returncode == 0 and not written.stderr, written.stdout + written.stderr
    for plugin, value in SETTINGS.items():
        path = home / "config" / "lab" / "user-settings" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(home / "config"), "JUPYTER_DATA_DIR": str(home / "data"),
           "JUPYTER_RUNTIME_DIR": str(home / "runtime"), "IPYTHONDIR": str(home / "ipython"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    import matplotlib.font_manager        # noqa: F401  a fresh machine's first import can note on stderr that it
                                          # builds the font cache: here, not in a chapter's output
    port, token, log = _free_port(), secrets.token_hex(16), home / "server.log"
    base = f"http://127.0.0.1:{port}"
    command = [str(Path(sys.executable).with_name("jupyter")), "lab", str(copies), "--no-browser",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={token}", f"--FileCheckpoints.checkpoint_dir={home / 'checkpoints'}",
               "--ServerApp.allow_root=True"]                                      # CI runs as root
    with open(log, "w") as out:
        server = subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert server.poll() is None, f"JupyterLab exited: {log.read_text()[-3000:]}"
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=5)
                break
            except OSError:
                assert time.monotonic() < deadline, f"JupyterLab did not answer in {START_S} s: {log.read_text()[-3000:]}"
                time.sleep(0.5)
        yield base, token, log, copies
    finally:
        server.terminate()
        try:
            server.wait(STOP_S)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(STOP_S)
        shutil.rmtree(home, ignore_errors=True)


class _Verdict(HTMLParser):
    """The text of the first paragraph of a verdict block."""

    def __init__(self, html):
        super().__init__()
        self.text, self._depth = None, 0
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "p" and self.text is None:
            self.text, self._depth = "", 1

    def handle_endtag(self, tag):
        if tag == "p" and self._depth:
            self._depth = 0

    def handle_data(self, data):
        if self._depth:
            self.text += data


_SHOWN = """out => {
  const verdict = out.querySelector(".memledger-verdict");
  return {
    measure: verdict && verdict.dataset.measure, bytes: verdict && verdict.dataset.bytes,
    verdict: verdict && verdict.querySelector("p").textContent,
    command: (out.querySelector(".memledger-cli code") || {}).textContent,
    rows: [...out.querySelectorAll("table tr")].map(tr => [...tr.cells].map(c => c.textContent)),
    model: out.querySelector(".widget-dropdown select").value,
  };
}"""


def shown(explorer) -> dict:
    return explorer.evaluate(_SHOWN)


def library(values: dict, capsys) -> dict:
    """The explorer's expected content for ``values``: command, CLI verdict, verdict line, table rows."""
    command = cli_command(values)
    assert cli(command.split()[1:] + ["--json"]) == 0, command
    data = json.loads(capsys.readouterr().out)
    ledger = Ledger(**ledger_settings(values))
    rows = _Rows(ledger.table().html()).rows
    return {"measure": data["measure"], "bytes": str(data["judged_bytes"]), "command": command, "rows": rows,
            "verdict": _Verdict(html_verdict(ledger, GPU_MEMORY[values["gpu"]], peak=True)).text}


class _Rows(HTMLParser):
    """Text of every table cell, row by row."""

    def __init__(self, html):
        super().__init__()
        self.rows, self._text = [], None
        self.feed(html)

    def handle_starttag(self, tag, attrs):
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._text = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._text is not None:
            self.rows[-1].append(self._text)
            self._text = None

    def handle_data(self, data):
        if self._text is not None:
            self._text += data


def move(explorer, field, value):
    """Set one control as a reader does: pick the option by its label, or type the number and press Enter."""
    control = BY_FIELD[field]
    box = explorer.locator(f".widget-inline-hbox:has(> label:text-is('{control.label}'))")
    if control.is_count:
        box.locator("input").fill(str(value))
        box.locator("input").press("Enter")
    else:
        box.locator("select").select_option(label=dict((v, k) for k, v in control.choices())[value])


def watched_page(browser, base, problems):
    """A new page of its own context that notes every console error, page error, failed request, HTTP error
    and request to another host (aborted) in ``problems``."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})

    def route(r):
        if urlsplit(r.request.url).netloc == urlsplit(base).netloc or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            problems.append(f"request to another host: {r.request.url}")
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    return context, page


def shut_down(base, token, name):
    """Shut down the kernel of the page's session (the server runs for the whole module)."""
    request = urllib.request.Request(f"{base}/api/sessions?token={token}")
    for session in json.loads(urllib.request.urlopen(request, timeout=STOP_S).read()):
        if session["path"] == name:
            urllib.request.urlopen(urllib.request.Request(f"{base}/api/sessions/{session['id']}?token={token}",
                                                          method="DELETE"), timeout=STOP_S)


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_chapter_runs_and_its_explorers_respond(browser, lab, chapter, capsys):
    base, token, log, copies = lab
    saved, listing = (copies / chapter).read_bytes(), sorted(os.listdir(copies))
    book = {p.name: p.read_bytes() for p in BOOK.iterdir()}
    cells = len(json.loads(saved)["cells"])
    problems = []
    context, page = watched_page(browser, base, problems)
    page.set_default_timeout(MOVE_S * 1000)
    try:
        page.goto(f"{base}/lab/tree/{chapter}?reset&token={token}", timeout=OPEN_S * 1000)
        page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length == {cells}",
                               timeout=OPEN_S * 1000)
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=OPEN_S * 1000)
        for menu, item in (("Edit", "Clear Outputs of All Cells"), ("Run", "Run All Cells")):
            page.click(f".lm-MenuBar-itemLabel:text-is('{menu}')")
            page.click(f".lm-Menu-itemLabel:text-is('{item}')")
        page.wait_for_function("""() => { const p = [...document.querySelectorAll('.jp-CodeCell .jp-InputPrompt')]
            .map(e => e.textContent.trim()); return p.length && p.every(t => /^\\[\\d+\\]:$/.test(t))
            || document.querySelector('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]'); }""",
                               timeout=RUN_S * 1000)                 # every cell ran, or one wrote an error
        page.wait_for_selector(".jp-Notebook-ExecutionIndicator[data-status='idle']", timeout=RUN_S * 1000)
        errors = page.evaluate("""() => [...document.querySelectorAll('.jp-OutputArea-output')]
            .filter(o => o.dataset.mimeType === 'application/vnd.jupyter.stderr'
                         || /Error displaying widget/.test(o.textContent))
            .map(o => o.textContent.slice(-500))""")                 # the end: the exception
        assert errors == []
        explorers = page.locator(".jp-OutputArea-output:has(.widget-gridbox)")
        explorers.first.wait_for()
        assert explorers.count() == CHAPTERS[chapter]
        for i in range(explorers.count()):
            explorer = explorers.nth(i)
            explorer.scroll_into_view_if_needed()
            start = shown(explorer)
            values = defaults(start["model"])
            assert {k: start[k] for k in ("measure", "bytes", "verdict", "command", "rows")} == library(values, capsys)
            for field, value in MOVES:
                before = shown(explorer)
                values[field] = value
                want = library(values, capsys)
                move(explorer, field, value)
                deadline = time.monotonic() + MOVE_S
                while (now := shown(explorer))["command"] != want["command"] and time.monotonic() < deadline:
                    page.wait_for_timeout(100)                       # the kernel recomputes, the page redraws
                assert {k: now[k] for k in want} == want, (field, value)
                assert now != before, (field, value)                 # the output did change
        page.wait_for_timeout(300)                                   # late asynchronous errors
    except Exception as error:
        raise AssertionError(f"{error}\n--- JupyterLab's log:\n{log.read_text()[-3000:]}") from error
    finally:
        context.close()
        shut_down(base, token, chapter)
    assert problems == []
    assert (copies / chapter).read_bytes() == saved                  # the copy was not written,
    assert sorted(os.listdir(copies)) == listing                     # nor a file added (checkpoints: temporary),
    assert {p.name: p.read_bytes() for p in BOOK.iterdir()} == book  # nor the book touched


#: MyST as typed, which a reader must never see in the rendered prose: glue, a role, a directive.
RAW = re.compile(r"\{glue|\{(?:ref|numref|eq|doc|cite(?::\w+)?)\}|:::\{|```\{")
#: What jupyterlab-myst makes of each directive the copies may hold (it drops one it does not know, silently).
DIRECTIVES = {"admonition": "aside.myst-admonition", "dropdown": "details.myst-dropdown", "math": ".katex-display"}
#: The words right before a ``{glue:text}`` role when they are plain text (no markup, within its paragraph).
PLAIN = re.compile(r"[A-Za-z0-9,; -]{8,}\Z")
#: LLaMA-2 7B's parameters, from its config.json (V 32000, d 4096, L 32, F 11008; an untied LM head; per block
#: four d x d attention projections, three MLP matrices and two RMSNorms; a final RMSNorm): 6,738,415,616, the
#: released checkpoint's count.
LLAMA2_7B = 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096) + 4096
#: Sentences whose glued number a source gives: page -> text its rendered prose must hold.
KNOWN = {
    "02_spec.ipynb": f"The result, {LLAMA2_7B:,}",
    "12_pytorch.ipynb": f"LLaMA-2 7B ({LLAMA2_7B:,} parameters)",
    "17_knobs.ipynb": f"{4 * 4096:,} tokens of LLaMA-2 7B",    # four times LLaMA-2's 4,096-token context
}


def site_equation_numbers() -> dict[str, list[str]]:
    """The numbers the site shows beside each page's labelled equations: Sphinx (numfig, no section numbers)
    counts them through the whole book in the order of _toc.yml (as the built site shows: chapter 3's is (1),
    chapter 4's (2), chapter 10's (4) to (11))."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    found, number = {}, 0
    for file in [c["file"] for part in toc["parts"] for c in part["chapters"]]:
        path = (ROOT / file).with_suffix(".ipynb")
        cells = json.loads(path.read_text())["cells"] if path.exists() else []
        labels = sum(len(re.findall(r"^:label:", "".join(c["source"]), re.M)) for c in cells if c["cell_type"] == "markdown")
        found[path.name] = [f"({n})" for n in range(number + 1, number + labels + 1)]
        number += labels
    return found


EQUATIONS = site_equation_numbers()


def _paragraph(text: str) -> str:
    """The end of ``text`` from the start of its paragraph, its wrapped lines joined by spaces."""
    lines = text.split("\n")
    start = len(lines) - 1
    while start and re.match(r"[A-Za-z0-9{(]", lines[start - 1]):      # a line of prose, not a heading, fence...
        start -= 1
    return " ".join(lines[start:])


def glued_sentences(name: str) -> list[str]:
    """For each ``{glue:text}`` of the chapter in book/ after plain words: those words (less the first, which may
    be cut) and the value the chapter's committed glue output holds, as MyST-NB pastes it (the text/plain repr
    of the glued value, a string without its quotes)."""
    path = BOOK / name
    if not path.exists():
        return []
    cells = json.loads(path.read_text())["cells"]
    values = {}
    for cell in cells:
        for output in cell.get("outputs", []):
            record = output.get("metadata", {}).get("scrapbook", {})
            text = output.get("data", {}).get(record.get("mime_prefix", "") + "text/plain")
            if "name" in record and text is not None:
                text = "".join(text)
                try:
                    values[record["name"]] = str(literal_eval(text))
                except (ValueError, SyntaxError):
                    values[record["name"]] = text
    found = []
    for cell in cells:
        source = "".join(cell["source"]) if cell["cell_type"] == "markdown" else ""
        for m in re.finditer(r"\{glue:text\}`([^`]+)`", source):
            before = PLAIN.search(_paragraph(source[:m.start()]))
            words = before and before.group().split(" ", 1)
            if words and len(words) == 2 and len(words[1].strip()) >= 8:
                found.append(" ".join(words[1].split()) + " " * words[1].endswith(" ") + values[m.group(1)])
    return found


_RENDERED = """n => { const cells = [...document.querySelectorAll('.jp-Notebook .jp-MarkdownCell')];
    cells.forEach(c => c.scrollIntoView());                  // JupyterLab renders a cell as it comes into view
    return cells.length == n && cells.every(c => c.querySelector('.myst, .jp-RenderedMarkdown')); }"""
_PROSE = """selectors => {
  const text = e => { const c = e.cloneNode(true); c.querySelectorAll('.katex').forEach(k => k.remove());
                      return c.textContent; };
  const cells = [...document.querySelectorAll('.jp-Notebook .jp-MarkdownCell')];
  return {
    cells: cells.map(c => text(c.querySelector('.myst, .jp-RenderedMarkdown'))),
    myst: cells.filter(c => c.querySelector('.myst')).length,
    outputs: [...document.querySelectorAll('.jp-OutputArea-output[data-mime-type="text/markdown"]')].map(text),
    unresolved: [...document.querySelectorAll('.jp-Notebook [title$="Not Found"]')]
                  .map(e => `${e.title}: ${e.textContent}`),
    equations: [...document.querySelectorAll('.jp-Notebook .jp-MarkdownCell a[title="Link to this Equation"]')]
                 .map(e => e.textContent),
    shown: Object.fromEntries(Object.entries(selectors).map(([name, selector]) =>
             [name, document.querySelectorAll(`.jp-Notebook .jp-MarkdownCell ${selector}`).length])),
  };
}"""


@pytest.mark.parametrize("name", PAGES)
def test_page_reads_as_in_the_book(browser, lab, name):
    base, token, log, copies = lab
    cells = json.loads((copies / name).read_text())["cells"]
    markdown = sum(c["cell_type"] == "markdown" for c in cells)
    source = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    fences = len(re.findall(r"^```+[a-z]*$", source, re.M))     # a code block's two, a ```{directive}'s last
    typed = {"code": (fences - len(re.findall(r"^```+\{", source, re.M))) // 2}
    for directive in re.findall(r"^(?:```+|:::+)\{([^}]+)\}", source, re.M):
        typed[directive] = typed.get(directive, 0) + 1
    problems = []
    context, page = watched_page(browser, base, problems)
    try:
        page.goto(f"{base}/lab/tree/{name}?reset&token={token}", timeout=OPEN_S * 1000)
        page.wait_for_function(f"() => document.querySelectorAll('.jp-Notebook .jp-Cell').length == {len(cells)}",
                               timeout=OPEN_S * 1000)
        page.wait_for_function(_RENDERED, arg=markdown, timeout=OPEN_S * 1000, polling=250)
        page.wait_for_timeout(300)                                   # late asynchronous errors
        shown = page.evaluate(_PROSE, {**DIRECTIVES, "code": "pre"})
    except Exception as error:
        raise AssertionError(f"{error}\n--- JupyterLab's log:\n{log.read_text()[-3000:]}") from error
    finally:
        context.close()
        shut_down(base, token, name)
    assert problems == []
    assert shown["myst"] == markdown, "markdown not rendered by jupyterlab-myst: pip install -r requirements.txt"
    assert all(text.strip() for text in shown["cells"]), "a markdown cell renders empty"
    prose = " ".join(" ".join(shown["cells"] + shown["outputs"]).split())
    assert sorted({m.group() for m in RAW.finditer(prose)}) == []
    assert shown["unresolved"] == []
    assert {k: n for k, n in typed.items() if shown["shown"].get(k, 0) < n} == {}     # each directive rendered
    assert [s for s in glued_sentences(name) if s not in prose] == []
    assert KNOWN.get(name, "") in prose
    assert shown["equations"] == EQUATIONS.get(name, [])                # numbered as on the site


def test_the_checks_see_the_glued_numbers():
    sentences = {name: glued_sentences(name) for name in PAGES}
    assert sum(map(len, sentences.values())) >= 100 and all(sentences[name] for name in KNOWN)


def test_the_book_holds_an_explorer():
    assert CHAPTERS and all(CHAPTERS.values())          # else the test above would check nothing
