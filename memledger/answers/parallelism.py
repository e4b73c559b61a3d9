"""One run on N GPUs, several ways: what each parallel layout keeps per GPU and what it sends per step.

A layout is a ledger with its parallel settings (:class:`memledger.ledger.ledger.Ledger`:
``dp`` and ``zero_stage``, ``tp`` and ``sequence_parallel``), or the first stage
of a pipeline (:func:`memledger.answers.pipeline.stage_ledgers`), plus the bytes each GPU
sends per step (:mod:`memledger.answers.communication`) at the recipe's storage types:
gradients at the recipe's gradient bytes, gathered parameters at its parameter
bytes, activations and their gradients at 2 bytes (BF16).

ZeRO-3 keeps only a shard of every parameter; before a block runs, forward or
backward, its parameters are all-gathered into full tensors, and the gradients
it produces are reduce-scattered back into shards (Rajbhandari et al. 2020,
Sec. 5.3 and 7.2.2). For at least one block at a time a GPU therefore holds the
block's full parameters and gradients: :func:`gather_buffer_bytes` books that
smallest buffer, (parameter bytes + gradient bytes) x the largest module that is
gathered at once (a block or the embedding), the 4 bytes per parameter of the largest
layer that DeepSpeed's ``estimate_zero3_model_states_mem_needs`` books
(``deepspeed/runtime/zero/stage3.py``). Real runs prefetch more
(DeepSpeed's ``stage3_prefetch_bucket_size``, ``stage3_max_live_parameters``).
"""
from dataclasses import dataclass, replace

import sympy as sp

from .communication import pipeline_elements, ring_elements, tensor_parallel_elements
from ..formulas import evaluate
from ..models.features import ModelKey
from ..core.exact import evaluate_expr
from ..ledger.ledger import Ledger
from ..states.recipes import RECIPES
from ..core.symbols import N_d, P

__all__ = ["ACTIVATION_BYTES", "Layout", "gather_buffer_bytes", "layout_table", "layouts", "pipeline_sent_bytes",
           "tensor_sent_bytes", "zero_sent_bytes"]

ACTIVATION_BYTES = 2      # activations and their gradients travel in BF16


@dataclass(frozen=True)
class Layout:
    """One way to split a run: ``gpu_bytes`` per GPU (the ledger's GPU total; the first stage's for a
    pipeline), ``transient_bytes`` held on top while a block is gathered (ZeRO-3), ``sent_bytes`` each
    GPU sends ``per`` optimizer step or micro-batch, and ``how`` it sends them."""
    name: str
    splits: str
    gpu_bytes: int
    transient_bytes: int
    sent_bytes: int
    per: str
    how: str


def gather_buffer_bytes(ledger: Ledger) -> int:
    """ZeRO-3's smallest gather buffer: one largest module's full parameters and gradients,
    (param bytes + grad bytes) x ceil(max(block, V*d)/t); 0 below stage 3 or without an architecture."""
    if ledger.zero_stage < 3 or ledger.arch is None:
        return 0
    recipe = RECIPES[ledger.recipe]
    unit = evaluate(ModelKey("largest unit", ledger.arch.features), ledger.values)
    return (recipe.role_bytes("param") + recipe.grad_bytes) * unit


def zero_sent_bytes(ledger: Ledger) -> int:
    """Bytes one data-parallel rank sends per step: the gradients reduce-scattered at the gradient
    bytes, the parameters all-gathered at the parameter bytes (twice at stage 3, forward and backward);
    plain data parallelism's all-reduce is the same reduce-scatter plus all-gather."""
    recipe = RECIPES[ledger.recipe]
    scatter = ring_elements("reduce-scatter", P, N_d) * recipe.grad_bytes
    gathers = 2 if ledger.zero_stage == 3 else 1
    expr = scatter + gathers * ring_elements("all-gather", P, N_d) * recipe.role_bytes("param")
    return evaluate_expr(sp.ceiling(expr), ledger.values)


def tensor_sent_bytes(ledger: Ledger) -> int:
    """Bytes one tensor-parallel rank sends per micro-batch: four all-reduces of B*S*d per layer
    (or as many reduce-scatter + all-gather pairs with sequence parallelism), in BF16."""
    expr = tensor_parallel_elements(ledger.sequence_parallel) * ACTIVATION_BYTES
    return evaluate_expr(sp.ceiling(expr), ledger.values)


def pipeline_sent_bytes(ledger: Ledger) -> int:
    """Bytes an inner pipeline stage sends per micro-batch: 2*B*S*d, an activation forward and its
    gradient backward, in BF16 (times m micro-batches per step)."""
    expr = pipeline_elements(ledger.sequence_parallel) * ACTIVATION_BYTES
    return evaluate_expr(sp.ceiling(expr), dict(ledger.values, m=1))


def layouts(template: Ledger, n_gpus: int, microbatches: int) -> list:
    """``template`` (one GPU's setup: model, micro-batch, sequence, recipe) on ``n_gpus`` GPUs, split
    by data parallelism (ZeRO stages 0-3), tensor parallelism (with and without sequence
    parallelism) and a 1F1B pipeline of ``microbatches`` micro-batches per step."""
    from .pipeline import stage_ledgers
    if template.dp != 1 or template.tp != 1 or template.zero_stage != 0:
        raise ValueError("layouts needs a one-GPU template: dp 1, tp 1, zero_stage 0")
    out = []
    data = ("the batch only: each GPU holds the whole model", "+ the optimizer states", "+ the gradients",
            "+ the parameters")
    for stage, splits in enumerate(data):
        ledger = replace(template, dp=n_gpus, zero_stage=stage)
        how = "all-reduce of the gradients" if stage == 0 else (
            "reduce-scatter gradients, all-gather parameters" + (" twice" if stage == 3 else ""))
        out.append(Layout("data parallel" if stage == 0 else f"ZeRO-{stage}", splits, ledger.totals["gpu"],
                          gather_buffer_bytes(ledger), zero_sent_bytes(ledger), "step", how))
    for sp_on in (False, True):
        ledger = replace(template, tp=n_gpus, sequence_parallel=sp_on)
        out.append(Layout("tensor + sequence parallel" if sp_on else "tensor parallel",
                          "+ the other activations, along the sequence" if sp_on else
                          "each layer's matrices, and the activations inside attention and the MLP",
                          ledger.totals["gpu"], 0, tensor_sent_bytes(ledger), "micro-batch",
                          "reduce-scatter + all-gather, 4 per layer" if sp_on else "all-reduce, 4 per layer"))
    first = stage_ledgers(template, n_gpus, microbatches)[0]
    out.append(Layout(f"pipeline (1F1B, {microbatches} micro-batches)", "the layers (the first stage shown)",
                      first["totals"]["gpu"], 0, pipeline_sent_bytes(template), "micro-batch",
                      "point-to-point to the neighbouring stages"))
    return out


def layout_table(rows, unit: str = "GB"):
    """The layouts as a :class:`~memledger.core.table.Table`."""
    from ..core.table import Table
    from ..core.units import format_bytes, in_unit

    def size(n):
        return format_bytes(n, unit, 2 if in_unit(n, unit) >= 1 else 3)
    return Table(("layout", "splits", "per GPU", "ZeRO-3 gathered block", "sent per GPU", "how"),
                 [(r.name, r.splits, format_bytes(r.gpu_bytes, unit, 1), size(r.transient_bytes) if r.transient_bytes
                   else "", f"{size(r.sent_bytes)} per {r.per}", r.how) for r in rows], numeric=(2, 3, 4))
