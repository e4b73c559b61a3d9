"""Views of a ledger as tables: plain text (terminal), Markdown and HTML (Jupyter).

Numbers are formatted only here and in :mod:`memledger.units`; the unit is
always printed next to them.
"""
from html import escape

from .units import format_bytes

_DEVICE_LABEL = {"gpu": "GPU", "cpu": "CPU", "nvme": "NVMe"}


def _lines(ledger, unit):
    """(component, group, device, exact bytes, formatted) rows plus per-device totals."""
    body = [(r.name, r.group, _DEVICE_LABEL[r.device], f"{r.bytes:,}", format_bytes(r.bytes, unit))
            for r in ledger.rows]
    totals = [(f"total on {_DEVICE_LABEL[dev]}", "", _DEVICE_LABEL[dev], f"{n:,}", format_bytes(n, unit))
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
