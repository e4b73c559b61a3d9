"""One training step, phase by phase: the landmarks, the transients and the peak (README.md, "One training step").

    step = Ledger("llama2-7b", recipe="bf16-pure-adamw", overhead_bytes=0).step(backend="cpu")
    step.landmarks["after forward"]   # {"gpu": ..., "cpu": ..., "nvme": ...}
    step.peak                          # Peak(bytes=..., phase="backward", layer=31, detail=...)

A step has four landmarks (``before forward``, ``after forward``, ``after
backward``, ``after step``) at which the live tensors are exact sums of named
rows: the model states of :mod:`memledger.states.placement` (gradients only after
backward), Adam's per-tensor step counters, the saved activations of
:func:`memledger.activations.inventory.inventory` (L blocks) and
:func:`memledger.activations.outside.outside_inventory`, the input and target ids, the
runtime overhead. Between landmarks the programs of :mod:`memledger.step.block`
and :mod:`memledger.step.outer` allocate and free transients op by op; the peak
is the largest total after any op, with its phase and block.

Scope of the op-by-op model: the reference decoder (:mod:`memledger.pytorch.reference`):
GPT blocks, and LLaMA blocks with multi-head, grouped-query or multi-query
attention (``n_kv_heads``: K and V at H_kv heads, never expanded to H, as
SDPA's ``enable_gqa`` and the inventory's ``gqa=True``), optionally with QKV
biases (Qwen2) and a tied LM head (Gemma); in either style a head size d_h
other than d/H (Gemma-7B: Q and the output projection's input H*d_h wide, K
and V H_kv*d_h); no, selective (the attention core checkpointed and
recomputed in backward) or full recomputation (the save policies of
:mod:`memledger.step.block`), one GPU rank. Refused with a ValueError naming the feature:
mixture of experts, learned positions and BERT's encoder parts, the math SDPA
kernel. ZeRO shards the states
as the ledger does (and the gradients as backward writes them); ZeRO-3
gathers each block's parameters (and, in backward, its gradients) before
running it, two blocks with prefetch (DeepSpeed's stage-3 prefetch bucket,
FSDP's ``forward_prefetch``/``backward_prefetch``); the gathered unit is one
block. Tensor (and sequence) parallelism is DTensor's ``parallelize_module`` as
:mod:`memledger.step.tensor` writes it: blocks at H/t heads and F/t, the
vocabulary-parallel embedding and loss, every all-reduce, reduce-scatter and
all-gather buffer, the norms and the untied embedding's gradient whole on every
rank; under SP each column-wise layer saves its own all-gathered input (checked
to the byte against ``tp_step`` by ``tests/step/test_tensor.py``).
"""
from dataclasses import dataclass
from functools import cached_property

from ..core.capacity import MARGIN, leaves_margin
from ..activations.backends import Backend, get_backend
from . import ddp
from .build import build
from .inputs import StepInputs, inputs_of
from .structure import StepStructure, block_of, step_values
from .vocab import LANDMARKS, Action, Device, Phase

__all__ = ["LANDMARKS", "Peak", "Step"]


@dataclass(frozen=True)
class Peak:
    """The largest total of the step on the GPU (the device the model runs on)."""
    bytes: int
    phase: str
    layer: object
    detail: str
    sample: int          # which moment of :attr:`Step.totals`


