"""The README is a first screen (issue 27): short, its links alive, and its one example's output what the
command prints today."""
from pathlib import Path
import re
import subprocess
import sys

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_and_its_links_resolve():
    assert len(README.splitlines()) <= 150
    links = re.findall(r"\]\(([^)#]+)\)", README)
    assert links and all((ROOT / link).exists() for link in links), [x for x in links if not (ROOT / x).exists()]


def test_the_first_screen_has_an_install_line_and_an_answer():
    first = "\n".join(README.splitlines()[:45])
    assert "pip install" in first and "\nmemledger ledger " in first and "fits" in first


@pytest.mark.slow
def test_the_example_prints_what_the_readme_shows(tmp_path):
    command = re.search(r"^(memledger ledger [^\n]+)\n```\n\n```\n(.*?)\n```", README, re.S | re.M)
    assert command, "the README's first example and its output"
    done = subprocess.run([sys.executable, "-m", "memledger", *command.group(1).split()[1:]], capture_output=True,
                          text=True, env={"MEMLEDGER_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.rstrip("\n") == command.group(2)
