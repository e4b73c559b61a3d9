"""Write the chapters as JupyterLab shows them: the book's prose with its numbers, references and citations.

    python scripts/lab.py                  # writes notebooks/ (ignored by git), then: jupyter lab notebooks/
    python scripts/lab.py --out DIR        # another folder
    python scripts/lab.py --force          # also overwrite copies you changed

JupyterLab, even with jupyterlab-myst (requirements.txt), renders MyST but not Jupyter Book's own markup:
``{glue:text}`` (MyST-NB), references across notebooks, ``{cite}`` against a .bib file, ``literalinclude`` and
``tableofcontents``. This script writes a reader's copy of every chapter in which

- each ``{glue:text}`key``` is the value the chapter's own committed glue output holds (MyST-NB stores it in
  the gluing cell's outputs under ``application/papermill.record/``, rendered as MyST-NB renders it), and each
  ``{glue:math}`` block the stored equation in a ``{math}`` block with the same label and the number the site
  gives it (the site numbers labelled equations through the whole book, ``:enumerator:``): so the numbers in
  the prose are still computed, never typed, and are those nbval checks against a fresh run;
- each ``{numref}`` to a figure "the figure" (JupyterLab shows the figure where its cell runs, unnumbered);
- each ``{ref}`` is a link to its target (the target's title, or the role's own text), each ``{eq}`` to
  another chapter a link showing the equation's number, each ``{cite}`` / ``{cite:t}`` the short form
  sphinxcontrib-bibtex prints on the site (``bibtex_reference_style: author_year``), linked to
  ``references.ipynb``;
- each ``literalinclude`` the code it includes (Sphinx's own reader), as a Python block;

and leaves to jupyterlab-myst what it renders itself: admonitions, dropdowns, math, ``{eq}`` within a
chapter, tables, definition lists. ``book/intro.md`` and ``book/references.md`` become notebooks
(``intro.ipynb`` with the table of contents of ``_toc.yml``, ``references.ipynb`` with the bibliography).
Code cells and their outputs are copied unchanged: every cell runs there as in ``book/`` (the chapters find
their data through the installed package, not the working folder).

A copy whose cells you edited since the script wrote it is kept, and the script says so; ``--force`` overwrites
it (a copy whose cells were only run, or that JupyterLab saved as it was, is written anew). Bad input (a glue
key without a stored value, an unknown label or citation key) stops the script with one line and exit status 2.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
import hashlib
import json
from pathlib import Path
import re
import sys

import nbformat

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
OUT = ROOT / "notebooks"
#: the fingerprint of every copy as the script last wrote it: a copy whose cells' sources differ was edited
MANIFEST = ".lab-written.json"
RECORD = "application/papermill.record/"
ROLE = re.compile(r"\{(glue:text|ref|numref|eq|cite|cite:t|cite:p)\}`([^`]+)`")
LABEL = re.compile(r"^\((?P<label>[^()\s]+)\)=[ \t]*\n(?P<heading>#+[ \t]+(?P<title>.+))?", re.M)
FENCE = re.compile(r"^(?P<fence>```+|:::+)\{(?P<name>[^}]+)\}[ \t]*(?P<argument>.*)\n(?P<body>(?:.*\n)*?)(?P=fence)[ \t]*$",
                   re.M)
OPTION = re.compile(r"^:(?P<name>[\w-]+):[ \t]*(?P<value>.*)$")
#: ASCII punctuation that means something to MyST inline: a glued value is text, as MyST-NB pastes it
SPECIAL = re.compile(r"([\\`*_{}\[\]<>$|~])")


class Problem(ValueError):
    """A chapter the script cannot turn into a reader's copy; the message is one line."""


@dataclass(frozen=True)
class Target:
    notebook: str          # file name in the output folder
    title: str             # what a reference to it shows
    anchor: str            # "" for a chapter's own title


def notebook_name(path: Path) -> str:
    return path.with_suffix(".ipynb").name


def sources() -> dict[str, tuple[Path, list[dict]]]:
    """Every page of the book: output name -> (source, cells). Markdown pages are one markdown cell."""
    pages = {}
    for path in sorted(BOOK.glob("*.ipynb")):
        pages[notebook_name(path)] = (path, json.loads(path.read_text())["cells"])
    for path in sorted(BOOK.glob("*.md")):
        pages[notebook_name(path)] = (path, [{"cell_type": "markdown", "source": path.read_text()}])
    return pages


