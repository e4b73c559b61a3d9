"""A calculator for the static book: JavaScript generated from the library, no kernel needed.

The page's script is data and code printed from memledger itself: presets,
recipes, the device of each component under each offload setting
(:func:`memledger.model_states.device_of`), and the per-layer activation
formulas and ZeRO shard sizes printed from their SymPy expressions with
``sympy.jscode``. Nothing is re-implemented by hand except summing rows.
Numbers are JavaScript doubles, exact for byte counts below 2^53.
"""
from itertools import product
import json

import sympy as sp

from .activations import RECOMPUTE, activation_bytes, inventory
from .architecture import PRESETS
from .display import SEQUENCE_CHOICES
from .hardware import GPU_MEMORY
from .ledger import DEFAULT_OVERHEAD, Ledger
from .model_states import OFFLOAD_DEVICES, PLACEMENTS, ZERO_SHARDS, device_of, elements_per_device
from .recipes import RECIPES, ROLES

_ACT_ARGS = ("B", "S", "d", "H", "L", "F")


def _js_function(args, expr) -> str:
    return f"function({', '.join(args)}) {{ return {sp.jscode(expr)}; }}"


def activation_key(style, dropout, flash, recompute) -> str:
    return f"{style}|{int(dropout)}|{int(flash)}|{recompute}"


def calculator_data() -> dict:
    """Everything the page needs, from the library (JSON-able, except the formula strings)."""
    return {
        "presets": {n: {"d": p.d_model, "L": p.n_layers, "H": p.n_heads, "F": p.d_ff, "style": p.style,
                        "P": p.params, "dropout": p.dropout} for n, p in PRESETS.items()},
        "recipes": {n: [[c.name, c.role, c.bytes_per_param] for c in r.components] for n, r in RECIPES.items()},
        "shards": {str(k): list(v) for k, v in ZERO_SHARDS.items()},
        "devices": {f"{role}|{opt}|{placement}": device_of(role, opt, "none", placement)
                    for role, opt, placement in product(ROLES, OFFLOAD_DEVICES, PLACEMENTS)},
        "gpus": GPU_MEMORY,
        "overhead": DEFAULT_OVERHEAD,
    }


def script() -> str:
    """The calculator's JavaScript: ``memledgerLedger(setup)`` returns rows and totals."""
    formulas = []
    for style, dropout, flash, recompute in product(("gpt", "llama"), (True, False), (True, False), RECOMPUTE):
        rows = inventory("swiglu" if style == "llama" else "gelu", "RMSNorm" if style == "llama" else "LayerNorm",
                         dropout, flash)
        formulas.append(f'"{activation_key(style, dropout, flash, recompute)}": '
                        f"{_js_function(_ACT_ARGS, activation_bytes(rows, recompute))}")
    shard = {str(s): _js_function(("P", "N_d", "t"), elements_per_device(s)) for s in (True, False)}
    return f"""
var MEMLEDGER = {json.dumps(calculator_data())};
MEMLEDGER.activations = {{{", ".join(formulas)}}};
MEMLEDGER.elements = {{"true": {shard["True"]}, "false": {shard["False"]}}};
function memledgerLedger(setup) {{
  var a = MEMLEDGER.presets[setup.preset], rows = [];
  var stage = String(setup.zero), t = 1;
  MEMLEDGER.recipes[setup.recipe].forEach(function (c) {{
    var sharded = MEMLEDGER.shards[stage].indexOf(c[1]) >= 0;
    var device = MEMLEDGER.devices[c[1] + "|" + setup.offload + "|" + setup.placement];
    rows.push([c[0], "model_states", device, c[2] * MEMLEDGER.elements[String(sharded)](a.P, setup.dp, t)]);
  }});
  var dropout = a.dropout ? 1 : 0, key = [a.style, dropout, setup.flash ? 1 : 0, setup.recompute].join("|");
  rows.push(["activations", "activations", "gpu",
             MEMLEDGER.activations[key](setup.batch, setup.seq, a.d, a.H, a.L, a.F)]);
  rows.push(["CUDA context + workspace", "overhead", "gpu", MEMLEDGER.overhead]);
  var totals = {{gpu: 0, cpu: 0, nvme: 0}};
  rows.forEach(function (r) {{ totals[r[2]] += r[3]; }});
  return {{rows: rows, totals: totals}};
}}
"""


