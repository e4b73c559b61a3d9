"""Local Sphinx extension: the few fixes the built site needs to load cleanly in a browser.

Each fix answers a console error or a stray file that the pinned Jupyter Book 1 stack
produces (docs: /work/shared/docs/toolchain.md, "The built site in a real browser"), and
tests/book/test_browser.py checks every page for them:

* Jupyter Book fires ``env-before-read-docs`` twice, so sphinx-thebe's inline
  ``const THEBE_JS_URL`` (and sphinx-togglebutton's selector) land twice in every
  page: a SyntaxError. Each page keeps one copy of every script.
* The static calculator's script (``_static/memledger-calculator.js``, which Jupyter
  Book adds to every page) is kept only on pages that hold a calculator.
* ``@jupyter-widgets/html-manager`` 1.x typesets with the MathJax 2 API
  (``MathJax.Hub.Queue``) while the site ships MathJax 3: pages with widgets and math
  get a shim that hands those calls to MathJax 3's ``typesetPromise``.
* The widget manager locates its fonts from its AMD module id, which resolves next to
  the page (``book/@jupyter-widgets/html-manager/dist/*.woff2``, 404): RequireJS is told
  where the vendored copy lives.
* The themes ship template fragments in their static folders
  (``webpack-macros.html``); they are removed from the published ``_static``.
* The calculator's step records (:func:`memledger.views.webpeak.site_records`) are written to
  ``_static/memledger-steps/``, and memledger's own source, with the few NumPy calls the step's
  build makes (``pyodide_numpy.py``), to ``_static/memledger-python.zip`` for Pyodide.
"""
import json
import posixpath
from pathlib import Path
import zipfile

import memledger
from memledger.views.webcalc import CSS_CLASS, SCRIPT
from memledger.views.webpeak import FOLDER, PYTHON_ARCHIVE, site_records

WIDGET_MANAGER = "html-manager/embed-amd.js"
#: The AMD id prefix under which the widget manager's bundle names itself.
WIDGET_MODULE_PREFIX = "@jupyter-widgets/html-manager/dist"

MATHJAX2_SHIM = """(function () {
  /* @jupyter-widgets/html-manager 1.x calls MathJax.Hub.Queue(["Typeset", MathJax.Hub, element]);
     MathJax 3 has no Hub: typeset the element with MathJax 3 instead (memledger _ext/memledger_site.py). */
  var pending = [];
  function queue(job) {
    var element = job && job[2], mathjax = window.MathJax;
    if (!element) return;
    if (mathjax && mathjax.typesetPromise) {
      (mathjax.startup.promise || Promise.resolve()).then(function () { return mathjax.typesetPromise([element]); });
    } else {
      pending.push(element);
    }
  }
  var config = window.MathJax = window.MathJax || {};
  config.Hub = {Queue: queue};
  config.startup = config.startup || {};
  var ready = config.startup.ready;
  config.startup.ready = function () {
    if (ready) ready(); else window.MathJax.startup.defaultReady();
    var mathjax = window.MathJax;
    mathjax.Hub = {Queue: queue};
    (mathjax.startup.promise || Promise.resolve()).then(function () {
      if (pending.length) return mathjax.typesetPromise(pending.splice(0));
    });
  };
})();"""


def _key(script):
    return (str(script.filename or ""), tuple(sorted(script.attributes.items())))


def _fix_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if scripts is None:
        return
    seen, kept = set(), []
    on_calculator_page = f'class="{CSS_CLASS}"' in context.get("body", "")
    for script in scripts:
        name = str(script.filename or "")
        if _key(script) in seen or (name.endswith(SCRIPT) and not on_calculator_page):
            continue
        seen.add(_key(script))
        kept.append(script)
    scripts[:] = kept           # Sphinx restores the site-wide list after each page

    manager = next((str(s.filename) for s in kept if str(s.filename or "").endswith(WIDGET_MANAGER)), None)
    if manager is None:
        return
    folder = posixpath.dirname(context["pathto"](manager, 1))
    # RequireJS reads a global `require` object as its configuration when it loads.
    app.add_js_file(None, priority=400,
                    body=f'var require = {{paths: {{"{WIDGET_MODULE_PREFIX}": "{folder}"}}}};')
    if any(str(s.attributes.get("body", "")).startswith("window.MathJax") for s in kept):
        app.add_js_file(None, body=MATHJAX2_SHIM)       # after the MathJax 3 configuration


def _drop_template_fragments(app, exception):
    if exception is None and app.builder.format == "html":
        for fragment in Path(app.outdir, "_static").glob("*webpack-macros.html"):
            fragment.unlink()


def _write_step_records(app, exception):
    if exception is not None or app.builder.format != "html":
        return
    folder = Path(app.outdir, "_static", FOLDER)
    folder.mkdir(parents=True, exist_ok=True)
    for name, record in site_records()[1].items():
        (folder / f"{name}.json").write_text(json.dumps(record, separators=(",", ":")))
    package = Path(memledger.__file__).parent
    with zipfile.ZipFile(Path(app.outdir, "_static", PYTHON_ARCHIVE), "w", zipfile.ZIP_DEFLATED) as archive:
        for path in sorted(package.rglob("*")):
            if path.is_file() and path.suffix in (".py", ".json") and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(package.parent).as_posix())
        archive.write(Path(__file__).with_name("pyodide_numpy.py"), "numpy.py")


def setup(app):
    app.connect("html-page-context", _fix_scripts, priority=900)
    app.connect("build-finished", _drop_template_fragments)
    app.connect("build-finished", _write_step_records)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