def _text(source) -> str:
    return "".join(source) if isinstance(source, list) else source


def _markdown(cells) -> list[str]:
    return [_text(c["source"]) for c in cells if c["cell_type"] == "markdown"]


def targets(pages) -> dict[str, Target]:
    """Every ``(label)=`` of the book: the title of the heading it stands on, and whether that is the page's title."""
    found = {}
    for name, (_, cells) in pages.items():
        first = True
        for text in _markdown(cells):
            for m in LABEL.finditer(text):
                if not m.group("title"):
                    raise Problem(f"{name}: label ({m.group('label')})= stands on no heading")
                top = first and m.group("heading").startswith("# ")
                found[m.group("label")] = Target(name, m.group("title").strip(), "" if top else m.group("label"))
            first = first and not re.search(r"^#\s", text, re.M)
    return found


def toc_order() -> list[str]:
    """The book's pages in the order of ``_toc.yml`` (output names)."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]] + [c["file"] for part in toc.get("parts", []) for c in part["chapters"]]
    return [notebook_name(Path(f)) for f in files]


def equations(pages) -> dict[str, tuple[str, int]]:
    """label -> (page, number): the site numbers the labelled equations through the whole book, in the order of
    ``_toc.yml`` (chapter 3's is (1), chapter 4's (2), ...); a page outside it comes after."""
    order = toc_order()
    found, number = {}, 0
    for name in sorted(pages, key=lambda n: (order.index(n) if n in order else len(order), n)):
        for text in _markdown(pages[name][1]):
            for m in re.finditer(r"^:label:[ \t]*(\S+)", text, re.M):
                number += 1
                found[m.group(1)] = (name, number)
    return found


def glued(cells) -> dict[str, dict]:
    """key -> the stored data of the chapter's glue outputs (MyST-NB's scrapbook records)."""
    found = {}
    for cell in cells:
        for output in cell.get("outputs", []):
            record = output.get("metadata", {}).get("scrapbook", {})
            if "name" in record:
                prefix = record.get("mime_prefix", RECORD)
                found[record["name"]] = {k[len(prefix):]: _text(v) for k, v in output.get("data", {}).items()
                                         if k.startswith(prefix)}
    return found


class Citations:
    """The short forms the site prints for ``{cite}`` and ``{cite:t}``: sphinxcontrib-bibtex's own reference style
    and bibliography style, as ``_config.yml`` names them (``bibtex_reference_style``, ``bibtex_default_style``)."""

    def __init__(self):
        import pybtex.database
        import pybtex.plugin
        from sphinxcontrib.bibtex.plugin import find_plugin
        import yaml

        config = yaml.safe_load((ROOT / "_config.yml").read_text())
        sphinx = config.get("sphinx", {}).get("config", {})
        self.bib = pybtex.database.BibliographyData()
        for bibfile in config["bibtex_bibfiles"]:
            self.bib.add_entries(pybtex.database.parse_file(str(ROOT / bibfile)).entries.items())
        style = pybtex.plugin.find_plugin("pybtex.style.formatting", sphinx.get("bibtex_default_style", "alpha"))()
        self.formatted = {e.key: e for e in style.format_entries(self.bib.entries.values())}
        self.style = find_plugin("sphinxcontrib.bibtex.style.referencing",
                                 sphinx.get("bibtex_reference_style", "label"))()

    def short(self, role: str, keys: list[str]) -> str:
        from sphinxcontrib.bibtex.style.referencing import format_references
        from sphinxcontrib.bibtex.style.template import SphinxReferenceInfo

        unknown = [k for k in keys if k not in self.bib.entries]
        if unknown:
            raise Problem(f"no bibliography entry {unknown[0]!r} (bibtex_bibfiles in _config.yml)")
        info = SphinxReferenceInfo(None, "", "", "", None, "", "")
        return str(format_references(self.style, role, [(self.bib.entries[k], self.formatted[k], info) for k in keys]))

    def bibliography(self) -> str:
        """Every entry, as the site's references page lists them, each under the short form that cites it."""
        return "\n\n".join(f"**{self.short('p', [key])}** {entry.text.render_as('markdown')}"
                           for key, entry in sorted(self.formatted.items(),
                                                    key=lambda item: self.short("p", [item[0]]).lower()))


