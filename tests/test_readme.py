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
    first = "\n".join(README.splitlines()[:50])
    assert "pip install" in first and "\nmemledger ledger " in first and "fits" in first
    assert "\nmemledger check " in first and "torchtune" in first         # issue 30: from the user's own config


def _shown_lines_are_printed(command: str, tmp_path):
    """The README shows some lines of ``command``'s output (the rest elided with ``...``): each is a line the
    command prints today."""
    found = re.search(rf"^({re.escape(command)} [^\n]+)\n```\n\n```\n(.*?)\n```", README, re.S | re.M)
    assert found, f"the README's {command} example and its output"
    done = subprocess.run([sys.executable, "-m", "memledger", *found.group(1).split()[1:]], capture_output=True,
                          text=True, env={"MEMLEDGER_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    printed = done.stdout.splitlines()
    shown = [line for line in found.group(2).splitlines() if line != "..."]
    assert shown and all(line in printed for line in shown), [line for line in shown if line not in printed]


@pytest.mark.slow
def test_the_example_prints_what_the_readme_shows(tmp_path):
    _shown_lines_are_printed("memledger ledger", tmp_path)


@pytest.mark.slow
def test_the_check_example_prints_what_the_readme_shows(tmp_path):
    _shown_lines_are_printed("memledger check", tmp_path)
