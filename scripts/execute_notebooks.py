"""Regenerate the committed outputs of the book's chapters.

    python scripts/execute_notebooks.py            # every book/*.ipynb
    python scripts/execute_notebooks.py book/04_activations.ipynb

Each notebook is executed from a fresh kernel in its own folder (as MyST-NB
and nbval do) and written back in place with its outputs and widget state,
so that nbval can compare a fresh execution against what is committed.
"""
from pathlib import Path
import sys

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]


def execute(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
                   store_widget_state=True).execute()
    nbformat.write(nb, path)


def main(paths) -> None:
    targets = [Path(p).resolve() for p in paths] or sorted((ROOT / "book").glob("*.ipynb"))
    for path in targets:
        print(f"executing {path.relative_to(ROOT)}", flush=True)
        execute(path)


if __name__ == "__main__":
    main(sys.argv[1:])
