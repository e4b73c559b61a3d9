"""One table type for every output: aligned text (terminals, nbval), Markdown, and HTML (Jupyter, the book)."""
from html import escape

__all__ = ["DEVICE_LABELS", "Table", "plain"]

#: How each device is printed.
DEVICE_LABELS = {"gpu": "GPU", "cpu": "CPU", "nvme": "NVMe"}


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
    return value if isinstance(value, str) else plain(value) if hasattr(value, "free_symbols") else str(value)


def plain(expr) -> str:
    """A SymPy expression for a table cell: 2·B·H·S^2 rather than 2*B*H*S**2."""
    return str(expr).replace("**", "^").replace("*", "·")
