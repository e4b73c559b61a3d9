"""Model states per device: recipe x ZeRO stage x data-parallel degree x offload.

ZeRO (Rajbhandari et al. 2020) shards over N_d data-parallel ranks:
stage 1 the optimizer states, stage 2 also the gradients, stage 3 also the
parameters. With K = 12 optimizer bytes (Adam, FP32 master + m + v):

    baseline 16P,  stage 1 4P + 12P/N_d,  stage 2 2P + 14P/N_d,  stage 3 16P/N_d

Tensor parallelism (t) first splits every component t ways. A shard is
rounded up to whole elements, ceil(P/(t*N_d)), so bytes stay integers.

Offload placements:

* ``"article"``: only the optimizer states (FP32 master, m, v) leave the GPU;
  parameters and gradients stay (the article's 28 GB resident, 84 GB on CPU).
* ``"zero-offload"``: gradients stream to the CPU too and the optimizer step
  runs there; only the BF16 parameters stay, 2P (Ren et al. 2021).
"""
from dataclasses import dataclass, field

from ..core.choices import check_choice
from ..core.dtypes import nbits, nbytes
from ..core.keyed import FormulaKey, positional
from .recipe import Recipe

__all__ = ["OFFLOAD_DEVICES", "PLACEMENTS", "ZERO_SHARDS", "ZERO_STAGES", "ComponentsKey", "StateSpec",
           "check_state_options", "component_key", "component_parts", "components_bytes", "device_of", "elements_per_device",
           "state_specs", "zero_formula"]

ZERO_STAGES = (0, 1, 2, 3)
#: Which component roles each ZeRO stage shards over the data-parallel ranks.
ZERO_SHARDS = {0: (), 1: ("optimizer",), 2: ("optimizer", "grad"), 3: ("optimizer", "grad", "param")}
OFFLOAD_DEVICES = ("none", "cpu", "nvme")
PLACEMENTS = ("article", "zero-offload")


@dataclass(frozen=True)
class StateSpec:
    """One component on one device: ``bytes_per_param`` x the elements it holds
    (:func:`elements_per_device` of ``sharded``). A quantized component (block
    constants, sub-byte storage) or a factored one (Adafactor) has its own
    formula key; ``component`` is the recipe's component."""
    name: str
    role: str
    device: str
    bytes_per_param: int
    sharded: bool
    component: object = field(default=None, compare=False, repr=False)

    @property
    def plain(self) -> bool:
        return self.component is None or self.component.plain

    def key(self, features=None) -> tuple:
        """The :mod:`memledger.formulas` key of its bytes; :attr:`factor` multiplies it."""
        if self.plain:
            return ("elements", self.sharded)
        return component_key((self.component,), ("elements", self.sharded), features)

    @property
    def factor(self) -> int:
        return self.bytes_per_param if self.plain else 1

    def expr(self, exact: bool = True, features=None):
        """Its bytes as a SymPy expression, e.g. 4*ceiling(P/(N_d*t))."""
        if self.plain:
            return self.bytes_per_param * elements_per_device(self.sharded, exact)
        return components_bytes(component_parts((self.component,)), elements_per_device(self.sharded, exact),
                                self.sharded, features, exact)


def component_parts(components) -> tuple:
    """What decides a component's bytes, hashable: (bits, block constants, factored: bytes per element or 0)."""
    return tuple((nbits(c.dtype), c.constants, nbytes(c.dtype) if c.factored else 0) for c in components)


@dataclass(frozen=True)
class ComponentsKey(FormulaKey):
    """The key of quantized or factored recipe components' summed bytes (:func:`components_bytes`): their
    :func:`component_parts`, the key of the element count they are stored for, and the model's features where a
    factored state needs its matrix shapes (else None)."""
    parts: tuple
    count: object
    features: object = None

    def positional(self) -> tuple:
        """``("components", parts, count's positional key)``, then the features' key where given."""
        return ("components", self.parts, positional(self.count)) + (
            self.features.key if self.features is not None else ())


