"""Assembling one step's programs into a flat list of ops, and running it with numbers.

:mod:`memledger.step.ops` and :mod:`memledger.step.outer` write one block and
the parts outside the blocks. Here they are laid end to end for L blocks:
forward (embedding, blocks 0..L-1, final norm and loss), backward (the loss,
blocks L-1..0, the embedding) and the optimizer step. A tensor is named
``(layer, name)`` (``layer`` None outside the blocks).

All blocks run the same program, so at any op of block i the total is
``T + i*A + local`` (A: what one block adds), linear in i: its largest value
over the middle blocks is at block 1 or block L-2. Blocks 0, 1, L-2 and L-1
are therefore run op by op and blocks 2..L-3 as one lump, which keeps the
program the same length for any L and the peak exact. Block 0 may run a program of its own
(:class:`FirstBlock`): it is always run op by op, so the middle blocks stay linear in i.
"""
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from .ops import Ref, residual_names
from .vocab import Action, Kind, Lifetime, OpRole, Phase, Scope

__all__ = ["GRADIENT_LUMP", "LUMP", "SAVED_LUMP", "Compiled", "FirstBlock", "Op", "Part", "explicit_layers",
           "flatten"]

#: The ``layer`` of the ops that stand for blocks 2..L-3 at once, and the two tensors that stand for theirs.
LUMP = "2..L-3"
SAVED_LUMP = "saved tensors of blocks 2..L-3"
GRADIENT_LUMP = "gradients of blocks 2..L-3"


class Part(StrEnum):
    """The programs outside the blocks."""
    FORWARD_START = "forward start"       # the causal mask, the embedding
    FORWARD_END = "forward end"           # the final norm, the LM head, the loss
    BACKWARD_START = "backward start"     # back through the loss, the LM head, the final norm
    BACKWARD_END = "backward end"         # the embedding's backward

    @property
    def backward(self) -> bool:
        return self in (Part.BACKWARD_START, Part.BACKWARD_END)


@dataclass(frozen=True)
class Op:
    """One op of the whole step: its tensors qualified as ``(layer, name)`` (``layer`` None outside the blocks)."""
    phase: Phase
    layer: object          # block index, None, or LUMP
    label: str
    frees: tuple
    allocs: tuple
    action: Action = Action.RUN
    role: object = None     # an OpRole (memledger.step.vocab): what the op is, for the transforms that find it


class FirstBlock(NamedTuple):
    """Block 0's own forward and backward programs, where its program differs from the others' (LitGPT's LoRA model:
    the embedding's output needs no gradient, so its first layer saves nothing before its first adapter)."""
    forward: list
    backward: list


def explicit_layers(n_layers):
    """The blocks run op by op: all when L <= 4, else 0, 1, L-2, L-1 (the rest is one lump)."""
    return list(range(n_layers)) if n_layers <= 4 else [0, 1, n_layers - 2, n_layers - 1]


def _qualify(name, layer, n_layers):
    """``(layer, name)`` of a name a program uses in block ``layer`` (None: outside the blocks); None for a shared
    tensor named by a block other than its last user, block 0, and past the blocks' ends where a :class:`Ref` has
    no ``edge`` (nothing there)."""
    if not isinstance(name, Ref):
        return (layer, name)
    scope, n = name.scope, name.name
    if scope is Scope.NEXT:
        return (layer + 1, n) if layer + 1 < n_layers else ((None, name.edge) if name.edge else None)
    if scope is Scope.PREVIOUS:
        return (layer - 1, n) if layer > 0 else ((None, name.edge) if name.edge else None)
    if scope is Scope.SHARED:
        return (None, n) if layer == 0 else None
    if scope is Scope.NOT_FIRST:
        return (layer, n) if layer > 0 else None
    return (0, n) if scope is Scope.FIRST else (n_layers - 1, n)


