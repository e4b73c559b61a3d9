"""The op-by-op machinery every timeline shares, without SymPy: a tensor of the table, a reference to another
block's tensor, an op, a program of ops (:mod:`memledger.step.ops` adds the training step's symbolic shapes;
:mod:`memledger.step.prefill` runs this machinery on whole numbers, so ``memledger infer`` never imports SymPy).
"""
from dataclasses import dataclass
from typing import NamedTuple

from ..core.dtypes import nbytes
from .vocab import Action, Device, Kind, Lifetime, OpRole, Scope, Stream

__all__ = ["CAUSAL_MASK", "INPUT_GRADIENT", "Placement", "Program", "ProgramOp", "Ref", "Tensor"]


@dataclass(frozen=True)
class Tensor:
    """One tensor of the step: ``expr`` bytes (SymPy), what it is, how long and where it lives, ``why`` it exists,
    and the CUDA ``stream`` its memory is allocated on (the caching allocator's pool it comes from)."""
    name: str
    expr: object
    kind: Kind
    lifetime: Lifetime
    device: Device = Device.GPU
    why: str = ""
    stream: Stream = Stream.DEFAULT


@dataclass(frozen=True)
class Ref:
    """A tensor a block's program names in another block (or outside the blocks): ``name`` in ``scope``; past the
    blocks' ends (after the last block, before the first) it is ``edge``, the tensor outside them."""
    scope: Scope
    name: str
    edge: str = None


#: The (S, S) causal mask the embedding's program builds once per forward; the blocks share it.
CAUSAL_MASK = Ref(Scope.SHARED, "causal mask")
#: The gradient a block's backward hands to the previous block (before block 0: the embedding output's).
INPUT_GRADIENT = Ref(Scope.PREVIOUS, "dX_out", "grad of the embedding output")


class Placement(NamedTuple):
    """Where the step keeps the gradients backward writes, and where the optimizer step runs (its temporaries)."""
    gradients: Device = Device.GPU
    optimizer: Device = Device.GPU


class ProgramOp(NamedTuple):
    """One op of a program: the tensors (names or :class:`Ref`) its inputs release just before it runs, and
    those it creates; ``role``: what it is, for the transforms that look for it (its label is for display)."""
    label: str
    frees: tuple
    allocs: tuple
    action: Action = Action.RUN
    role: OpRole = None


class Program:
    """A growing list of ops over a table of named tensors, shared by the programs of one step."""

    def __init__(self, tensors: dict, placement: Placement = None):
        self.tensors, self.placement, self.ops = tensors, placement or Placement(), []

    def fork(self) -> "Program":
        """An empty program over the same tensors."""
        return Program(self.tensors, self.placement)

    def new(self, name, shape, dtype, why, kind=Kind.TRANSIENT, device=Device.GPU):
        """Define a temporary (bytes = product of ``shape`` x bytes of ``dtype``) and return its name."""
        size = nbytes(dtype)
        for n in shape:
            size = size * n
        self.tensors[name] = Tensor(name, size, kind, Lifetime.TEMPORARY, device, why)
        return name

    def op(self, label, alloc=(), free=(), action=Action.RUN, role: OpRole = None):
        self.ops.append(ProgramOp(label, tuple(n for n in free if n), tuple(n for n in alloc if n), action, role))