def component_key(components, count_key, features=None) -> ComponentsKey:
    """Formula key of the summed bytes of ``components`` for the element count of ``count_key``."""
    if any(c.factored for c in components) and features is None:
        name = next(c.name for c in components if c.factored)
        raise ValueError(f"{name} needs the matrix shapes: give an architecture")
    parts = component_parts(components)
    return ComponentsKey(parts, count_key, features if any(p[2] for p in parts) else None)


def components_bytes(parts, elements, sharded=False, features=None, exact=True):
    """Bytes of quantized/factored components for ``elements`` parameters: packed data rounded up to
    whole bytes plus one constant per started block; a factored state is rows + columns of each matrix
    (:func:`memledger.models.tensors.factored_elements_expr`), shared like the component."""
    import sympy as sp
    from ..core.symbols import N_d, t
    total = 0
    for bits, constants, factored in parts:
        if factored:
            from ..models.tensors import factored_elements_expr
            share = factored_elements_expr(features) / (t * N_d if sharded else t)
            total += factored * (sp.ceiling(share) if exact else share)
            continue
        total += bits // 8 * elements if bits % 8 == 0 else sp.ceiling(sp.Integer(bits) * elements / 8)
        total += sum(nbytes(c) * sp.ceiling(elements / block) for block, c in constants)
    return total


def elements_per_device(sharded: bool, exact: bool = True):
    """Parameters a device holds of one component: ceil(P/(t*N_d)) if ZeRO shards it,
    else ceil(P/t). ``exact=False`` drops the rounding, as the ZeRO paper writes it."""
    import sympy as sp
    from ..core.symbols import N_d, P, t
    share = P / (t * N_d) if sharded else P / t
    return sp.ceiling(share) if exact else share


def check_state_options(zero_stage, offload_params) -> None:
    """Parameters can be offloaded only when ZeRO-3 partitions them (ZeRO-Infinity)."""
    if offload_params != "none" and zero_stage != 3:
        raise ValueError(f"offload_params needs zero_stage 3 (ZeRO-Infinity), got zero_stage {zero_stage}")


def device_of(role: str, offload_optimizer: str, offload_params: str, placement: str) -> str:
    """Where a component with ZeRO ``role`` lives under the offload settings."""
    if role == "optimizer" and offload_optimizer != "none":
        return offload_optimizer
    if role == "grad" and offload_optimizer != "none" and placement == "zero-offload":
        return "cpu"            # gradients go to host memory, where the optimizer step runs
    if role == "param" and offload_params != "none":
        return offload_params
    return "gpu"


def state_specs(recipe: Recipe, zero_stage: int = 0, offload_optimizer: str = "none",
                offload_params: str = "none", placement: str = "article") -> list:
    """One :class:`StateSpec` per recipe component, per device (GPU rank)."""
    check_choice("zero_stage", zero_stage, ZERO_STAGES)
    check_choice("offload_optimizer", offload_optimizer, OFFLOAD_DEVICES)
    check_choice("offload_params", offload_params, OFFLOAD_DEVICES)
    check_choice("offload_placement", placement, PLACEMENTS)
    check_state_options(zero_stage, offload_params)
    return [StateSpec(c.name, c.role, device_of(c.role, offload_optimizer, offload_params, placement),
                      c.bytes_per_param, c.role in ZERO_SHARDS[zero_stage], c)
            for c in recipe.components]


def zero_formula(recipe: Recipe, zero_stage: int):
    """Per-device model-state bytes as the ZeRO paper writes them (no TP, no rounding):
    e.g. 2P + 2P + 12P/N_d for stage 1 of the 16 B/param recipe."""
    import sympy as sp
    from ..core.symbols import t
    return sp.expand(sum(r.expr(exact=False) for r in state_specs(recipe, zero_stage)).subs(t, 1))
