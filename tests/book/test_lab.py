"""scripts/lab.py, the reader's copies of the chapters that the README's command (c) opens in JupyterLab.

What JupyterLab shows of them is tested in tests/views/test_jupyterlab.py (Chromium); here, without a browser:
no markup is left that JupyterLab with jupyterlab-myst cannot render, included code is the code of the file,
citations print the short form of their entry, bad input stops the script in one line, and a copy its reader
changed is kept."""
import ast
import importlib.util
import json
from pathlib import Path
import re
import shutil
import sys

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
_spec = importlib.util.spec_from_file_location("memledger_lab_script", ROOT / "scripts" / "lab.py")
lab = sys.modules[_spec.name] = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lab)


@pytest.fixture(scope="module")
def copies():
    return {name: json.loads(text) for name, text in lab.reader_copies().items()}


def markdown(nb) -> list[str]:
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown"]


def test_every_page_is_written_with_its_cells(copies):
    pages = [*BOOK.glob("*.ipynb"), *BOOK.glob("*.md")]
    assert sorted(copies) == sorted(p.with_suffix(".ipynb").name for p in pages)
    for path in BOOK.glob("*.ipynb"):
        book = json.loads(path.read_text())
        copy = copies[path.name]
        assert [c["cell_type"] for c in copy["cells"]] == [c["cell_type"] for c in book["cells"]]
        assert [c for c in copy["cells"] if c["cell_type"] == "code"] == \
               [c for c in book["cells"] if c["cell_type"] == "code"]          # code and outputs as committed


def test_no_markup_jupyterlab_cannot_render(copies):
    left = {}
    for name, nb in copies.items():
        text = "\n".join(markdown(nb))
        here = set(re.findall(r"^:label:\s*(\S+)", text, re.M))
        found = re.findall(r"\{(?:glue[:\w]*|ref|numref|doc|cite(?::\w+)?)\}`[^`]*`", text)
        found += re.findall(r"^(?:```+|:::+)\{(?:glue[:\w]*|literalinclude|include|tableofcontents|bibliography)\}",
                            text, re.M)
        found += [m for m in re.findall(r"\{eq\}`([^`]*)`", text) if m not in here]      # another page's equation
        if found:
            left[name] = found
    assert left == {}


def test_included_code_is_the_files_code(copies):
    """Each ``literalinclude`` ``:pyobject:`` becomes the object's source as Python's own parser delimits it."""
    checked = 0
    for path in BOOK.glob("*.ipynb"):
        for source, copy in zip(markdown(json.loads(path.read_text())), markdown(copies[path.name])):
            for m in re.finditer(r"```\{literalinclude\} (\S+)\n:pyobject: (\S+)\n(?::language: \w+\n)?(?::dedent: (\d+)\n)?",
                                 source):
                code = (path.parent / m.group(1)).read_text()
                node = ast.parse(code)
                for part in m.group(2).split("."):
                    node = next(n for n in node.body if getattr(n, "name", None) == part)
                lines = code.splitlines()[node.lineno - 1 - len(node.decorator_list):node.end_lineno]
                cut = int(m.group(3) or 0)
                assert "```python\n" + "\n".join(line[cut:] for line in lines) + "\n```" in copy, m.group(2)
                checked += 1
    assert checked >= 4


def test_citations_print_the_short_form_of_their_entry(copies):
    """sphinxcontrib-bibtex's author-year style (``bibtex_reference_style: author_year``): ``{cite}`` gives
    [Author, Year], ``{cite:t}`` Author [Year]; three or more authors are the first and "et al."; each links to
    the references page. The authors and years are those of the entries in book/references.bib."""
    text = "\n".join(markdown(copies["17_knobs.ipynb"]) + markdown(copies["02_spec.ipynb"]))
    assert "[[torchtune maintainers and contributors, 2024]](references.ipynb)" in text
    assert "[[Touvron et al., 2023]](references.ipynb)" in text
    assert "[Korthikanti et al. [2022]](references.ipynb)" in text
    assert "torchtune maintainers and contributors, 2024" in "\n".join(markdown(copies["references.ipynb"]))


def test_references_show_their_targets_title(copies):
    text = "\n".join(markdown(copies["12_pytorch.ipynb"]))
    assert "[Itemize what a transformer block saves for backward](04_activations.ipynb)" in text
    assert "Eq. [(2)](04_activations.ipynb)" in text          # the book's second labelled equation (chapter 3 has one)


def a_book(folder: Path) -> Path:
    """A copy of book/ in ``folder``, beside the package its chapters include code from."""
    (folder / "memledger").symlink_to(ROOT / "memledger")
    return shutil.copytree(BOOK, folder / "book")


def test_a_missing_glued_value_stops_the_script_in_one_line(tmp_path, monkeypatch, capsys):
    book = a_book(tmp_path)
    nb = json.loads((BOOK / "17_knobs.ipynb").read_text())
    for cell in nb["cells"]:
        cell["outputs"] = [] if cell["cell_type"] == "code" else cell.get("outputs")
        if cell["outputs"] is None:
            del cell["outputs"]
    (book / "17_knobs.ipynb").write_text(json.dumps(nb))
    monkeypatch.setattr(lab, "BOOK", book)
    assert lab.main(["--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "17_knobs.ipynb: {glue:text}`knobs.seq` has no stored value" in err


def test_a_copy_whose_cells_its_reader_edited_is_kept_until_forced(tmp_path, monkeypatch, capsys):
    book = a_book(tmp_path)
    monkeypatch.setattr(lab, "BOOK", book)
    out = tmp_path / "out"
    assert lab.main(["--out", str(out)]) == 0
    written = (out / "17_knobs.ipynb").read_text()
    nb = json.loads(written)
    nb["cells"][1]["outputs"], nb["metadata"]["saved_by"] = [], "JupyterLab"     # cells run, notebook saved
    (out / "17_knobs.ipynb").write_text(json.dumps(nb))
    assert lab.main(["--out", str(out)]) == 0 and "kept" not in capsys.readouterr().out
    assert (out / "17_knobs.ipynb").read_text() == written                     # written anew
    (out / "17_knobs.ipynb").write_text(written.replace("16,384", "my own note"))
    assert lab.main(["--out", str(out)]) == 0
    assert "kept" in capsys.readouterr().out and "my own note" in (out / "17_knobs.ipynb").read_text()
    assert lab.main(["--out", str(out), "--force"]) == 0
    assert (out / "17_knobs.ipynb").read_text() == written
