"""Views of a ledger as tables: plain text (terminal), Markdown and HTML (Jupyter).

Numbers are formatted only here and in :mod:`memledger.units`; the unit is
always printed next to them.
"""
from html import escape

import sympy as sp

from .units import format_bytes

#: Sequence lengths the interactive views (widget, static calculator) offer.
SEQUENCE_CHOICES = (512, 1024, 2048, 4096, 8192, 16384, 32768)

#: How each device is printed.
DEVICE_LABELS = {"gpu": "GPU", "cpu": "CPU", "nvme": "NVMe"}


def _lines(ledger, unit):
    """(component, group, device, exact bytes, formatted) rows plus per-device totals."""
    body = [(r.name, r.group, DEVICE_LABELS[r.device], f"{r.bytes:,}", format_bytes(r.bytes, unit))
            for r in ledger.rows]
    totals = [(f"total on {DEVICE_LABELS[dev]}", "", DEVICE_LABELS[dev], f"{n:,}", format_bytes(n, unit))
              for dev, n in ledger.totals.items() if n or dev == "gpu"]
    return body, totals


HEADER = ("component", "group", "device", "bytes", "size")


def text_table(ledger, unit: str = "GB") -> str:
    """Aligned columns for a terminal, totals under a rule."""
    body, totals = _lines(ledger, unit)
    widths = [max(len(str(row[i])) for row in [HEADER] + body + totals) for i in range(len(HEADER))]

    def fmt(row):
        cells = [str(c).ljust(w) if i < 3 else str(c).rjust(w) for i, (c, w) in enumerate(zip(row, widths))]
        return "  ".join(cells).rstrip()
    rule = "-" * len(fmt(HEADER))
    return "\n".join([fmt(HEADER), rule] + [fmt(r) for r in body] + [rule] + [fmt(r) for r in totals])


def markdown_table(ledger, unit: str = "GB") -> str:
    body, totals = _lines(ledger, unit)
    lines = ["| " + " | ".join(HEADER) + " |", "|---|---|---|---:|---:|"]
    lines += ["| " + " | ".join(row) + " |" for row in body]
    lines += ["| **" + row[0] + "** | | " + row[2] + " | **" + row[3] + "** | **" + row[4] + "** |" for row in totals]
    return "\n".join(lines)


def html_table(ledger, unit: str = "GB") -> str:
    body, totals = _lines(ledger, unit)
    head = "".join(f"<th>{h}</th>" for h in HEADER)
    cells = lambda row, tag: "".join(
        f'<{tag} style="text-align:{"right" if i > 2 else "left"}">{escape(str(c))}</{tag}>'
        for i, c in enumerate(row))
    rows = "".join(f"<tr>{cells(r, 'td')}</tr>" for r in body)
    rows += "".join(f"<tr>{cells(r, 'th')}</tr>" for r in totals)
    return f'<table class="memledger"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>'


_GROUP_COLOURS = {"model_states": "#4C72B0", "activations": "#DD8452", "overhead": "#8C8C8C"}


def html_verdict(ledger, gpu_bytes: int, unit: str = "GB") -> str:
    """A stacked bar of the GPU rows against ``gpu_bytes``, and a fits / does-not-fit line (pure HTML)."""
    used = ledger.totals["gpu"]
    scale = max(used, gpu_bytes)
    segments = "".join(
        f'<div title="{escape(r.name)}: {format_bytes(r.bytes, unit)}" style="width:{100 * r.bytes / scale:.3f}%;'
        f'background:{_GROUP_COLOURS[r.group]};border-right:1px solid white"></div>'
        for r in ledger.rows if r.device == "gpu" and r.bytes)
    line = f'<div style="position:absolute;left:{100 * gpu_bytes / scale:.3f}%;top:-4px;bottom:-4px;' \
           f'border-left:3px dashed crimson"></div>'
    fits = ledger.fits(gpu_bytes)
    verdict = (f'<b style="color:{"green" if fits else "crimson"}">{"fits" if fits else "does not fit"}</b>: '
               f"{format_bytes(used, unit)} per GPU against {format_bytes(gpu_bytes, unit)}")
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {g.replace("_", " ")}' for g, c in _GROUP_COLOURS.items())
    return (f'<div class="memledger-verdict"><p>{verdict}</p>'
            f'<div style="position:relative;display:flex;height:22px;background:#eee;margin:6px 0">{segments}{line}</div>'
            f'<p style="font-size:85%">{legend}; dashed line: GPU memory</p></div>')


class Table:
    """A small table that prints as aligned text (terminals, nbval) and renders as HTML (Jupyter, the book)."""

    def __init__(self, header, rows):
        self.header = tuple(header)
        self.rows = [tuple(_plain(c) if isinstance(c, sp.Basic) else str(c) for c in r) for r in rows]

    def __repr__(self):
        rows = [self.header] + self.rows
        widths = [max(len(r[i]) for r in rows) for i in range(len(self.header))]
        return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows)

    def _repr_html_(self):
        head = "".join(f"<th>{escape(h)}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{escape(c)}</td>" for c in r) + "</tr>" for r in self.rows)
        return f'<table class="memledger-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def _plain(expr) -> str:
    """A SymPy expression for a table cell: 2·B·H·S^2 rather than 2*B*H*S**2."""
    return str(expr).replace("**", "^").replace("*", "·")


def inventory_table(rows, values=None, unit: str = "MiB") -> Table:
    """Saved tensors: name, why autograd keeps it, shape, dtype, bytes (symbolic, and at ``values``)."""
    from .evaluate import exact_function
    from .symbols import ARGS
    sizes = exact_function(ARGS, tuple(r.bytes for r in rows))(*values) if values else None
    header = ("tensor", "block", "kept because", "shape", "dtype", "bytes") + ((unit,) if values else ())
    return Table(header, [
        (r.name, r.block, r.why, " × ".join(str(s) for s in r.shape), r.dtype, _plain(r.bytes))
        + ((format_bytes(sizes[i], unit, 0 if sizes[i] % (1 << 20) == 0 else 2),) if values else ())
        for i, r in enumerate(rows)])


def recipe_table(recipe, n_params: int = None, unit: str = "GB") -> Table:
    """Components of a recipe: dtype, bytes/param, ZeRO role (and bytes for ``n_params``)."""
    header = ("component", "dtype", "bytes/param", "ZeRO shards it as", "why it exists") + (
        (f"for {n_params:,} params",) if n_params else ())
    return Table(header, [
        (c.name, c.dtype, c.bytes_per_param, c.role, c.why)
        + ((format_bytes(c.bytes_per_param * n_params, unit, 0),) if n_params else ())
        for c in recipe.components])
