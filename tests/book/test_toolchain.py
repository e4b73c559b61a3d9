"""The toolchain's own cost, where a dependency's choice would cost every chapter: importing MyST-NB's
``glue`` (each chapter's first cell) imports nbformat and jsonschema, and jsonschema 4.25+ with ``rfc3987-syntax``
installed compiles 38 Lark grammars on import (about 6 s a process; requirements.txt pins jsonschema 4.24.1)."""
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow


def test_glue_compiles_no_grammar_on_import():
    code = "import sys, myst_nb.ext.glue; print(sorted(m for m in ('lark', 'rfc3987_syntax') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