class Step:
    """The step timeline of a setup (:class:`~memledger.step.inputs.StepInputs`, or a
    :class:`memledger.ledger.ledger.Ledger`: its ``step_inputs``) under a backend's conventions. ``ledger`` keeps
    what was given (for the caller's display; the step reads only :attr:`inputs`)."""

    def __init__(self, setup, backend="article", **changes):
        self.ledger = setup
        self.inputs: StepInputs = inputs_of(setup)
        self.conventions: Backend = get_backend(backend, **changes)
        self.structure = StepStructure.of(self.inputs, self.conventions)
        self.built = build(self.structure)
        self.values = step_values(self.inputs)

    @cached_property
    def sizes(self):
        return self.built.sizes(self.values)

    @cached_property
    def totals(self):
        """The GPU total after every op of the step (an int64 array, or exact Python ints where a total could pass
        2^63; :attr:`built` has the ops)."""
        return self.built.totals(self.sizes)

    @cached_property
    def rows(self) -> list:
        """Named rows: {"name", "kind", "phase", "device", "bytes", "formula", "live"} (``memledger step --json``);
        "live" is the set of landmarks the row is live at."""
        rows = self.built.rows(self.values)
        return ddp.expand_rows(rows, self.ddp_buckets) if self.structure.framework == "ddp" else rows

    @cached_property
    def ddp_buckets(self) -> list:
        """DDP's gradient buckets, in its reducer's order: [(name, bytes, formula, [parameters])]
        (:mod:`memledger.step.ddp`); [] under another framework."""
        if self.structure.framework != "ddp":
            return []
        return ddp.bucket_rows(self.built, self.values, self.inputs.ddp.bucket_mb)

    @cached_property
    def landmarks(self) -> dict:
        """{landmark: {"gpu": int, "cpu": int, "nvme": int}}: what the programs leave live there, which is
        the sum of the :attr:`rows` live there (``tests/step/test_timeline.py``)."""
        return {name: {dev.value: self.built.landmark(name, self.sizes, dev) for dev in Device} for name in LANDMARKS}

    @cached_property
    def peak(self) -> Peak:
        sample = int(self.totals.argmax())
        total = int(self.totals[sample])
        op = self.built.ops[self.built.compiled.ops[sample]]
        layer = block_of(op.layer, self.structure.layers is None, self.values["L"])
        block = f"block {layer}" if layer is not None else "outside the blocks"
        return Peak(total, op.phase.value, layer, f"{op.phase}, {block}: {op.label}", sample)

    def live_at_peak(self) -> tuple:
        """(name, bytes) of every GPU tensor live at the peak, largest first (blocks named by index)."""
        live = self.built.live_at(self.peak.sample, self.sizes, self.values["L"])
        return ddp.expand_live(live, self.ddp_buckets) if self.ddp_buckets else live

    def phase_peaks(self) -> dict:
        """The largest GPU total between landmarks: {"forward": ..., "backward": ..., "optimizer": ...}
        (forward includes the loss; backward starts after the "after forward" landmark)."""
        marks = [i for i, op in enumerate(self.built.ops) if op.action is Action.LANDMARK]
        out = {}
        for total, index in zip(self.totals, self.built.compiled.ops):
            phase = Phase.FORWARD if index < marks[0] else (Phase.BACKWARD if index < marks[1] else Phase.OPTIMIZER)
            out[phase.value] = max(out.get(phase.value, 0), int(total))
        return out

    def block_peaks(self) -> dict:
        """{("forward" or "backward", block index): the largest GPU total after an op of that block}, for the
        blocks run op by op (all when L <= 4, else 0, 1, L-2, L-1); a recomputed block's forward re-run
        belongs to its backward."""
        out = {}
        lumped, n_layers = self.structure.layers is None, self.values["L"]
        for total, index in zip(self.totals, self.built.compiled.ops):
            op = self.built.ops[index]
            if isinstance(op.layer, int) and op.phase in (Phase.FORWARD, Phase.BACKWARD):
                key = (op.phase.value, block_of(op.layer, lumped, n_layers))
                out[key] = max(out.get(key, 0), int(total))
        return out

    def series(self):
        """For a figure: (x, {kind: GPU bytes after every op}, marks). x runs over the step in block units
        (forward blocks 0..L-1, the loss, backward blocks L-1..0, the optimizer), the lumped middle blocks
        spanning their width; kinds are param, grad, optimizer, activation, transient, overhead; marks
        maps each landmark to its x."""
        import numpy as np
        built, L = self.built, self.values["L"]
        by_kind = {k.value: built.compiled.counts @ (self.sizes * built.gpu * mask)
                   for k, mask in built.kind_masks().items()}
        marks = {"before forward": 0.0, "after forward": L + 1.0, "after backward": 2 * L + 2.0,
                 "after step": 2 * L + 3.0}
        return np.array(built.positions(L)), by_kind, marks

    def fits(self, gpu_bytes: int, margin: int = MARGIN) -> bool:
        """Whether the peak fits in ``gpu_bytes`` (the GPU's real capacity, :mod:`memledger.ledger.hardware`)
        with ``margin`` to spare, as every verdict asks (:mod:`memledger.core.capacity`)."""
        return leaves_margin(self.peak.bytes, gpu_bytes, margin)

    def within(self, gpu_bytes: int) -> bool:
        """Whether the peak is at most ``gpu_bytes``, nothing to spare (not a fit: :meth:`fits`)."""
        return self.peak.bytes <= gpu_bytes

    def to_dict(self) -> dict:
        """The JSON object of ``memledger step --json``: inputs, landmarks, peak (with what is live there), rows."""
        inputs = dict(self.inputs.record)
        inputs["n_params"] = self.values["P"]
        inputs["backend"] = self.conventions.name
        inputs["conventions"] = {k: v for k, v in vars(self.conventions).items() if k != "name"}
        return {"inputs": inputs, "landmarks": self.landmarks,
                "peak": {"gpu": self.peak.bytes, "phase": self.peak.phase, "layer": self.peak.layer,
                         "detail": self.peak.detail,
                         "live": [{"name": n, "bytes": b} for n, b in self.live_at_peak()]},
                "rows": [{k: r[k] for k in ("name", "kind", "phase", "device", "bytes", "formula")}
                         | {"live": [m for m in LANDMARKS if m in r.get("live", ())]} for r in self.rows]}

    def table(self, unit: str = "GB"):
        from .table import step_table
        return step_table(self, unit)

    def __str__(self):
        return self.table().text()
