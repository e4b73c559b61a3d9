"""The chapters as a reader runs them: ``jupyter lab book/`` (README), every cell run, every explorer moved.

Starts JupyterLab from the checkout (the README's ``jupyter lab book/``) on 127.0.0.1, on a free port and with
a token, with the Jupyter config, data and runtime folders and the IPython folder in a temporary folder (the
user's own are not read or written; the checkout comes first on the kernel's ``PYTHONPATH``). Debian's
Chromium (``/usr/bin/chromium``, driven by Playwright, never ``playwright install``) opens each chapter that
holds a widget, clears its saved outputs and runs every cell from JupyterLab's Run menu; then no cell may
have written to stderr or raised, every explorer must render, and each control moved must make its explorer
show what the library computes for the new setting: the verdict (``memledger ledger --json``'s judged bytes
and measure for the command the explorer prints, and the library's own verdict line) and the ledger's rows.
Any console error, page error, failed request, HTTP error or request to another host fails the test.

Three user settings, written to the temporary config folder, keep the run deterministic: every cell stays
in the page (``windowingMode: none``, so the test sees every output), no autosave (the committed chapter is
never written; checked), and JupyterLab does not ask about fetching news. Checkpoints go to the temporary
folder too, so ``book/`` gains no file (checked).
"""
import json
import os
from pathlib import Path
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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def lab():
    """A JupyterLab server on ``book/``; yields (base URL, token, log file). Stopped at the end."""
    home = Path(tempfile.mkdtemp(prefix="memledger-jupyterlab-"))
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
    command = [str(Path(sys.executable).with_name("jupyter")), "lab", "book/", "--no-browser",
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
        yield base, token, log
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


@pytest.mark.parametrize("chapter", sorted(CHAPTERS))
def test_chapter_runs_and_its_explorers_respond(browser, lab, chapter, capsys):
    base, token, log = lab
    saved, listing = (BOOK / chapter).read_bytes(), sorted(os.listdir(BOOK))
    cells = len(json.loads(saved)["cells"])
    problems = []
    context = browser.new_context(viewport={"width": 1400, "height": 1000})

    def route(r):
        if urlsplit(r.request.url).netloc == urlsplit(base).netloc or r.request.url.startswith(("data:", "blob:")):
            r.continue_()
        else:
            problems.append(f"request to another host: {r.request.url}")
            r.abort()

    context.route("**/*", route)
    page = context.new_page()
    page.set_default_timeout(MOVE_S * 1000)
    page.on("console", lambda m: m.type == "error" and problems.append(f"console: {m.text}"))
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"failed: {r.url} {r.failure}"))
    page.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    try:
        page.goto(f"{base}/lab/tree/{chapter}?token={token}", timeout=OPEN_S * 1000)
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
    assert problems == []
    assert (BOOK / chapter).read_bytes() == saved                    # the committed chapter was not written,
    assert sorted(os.listdir(BOOK)) == listing                       # nor a file added (checkpoints: temporary)


def test_the_book_holds_an_explorer():
    assert CHAPTERS and all(CHAPTERS.values())          # else the test above would check nothing
