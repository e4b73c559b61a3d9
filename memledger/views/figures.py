"""Conceptual figures (matplotlib): when each tensor lives, and how the parallel layouts split a run.

Each draws objects the tables use, never typed numbers:

* :func:`block_lifetimes`: one block's tensors on the step's op axis, from a
  :class:`memledger.step.timeline.Step`'s ops: born in the forward pass, read
  and freed by the backward op that needs them (saved) or freed within the
  forward pass (transients).
* :func:`zero_partitions`: what each of N_d GPUs keeps under ZeRO stages 0-3,
  from :class:`memledger.ledger.ledger.Ledger` rows by role.
* :func:`fsdp_schematic`: FSDP2's all-gather and reduce-scatter per unit over
  one step, from an architecture's units (the embedding with the head, and each
  block) and their BF16 sizes. FSDP2 itself is not modelled: a schematic.
* :func:`pipeline_schedules`: 1F1B and interleaved schedules run by
  :func:`memledger.answers.pipeline.run_schedule`, with each stage's chunks in flight.
* :func:`tensor_parallel_split`: a block's projections split over t GPUs
  (Megatron-LM: column- or row-parallel) and its saved tensors per GPU with
  tensor and sequence parallelism (:meth:`memledger.activations.inventory.Saved.rank_bytes`).
* :func:`loss_tensors`: the tensors of the loss phase, op by op, from a step.

Captions live in the chapters; no function sets a title.
"""
from dataclasses import replace

import matplotlib.pyplot as plt
from matplotlib.patches import Rectangle
import numpy as np

from ..activations.inventory import inventory
from ..answers.pipeline import in_flight_chunks, run_schedule
from ..core.units import in_unit
from ..ledger.ledger import Ledger
from ..models.tensors import projections
from .plots import STEP_KINDS, colour

__all__ = ["ROW_PARALLEL", "block_lifetimes", "fsdp_schematic", "fsdp_slots", "fsdp_unsharded", "lifetimes",
           "loss_tensors", "pipeline_schedules", "tensor_parallel_split", "zero_partitions"]

SAVED, TRANSIENT = STEP_KINDS["activation"][1], STEP_KINDS["transient"][1]
#: Megatron-LM's row-parallel projections (the attention output and the MLP's last); the others are column-parallel.
ROW_PARALLEL = ("o_proj", "down_proj")
_GPUS = plt.get_cmap("tab10").colors


def lifetimes(step, layer: int = 1) -> list:
    """(name, bytes, born, freed, saved) of every tensor block ``layer`` creates in the forward pass, with the
    indices of the ops that allocate and free it in ``step.built.ops`` (``saved``: it lives into the backward
    pass, which reads it at the op that frees it)."""
    built = step.built
    size = dict(zip(built.names, (int(b) for b in step.sizes)))
    born, freed = {}, {}
    for i, op in enumerate(built.ops):
        for q in op.allocs:
            if q[0] == layer and op.phase == "forward":
                born.setdefault(q[1], i)
        for q in op.frees:
            if q[0] == layer and q[1] in born:
                freed.setdefault(q[1], i)
    ends = {i for i, op in enumerate(built.ops) if op.phase == "backward" and op.layer == layer}
    out = []
    for name, i in sorted(born.items(), key=lambda kv: kv[1]):
        j = freed.get(name, max(ends))
        if size.get(name):
            out.append((name, size[name], i, j, built.ops[j].phase == "backward"))
    return out


def block_lifetimes(step, layer: int = 1, unit: str = "MiB", ax=None):
    """One block's tensors as bars from the op that creates them to the op that frees them: its forward pass,
    the rest of the step squeezed into a gap, its backward pass; saved tensors orange, transients red."""
    rows = lifetimes(step, layer)
    ops = step.built.ops
    forward = sorted({i for _, _, i, _, _ in rows} | {j for *_, j, s in rows if not s})
    backward = sorted({i for i, op in enumerate(ops) if op.phase == "backward" and op.layer == layer})
    gap = 10
    x = {i: k for k, i in enumerate(forward)}
    x.update({i: len(forward) + gap + k for k, i in enumerate(backward)})
    ax = ax or plt.subplots(figsize=(8, 0.28 * len(rows) + 1.4))[1]
    for y, (_, _, i, j, saved) in enumerate(rows):
        ax.barh(y, x[j] - x[i] + 0.6, left=x[i] - 0.3, color=SAVED if saved else TRANSIENT, height=0.7)
        ax.plot([x[j] + 0.3], [y], marker="|", color="black", markersize=9)
    ax.axvspan(len(forward) - 0.5, len(forward) + gap - 0.5, color="#eeeeee", zorder=0)
    ax.set_yticks(range(len(rows)), [f"{n} ({float(in_unit(b, unit)):.0f} {unit})" for n, b, *_ in rows],
                  fontsize=7)
    ax.invert_yaxis()
    ax.set_xticks([(len(forward) - 1) / 2, len(forward) + (gap - 1) / 2, len(forward) + gap + (len(backward) - 1) / 2],
                  [f"block {layer} forward", "the rest of\nthe step", f"block {layer} backward"],
                  fontsize=8)
    ax.bar([0], [0], color=SAVED, label="saved for backward")
    ax.bar([0], [0], color=TRANSIENT, label="freed in the forward pass")
    ax.plot([], [], marker="|", color="black", linestyle="none", label="read and freed")
    ax.legend(fontsize=8, frameon=False, loc="lower right")
    ax.figure.tight_layout()
    return ax.figure


