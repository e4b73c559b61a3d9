"""What every calculator convention shares: the inputs a ledger lacks, the itemized result, the errata.

A convention is another tool's (or text's) way of estimating training memory,
reproduced exactly and cited. It reads a :class:`~memledger.ledger.ledger.Ledger`
(the model, batch, sequence, recipe, ZeRO stage, data-parallel degree, offload,
recomputation, tensor parallelism) plus the few :class:`ConventionInputs` the
ledger does not hold (the largest layer, GPUs per node, nodes, a CPU buffer
factor, ``zero_init``), and returns an :class:`Estimate`: itemized rows of
exact integer bytes, each a SymPy expression of the convention's own symbols,
plus the text the tool itself would print:

    convention.estimate(Ledger("llama2-7b", dp=8), ConventionInputs(nodes=2))

The GPUs a convention counts are all of the ledger's: G (GPUs per node) x
M (nodes) = dp x tp (Megatron-LM's data-parallel size is then G M / t, the
EleutherAI cookbook's ``num_gpus`` is dp x tp x pp with one stage). Where a source's published
number contradicts its own formula or code, the convention carries an
:class:`Erratum` with the arithmetic.
"""
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction

import sympy as sp

from ..core.choices import check_count, check_flag
from ..core.rows import Row, Rows
from ..core.symbols import B, F, H, L, P, S, V, d, t
from ..core.units import parse_number
from ..ledger.ledger import Ledger
from ..states.recipes import get_recipe

__all__ = ["BUFFER_FACTOR_LIMIT", "G", "GROUPS", "KINDS", "M", "P_max", "READABLE", "Convention", "ConventionInputs",
           "Erratum", "Estimate", "Item", "beta", "evaluate", "p_pp"]

#: Symbols the conventions need beyond memledger's notation.
G = sp.Symbol("G", positive=True, integer=True)             # GPUs per node
M = sp.Symbol("M", positive=True, integer=True)             # nodes
beta = sp.Symbol("beta", positive=True)                     # CPU buffer factor (DeepSpeed: 1.5)
P_max = sp.Symbol("P_max", positive=True, integer=True)     # parameters of the largest layer (module)
p_pp = sp.Symbol("p", positive=True, integer=True)          # pipeline-parallel degree (Megatron)

GROUPS = ("model_states", "activations", "overhead")
KINDS = ("outdated", "typo", "inconsistent", "unstated")
#: The largest CPU buffer factor accepted (DeepSpeed's default is 1.5).
BUFFER_FACTOR_LIMIT = 1000
#: What a convention may read (:attr:`Convention.reads`): Ledger fields, then :class:`ConventionInputs` fields.
READABLE = ("batch_size", "seq_len", "recipe", "recompute", "tp", "zero_stage", "dp", "offload_optimizer",
            "offload_params", "largest_layer", "gpus_per_node", "nodes", "buffer_factor", "zero_init")


@dataclass(frozen=True)
class ConventionInputs:
    """What other calculators read and a :class:`~memledger.ledger.ledger.Ledger` does not hold.

    ``largest_layer``: parameters of the largest single module (DeepSpeed's
    ``largest_layer_params``; None: derived from the ledger's architecture);
    ``gpus_per_node`` (None: the ledger's GPUs, dp x tp, over ``nodes``; given,
    G x M must equal them); ``nodes``; ``buffer_factor``: DeepSpeed's
    ``additional_buffer_factor``, an exact number from 1 to 1000 (a string such
    as ``"1.5"`` is read exactly); ``zero_init``: DeepSpeed ZeRO-3 with ``zero.Init``.
    """
    largest_layer: int | None = None
    gpus_per_node: int | None = None
    nodes: int = 1
    buffer_factor: Fraction = Fraction(3, 2)
    zero_init: bool = True

    def __post_init__(self):
        for name in ("largest_layer", "gpus_per_node"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, check_count(name, getattr(self, name)))
        object.__setattr__(self, "nodes", check_count("nodes", self.nodes))
        object.__setattr__(self, "buffer_factor", parse_number(self.buffer_factor, "buffer_factor", 1,
                                                               BUFFER_FACTOR_LIMIT, example="1.5"))
        check_flag("zero_init", self.zero_init)

    def per_node(self, ledger: Ledger) -> int:
        """G: GPUs per node, given or the ledger's GPUs (dp x tp) over the nodes; ``ValueError`` where G x M
        is not dp x tp."""
        gpus, what = ledger.dp * ledger.tp, ("dp" if ledger.tp == 1 else "dp x tp")
        if self.gpus_per_node is not None:
            if self.gpus_per_node * self.nodes != gpus:
                raise ValueError(f"gpus_per_node x nodes ({self.gpus_per_node} x {self.nodes}) must equal {what} "
                                 f"({gpus})")
            return self.gpus_per_node
        if gpus % self.nodes:
            raise ValueError(f"{what} ({gpus}) must be a multiple of nodes ({self.nodes})")
        return gpus // self.nodes

    def largest(self, ledger: Ledger) -> int:
        """The largest module's parameters: given (at most the ledger's parameters), or from the architecture."""
        if self.largest_layer is not None:
            if self.largest_layer > ledger.params:
                raise ValueError(f"largest_layer ({self.largest_layer:,}) must not exceed the model's parameters "
                                 f"({ledger.params:,})")
            return self.largest_layer
        if ledger.arch is None:
            raise ValueError("this convention needs the largest layer's size: give largest_layer or an architecture")
        from ..models.tensors import largest_module_params
        return largest_module_params(ledger.arch)