def flatten(n_layers: int, c, outside: dict, fwd, bwd, optimizer, lump=None, first: FirstBlock = None) -> list:
    """The step's ops: ``outside`` maps each :class:`Part` to its ops; ``fwd``/``bwd`` one block's, ``optimizer``
    the optimizer step's; ``lump(phase, n_layers)``: (frees, allocs) a framework adds to the lumped blocks' op
    (:mod:`memledger.step.fsdp2`); ``first``: block 0's own programs (:class:`FirstBlock`), else it runs ``fwd`` and
    ``bwd`` as every block does."""
    ops = []
    extra = lump or (lambda phase, n: ((), ()))

    def add(phase, layer, program):
        for op in program:
            q = [_qualify(n, layer, n_layers) for n in op.frees]
            a = [_qualify(n, layer, n_layers) for n in op.allocs]
            ops.append(Op(phase, layer, op.label, tuple(n for n in q if n), tuple(n for n in a if n), op.action,
                          op.role))

    def outside_ops(part, phase):
        add(phase, None, outside[part])

    def landmark(phase, name, role=None):
        ops.append(Op(phase, None, name, (), (), Action.LANDMARK, role))

    layers = explicit_layers(n_layers)
    x = residual_names(c)[0]
    outside_ops(Part.FORWARD_START, Phase.FORWARD)
    first = first or FirstBlock(fwd, bwd)
    for i in layers:
        add(Phase.FORWARD, i, first.forward if i == 0 else fwd)
        if i == 1 and n_layers > 4:
            frees, allocs = extra(Phase.FORWARD, n_layers)
            ops.append(Op(Phase.FORWARD, LUMP, "blocks 2 to L-3", ((2, x),) + frees,
                          ((None, SAVED_LUMP), (n_layers - 2, x)) + allocs))
    outside_ops(Part.FORWARD_END, Phase.LOSS)
    landmark(Phase.LOSS, "after forward")
    outside_ops(Part.BACKWARD_START, Phase.LOSS)
    for i in reversed(layers):
        add(Phase.BACKWARD, i, first.backward if i == 0 else bwd)
        if i == n_layers - 2 and n_layers > 4:
            frees, allocs = extra(Phase.BACKWARD, n_layers)
            ops.append(Op(Phase.BACKWARD, LUMP, "blocks L-3 to 2", ((None, SAVED_LUMP),
                          (n_layers - 3, "dX_out")) + frees, ((None, GRADIENT_LUMP), (1, "dX_out")) + allocs))
    outside_ops(Part.BACKWARD_END, Phase.BACKWARD)
    landmark(Phase.BACKWARD, "after backward")
    add(Phase.OPTIMIZER, None, optimizer)
    landmark(Phase.OPTIMIZER, "after step", OpRole.OPTIMIZER_STEP_DONE)
    return ops


class Compiled:
    """The step's op list, run once without numbers: after every op, how many of each tensor are live
    (``static``: the ``(layer, name)`` live the whole step; ``tensors``: the table, for their kinds).

    ``counts[k, j]``: copies of tensor ``names[j]`` (a name of the tensor table; several blocks' tensors
    of the same name add up) live after sample k; ``ops[k]``: the op of sample k; ``mark_counts``: the counts
    at each landmark. The total after op k is ``counts[k] @ sizes`` for any numbers.
    """

    def __init__(self, ops, static, tensors):
        import numpy as np
        live = {n: True for n in static}
        rows, self.ops, self.live, marks = [], [], [], {}
        collected = ()

        def snapshot():
            counts = {}
            for q in live:
                counts[q[1]] = counts.get(q[1], 0) + 1
            return counts

        def gradients():
            return [n for n in live if tensors[n[1]].kind is Kind.GRAD and tensors[n[1]].lifetime is not Lifetime.STEP]
        marks["before forward"] = snapshot()
        for index, op in enumerate(ops):
            if op.action is Action.LANDMARK:
                marks[op.label] = snapshot()
                continue
            if op.action is Action.COLLECT_GRADIENTS:
                collected = tuple(gradients())
                continue
            if op.action is Action.RELEASE_GRADIENTS:
                for n in gradients():
                    del live[n]
            if op.action is Action.FREE_COLLECTED_GRADIENTS:
                for n in collected:
                    del live[n]
            for n in op.frees:
                del live[n]
            for n in op.allocs:
                if n in live:
                    raise ValueError(f"{n} allocated twice")
                live[n] = True
            rows.append(snapshot())
            self.ops.append(index)
            self.live.append(tuple(live))
        self.names = sorted({n for r in rows + list(marks.values()) for n in r})
        position = {n: j for j, n in enumerate(self.names)}

        def matrix(snapshots):
            out = np.zeros((len(snapshots), len(self.names)), dtype=np.int64)
            for k, r in enumerate(snapshots):
                for n, m in r.items():
                    out[k, position[n]] = m
            return out
        self.counts = matrix(rows)
        self.mark_counts = dict(zip(marks, matrix(list(marks.values()))))