_ROLES = (("param", "weights"), ("grad", "gradients"), ("optimizer", "optimizer states"))


def zero_partitions(template: Ledger, dp: int = 4, unit: str = "GB", ax=None):
    """Model states per GPU under ZeRO stages 0-3 over ``dp`` GPUs (``template``'s recipe and parameters): one
    bar per GPU, stacked by role; a sharded role is hatched and labelled with the GPU's shard."""
    stages = range(4)
    ax = ax or plt.subplots(figsize=(8, 4.2))[1]
    y = 0
    ticks = []
    whole = replace(template, zero_stage=0, dp=dp).by_role("gpu")
    for stage in stages:
        roles = replace(template, zero_stage=stage, dp=dp).by_role("gpu")
        for gpu in range(dp):
            left = 0.0
            for role, label in _ROLES:
                width = float(in_unit(roles.get(role, 0), unit))
                sharded = roles.get(role, 0) < whole.get(role, 0)
                ax.barh(y, width, left=left, color=colour(label), edgecolor="white", hatch="//" if sharded else None,
                        label=label if (stage, gpu) == (0, 0) else None)
                if sharded and width:
                    ax.text(left + width / 2, y, f"{gpu + 1}/{dp}", ha="center", va="center", fontsize=6,
                            color="white")
                left += width
            y += 1
        ticks.append((y - (dp + 1) / 2, "no ZeRO" if stage == 0 else f"ZeRO-{stage}"))
        y += 1
    ax.set_yticks([t for t, _ in ticks], [label for _, label in ticks])
    ax.invert_yaxis()
    ax.set_xlabel(f"model states per GPU ({unit}), {dp} GPUs, one bar each")
    ax.bar([0], [0], color="white", edgecolor="black", hatch="//", label="sharded: this GPU's part")
    ax.legend(fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure


def fsdp_unsharded(arch, blocks: int = 4, quarter: int = 4):
    """The schematic's unsharded BF16 bytes, sampled ``quarter`` times per slot: (times, parameters, gradients).

    Slots: block i runs forward in [i + 1, i + 2) after its all-gather in [i, i + 1) (prefetched while block
    i - 1 runs); the loss runs in slot ``blocks + 1``; backward runs block ``blocks - 1 - k`` in
    [blocks + 2 + k, blocks + 3 + k), its gather one slot before, its gradients unsharded until their
    reduce-scatter ends one slot after. The root unit (embedding, final norm, head) stays gathered."""
    from ..models.parameters import block_params_expr
    block = 2 * arch.evaluate(block_params_expr(arch.features))
    root = 2 * arch.computed_params - arch.n_layers * block
    end = 2 * blocks + 3
    params = np.full(quarter * end, root, dtype=np.int64)
    grads = np.zeros(quarter * end, dtype=np.int64)
    for s_, backward in fsdp_slots(blocks):
        params[quarter * s_:quarter * (s_ + 2)] += block
        if backward:
            grads[quarter * (s_ + 1):quarter * (s_ + 3)] += block
    return np.arange(quarter * end) / quarter, params, grads


def fsdp_slots(blocks: int) -> list:
    """(slot of the gather, backward?) for each block unit, forward then backward (see :func:`fsdp_unsharded`)."""
    return [(i, False) for i in range(blocks)] + [(blocks + 1 + k, True) for k in range(blocks)]


def fsdp_schematic(arch, blocks: int = 4, unit: str = "GB"):
    """FSDP2 over one step, as a schematic (FSDP2 is not modelled): one row per block unit (``blocks`` of them),
    its all-gather (AG) overlapping the unit before it (prefetch), its forward or backward, and in backward its
    reduce-scatter (RS) overlapping the unit after it; the root unit (embedding, final norm, head) gathered for
    the whole step and computing the loss between the two passes. Below, what is unsharded at each moment
    (:func:`fsdp_unsharded`: ``arch``'s block and root sizes, 2 bytes per parameter)."""
    end = 2 * blocks + 3
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(8.5, 4.6), height_ratios=(3, 1.4))
    top.add_patch(Rectangle((0, -0.35), end, 0.7, facecolor="#dddddd"))
    top.add_patch(Rectangle((blocks + 1, -0.35), 1, 0.7, facecolor=STEP_KINDS["transient"][1]))
    top.text(blocks / 2 + 0.5, 0, "root unit: gathered for the whole step", ha="center", va="center", fontsize=7)
    top.text(blocks + 1.5, 0, "loss", ha="center", va="center", fontsize=7, color="white")
    for (s_, backward), u in zip(fsdp_slots(blocks), list(range(blocks)) + list(range(blocks - 1, -1, -1))):
        y = u + 1
        top.add_patch(Rectangle((s_ + 0.05, y - 0.35), 0.9, 0.7, facecolor=_GPUS[0]))
        top.text(s_ + 0.5, y, "AG", ha="center", va="center", fontsize=7, color="white")
        top.add_patch(Rectangle((s_ + 1, y - 0.35), 1, 0.7, facecolor=STEP_KINDS["grad" if backward
                                                                                   else "activation"][1]))
        top.text(s_ + 1.5, y, "bwd" if backward else "fwd", ha="center", va="center", fontsize=7)
        if backward:
            top.add_patch(Rectangle((s_ + 2.05, y - 0.35), 0.9, 0.7, facecolor=_GPUS[1]))
            top.text(s_ + 2.5, y, "RS", ha="center", va="center", fontsize=7, color="white")
    top.set_yticks(range(blocks + 1), ["root"] + [f"block {i}" for i in range(blocks)], fontsize=8)
    top.set_ylim(blocks + 0.6, -0.6)
    t, params, grads = fsdp_unsharded(arch, blocks)
    bottom.stackplot(t, [float(in_unit(int(b), unit)) for b in params], [float(in_unit(int(b), unit)) for b in grads],
                     colors=(_GPUS[0], STEP_KINDS["grad"][1]), step="post",
                     labels=("gathered BF16 parameters", "unsharded BF16 gradients"))
    bottom.set_ylabel(f"unsharded ({unit})", fontsize=8)
    bottom.legend(fontsize=7, frameon=False, loc="upper left")
    for ax in (top, bottom):
        ax.set_xlim(0, end)
        ax.set_xticks([(blocks + 1) / 2, blocks + 1.5, blocks + 2 + (blocks + 1) / 2], ["forward", "loss", "backward"],
                      fontsize=8)
    fig.tight_layout()
    return fig