def _escape(text: str) -> str:
    return SPECIAL.sub(r"\\\1", text)


def _link(text: str, target: str) -> str:
    return f"[{text}]({target})"


class Page:
    """One page's markdown rewritten for JupyterLab."""

    def __init__(self, name: str, cells, labels, numbers, titles, citations):
        self.name, self.labels, self.numbers, self.titles, self.citations = name, labels, numbers, titles, citations
        self.glue = glued(cells)

    def _href(self, target: Target) -> str:
        where = "" if target.notebook == self.name else target.notebook
        return f"{where}#{target.anchor}" if target.anchor else (where or "#")

    def role(self, m: re.Match) -> str:
        role, content = m.group(1), " ".join(m.group(2).split())
        if role == "glue:text":
            return _escape(self.glued_text(content))
        if role == "ref":
            explicit = re.fullmatch(r"(?P<text>.+?)\s*<(?P<label>[^<>]+)>", content)
            label = explicit.group("label") if explicit else content
            if label not in self.labels:
                raise Problem(f"{self.name}: {{ref}} to an unknown label {label!r}")
            target = self.labels[label]
            return _link(explicit.group("text") if explicit else target.title, self._href(target))
        if role == "numref":                       # a figure of this chapter, drawn by the cell that names it
            start = m.start() == 0 or m.string[:m.start()].rstrip(" ").endswith((".", "\n", ":"))
            return "The figure" if start else "the figure"
        if role == "eq":
            if content not in self.numbers:
                raise Problem(f"{self.name}: {{eq}} to an unknown equation {content!r}")
            page, number = self.numbers[content]
            if page == self.name:
                return m.group(0)                   # jupyterlab-myst links it, showing the block's :enumerator:
            return _link(f"({number})", page)
        keys = [k.strip() for k in content.split(",")]
        return _link(self.citations.short("t" if role == "cite:t" else "p", keys), "references.ipynb")

    def glued_text(self, content: str) -> str:
        from myst_nb.core.variables import format_plain_text

        key, _, spec = content.rpartition(":") if ":" in content else (content, "", "s")
        data = self.glue.get(key)
        if data is None or "text/plain" not in data:
            raise Problem(f"{self.name}: {{glue:text}}`{key}` has no stored value "
                          f"(run: python scripts/execute_notebooks.py book/{self.name})")
        return format_plain_text(data["text/plain"], spec or "s")

    def directive(self, m: re.Match) -> str:
        name, argument = m.group("name"), m.group("argument").strip()
        lines = m.group("body").splitlines()
        options = {}
        while lines and (o := OPTION.match(lines[0])):
            options[o.group("name")] = o.group("value").strip()
            lines.pop(0)
        if name == "glue:math":
            from myst_nb.core.render import strip_latex_delimiters

            data = self.glue.get(argument, {})
            if "text/latex" not in data:
                raise Problem(f"{self.name}: {{glue:math}} {argument} has no stored equation "
                              f"(run: python scripts/execute_notebooks.py book/{self.name})")
            label = options.get("label") or options.get("name")
            head = f":label: {label}\n:enumerator: {self.numbers[label][1]}\n" if label else ""
            return f"```{{math}}\n{head}{strip_latex_delimiters(data['text/latex'])}\n```"
        if name == "literalinclude":
            return self.included(argument, options)
        if name == "tableofcontents":
            return table_of_contents(self.titles)
        if name == "bibliography":
            return self.citations.bibliography()
        inner = FENCE.sub(self.directive, m.group("body"))       # a directive inside a dropdown, say
        return m.string[m.start():m.start("body")] + inner + m.string[m.end("body"):m.end()]

    def included(self, argument: str, options: dict) -> str:
        from sphinx.directives.code import LiteralIncludeReader

        path = (BOOK / argument).resolve()
        if not path.is_file():
            raise Problem(f"{self.name}: literalinclude of a missing file {argument}")
        known = {"pyobject": str, "dedent": int, "lines": str, "start-after": str, "end-before": str,
                 "start-at": str, "end-at": str}
        settings = {k: known[k](v) for k, v in options.items() if k in known}

        class Config:
            source_encoding = "utf-8-sig"

        text, _ = LiteralIncludeReader(str(path), settings, Config()).read()
        fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", text)), default=0))
        return f"{fence}{options.get('language', 'python')}\n{text.rstrip()}\n{fence}"

    def markdown(self, text: str) -> str:
        """The cell's source with every role and directive JupyterLab cannot render replaced."""
        closed = text if text.endswith("\n") else text + "\n"        # a fence may close on the last line
        done = FENCE.sub(self.directive, ROLE.sub(self.role, closed))
        return done if text.endswith("\n") else done[:-1]


