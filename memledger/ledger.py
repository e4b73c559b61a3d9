"""A whole training setup -> rows (component, group, device, exact bytes), per GPU.

    ledger = Ledger("article-7b", batch_size=1, seq_len=2048)
    ledger.totals            # {"gpu": 144_601_641_984, "cpu": 0, "nvme": 0}

Rows come from three groups: model states (:mod:`memledger.model_states`),
saved activations (:mod:`memledger.activations`, L layers) and a runtime
overhead (the article's 1-2 GB of CUDA context and workspace; 2 GB by
default, as in its sums). Every row is a SymPy expression evaluated exactly by
a lambdified function compiled once per structure (:mod:`memledger.evaluate`).
"""
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
import operator
from typing import NamedTuple, Optional, Union

import numpy as np
import sympy as sp

from . import display
from .activations import RECOMPUTE, activation_bytes, inventory
from .architecture import Architecture, block_params_expr, get_preset
from .evaluate import exact_function, vectorized_function
from .model_states import elements_per_device, state_rows
from .recipes import DEFAULT_RECIPE, get_recipe
from .symbols import ARGS, FIELDS, O, V, d, t
from .transfer import Traffic, step_traffic
from .units import GB

DEVICES = ("gpu", "cpu", "nvme")
DEFAULT_OVERHEAD = 2 * GB


@dataclass(frozen=True)
class Row:
    """One line of the ledger: exact ``bytes`` on ``device``; ``expr`` is its formula."""
    name: str
    group: str
    device: str
    bytes: int
    expr: sp.Expr = field(compare=False, repr=False)


class _Structure(NamedTuple):
    """The discrete choices that decide a ledger's formulas (not its numbers)."""
    recipe: str
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    offload_placement: str
    style: Optional[str]          # None: no architecture, model states only
    dropout: bool
    flash_attention: bool
    recompute: str
    tensor_parallel: bool
    sequence_parallel: bool


@lru_cache(maxsize=256)
def _row_specs(s: _Structure):
    """(name, group, device, expr) for every row of a structure."""
    recipe = get_recipe(s.recipe)
    specs = [(r.name, "model_states", r.device, r.expr)
             for r in state_rows(recipe, s.zero_stage, s.offload_optimizer, s.offload_params, s.offload_placement,
                                 style=s.style)]
    if s.style is not None:
        if s.offload_params != "none":
            # ZeRO-3 gathers one module's parameters (and gradients) at a time:
            # DeepSpeed's estimate_zero3_model_states_mem_needs books 4 x largest layer.
            largest = sp.Max(block_params_expr(s.style), V * d)
            gathered = sp.ceiling(largest / t)
            grad = next(c for c in recipe.components if c.role == "grad")
            specs.append(("gathered parameters + gradients (largest layer)", "model_states", "gpu",
                          recipe.role_bytes_for("param", gathered) + grad.bytes_for(gathered)))
        rows = inventory("swiglu" if s.style == "llama" else "gelu",
                         "RMSNorm" if s.style == "llama" else "LayerNorm", s.dropout, s.flash_attention)
        specs.append(("activations", "activations", "gpu",
                      activation_bytes(rows, s.recompute, s.tensor_parallel, s.sequence_parallel)))
    specs.append(("CUDA context + workspace", "overhead", "gpu", O))
    return tuple(specs)


def _positive_int(name, value):
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool) or number < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return number


