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
program the same length for any L and the peak exact.
"""
from dataclasses import dataclass

from .ops import io_names
from .outer import final_input

FORWARD, LOSS, BACKWARD, OPTIMIZER = "forward", "loss", "backward", "optimizer"


@dataclass(frozen=True)
class Op:
    phase: str
    layer: object          # block index, None, or "2..L-3" for the lump
    label: str
    frees: tuple           # qualified names
    allocs: tuple


def explicit_layers(n_layers):
    """The blocks run op by op: all when L <= 4, else 0, 1, L-2, L-1 (the rest is one lump)."""
    return list(range(n_layers)) if n_layers <= 4 else [0, 1, n_layers - 2, n_layers - 1]


def _qualify(name, layer, n_layers, c):
    if name.startswith("next: "):
        return (layer + 1, name[6:]) if layer + 1 < n_layers else (None, final_input(c))
    if name.startswith("prev: "):
        return (layer - 1, name[6:]) if layer > 0 else (None, "grad of the embedding output")
    if name.startswith("@causal mask"):
        return (None, "causal mask") if layer == 0 else None
    return (layer, name)


def _outside(name, n_layers):
    if name.startswith("first: "):
        return (0, name[7:])
    if name.startswith("last: "):
        return (n_layers - 1, name[6:])
    return (None, name)


def flatten(n_layers: int, c, outside: dict, fwd, bwd, lumps: dict) -> list:
    """The step's ops: ``outside`` maps "forward start" etc. to op lists; ``fwd``/``bwd`` one block's;
    ``lumps`` names the two lump tensors ("saved", "grads") of blocks 2..L-3."""
    ops = []

    def add(phase, layer, program, qualify):
        for label, frees, allocs in program:
            q = [qualify(n) for n in frees]
            ops.append(Op(phase, layer, label, tuple(n for n in q if n), tuple(qualify(n) for n in allocs)))

    def outside_ops(key, phase):
        add(phase, None, outside[key], lambda n: _outside(n, n_layers))

    layers = explicit_layers(n_layers)
    x = io_names(c)[0]
    outside_ops("forward start", FORWARD)
    for i in layers:
        add(FORWARD, i, fwd, lambda n, i=i: _qualify(n, i, n_layers, c))
        if i == 1 and n_layers > 4:
            ops.append(Op(FORWARD, f"2..{n_layers - 3}", "blocks 2 to L-3", ((2, x),),
                          ((None, lumps["saved"]), (n_layers - 2, x))))
    outside_ops("forward end", LOSS)
    ops.append(Op(LOSS, None, "@landmark after forward", (), ()))
    outside_ops("backward start", LOSS)
    for i in reversed(layers):
        add(BACKWARD, i, bwd, lambda n, i=i: _qualify(n, i, n_layers, c))
        if i == n_layers - 2 and n_layers > 4:
            ops.append(Op(BACKWARD, f"{n_layers - 3}..2", "blocks L-3 to 2", ((None, lumps["saved"]),
                          (n_layers - 3, "dX_out")), ((None, lumps["grads"]), (1, "dX_out"))))
    outside_ops("backward end", BACKWARD)
    ops.append(Op(BACKWARD, None, "@landmark after backward", (), ()))
    outside_ops("optimizer", OPTIMIZER)
    ops.append(Op(OPTIMIZER, None, "@landmark after step", (), ()))
    return ops


class Compiled:
    """The step's op list, run once without numbers: after every op, how many of each tensor are live.

    ``counts[k, j]``: copies of tensor ``names[j]`` (a name of the tensor table; several blocks' tensors
    of the same name add up) live after sample k; ``ops[k]``: the op of sample k; ``marks``: the counts
    at each landmark. The total after op k is ``counts[k] @ sizes`` for any numbers.
    """

    def __init__(self, ops, static, kinds):
        import numpy as np
        live = {n: True for n in static}
        rows, self.ops, self.live, self.marks = [], [], [], {}
        collected = ()

        def snapshot():
            counts = {}
            for q in live:
                counts[q[1]] = counts.get(q[1], 0) + 1
            return counts
        self.marks["before forward"] = snapshot()
        for index, op in enumerate(ops):
            if op.label.startswith("@landmark "):
                self.marks[op.label[10:]] = snapshot()
                continue
            if op.label == "@collect gradients":
                collected = tuple(n for n in live if kinds.get(n) == "grad")
                continue
            if op.label == "@release gradients":
                for n in [n for n in live if kinds.get(n) == "grad"]:
                    del live[n]
            for n in op.frees:
                if n == (None, "@gradients"):
                    for g in collected:
                        live.pop(g, None)
                else:
                    del live[n]
            for n in op.allocs:
                if n in live:
                    raise ValueError(f"{n} allocated twice")
                live[n] = True
            rows.append(snapshot())
            self.ops.append(index)
            self.live.append(tuple(live))
        self.names = sorted({n for r in rows + list(self.marks.values()) for n in r})
        position = {n: j for j, n in enumerate(self.names)}
        self.counts = np.zeros((len(rows), len(self.names)), dtype=np.int64)
        for k, r in enumerate(rows):
            for n, m in r.items():
                self.counts[k, position[n]] = m
        self.mark_counts = {}
        for key, r in self.marks.items():
            vector = np.zeros(len(self.names), dtype=np.int64)
            for n, m in r.items():
                vector[position[n]] = m
            self.mark_counts[key] = vector


def qualified_tensors(ops, static) -> set:
    names = set(static)
    for op in ops:
        names.update(op.frees)
        names.update(op.allocs)
    return names
