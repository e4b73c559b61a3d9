"""Views of a ledger as tables: plain text (terminal), Markdown and HTML (Jupyter).

Numbers are formatted only here and in :mod:`memledger.units`; the unit is
always printed next to them.
"""
from html import escape

from .units import format_bytes, unit_size

#: Sequence lengths the interactive views (widget, static calculator) offer.
SEQUENCE_CHOICES = (512, 1024, 2048, 4096, 8192, 16384, 32768)

#: How each device is printed.
DEVICE_LABELS = {"gpu": "GPU", "cpu": "CPU", "nvme": "NVMe"}
HEADER = ("component", "group", "device", "bytes", "size")


def ledger_table(ledger, unit: str = "GB") -> "Table":
    """The ledger's rows, then one total per device in use (the GPU's always)."""
    body = [(r.name, r.group, DEVICE_LABELS[r.device], f"{r.bytes:,}", format_bytes(r.bytes, unit))
            for r in ledger.rows]
    totals = [(f"total on {DEVICE_LABELS[dev]}", "", DEVICE_LABELS[dev], f"{n:,}", format_bytes(n, unit))
              for dev, n in ledger.totals.items() if n or dev == "gpu"]
    return Table(HEADER, body, totals=totals, numeric=(3, 4), css="memledger")


_GROUP_COLOURS = {"model_states": "#4C72B0", "activations": "#DD8452", "overhead": "#8C8C8C"}


def html_verdict(ledger, gpu_bytes: int, unit: str = "GB", peak: bool = False) -> str:
    """A stacked bar of the GPU rows against ``gpu_bytes``, and a fits / does-not-fit line (pure HTML) that says
    what it judged (:mod:`memledger.measure`): with ``peak``, the step's peak where the timeline models the
    setup (marked on the bar), else the sum of the rows at the end of the forward pass, as the static
    calculator, which cannot run the timeline, judges."""
    from .measure import SUM_CLAUSE, describe, judge, uses_peak
    used = ledger.totals["gpu"]
    judged = judge(ledger, uses_peak(ledger) if peak else False)
    scale = max(used, gpu_bytes, judged.bytes)
    segments = "".join(
        f'<div title="{escape(r.name)}: {format_bytes(r.bytes, unit)}" style="width:{100 * r.bytes / scale:.3f}%;'
        f'background:{_GROUP_COLOURS[r.group]};border-right:1px solid white"></div>'
        for r in ledger.rows if r.device == "gpu" and r.bytes)
    line = f'<div style="position:absolute;left:{100 * gpu_bytes / scale:.3f}%;top:-4px;bottom:-4px;' \
           f'border-left:3px dashed crimson"></div>'
    marks = "dashed line: GPU memory"
    if judged.key != "total":
        line += (f'<div title="{escape(judged.measure)}: {format_bytes(judged.bytes, unit)}" style="position:absolute;'
                 f'left:{100 * judged.bytes / scale:.3f}%;top:-4px;bottom:-4px;border-left:3px solid black"></div>')
        marks += f"; solid line: {escape(judged.measure)}"
    fits = judged.bytes <= gpu_bytes
    clause = describe(ledger, judged, unit) if peak else SUM_CLAUSE
    verdict = (f'<b style="color:{"green" if fits else "crimson"}">{"fits" if fits else "does not fit"}</b>: '
               f"{format_bytes(judged.bytes, unit)} per GPU against {format_bytes(gpu_bytes, unit)}{escape(clause)}")
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {g.replace("_", " ")}' for g, c in _GROUP_COLOURS.items())
    return (f'<div class="memledger-verdict"><p>{verdict}</p>'
            f'<div style="position:relative;display:flex;height:22px;background:#eee;margin:6px 0">{segments}{line}</div>'
            f'<p style="font-size:85%">{legend}; {marks}</p></div>')


class Table:
    """A table rendered in one place for every output: aligned text (terminals, nbval),
    Markdown, and HTML (Jupyter, the book). ``totals`` are rows set apart under a rule
    (bold in Markdown and HTML); ``numeric`` columns are right-aligned."""

    def __init__(self, header, rows, totals=(), numeric=(), css="memledger-table"):
        self.header = tuple(header)
        self.rows = [tuple(_cell(c) for c in r) for r in rows]
        self.totals = [tuple(_cell(c) for c in r) for r in totals]
        self.numeric = frozenset(numeric)
        self.css = css

    def text(self) -> str:
        rows = [self.header] + self.rows + self.totals
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.header))]

        def line(row):
            return "  ".join(c.rjust(w) if i in self.numeric else c.ljust(w)
                             for i, (c, w) in enumerate(zip(row, widths))).rstrip()
        out = [line(self.header)]
        if self.totals:
            rule = "-" * len(line(self.header))
            return "\n".join(out + [rule] + [line(r) for r in self.rows] + [rule] + [line(r) for r in self.totals])
        return "\n".join(out + [line(r) for r in self.rows])

    def markdown(self) -> str:
        align = "|".join("---:" if i in self.numeric else "---" for i in range(len(self.header)))
        lines = ["| " + " | ".join(self.header) + " |", f"|{align}|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        lines += ["| " + " | ".join(f"**{c}**" if c else "" for c in r) + " |" for r in self.totals]
        return "\n".join(lines)

    def html(self) -> str:
        def cells(row, tag):
            return "".join(f'<{tag} style="text-align:{"right" if i in self.numeric else "left"}">{escape(c)}</{tag}>'
                           for i, c in enumerate(row))
        head = cells(self.header, "th")
        body = "".join(f"<tr>{cells(r, 'td')}</tr>" for r in self.rows)
        body += "".join(f"<tr>{cells(r, 'th')}</tr>" for r in self.totals)
        return f'<table class="{self.css}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'

    __repr__ = __str__ = text
    _repr_html_ = html


def _cell(value) -> str:
    """A table cell as text; SymPy expressions plainly (2·B·H·S^2)."""
    return value if isinstance(value, str) else _plain(value) if hasattr(value, "free_symbols") else str(value)


def _plain(expr) -> str:
    """A SymPy expression for a table cell: 2·B·H·S^2 rather than 2*B*H*S**2."""
    return str(expr).replace("**", "^").replace("*", "·")


def inventory_table(rows, values=None, unit: str = "MiB") -> Table:
    """Saved tensors: name, why autograd keeps it, shape, dtype, bytes (symbolic, and at ``values``:
    symbol name -> number, e.g. ``Ledger(...).values``)."""
    from .formulas import evaluate_expr
    sizes = [evaluate_expr(r.bytes, values) for r in rows] if values else None
    header = ("tensor", "block", "kept because", "shape", "dtype", "bytes") + ((unit,) if values else ())
    return Table(header, [
        (r.name, r.block, r.why, " × ".join(str(s) for s in r.shape), r.dtype, _plain(r.bytes))
        + ((format_bytes(sizes[i], unit, 0 if sizes[i] % unit_size(unit) == 0 else 2),) if values else ())
        for i, r in enumerate(rows)])


def recipe_table(recipe, n_params: int = None, unit: str = "GB") -> Table:
    """Components of a recipe: dtype, bytes/param, ZeRO role (and bytes for ``n_params``)."""
    header = ("component", "dtype", "bytes/param", "ZeRO shards it as", "why it exists") + (
        (f"for {n_params:,} params",) if n_params else ())
    return Table(header, [
        (c.name, c.dtype, c.bytes_per_param, c.role, c.why)
        + ((format_bytes(c.bytes_per_param * n_params, unit, 0),) if n_params else ())
        for c in recipe.components])
