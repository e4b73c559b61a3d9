#!/usr/bin/env bash
# Copy the book's JavaScript (MathJax, RequireJS, the ipywidgets HTML manager, Pyodide) from
# npm into _vendor/vendor/, which _config.yml serves at <site>/vendor/ via
# html_extra_path: the built site loads no script from the network.
set -euo pipefail
cd "$(dirname "$0")/.."
npm ci --no-audit --no-fund --loglevel=error
rm -rf _vendor && mkdir -p _vendor/vendor
cp node_modules/requirejs/require.js _vendor/vendor/require.js
cp -r node_modules/@jupyter-widgets/html-manager/dist _vendor/vendor/html-manager
cp -r node_modules/mathjax/es5 _vendor/vendor/mathjax
# Pyodide (CPython in WebAssembly) and the pure-Python SymPy it imports: the calculator builds a step
# structure that the site does not carry with memledger itself, in the browser (memledger/views/webpeak.py)
mkdir -p _vendor/vendor/pyodide
for f in pyodide.js pyodide.asm.js pyodide.asm.wasm python_stdlib.zip pyodide-lock.json; do
  cp "node_modules/pyodide/$f" _vendor/vendor/pyodide/
done
python - <<'PY'
"""SymPy and mpmath, the versions installed from requirements.txt, as one zip for Pyodide."""
from pathlib import Path
import zipfile

import mpmath
import sympy

with zipfile.ZipFile("_vendor/vendor/pyodide/sympy.zip", "w", zipfile.ZIP_DEFLATED) as archive:
    for package in (sympy, mpmath):
        folder = Path(package.__file__).parent
        for path in sorted(folder.rglob("*.py")):
            if "tests" not in path.relative_to(folder).parts:
                archive.write(path, path.relative_to(folder.parent).as_posix())
PY
