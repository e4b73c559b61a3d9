"""Shared test configuration: one clean, strict build of the book per test run; slow markers.

``build`` runs ``jupyter-book build . -W -n --keep-going`` on an empty ``_build`` once per run;
tests/book/test_build.py and tests/book/test_browser.py both read it. Under pytest-xdist each worker is
its own process, so a file lock lets the first worker build and the others wait for that build.

The chapters run once per run, not twice: where nbval runs in the same run (the README's test command,
``--nbval``), it executes every chapter and fails on any output that differs from the committed one, so the
build renders those committed outputs (``execute_notebooks: off``, everything else as ``_config.yml`` says:
``-W``, a clean ``_build``). Without ``--nbval`` the build executes every chapter, as ``_config.yml`` says
(``force``) and as the README's build command does.
"""
import fcntl
import hashlib
import os
from pathlib import Path
import shutil
import subprocess
import sys
import tempfile
import uuid

import pytest
from hypothesis import settings

# CI runs every fuzz test on the examples a fixed seed draws (the same on every run): a fresh draw each run could fail
# CI on an example no change introduced. A contributor's runs draw anew.
settings.register_profile("ci", derandomize=True)
if os.environ.get("CI"):
    settings.load_profile("ci")

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
_STAMP = BUILD / ".memledger-test-run"
_SOLO_RUN = uuid.uuid4().hex


def _run_id(config) -> str:
    """The same id in every xdist worker of one run; a fresh one in a run without xdist."""
    return getattr(config, "workerinput", {}).get("testrunuid", _SOLO_RUN)


#: PyTorch's measurements, recorded (memledger/pytorch/record.py): read by default, measured with --pytorch=live,
#: written with --pytorch=record (its command: memledger.pytorch.record.COMMAND).
RECORD = ROOT / "tests" / "pytorch_record.jsonl.gz"


def pytest_addoption(parser):
    group = parser.getgroup("memledger")
    group.addoption("--pytorch", choices=("recorded", "live", "record"), default="recorded",
                    help="PyTorch's measurements: read from tests/pytorch_record.jsonl.gz (recorded, the default), "
                         "run (live: each also checked against the record), or run and written into it (record)")
    group.addoption("--live-sample", type=int, default=6, metavar="N",
                    help="recorded mode: N recorded calls run live each run (tests/pytorch/test_record.py)")
    group.addoption("--live-sample-seed", default=None, metavar="SEED",
                    help="which calls the live sample runs (default: today's date, UTC, so it rotates daily)")


def pytest_configure(config):
    """Compiled steps (memledger/step/cache.py) go to a cache of the test runs, not the user's own; PyTorch's
    measurements in the mode ``--pytorch`` asks for; a record run's workers put what they measured in one folder."""
    from memledger.pytorch import record
    os.environ.setdefault("MEMLEDGER_CACHE_DIR", str(Path(tempfile.gettempdir()) / "memledger-test-cache"))
    mode = config.getoption("pytorch")
    record.configure(mode, RECORD)
    if mode == "record" and not hasattr(config, "workerinput"):
        os.environ["MEMLEDGER_RECORD_PARTS"] = tempfile.mkdtemp(prefix="memledger-record-")


def live_sample_seed(config) -> str:
    import datetime
    return config.getoption("live_sample_seed") or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%d")


def pytest_report_header(config):
    from memledger.pytorch import record
    mode = config.getoption("pytorch")
    if mode == "recorded":
        stored = record.head(RECORD)
        status = record.record_status(stored) or "current"
        return (f"pytorch: recorded, {stored.get('calls', 0)} calls in {RECORD.relative_to(ROOT)} "
                f"({status}); live sample: {config.getoption('live_sample')} calls, "
                f"--live-sample-seed={live_sample_seed(config)}")
    return f"pytorch: {mode} (every measurement runs PyTorch)"


