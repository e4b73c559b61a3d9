"""A precision/optimizer recipe: what a training run keeps for every parameter (the machinery; the
catalog is :mod:`memledger.states.recipes`).

A recipe is a list of per-parameter components (BF16 weights, gradients, FP32
master copy, Adam moments ...). Its bytes/param is the *sum* of its components,
never a typed constant: the article's 16 bytes/param is
2 (BF16 params) + 2 (BF16 grads) + 4 (FP32 master) + 4 (Adam m) + 4 (Adam v).

Each component says how ZeRO treats it (Rajbhandari et al. 2020): ``"param"``
(sharded from stage 3), ``"grad"`` (from stage 2) or ``"optimizer"`` (from
stage 1; the FP32 master copy is optimizer state there, K = 12 for Adam).
"""
from dataclasses import dataclass
from fractions import Fraction
from typing import Optional

from ..core.dtypes import nbits, nbytes
from ..core.vocabulary import Role, State

__all__ = ["ROLES", "Component", "Recipe"]

ROLES = tuple(r.value for r in (Role.PARAM, Role.GRAD, Role.OPTIMIZER))


@dataclass(frozen=True)
class Component:
    """One per-parameter tensor: ``name``, storage ``dtype``, ZeRO ``role``.

    Quantized storage adds per-block constants: ``constants`` is a tuple of
    (elements per constant, constant dtype), e.g. ``((64, "int8"), (16384, "fp32"))``
    for QLoRA's NF4 with double quantization. ``factored`` (Adafactor) keeps a
    matrix's second moment as rows + columns, so its size depends on the shapes. ``state``: which optimizer
    state it is, where the step needs to know (:class:`~memledger.core.vocabulary.State`).
    """
    name: str
    dtype: str
    role: str
    why: str
    constants: tuple = ()
    factored: bool = False
    fp32_below: int = 0     # tensors with fewer elements are kept in fp32 (bitsandbytes' min_8bit_size)
    state: Optional[State] = None

    @property
    def bytes_per_param(self):
        """Bytes per parameter: an int for plain storage, else an exact Fraction
        (bits/8 + constant bytes per block). Factored states count 0 here: their
        rows + columns vanish per parameter for large matrices; see :meth:`bytes_for`."""
        if self.factored:
            return 0
        value = Fraction(nbits(self.dtype), 8) + sum(Fraction(nbytes(c), block) for block, c in self.constants)
        return int(value) if value.denominator == 1 else value

    @property
    def plain(self) -> bool:
        """Whole bytes per parameter, no block constants, not factored."""
        return not (self.constants or self.factored) and nbits(self.dtype) % 8 == 0

    def bytes_for(self, elements):
        """Exact bytes for ``elements`` parameters stored as one tensor (a SymPy
        expression if ``elements`` is one): packed elements rounded up to whole
        bytes, plus one constant per started block. Factored components need
        the shapes: ``ValueError`` (use :func:`memledger.models.tensors.factored_elements_expr`)."""
        if self.factored:
            raise ValueError(f"{self.name} is factored (rows + columns): its size needs the architecture's "
                             "matrix shapes, give an architecture")
        bits = nbits(self.dtype)
        if isinstance(elements, int):                     # plain Python: the command line has no SymPy
            if elements < self.fp32_below:
                return 4 * elements
            return -(-bits * elements // 8) + sum(nbytes(c) * -(-elements // block) for block, c in self.constants)
        import sympy as sp
        data = bits // 8 * elements if bits % 8 == 0 else sp.ceiling(sp.Integer(bits) * elements / 8)
        return data + sum(nbytes(c) * sp.ceiling(sp.sympify(elements) / block) for block, c in self.constants)


@dataclass(frozen=True)
class Recipe:
    """A named precision/optimizer recipe and the source that books it this way; ``fp8_gemms``: its matmuls run
    in FP8 (Transformer Engine or FP8 kernels, :mod:`memledger.states.extra`)."""
    name: str
    title: str
    components: tuple
    source: str
    fp8_gemms: bool = False

    @property
    def bytes_per_param(self) -> int:
        """Sum of the components' bytes per parameter."""
        return sum(c.bytes_per_param for c in self.components)

    def bytes_per_param_sum(self):
        """The sum unevaluated, e.g. ``2 + 2 + 4 + 4 + 4``, for display."""
        import sympy as sp
        return sp.Add(*(sp.Rational(c.bytes_per_param) for c in self.components), evaluate=False)

    def role_bytes(self, role: str):
        """Bytes per parameter of the components with ZeRO ``role``."""
        return sum(c.bytes_per_param for c in self.components if c.role == role)

    def role_bytes_for(self, role: str, elements):
        """Exact bytes of the components with ``role`` for ``elements`` parameters."""
        return sum((c.bytes_for(elements) for c in self.components if c.role == role), 0)

    @property
    def grad_bytes(self):
        """Bytes per parameter of the gradient backward writes (the first gradient component):
        what crosses PCIe to an offloaded optimizer, and what ZeRO-3 gathers with a unit."""
        return self.grad_component.bytes_per_param

    @property
    def grad_component(self) -> Component:
        return next(c for c in self.components if c.role == "grad")

    @property
    def plain(self) -> bool:
        """Every component a whole number of bytes per parameter (no blocks, not factored)."""
        return all(c.plain for c in self.components)
