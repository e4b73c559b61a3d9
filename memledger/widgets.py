"""An ipywidgets explorer of the ledger: change the setup, watch the ledger move.

Each update builds a :class:`~memledger.ledger.Ledger`, whose rows are
evaluated by lambdified SymPy expressions (compiled once per structure), and
redraws an HTML table and bar: no ``subs``, no matplotlib, milliseconds.
"""
import ipywidgets as w

from .architecture import PRESETS
from .display import SEQUENCE_CHOICES, html_verdict
from .ledger import Ledger
from .recipes import RECIPES
from .hardware import GPU_MEMORY
from .units import format_bytes

STATIC_NOTE = ("<i>Interactive with a running Jupyter kernel. In the static book the controls show their "
               "starting values and do not recompute.</i>")
GPU_SIZES = {f"{name} ({format_bytes(n, digits=0)})": n for name, n in GPU_MEMORY.items()}


def controls(preset: str = "article-7b") -> dict:
    """The explorer's input widgets, by Ledger field name."""
    style = {"description_width": "8em"}
    drop = lambda label, options, value: w.Dropdown(description=label, options=options, value=value, style=style)
    return {
        "arch": drop("model", list(PRESETS), preset),
        "batch_size": w.BoundedIntText(description="batch B", value=Ledger.batch_size, min=1, max=4096,
                                       style=style),
        "seq_len": drop("sequence S", list(SEQUENCE_CHOICES), Ledger.seq_len),
        "recipe": drop("recipe", list(RECIPES), "bf16-adamw"),
        "recompute": drop("recompute", ["none", "selective", "full"], "none"),
        "zero_stage": drop("ZeRO stage", [0, 1, 2, 3], 0),
        "dp": w.BoundedIntText(description="data parallel", value=1, min=1, max=65536, style=style),
        "offload_optimizer": drop("offload optimizer", ["none", "cpu", "nvme"], "none"),
        "offload_placement": drop("placement", ["article", "zero-offload"], "article"),
        "gpu": drop("GPU", list(GPU_SIZES), list(GPU_SIZES)[0]),
    }


def render(values: dict) -> str:
    """HTML for one setting of the controls: verdict, bar and ledger table (or the error)."""
    settings = {k: v for k, v in values.items() if k != "gpu"}
    try:
        ledger = Ledger(**settings)
    except ValueError as error:
        return f'<p style="color:crimson">{error}</p>'
    return html_verdict(ledger, GPU_SIZES[values["gpu"]]) + ledger.table().html()


def explorer(preset: str = "article-7b") -> w.Widget:
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