def titles(pages) -> dict[str, str]:
    """Each page's title: its first heading."""
    found = {}
    for name, (_, cells) in pages.items():
        heading = next((m for text in _markdown(cells) if (m := re.search(r"^#[ \t]+(.+)$", text, re.M))), None)
        found[name] = heading.group(1).strip() if heading else name
    return found


def table_of_contents(titles) -> str:
    """The parts and chapters of ``_toc.yml``, each chapter a link showing its title."""
    import yaml

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    lines = []
    for part in toc.get("parts", []):
        lines += [f"**{part['caption']}**", ""]
        for chapter in part["chapters"]:
            name = notebook_name(Path(chapter["file"]))
            lines.append(f"- {_link(titles.get(name, name), name)}")
        lines.append("")
    return "\n".join(lines).rstrip()


def _notebook(path: Path, cells) -> nbformat.NotebookNode:
    if path.suffix == ".ipynb":
        return nbformat.read(path, as_version=4)
    nb = nbformat.v4.new_notebook(metadata={"kernelspec": {"display_name": "Python 3", "language": "python",
                                                           "name": "python3"}})
    nb.cells = [nbformat.v4.new_markdown_cell(c["source"], id=f"{path.stem}-{i}") for i, c in enumerate(cells)]
    return nb


def reader_copies() -> dict[str, str]:
    """Every page's reader copy: output name -> notebook JSON text."""
    pages = sources()
    labels, numbers, named = targets(pages), equations(pages), titles(pages)
    citations = Citations()
    copies = {}
    for name, (path, cells) in pages.items():
        page = Page(name, cells, labels, numbers, named, citations)
        nb = _notebook(path, cells)
        for cell in nb.cells:
            if cell.cell_type == "markdown":
                cell.source = page.markdown(cell.source)
        copies[name] = nbformat.writes(nb) + "\n"
    return copies


def fingerprint(text: str) -> str:
    """What a reader writes in a notebook: its cells' types and sources (running cells, or JupyterLab saving
    the notebook with its own metadata, changes neither)."""
    try:
        cells = json.loads(text)["cells"]
    except (ValueError, KeyError, TypeError):
        return "unreadable"
    typed = [(c.get("cell_type"), _text(c.get("source", ""))) for c in cells]
    return hashlib.sha256(json.dumps(typed).encode()).hexdigest()


def write(out: Path, force: bool = False) -> list[str]:
    """Write the copies to ``out``; returns the names kept because their reader changed a cell's source."""
    copies = reader_copies()
    out.mkdir(parents=True, exist_ok=True)
    manifest_path = out / MANIFEST
    written = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    kept = []
    for name, text in copies.items():
        path = out / name
        if path.exists() and not force and fingerprint(path.read_text()) not in (written.get(name), fingerprint(text)):
            kept.append(name)
            continue
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
        written[name] = fingerprint(text)
    manifest_path.write_text(json.dumps(written, indent=1, sort_keys=True) + "\n")
    (out / "README.md").write_text(
        "# The book's chapters for JupyterLab\n\nWritten by `python scripts/lab.py` from `book/` (edit the "
        "chapters there); open them with `jupyter lab notebooks/`. A copy whose cells you edit here is yours: "
        "the script keeps it until you delete it or run it with `--force`.\n")
    return kept


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help="folder to write (default: notebooks/)")
    parser.add_argument("--force", action="store_true", help="also overwrite copies changed since written")
    args = parser.parse_args(argv)
    try:
        kept = write(args.out, args.force)
    except Problem as problem:
        print(f"scripts/lab.py: {problem}", file=sys.stderr)
        return 2
    for name in kept:
        print(f"kept {args.out / name}: changed since it was written (delete it, or use --force, for the book's)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
