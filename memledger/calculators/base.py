"""What every calculator convention shares: its inputs, its itemized result, its errata.

A convention is another tool's (or text's) way of estimating training memory,
reproduced exactly and cited. It reads a :class:`Setup` (the inputs it needs
and memledger's ledger lacks: largest layer, GPUs per node, nodes, a CPU
buffer factor, ``zero_init`` ...) and returns an :class:`Estimate`: itemized
rows of exact integer bytes, each a SymPy expression of the convention's own
symbols, plus the text the tool itself would print.

Where a source's published number contradicts its own formula or code, the
convention carries an :class:`Erratum` with the arithmetic.
"""
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import sympy as sp

from ..models.architecture import Architecture
from ..core.rows import Row, Rows
from ..core.symbols import B, F, H, L, P, S, V, d, t

#: Symbols the conventions need beyond memledger's notation.
G = sp.Symbol("G", positive=True, integer=True)             # GPUs per node
M = sp.Symbol("M", positive=True, integer=True)             # nodes
beta = sp.Symbol("beta", positive=True)                     # CPU buffer factor (DeepSpeed: 1.5)
P_max = sp.Symbol("P_max", positive=True, integer=True)     # parameters of the largest layer (module)
p_pp = sp.Symbol("p", positive=True, integer=True)          # pipeline-parallel degree (Megatron)

GROUPS = ("model_states", "activations", "overhead")
KINDS = ("outdated", "typo", "inconsistent", "unstated")


@dataclass(frozen=True)
class Setup:
    """One training setup, as the conventions read it.

    ``n_params``: parameters P; ``largest_layer``: parameters of the largest
    single module (DeepSpeed's ``largest_layer_params``; derived from ``arch``
    when omitted); GPUs = ``gpus_per_node`` x ``nodes``; ``buffer_factor`` is
    DeepSpeed's ``additional_buffer_factor``.
    """
    n_params: int
    arch: Architecture | None = None
    largest_layer: int | None = None
    batch_size: int = 1
    seq_len: int = 2048
    gpus_per_node: int = 1
    nodes: int = 1
    buffer_factor: Fraction = Fraction(3, 2)
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    zero_init: bool = True
    recompute: str = "none"
    tp: int = 1
    dtype: str = "bf16"
    flash_attention: bool = False    # memledger's reference ledger only: no convention models these two
    dropout: bool = None             # None: as the architecture says

    def __post_init__(self):
        for name in ("n_params", "batch_size", "seq_len", "gpus_per_node", "nodes", "tp"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.largest_layer is not None and (not isinstance(self.largest_layer, int) or self.largest_layer < 1
                                               or self.largest_layer > self.n_params):
            raise ValueError(f"largest_layer must be a positive integer no larger than n_params, "
                             f"got {self.largest_layer!r}")
        try:
            factor = Fraction(str(self.buffer_factor))
        except (ValueError, ZeroDivisionError):
            factor = None
        if factor is None or factor < 1:
            raise ValueError(f"buffer_factor must be a number >= 1, got {self.buffer_factor!r}")
        object.__setattr__(self, "buffer_factor", factor)
        if self.zero_stage not in (0, 1, 2, 3) or isinstance(self.zero_stage, bool):
            raise ValueError(f"zero_stage must be 0, 1, 2 or 3, got {self.zero_stage!r}")
        if self.recompute not in ("none", "selective", "full"):
            raise ValueError(f"recompute must be none, selective or full, got {self.recompute!r}")

    @property
    def gpus(self) -> int:
        return self.gpus_per_node * self.nodes

    @property
    def largest(self) -> int:
        """The largest module's parameters: given, or derived from the architecture."""
        if self.largest_layer is not None:
            return self.largest_layer
        if self.arch is None:
            raise ValueError("this convention needs the largest layer's size: give largest_layer or an architecture")
        from ..models.tensors import largest_module_params
        return largest_module_params(self.arch)

    def values(self) -> dict:
        """Numbers for every symbol a convention's expressions may contain."""
        a = self.arch
        values = {P: self.n_params, G: self.gpus_per_node, M: self.nodes, beta: sp.Rational(self.buffer_factor),
                  B: self.batch_size, S: self.seq_len, t: self.tp, p_pp: 1}
        if a is not None:
            values.update({d: a.d_model, L: a.n_layers, H: a.n_heads, F: a.d_ff, V: a.vocab_size})
        if self.largest_layer is not None or a is not None:
            values[P_max] = self.largest
        return values


@dataclass(frozen=True)
class Item:
    """One row of a convention's estimate: a formula in the convention's symbols."""
    name: str
    group: str
    device: str
    expr: sp.Expr
    role: str = ""          # param / grad / optimizer for model states; "mixed": one sum over several roles


@dataclass(frozen=True)
class Estimate:
    """A convention's result for one setup: rows (exact bytes) and the text the tool prints."""
    convention: str
    rows: tuple
    printed: str = ""

    def total(self, device: str = "gpu", group: str | None = None) -> int:
        return self.rows.total(device, group)

    def to_dict(self) -> dict:
        return {"convention": self.convention,
                "rows": [r.to_dict("role", "formula") for r in self.rows],
                "totals": {dev: self.total(dev) for dev in ("gpu", "cpu")}, "printed": self.printed}


@dataclass(frozen=True)
class Erratum:
    """A published number (or statement) that its own source's formula or code contradicts."""
    source: str
    where: str
    stated: str
    computed: str
    arithmetic: str
    kind: str = "inconsistent"

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, got {self.kind!r}")


@dataclass(frozen=True)
class Convention:
    """A named, cited convention: ``items(setup)`` gives its formulas, ``printed(setup, rows)``
    the tool's own text; ``differs`` says why it disagrees with memledger's exact ledger."""
    name: str
    title: str
    source: str
    items: Callable = field(repr=False)
    differs: str = ""
    reads: tuple = ()
    printed: Callable | None = field(default=None, repr=False)
    errata: tuple = ()

    def estimate(self, setup: Setup) -> Estimate:
        values = setup.values()
        rows = Rows(Row(i.name, i.group, i.device, evaluate(i.expr, values), i.role, str(i.expr))
                    for i in self.items(setup))
        return Estimate(self.name, rows, self.printed(setup, rows) if self.printed else "")


_NEEDS = {P_max: "the largest layer's size (largest_layer, or an architecture)"}
_NEEDS.update({s: "an architecture (d_model, n_layers, n_heads ...)" for s in (d, L, H, F, V)})


def evaluate(expr, values: dict) -> int:
    """``expr`` at ``values``, exactly; ``ValueError`` if it is not a whole number of bytes."""
    value = sp.sympify(expr).subs(values)
    if not value.is_number:
        missing = sorted({_NEEDS.get(s, str(s)) for s in value.free_symbols})
        raise ValueError(f"this convention needs {' and '.join(missing)}")
    value = sp.nsimplify(value) if value.is_Float else value
    if not value.is_integer:
        raise ValueError(f"{expr} is not a whole number of bytes at these inputs ({value})")
    return int(value)