def pytest_sessionfinish(session):
    """``--pytorch=record``: each process leaves what it measured in the run's folder; the controller (or the
    only process) writes them all into the record."""
    from memledger.pytorch import record
    if session.config.getoption("pytorch") != "record":
        return
    import json
    parts = Path(os.environ["MEMLEDGER_RECORD_PARTS"])
    (parts / f"{os.getpid()}.json").write_text(json.dumps(record.measured()))
    if not hasattr(session.config, "workerinput"):
        cases = {}
        for part in sorted(parts.glob("*.json")):
            cases.update(json.loads(part.read_text()))
        shutil.rmtree(parts, ignore_errors=True)
        written = record.save(cases, RECORD)
        print(f"\npytorch: {len(cases)} calls measured, {len(written['cases'])} in {RECORD.relative_to(ROOT)}")


@pytest.fixture(scope="session")
def build(request):
    """A clean strict build made in this test run; returns the _build folder."""
    run = _run_id(request.config)
    lock = Path(tempfile.gettempdir()) / f"memledger-build-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]}.lock"
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if not (_STAMP.exists() and _STAMP.read_text() == run):
            shutil.rmtree(BUILD, ignore_errors=True)
            config = [] if not request.config.getoption("nbval", False) else ["--config", _rendering_config()]
            done = subprocess.run([str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT),
                                   "-W", "-n", "--keep-going", *config], capture_output=True, text=True, cwd=ROOT)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            _STAMP.write_text(run)
    return BUILD



def _rendering_config() -> str:
    """A copy of ``_config.yml`` that renders the committed outputs (``execute_notebooks: off``) instead of
    executing the chapters, written to a temporary file; its local extension's folder made absolute."""
    import yaml

    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["execute_notebooks"] = "off"
    extensions = config["sphinx"]["local_extensions"]
    config["sphinx"]["local_extensions"] = {name: str(ROOT / path) for name, path in extensions.items()}
    path = Path(tempfile.mkdtemp(prefix="memledger-build-")) / "_config.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return str(path)


#: How a test module says that every test in it is slow. Under ``-m "not slow"`` such a module is not even
#: imported (read as text, never executed), which spares the edit loop PyTorch's and Playwright's import time.
SLOW_MODULE = "\npytestmark = pytest.mark.slow\n"


def pytest_ignore_collect(collection_path, config):
    if (collection_path.suffix == ".py" and collection_path.name.startswith("test_")
            and config.getoption("markexpr", "") == "not slow" and SLOW_MODULE in collection_path.read_text()):
        return True


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """``@pytest.mark.sample(n)`` on a parametrized test: n of its cases, spread over the grid, run in the fast
    loop; the others are marked slow (the whole grid runs in the full suite). ``@pytest.mark.live(n)``: under
    ``--pytorch=live`` n of its cases, spread the same way, run PyTorch; the others read the record (as every case
    does by default). A test that reads the book's build or drives a browser is marked ``book``."""
    live = config.getoption("pytorch") == "live"
    for name, spread_out in (("sample", lambda item: item.add_marker(pytest.mark.slow)),
                             ("live", lambda item: setattr(item, "reads_the_record", live))):
        grids = {}
        for item in items:
            marker = item.get_closest_marker(name)
            if marker is not None:
                grids.setdefault((item.path, item.originalname), (marker.args[0], []))[1].append(item)
        for n, cases in grids.values():
            keep = {i * len(cases) // n for i in range(min(n, len(cases)))}
            for i, item in enumerate(cases):
                if i not in keep:
                    spread_out(item)
    for item in items:
        if {"build", "browser"} & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.book)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A case ``@pytest.mark.live(n)`` leaves out of the live run reads PyTorch's numbers from the record."""
    if not getattr(item, "reads_the_record", False):
        return (yield)
    from memledger.pytorch import record
    before = record.switch("recorded")
    try:
        return (yield)
    finally:
        record.switch(before)


#: Debian's Chromium, driven by Playwright (never its own browser download), for the site and JupyterLab tests.
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM.exists():
        pytest.skip("needs Chromium at /usr/bin/chromium (apt-get install -y chromium)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield chromium
        chromium.close()
