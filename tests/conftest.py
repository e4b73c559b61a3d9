"""Shared test configuration: one clean, strict build of the book per test run; slow markers.

``build`` runs ``jupyter-book build . -W -n --keep-going`` on an empty ``_build``
(every chapter executed) once per run, about half a minute; test_book.py and
test_browser.py both read it. Under pytest-xdist each worker is its own process,
so a file lock lets the first worker build and the others wait for that build.
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

ROOT = Path(__file__).resolve().parents[1]
BUILD = ROOT / "_build"
_STAMP = BUILD / ".memledger-test-run"
_SOLO_RUN = uuid.uuid4().hex


def _run_id(config) -> str:
    """The same id in every xdist worker of one run; a fresh one in a run without xdist."""
    return getattr(config, "workerinput", {}).get("testrunuid", _SOLO_RUN)


def pytest_configure(config):
    """Compiled steps (memledger/steppeak.py) go to a cache of the test runs, not the user's own."""
    os.environ.setdefault("MEMLEDGER_CACHE_DIR", str(Path(tempfile.gettempdir()) / "memledger-test-cache"))


@pytest.fixture(scope="session")
def build(request):
    """A clean strict build made in this test run; returns the _build folder."""
    run = _run_id(request.config)
    lock = Path(tempfile.gettempdir()) / f"memledger-build-{hashlib.sha1(str(ROOT).encode()).hexdigest()[:12]}.lock"
    with open(lock, "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        if not (_STAMP.exists() and _STAMP.read_text() == run):
            shutil.rmtree(BUILD, ignore_errors=True)
            done = subprocess.run([str(Path(sys.executable).with_name("jupyter-book")), "build", str(ROOT),
                                   "-W", "-n", "--keep-going"], capture_output=True, text=True, cwd=ROOT)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            _STAMP.write_text(run)
    return BUILD



#: Test modules whose every test is slow (``pytestmark = pytest.mark.slow``): under ``-m "not slow"`` they
#: are not even imported, which spares the edit loop PyTorch's and Playwright's import time.
ALL_SLOW = {"test_browser.py", "test_jupyterlab.py", "test_lora_torch.py", "test_torchcompare.py", "test_torchref.py"}


def pytest_ignore_collect(collection_path, config):
    if collection_path.name in ALL_SLOW and config.getoption("markexpr", "") == "not slow":
        return True
    return None


def pytest_collection_modifyitems(items):
    """nbval's notebook items (each runs a kernel) and whatever needs the build are slow."""
    for item in items:
        if item.path.suffix == ".ipynb" or "build" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
