"""A ledger's rows and per-device totals as a :class:`~memledger.core.table.Table`."""
from ..core.table import DEVICE_LABELS, Table
from ..core.units import format_bytes

__all__ = ["HEADER", "ledger_table"]

HEADER = ("component", "group", "device", "bytes", "size")


def ledger_table(ledger, unit: str = "GB") -> "Table":
    """The ledger's rows, then one total per device in use (the GPU's always)."""
    body = [(r.name, r.group, DEVICE_LABELS[r.device], f"{r.bytes:,}", format_bytes(r.bytes, unit))
            for r in ledger.rows]
    totals = [(f"total on {DEVICE_LABELS[dev]}", "", DEVICE_LABELS[dev], f"{n:,}", format_bytes(n, unit))
              for dev, n in ledger.totals.items() if n or dev == "gpu"]
    return Table(HEADER, body, totals=totals, numeric=(3, 4), css="memledger")