_FORM = """
<div class="memledger-calculator" id="memledger-calculator">
<p><b>Calculator</b> (runs in your browser; no kernel needed)</p>
<form onsubmit="return false" style="display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:4px 12px">
{fields}
</form>
<div class="memledger-calculator-out"></div>
</div>
"""


def _select(name, label, options, value):
    opts = "".join(f'<option value="{o}"{" selected" if str(o) == str(value) else ""}>{o}</option>' for o in options)
    return f'<label>{label} <select name="{name}">{opts}</select></label>'


def _number(name, label, value, maximum):
    return f'<label>{label} <input name="{name}" type="number" min="1" max="{maximum}" step="1" value="{value}"></label>'


_DRIVER = """
(function () {
  var root = document.getElementById("memledger-calculator"), form = root.querySelector("form");
  var out = root.querySelector(".memledger-calculator-out");
  function gb(n) { return (n / 1e9).toFixed(2) + " GB"; }
  function update() {
    var f = form.elements;
    var setup = {preset: f.preset.value, batch: +f.batch.value, seq: +f.seq.value, recipe: f.recipe.value,
                 recompute: f.recompute.value, flash: f.flash.value === "yes", zero: +f.zero.value, dp: +f.dp.value,
                 offload: f.offload.value, placement: f.placement.value};
    if (!(setup.batch >= 1 && setup.seq >= 1 && setup.dp >= 1) || [setup.batch, setup.seq, setup.dp].some(
        function (v) { return v !== Math.floor(v); })) {
      out.innerHTML = "<p style='color:crimson'>batch, sequence and data parallel must be positive integers</p>";
      return;
    }
    var ledger = memledgerLedger(setup), gpu = MEMLEDGER.gpus[f.gpu.value], used = ledger.totals.gpu;
    var html = "<p><b style='color:" + (used <= gpu ? "green'>fits" : "crimson'>does not fit") + "</b>: " +
               gb(used) + " per GPU against " + gb(gpu) + "</p><table class='memledger'><tr><th>component</th>" +
               "<th>device</th><th>size</th></tr>";
    ledger.rows.forEach(function (r) {
      html += "<tr><td>" + r[0] + "</td><td>" + r[2].toUpperCase() + "</td><td style='text-align:right'>" +
              gb(r[3]) + "</td></tr>";
    });
    ["gpu", "cpu", "nvme"].forEach(function (d) {
      if (ledger.totals[d] || d === "gpu") {
        html += "<tr><th>total on " + d.toUpperCase() + "</th><th></th><th style='text-align:right'>" +
                gb(ledger.totals[d]) + "</th></tr>";
      }
    });
    out.innerHTML = html + "</table>";
  }
  form.addEventListener("input", update);
  form.addEventListener("change", update);
  update();
})();
"""


def calculator_html(preset: str = "article-7b") -> str:
    """The calculator as one HTML fragment: a form, an output area and its script."""
    fields = [
        _select("preset", "model", list(PRESETS), preset),
        _number("batch", "batch B", Ledger.batch_size, 4096),
        _select("seq", "sequence S", list(SEQUENCE_CHOICES), Ledger.seq_len),
        _select("recipe", "recipe", list(RECIPES), "bf16-adamw"),
        _select("recompute", "recompute", list(RECOMPUTE), "none"),
        _select("flash", "FlashAttention", ["no", "yes"], "no"),
        _select("zero", "ZeRO stage", [0, 1, 2, 3], 0),
        _number("dp", "data parallel", 1, 65536),
        _select("offload", "offload optimizer", list(OFFLOAD_DEVICES), "none"),
        _select("placement", "placement", list(PLACEMENTS), "article"),
        _select("gpu", "GPU", list(GPU_MEMORY), "a100-80gb"),
    ]
    return _FORM.format(fields="\n".join(fields)) + f"<script>{script()}{_DRIVER}</script>"


class Calculator:
    """Displays as the calculator in Jupyter and in the built book."""

    def __init__(self, preset: str = "article-7b"):
        self.preset = preset

    def _repr_html_(self):
        return calculator_html(self.preset)

    def __repr__(self):
        return f"Calculator({self.preset!r}): an HTML form; open the book or Jupyter to use it"