@dataclass(frozen=True)
class Ledger:
    """Memory of one training setup, per GPU.

    ``arch``: an :class:`Architecture` or a preset name; without one, give
    ``n_params`` and get model states only. ``n_params`` with ``arch`` overrides
    the architecture's count. ``dropout=None`` follows the architecture
    (GPT-style yes, LLaMA-style no).
    """
    arch: Union[Architecture, str, None] = None
    n_params: Optional[int] = None
    batch_size: int = 1
    seq_len: int = 2048
    recipe: str = DEFAULT_RECIPE
    recompute: str = "none"
    tp: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    dp: int = 1
    offload_optimizer: str = "none"
    offload_params: str = "none"
    offload_placement: str = "article"
    overhead_bytes: int = DEFAULT_OVERHEAD
    dropout: Optional[bool] = None
    flash_attention: bool = False

    def __post_init__(self):
        arch = get_preset(self.arch) if isinstance(self.arch, str) else self.arch
        object.__setattr__(self, "arch", arch)
        if arch is None and self.n_params is None:
            raise ValueError("give an architecture (a preset or d_model/n_layers/n_heads) or n_params")
        for name in ("batch_size", "seq_len", "tp", "dp") + (("n_params",) if self.n_params is not None else ()):
            object.__setattr__(self, name, _positive_int(name, getattr(self, name)))
        if not (isinstance(self.overhead_bytes, int) and self.overhead_bytes >= 0):
            raise ValueError(f"overhead_bytes must be a non-negative integer, got {self.overhead_bytes!r}")
        if self.recompute not in RECOMPUTE:
            raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {self.recompute!r}")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tensor parallelism: tp must be > 1")
        if arch is not None and (arch.d_model % self.tp or arch.n_heads % self.tp):
            raise ValueError(f"tp ({self.tp}) must divide d_model ({arch.d_model}) and n_heads ({arch.n_heads})")
        if self.dropout is None:
            object.__setattr__(self, "dropout", arch.dropout if arch is not None else False)
        _row_specs(self.structure)      # validates recipe, ZeRO stage and offload choices

    @property
    def params(self) -> int:
        """The parameter count the ledger books."""
        return self.n_params if self.n_params is not None else self.arch.params

    @property
    def structure(self) -> _Structure:
        return _Structure(self.recipe, self.zero_stage, self.offload_optimizer, self.offload_params,
                          self.offload_placement, self.arch.style if self.arch else None, bool(self.dropout),
                          bool(self.flash_attention), self.recompute, self.tp > 1, bool(self.sequence_parallel))

    def values(self) -> tuple:
        """Numbers for :data:`memledger.symbols.ARGS` (B, S, d, H, L, F, V, P, N_d, t, O)."""
        a = self.arch
        shape = (a.d_model, a.n_heads, a.n_layers, a.d_ff, a.vocab_size) if a else (1, 1, 1, 1, 1)
        return (self.batch_size, self.seq_len, shape[0], shape[1], shape[2], shape[3], shape[4],
                self.params, self.dp, self.tp, self.overhead_bytes)

    @cached_property
    def rows(self) -> list:
        specs = _row_specs(self.structure)
        numbers = exact_function(ARGS, tuple(s[3] for s in specs))(*self.values())
        return [Row(name, group, device, n, expr) for (name, group, device, expr), n in zip(specs, numbers)]

    @property
    def totals(self) -> dict:
        """Bytes per device: {"gpu": ..., "cpu": ..., "nvme": ...}."""
        return {dev: sum(r.bytes for r in self.rows if r.device == dev) for dev in DEVICES}

    def group_total(self, group: str, device: Optional[str] = None) -> int:
        """Bytes of one group (on one device, or on all)."""
        return sum(r.bytes for r in self.rows if r.group == group and device in (None, r.device))

    def fits(self, gpu_bytes: int) -> bool:
        """Whether the GPU total fits in ``gpu_bytes``."""
        return self.totals["gpu"] <= gpu_bytes

    @property
    def traffic(self) -> Traffic:
        """Host<->device bytes per optimizer step for this rank (see :mod:`memledger.transfer`)."""
        shard, = exact_function(ARGS, (elements_per_device(self.zero_stage >= 1),))(*self.values())
        return step_traffic(get_recipe(self.recipe), self.offload_optimizer, self.offload_params, shard)

    def inputs(self) -> dict:
        fields = asdict(self)
        fields["arch"] = None if self.arch is None else {
            k: v for k, v in asdict(self.arch).items() if k != "description"}
        fields["n_params"] = self.params
        return fields

    def to_dict(self) -> dict:
        """The CLI's JSON object: inputs, rows (exact integer bytes), totals, traffic."""
        return {
            "inputs": self.inputs(),
            "rows": [{"name": r.name, "group": r.group, "device": r.device, "bytes": r.bytes,
                      "formula": str(r.expr)} for r in self.rows],
            "totals": self.totals,
            "traffic": asdict(self.traffic),
        }

    def table(self, unit: str = "GB") -> str:
        """A plain-text table for terminals."""
        return display.text_table(self, unit)

    def __str__(self):
        return self.table()

    def _repr_html_(self):
        return display.html_table(self)

    def _repr_markdown_(self):
        return display.markdown_table(self)


def sweep(template: Ledger, **arrays) -> dict:
    """Per-device totals of ``template``'s structure over NumPy arrays of inputs.

    Keyword names are :data:`memledger.symbols.NOTATION` fields
    (``batch_size``, ``seq_len``, ``dp`` ...); the rest is taken from
    ``template``. Returns {"gpu": array, "cpu": array, "nvme": array} in float64.
    """
    unknown = set(arrays) - set(FIELDS)
    if unknown:
        raise ValueError(f"cannot sweep over {', '.join(sorted(unknown))}; choose from {', '.join(FIELDS)}")
    values = [np.asarray(arrays.get(f, v), dtype=np.float64) for f, v in zip(FIELDS, template.values())]
    specs = _row_specs(template.structure)
    results = vectorized_function(ARGS, tuple(s[3] for s in specs))(*values)
    shape = np.broadcast_shapes(*(np.shape(v) for v in values))
    out = {dev: np.zeros(shape) for dev in DEVICES}
    for (_, _, device, _), value in zip(specs, results):
        out[device] = out[device] + value
    return out
