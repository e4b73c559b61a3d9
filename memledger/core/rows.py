"""One row type for every account memledger keeps, and the collection that totals it.

The ledger, the LoRA/QLoRA ledger, inference, pipeline stages and other calculators' estimates all print
rows of the same shape: a named amount of exact integer ``bytes`` on a ``device``, in a ``group``
(model states, activations, overhead, ...), with a ZeRO ``role`` where one applies and its ``formula``
as SymPy prints it. :class:`Rows` adds them up per device, per group and per role.
"""
from dataclasses import dataclass

from .vocabulary import Device

__all__ = ["DEVICES", "Row", "Rows"]

#: Where a row's bytes live.
DEVICES = tuple(d.value for d in Device)


@dataclass(frozen=True)
class Row:
    """One line of an account: ``bytes`` (an exact int) of ``name`` on ``device``.

    ``group``: model_states, activations, overhead (inference: its own parts); ``role``: for model states,
    ZeRO's param / grad / optimizer, "gathered" (ZeRO-3's gathered unit) or "mixed" (one sum over several
    roles, as a source books it), "" where none applies; ``formula``: the formula as SymPy prints it, ""
    where the bytes are counted tensor by tensor.
    """
    name: str
    group: str
    device: str
    bytes: int
    role: str = ""
    formula: str = ""

    def __post_init__(self):
        for name in ("group", "device", "role"):          # a vocabulary member (core.vocabulary) as its plain string
            object.__setattr__(self, name, str(getattr(self, name)))

    @property
    def expr(self):
        """The formula as a SymPy expression over the notation's symbols (:mod:`memledger.core.symbols`);
        the bytes themselves where the row has no formula."""
        import sympy as sp
        from . import symbols
        if not self.formula:
            return sp.Integer(self.bytes)
        names = {s.name: s for s in vars(symbols).values() if isinstance(s, sp.Symbol)}
        return sp.sympify(self.formula, locals=names)

    def to_dict(self, *fields: str) -> dict:
        """The row as JSON: name, group, device, bytes, then the optional ``fields`` asked for."""
        return {"name": self.name, "group": self.group, "device": self.device, "bytes": self.bytes,
                **{f: getattr(self, f) for f in fields}}


class Rows(tuple):
    """Rows, with their totals: per device (:attr:`totals`), per group or device (:meth:`total`), per role."""

    def bytes_of(self, name: str) -> int:
        """The bytes of the row called ``name`` (``KeyError`` if none is)."""
        for r in self:
            if r.name == name:
                return r.bytes
        raise KeyError(name)

    @property
    def totals(self) -> dict:
        """Bytes per device: {"gpu": ..., "cpu": ..., "nvme": ...}."""
        return {dev: self.total(dev) for dev in DEVICES}

    def total(self, device: str | None = "gpu", group: str | None = None) -> int:
        """Bytes on ``device`` (None: every device), of ``group`` (None: every group)."""
        return sum(r.bytes for r in self if device in (None, r.device) and group in (None, r.group))

    def by_role(self, device: str | None = None) -> dict:
        """Model-state bytes by role: {"param": ..., "grad": ..., "optimizer": ...} plus any other role present
        ("gathered", "mixed"), on every device or one."""
        roles = {"param": 0, "grad": 0, "optimizer": 0}
        for r in self:
            if r.group == "model_states" and device in (None, r.device):
                roles[r.role] = roles.get(r.role, 0) + r.bytes
        return roles
