"""Precision/optimizer recipes: what a training run keeps for every parameter.

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

from .choices import lookup
from .dtypes import nbits, nbytes

ROLES = ("param", "grad", "optimizer")


@dataclass(frozen=True)
class Component:
    """One per-parameter tensor: ``name``, storage ``dtype``, ZeRO ``role``.

    Quantized storage adds per-block constants: ``constants`` is a tuple of
    (elements per constant, constant dtype), e.g. ``((64, "int8"), (16384, "fp32"))``
    for QLoRA's NF4 with double quantization. ``factored`` (Adafactor) keeps a
    matrix's second moment as rows + columns, so its size depends on the shapes.
    """
    name: str
    dtype: str
    role: str
    why: str
    constants: tuple = ()
    factored: bool = False
    fp32_below: int = 0     # tensors with fewer elements are kept in fp32 (bitsandbytes' min_8bit_size)

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
        the shapes: ``ValueError`` (use :func:`memledger.tensors.factored_elements_expr`)."""
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
    """A named precision/optimizer recipe and the source that books it this way."""
    name: str
    title: str
    components: tuple
    source: str

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


_PARAMS = Component("BF16 parameters", "bf16", "param", "the working weights forward and backward read")
_GRADS = Component("BF16 gradients", "bf16", "grad", "dLoss/dtheta, one per parameter, written by backward")
_MASTER = Component("FP32 master weights", "fp32", "optimizer",
                    "BF16 has 7 fraction bits: small updates round away without an FP32 copy")
_ADAM_M = Component("Adam first moment m", "fp32", "optimizer", "running mean of gradients")
_ADAM_V = Component("Adam second moment v", "fp32", "optimizer", "running mean of squared gradients")

RECIPES = {r.name: r for r in [
    Recipe("bf16-adamw", "BF16 mixed precision + AdamW (16 B/param)",
           (_PARAMS, _GRADS, _MASTER, _ADAM_M, _ADAM_V),
           "the article; ZeRO (Rajbhandari et al. 2020, K = 12); EleutherAI Transformer Math 101"),
    Recipe("bf16-adamw-fp32-grads", "BF16 mixed precision + AdamW, FP32 gradients (18 B/param)",
           (_PARAMS, Component("FP32 gradients", "fp32", "grad", "gradients kept/accumulated in FP32"),
            _MASTER, _ADAM_M, _ADAM_V),
           "HF 'model memory anatomy'; Bekman, ML Engineering; Megatron-LM without distributed optimizer"),
    Recipe("bf16-adamw-fp32-accum", "BF16 mixed precision + AdamW + FP32 grad accumulation (20 B/param)",
           (_PARAMS, _GRADS, Component("FP32 gradient accumulator", "fp32", "grad",
                                       "sums micro-batch gradients in FP32"),
            _MASTER, _ADAM_M, _ADAM_V),
           "HF Ultra-Scale Playbook (FP32 gradient accumulation)"),
    Recipe("fp32-adamw", "pure FP32 + AdamW (16 B/param, no master copy needed)",
           (Component("FP32 parameters", "fp32", "param", "the weights are their own master copy"),
            Component("FP32 gradients", "fp32", "grad", "dLoss/dtheta in FP32"),
            _ADAM_M, _ADAM_V),
           "EleutherAI Transformer Math 101"),
    Recipe("bf16-pure-adamw", "pure BF16 + AdamW, no master copy (8 B/param)",
           (_PARAMS, _GRADS,
            Component("Adam first moment m (BF16)", "bf16", "optimizer",
                      "torch.optim.AdamW keeps its moments in the parameters' dtype (zeros_like(p))"),
            Component("Adam second moment v (BF16)", "bf16", "optimizer", "likewise, in BF16")),
           "torch/optim/adam.py, Adam._init_group: exp_avg, exp_avg_sq = torch.zeros_like(p); docs/step.md"),
    Recipe("bf16-sgd-momentum", "BF16 mixed precision + SGD with momentum (12 B/param)",
           (_PARAMS, _GRADS, _MASTER, Component("SGD momentum", "fp32", "optimizer", "running gradient average")),
           "EleutherAI Transformer Math 101 (8 B of optimizer state: master + momentum)"),
    Recipe("bf16-adam-8bit", "BF16 mixed precision + 8-bit Adam (10 B/param)",
           (_PARAMS, _GRADS, _MASTER,
            Component("Adam m (8-bit)", "int8", "optimizer", "block-quantized first moment"),
            Component("Adam v (8-bit)", "int8", "optimizer", "block-quantized second moment")),
           "Dettmers et al. 2022, 8-bit optimizers; Transformer Math 101 (6 B of optimizer state)"),
]}
DEFAULT_RECIPE = "bf16-adamw"

from .recipes_extra import EXTRA_RECIPES  # noqa: E402  (they are built from Component and Recipe above)

#: The recipes people fine-tune and train with beyond the article's (:mod:`memledger.recipes_extra`):
#: kept apart so that :data:`RECIPES` stays the article's table the chapters print.
FINETUNE_RECIPES = {r.name: r for r in EXTRA_RECIPES}
#: Every recipe a ledger, the CLI and :func:`get_recipe` accept.
ALL_RECIPES = {**RECIPES, **FINETUNE_RECIPES}


def get_recipe(name: str) -> Recipe:
    """The recipe called ``name``; ``ValueError`` listing the known ones otherwise."""
    return lookup(ALL_RECIPES, name, "recipe")