def offloads(ledger: Ledger) -> tuple:
    """(optimizer offloaded, parameters offloaded): what DeepSpeed's estimators ask, as two flags."""
    return ledger.offload_optimizer != "none", ledger.offload_params != "none"


def weight_dtype(ledger: Ledger) -> str:
    """The dtype of the recipe's working parameters ("fp32", "bf16", "fp8" ...)."""
    return next(c.dtype for c in get_recipe(ledger.recipe).components if c.role == "param")


def values(ledger: Ledger, inputs: ConventionInputs) -> dict:
    """Numbers for every symbol a convention's expressions may contain."""
    a = ledger.arch
    found = {P: ledger.params, G: inputs.per_node(ledger), M: inputs.nodes, beta: inputs.buffer_factor,
             B: ledger.batch_size, S: ledger.seq_len, t: ledger.tp, p_pp: 1}
    if a is not None:
        found.update({d: a.d_model, L: a.n_layers, H: a.n_heads, F: a.d_ff, V: a.vocab_size})
    if inputs.largest_layer is not None or a is not None:
        found[P_max] = inputs.largest(ledger)
    return found


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
    """A named, cited convention: ``items(ledger, inputs)`` gives its formulas, ``printed(ledger, inputs,
    rows)`` the tool's own text; ``differs`` says why it disagrees with memledger's exact ledger.

    ``reads``: the names of :data:`READABLE` it reads besides the model (the command line refuses the others
    with ``--convention``); ``zero_stage``: the stage an estimator is named after (DeepSpeed's), whatever
    the ledger's."""
    name: str
    title: str
    source: str
    items: Callable = field(repr=False)
    differs: str = ""
    reads: tuple = ()
    printed: Callable | None = field(default=None, repr=False)
    errata: tuple = ()
    zero_stage: int | None = None

    def __post_init__(self):
        unknown = set(self.reads) - set(READABLE)
        if unknown:
            raise ValueError(f"{self.name} reads unknown inputs {', '.join(sorted(unknown))}")

    def stage_conflict(self, stage) -> str:
        """Why a stated ZeRO ``stage`` (the command line's ``--zero``; None: not stated) contradicts this
        convention, an estimator named after another stage, or "" (``ledger --convention`` refuses it, ``compare``
        gives the same line as the convention's error row)."""
        if self.zero_stage is None or stage is None or stage == self.zero_stage:
            return ""
        return f"{self.name} estimates ZeRO stage {self.zero_stage}; --zero {stage} contradicts it"

    def estimate(self, ledger: Ledger, inputs: ConventionInputs = None) -> Estimate:
        """This convention's estimate of ``ledger``'s setup with the ``inputs`` the ledger lacks (None: the
        defaults of :class:`ConventionInputs`)."""
        inputs = ConventionInputs() if inputs is None else inputs
        if not isinstance(ledger, Ledger):
            raise TypeError(f"ledger must be a Ledger, got {ledger!r}")
        if not isinstance(inputs, ConventionInputs):
            raise TypeError(f"inputs must be ConventionInputs, got {inputs!r}")
        found = values(ledger, inputs)
        rows = Rows(Row(i.name, i.group, i.device, evaluate(i.expr, found), i.role, str(i.expr))
                    for i in self.items(ledger, inputs))
        return Estimate(self.name, rows, self.printed(ledger, inputs, rows) if self.printed else "")


_NEEDS = {P_max: "the largest layer's size (largest_layer, or an architecture)"}
_NEEDS.update({s: "an architecture (d_model, n_layers, n_heads ...)" for s in (d, L, H, F, V)})


def evaluate(expr, values: dict) -> int:
    """``expr`` at ``values`` (symbol -> number), exactly, by its compiled plain-Python form
    (:func:`memledger.core.exact.exact_function`, cached per formula); ``ValueError`` if a symbol has no value
    or the result is not a whole number of bytes."""
    from ..core.exact import exact_function
    expr = sp.sympify(expr)
    missing = sorted({_NEEDS.get(s, str(s)) for s in expr.free_symbols if s not in values})
    if missing:
        raise ValueError(f"this convention needs {' and '.join(missing)}")
    symbols = tuple(sorted(expr.free_symbols, key=lambda s: s.name))
    try:
        return exact_function(symbols, (expr,))(*(values[s] for s in symbols))[0]
    except ArithmeticError as e:
        raise ValueError(f"{expr} is not a whole number of bytes at these inputs ({str(e).rsplit(' ', 1)[-1]})") \
            from None
