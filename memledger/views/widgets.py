"""An ipywidgets explorer of the ledger: change the setup, watch the ledger move.

The controls are :data:`memledger.views.controls.CONTROLS` (the same ones the static
calculator shows). Each update builds a :class:`~memledger.ledger.ledger.Ledger`,
whose rows are evaluated by lambdified SymPy expressions (compiled once per
structure), and its step's peak where the timeline models the setup
(:mod:`memledger.answers.verdict`: the verdict says whether it judged "the peak of a
training step" or "the sum of the rows at the end of the forward pass"), and
redraws an HTML table and bar: no ``subs``, no matplotlib. Under the verdict, the
``memledger ledger`` command of the same setup (:func:`memledger.views.controls.cli_command`),
whose verdict is this one. An update takes well
under a millisecond; the first setting of a new structure (a recipe, a
recompute mode, a ZeRO stage ... seen for the first time) builds that step's
programs once, tens of milliseconds (``benchmarks/bench.py``).
"""
from html import escape

import ipywidgets as w

from ..models.presets import ARTICLE_PRESET
from .controls import CONTROLS, GPU_FIELD, cli_command, defaults, ledger_settings
from .display import html_verdict
from ..ledger.hardware import gpu_memory
from ..ledger.ledger import Ledger

STATIC_NOTE = ("<i>Interactive with a running Jupyter kernel. In the static book the controls show their "
               "starting values and do not recompute.</i>")


def _widget(control, value, style):
    if control.is_count:
        return w.BoundedIntText(description=control.label, value=value, min=1, max=control.maximum, style=style)
    return w.Dropdown(description=control.label, options=control.choices(), value=value, style=style)


def controls(preset: str = ARTICLE_PRESET) -> dict:
    """The explorer's input widgets, by Ledger field name (and ``"gpu"``)."""
    style = {"description_width": "8em"}
    values = defaults(preset)
    return {c.field: _widget(c, values[c.field], style) for c in CONTROLS}


def command_line(values: dict) -> str:
    """HTML: the ``memledger ledger`` command that prints this setting's ledger and verdict (nothing where a
    control refuses its value: the error says which)."""
    try:
        command = cli_command(values)
    except ValueError:
        return ""
    return f'<p class="memledger-cli">On the command line: <code style="user-select:all">{escape(command)}</code></p>'


def render(values: dict) -> str:
    """HTML for one setting of the controls: verdict (the step's peak where modelled), the same setup's
    command line, bar and ledger table (or the error, escaped, and the command line)."""
    try:
        ledger = Ledger(**ledger_settings(values))
        gpu_bytes = gpu_memory(values[GPU_FIELD])
    except (ValueError, TypeError) as error:
        return f'<p style="color:crimson">{escape(str(error))}</p>' + command_line(values)
    return html_verdict(ledger, gpu_bytes, peak=True) + command_line(values) + ledger.table().html()


def explorer(preset: str = ARTICLE_PRESET) -> w.Widget:
    """The widget: controls in a grid, then the verdict, the bar and the ledger table."""
    inputs = controls(preset)
    output = w.HTML()

    def update(*_):
        output.value = render({k: c.value for k, c in inputs.items()})

    for c in inputs.values():
        c.observe(update, names="value")
    update()
    grid = w.GridBox(list(inputs.values()), layout=w.Layout(grid_template_columns="repeat(2, minmax(0, 1fr))"))
    return w.VBox([w.HTML(STATIC_NOTE), grid, output])


__all__ = ["STATIC_NOTE", "command_line", "controls", "explorer", "render"]