def pipeline_schedules(p: int = 4, m: int = 8, interleave: int = 2, forward=1, backward=2):
    """1F1B and the interleaved schedule with ``interleave`` chunks, run by
    :func:`memledger.answers.pipeline.run_schedule`: one Gantt row per stage, each box a micro-batch's forward
    (light) or backward (dark) in that micro-batch's colour; beside each, the stage's chunks in flight over
    time, whose maximum is :func:`memledger.answers.pipeline.in_flight_chunks`."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 4.6), width_ratios=(3, 1))
    runs = {v: run_schedule(p, m, v, forward, backward) for v in (1, interleave)}
    end = max(float(e) for ops in runs.values() for *_, e in ops)
    for row, (v, ops) in zip(axes, runs.items()):
        gantt, flight = row
        for rank, kind, micro, _, start, stop in ops:
            c = _GPUS[micro % len(_GPUS)]
            gantt.add_patch(Rectangle((float(start), rank - 0.4), float(stop - start), 0.8, facecolor=c,
                                      alpha=0.45 if kind == "F" else 1.0, edgecolor="white", linewidth=0.5))
            gantt.text(float(start + stop) / 2, rank, str(micro + 1), ha="center", va="center", fontsize=5)
        gantt.set_xlim(0, end)
        gantt.set_ylim(p - 0.5, -0.5)
        gantt.set_yticks(range(p), [f"stage {r}" for r in range(p)], fontsize=8)
        gantt.set_ylabel("1F1B" if v == 1 else f"interleaved, {v} chunks", fontsize=8)
        times = np.linspace(0, end, 400)
        for rank in range(p):
            starts = np.array([float(s) for r, k, _, _, s, _ in ops if r == rank and k == "F"])
            ends = np.array([float(e) for r, k, _, _, _, e in ops if r == rank and k == "B"])
            held = [(starts <= t).sum() - (ends <= t).sum() for t in times]       # activations: forward to backward
            flight.plot(times, held, color=_GPUS[rank % len(_GPUS)], linewidth=1, label=f"stage {rank}")
            flight.axhline(in_flight_chunks(p, m, v, rank), color=_GPUS[rank % len(_GPUS)], linestyle=":",
                           linewidth=0.6)
        flight.set_ylabel("chunks in flight", fontsize=8)
        flight.set_ylim(bottom=0)
    axes[1, 0].set_xlabel("time (a micro-batch's forward = 1, its backward = 2)", fontsize=8)
    axes[0, 1].legend(fontsize=6, frameon=False, loc="upper right")
    fig.tight_layout()
    return fig


def tensor_parallel_split(ledger: Ledger, t: int = 4, unit: str = "MiB"):
    """Left: the block's projections (``ledger``'s architecture), each drawn input width by output height, split
    over ``t`` GPUs along the output (column-parallel) or, for :data:`ROW_PARALLEL`, along the input, one colour
    per GPU. Right: what one layer saves per GPU, row by row, on
    one GPU, with tensor parallelism and with sequence parallelism too."""
    arch = ledger.arch
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4.4), width_ratios=(1.2, 1))
    shapes = projections(arch.features)
    x = 0.0
    for name, (out, inp) in shapes.items():
        w, h = arch.evaluate(inp) / arch.d_model, arch.evaluate(out) / arch.d_model
        rows_split = name in ROW_PARALLEL
        for g in range(t):
            piece = (x + g * w / t, 0, w / t, h) if rows_split else (x, h - (g + 1) * h / t, w, h / t)
            left.add_patch(Rectangle(piece[:2], *piece[2:], facecolor=_GPUS[g], edgecolor="white", linewidth=0.6))
        left.text(x + w / 2, -0.15, name, ha="center", va="top", fontsize=7, rotation=90)
        x += w + 0.4
    left.set_xlim(-0.2, x)
    left.set_ylim(-1.3, max(arch.evaluate(o) for o, _ in shapes.values()) / arch.d_model + 0.2)
    left.set_aspect("equal")
    left.axis("off")
    left.text(0, left.get_ylim()[1], "input width \u2192, output height \u2191 (units of d); one colour per GPU",
              fontsize=7, va="bottom")
    rows = inventory(arch.mlp, arch.norm, dropout=ledger.dropout, attention_dropout=arch.attention_dropout)
    values = {**ledger.values, "t": t}
    sizes = [[float(in_unit(_value(r.rank_bytes(tp, sp_), values), unit)) for tp, sp_ in
              ((False, False), (True, False), (True, True))] for r in rows]
    y = np.arange(len(rows))
    for k, (label, colour_) in enumerate((("one GPU", "#bbbbbb"), (f"tensor parallel, t = {t}", _GPUS[0]),
                                          ("+ sequence parallel", _GPUS[2]))):
        right.barh(y + (k - 1) * 0.27, [s[k] for s in sizes], height=0.27, color=colour_, label=label)
    right.set_yticks(y, [r.name for r in rows], fontsize=7)
    right.invert_yaxis()
    right.set_xlabel(f"saved per layer and GPU ({unit})", fontsize=8)
    right.legend(fontsize=7, frameon=False, loc="lower right")
    fig.tight_layout()
    return fig


def _value(expr, values) -> int:
    from ..core.exact import evaluate_expr
    return evaluate_expr(expr, values)


def loss_tensors(step, unit: str = "GB", ax=None):
    """The loss phase op by op: every tensor it creates (the logits, their FP32 copy, the log-softmax, the
    gradients flowing back) and the final norm's and LM head's inputs, stacked as live after each op."""
    built = step.built
    size = dict(zip(built.names, (int(b) for b in step.sizes * built.gpu)))
    loss_ops = [i for i, op in enumerate(built.ops) if op.phase == "loss"]
    names = []
    for i in loss_ops:
        for q in built.ops[i].allocs:
            if q[0] is None and size.get(q[1]) and q[1] not in names and not q[1].startswith("grad "):
                names.append(q[1])
    samples = [k for k, i in enumerate(built.compiled.ops) if i in set(loss_ops)]
    labels = [built.ops[built.compiled.ops[k]].label for k in samples]
    live = [{name for layer, name in built.compiled.live[k] if layer is None} for k in samples]
    names = [n for n in ["final LayerNorm input", "final RMSNorm input"] if n in size] + names
    ax = ax or plt.subplots(figsize=(8.5, 4))[1]
    bottom = np.zeros(len(samples))
    cmap = plt.get_cmap("tab20").colors
    for j, name in enumerate(names):
        heights = np.array([float(in_unit(size[name], unit)) if name in s else 0.0 for s in live])
        if heights.any():
            ax.bar(range(len(samples)), heights, bottom=bottom, color=cmap[j % len(cmap)], label=name,
                   edgecolor="white", linewidth=0.4)
            bottom += heights
    ax.set_xticks(range(len(samples)), labels, rotation=60, ha="right", fontsize=7)
    ax.set_ylabel(f"live tensors of the loss ({unit})")
    ax.legend(fontsize=7, frameon=False, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.figure.tight_layout()
    return ax.figure
