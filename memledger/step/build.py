"""Building a step's programs and rows from a ledger's choices (cached per structure).

:class:`StepStructure` holds the discrete choices (block style, kernels,
recipe, ZeRO, offload, recomputation, ...); :func:`build` turns one into the
flat op list (:mod:`memledger.step.trace`), the table of named tensors with
their SymPy sizes, and one tape that evaluates every size exactly
(:mod:`memledger.core.tape`). A :class:`~memledger.step.timeline.Step` then only evaluates that tape and adds
integers.
"""
from functools import lru_cache

import numpy as np
import sympy as sp

from ..activations.inventory import inventory, kept_rows
from ..activations.outside import outside_inventory
from ..core.dtypes import nbytes
from ..core.exact import evaluate_expr
from ..core.keyed import as_int
from ..core.tape import Tape, record as tape
from ..core.vocabulary import State
from ..core.symbols import L, N_d, O, P, t
from ..states.placement import ZERO_SHARDS, device_of, state_specs
from ..states.recipes import ALL_RECIPES as RECIPES
from . import amp, amploss, bnb, ddp, families, fsdp2, hf, litgpt, loss, offload, optim, outer, packing, parallel, tensor
from . import gpt_style, litgpt_loss, torchtitan as titan, torchtune as tune
from .block import block_backward, block_forward
from .ops import BSd, Placement, Program, Tensor, block_params, residual_names
from .outer import Param
from .params import param_tensors, zero3_units
from .structure import BNB_KINDS, OPTIMIZER_OF, StepStructure, split_refusal
from .trace import GRADIENT_LUMP, LUMP, SAVED_LUMP, Compiled, Part, explicit_layers, flatten
from .vocab import LANDMARKS, Device, Kind, Lifetime, Phase

__all__ = ["IDS", "Built", "build"]

IDS = ("input ids", "target ids")
#: The kinds in the order the figure stacks them.
KIND_ORDER = (Kind.PARAM, Kind.OPTIMIZER, Kind.GRAD, Kind.ACTIVATION, Kind.TRANSIENT, Kind.OVERHEAD)


class Built:
    """The programs and rows of one :class:`StepStructure`, and the compiled sizes."""

    fsdp = None         # framework fsdp2: its units and buffers (memledger.step.fsdp2), set by __init__

    def __init__(self, s: StepStructure):
        self.shape = c = s.shape
        self.structure = s
        recipe = RECIPES[s.recipe]
        placement, share = _placement(s), _share(s)
        layer_rows, outside_rows = _saved_rows(s)
        tensors = _tensors(s, layer_rows, outside_rows)
        p = Program(tensors, placement)
        outer.define_grads(p, c, share)
        outside_rows, outside = _outside(p, s, outside_rows)
        fwd, bwd = _blocks(p, s, share)
        if s.zero_stage == 3:
            zero3_units(tensors, outside, fwd, bwd, c, recipe, s)
        self.fsdp = fsdp2.wrap(tensors, outside, fwd, bwd, c, s) if s.framework == "fsdp2" else None
        opt, step_ops = self._optimizer(p, recipe, share)
        _lumps(tensors, s, layer_rows, placement)
        if self.fsdp:
            tensors[GRADIENT_LUMP] = self.fsdp.gradient_lump()
        self.ops = self._flattened(outside, fwd, bwd, opt, tensors, step_ops)
        self.tensors, self.layer_rows, self.outside_rows, self.placement = tensors, layer_rows, outside_rows, placement
        self._static_rows(recipe)
        self._compile()

    def _optimizer(self, p, recipe, share):
        """The optimizer step's program (empty with the optimizer in backward), and ``step_ops(layer, name)``: one
        parameter's step, for the optimizer in backward."""
        s, c = self.structure, self.shape
        conv, placement = s.conventions, p.placement
        opt = p.fork()
        moments, master = outer.adamw(recipe)
        kind, impl = OPTIMIZER_OF[s.recipe], implementation(s)
        layers = explicit_layers(s.layers or 5)
        rank = tensor.param_share(share) if s.tensor_parallel else (lambda name, n: share(n))
        params = [x._replace(elements=rank(x.key, x.elements)) for x in param_tensors(c, layers)] \
            if "grad" not in ZERO_SHARDS[s.zero_stage] else [Param("flat partition", sp.ceiling(P / (t * N_d)))]
        if self.fsdp:
            params = self.fsdp.optimizer_params(layers)
        others = None if kind == "adamw" and impl != "fused" else \
            (lambda q: optim.temporaries(q, c, kind, impl, params, moments, c.grad_dtype, placement.optimizer))
        if not s.in_backward:
            outer.optimizer(opt, params, moments, master and c.grad_dtype != "fp32", conv.foreach, c.grad_dtype,
                            kept=s.bucket_view or titan.on(c), others=others)
            if s.tensor_parallel and not conv.foreach and not c.is_tied and others is None and not self.fsdp:
                tensor.redistribute_embedding_gradient(opt.ops, p.tensors, c.grad_dtype)
            if c.amp:                   # GradScaler: unscale_ after the gradients are collected, update() at the end
                q = p.fork()
                amp.optimizer_start(q)
                opt.ops[1:1] = q.ops
                opt.ops[:] = amp.optimizer_end(opt.ops)
        opt.ops[:] = tune.optimizer(opt.ops, c, p.fork)     # torchtune's recipe: scale_grads, then its resets
        opt.ops[:] = titan.optimizer(opt.ops, c, p.fork, self._tensor_count())   # torchtitan's clip_grad_norm_
        return opt, lambda layer, name: optim.one_parameter(p.fork(), c, kind, impl, name, moments, c.grad_dtype,
                                                           placement.optimizer)

    def _tensor_count(self):
        """How many parameter tensors the model has (one AdamW step counter, one clipped norm each)."""
        c = self.shape
        return len(block_params(c)) * L + len(outer.head_params(c)) + 1 + tune.extra_step_counters(c, L)

    def _flattened(self, outside, fwd, bwd, opt, tensors, step_ops) -> list:
        """The step's flat op list, with what frameworks and features do across programs."""
        s, c = self.structure, self.shape
        ops = flatten(s.layers or 5, c, outside, fwd.ops, bwd.ops, opt.ops, self.fsdp and self.fsdp.lump)
        if c.amp:                       # the FP16 copies only the cache holds, freed as the autocast region exits
            ops = amp.release_cached(ops, tensors, c, s.layers or 5)
        if self.fsdp:
            ops = self.fsdp.finalize(ops)
        if s.bucket_view or titan.on(c):    # DDP: each gradient copied into its bucket as it is written;
            ops = ddp.bucket_views(ops, tensors)    # torchtitan: added into the kept one (memledger.step.torchtitan)
        if s.in_backward:
            ops = optim.in_backward(ops, tensors, step_ops)
        return ops

    def _bnb_rows(self, static):
        """bitsandbytes' Adam states, per tensor from source (:mod:`memledger.step.bnb`); paged ones on the host
        column (CUDA unified memory, outside the caching allocator's count)."""
        s = self.structure
        eight = OPTIMIZER_OF[s.recipe] == "adam8bit-bnb"
        device, unified = bnb.state_bytes(self.shape, eight, s.paged_optimizer)
        what = ("bitsandbytes 8-bit Adam states from source (uint8 m and v, FP32 absmax per 256, qmaps; FP32 under 4,096 "
                "elements)" if eight else "bitsandbytes 32-bit Adam states from source (FP32 m and v)")
        static(what, device, Kind.OPTIMIZER, why="from source: bitsandbytes optim/optimizer.py init_state")
        if s.paged_optimizer:
            static(what.split(" (")[0] + ", paged: CUDA unified memory (host-backed, outside the caching allocator)",
                   unified, Kind.OPTIMIZER, Device.CPU, "get_state_buffer: F.get_paged for tensors of >= 1e5 elements")

    def _compile(self):
        """The op list compiled (:class:`Compiled`), the device masks, and every tensor's size as one exact function."""
        tensors = self.tensors
        self.compiled = Compiled(self.ops, self.static, tensors)
        self.names = self.compiled.names
        self.masks = {dev: np.array([self.tensors[n].device is dev for n in self.names], dtype=np.int64)
                      for dev in Device}
        self.gpu = self.masks[Device.GPU]
        exprs = [sp.sympify(tensors[n].expr) for n in self.names]
        self.symbols = tuple(sorted(set().union(*(e.free_symbols for e in exprs)), key=lambda x: x.name))
        self._tape = Tape(tape(self.symbols, exprs))

    def _static_rows(self, recipe):
        """Model states (no backward-written gradient), step counters, ids, overhead: live the whole step."""
        s, c, conv = self.structure, self.shape, self.structure.conventions
        t_ = self.tensors
        self.static = []

        def static(name, expr, kind, device=Device.GPU, why=""):
            t_[name] = Tensor(name, expr, kind, Lifetime.STEP, device, why)
            self.static.append((None, name))
        specs = state_specs(recipe, s.zero_stage, s.offload_optimizer, s.offload_params, s.offload_placement)
        self.grad_row = next(spec for spec in specs if spec.role == "grad")     # the one backward writes
        #: the master weights among the model states: they exist from the start, the optimizer's other states are
        #: created at its first step (memledger.ledger.replay)
        self.masters = frozenset(spec.name for spec in specs if spec.component.state is State.MASTER)
        bnb_states = OPTIMIZER_OF[s.recipe] in BNB_KINDS
        for spec in specs if not self.fsdp else ():
            if bnb_states and spec.role == "optimizer" and spec.component.state is not State.MASTER:
                continue                        # Adam's two states, per tensor below
            if spec is not self.grad_row:
                factored = spec.component is not None and spec.component.factored
                static(spec.name, optim.factored_bytes(c, spec.component) if factored else spec.expr(),
                       Kind(spec.role), Device(spec.device),
                       "a model state (the recipe's component)")
        if bnb_states:
            self._bnb_rows(static)
        for name, expr, kind, why, device in self.fsdp.static() if self.fsdp else ():
            static(name, expr, kind, device, why=why)
        kind = OPTIMIZER_OF[s.recipe]
        if conv.step_counters and kind in ("adamw", "adafactor"):
            count = self._tensor_count()
            host = conv.step_counters == "host" and not (conv.fused and kind == "adamw")
            static("Adam step counters" if kind == "adamw" else "Adafactor step counters", 4 * count, Kind.OPTIMIZER,
                   Device.CPU if host else self.placement.optimizer,
                   f"one 0-d FP32 step tensor per parameter tensor (torch.optim.{'Adam' if kind == 'adamw' else 'Adafactor'}"
                   f"{', fused: on the device' if conv.fused and kind == 'adamw' else ''})")
        for device in dict.fromkeys(spec.device for spec in specs) if s.tensor_parallel and not self.fsdp else ():
            per = sum(spec.bytes_per_param for spec in specs if spec is not self.grad_row and spec.device == device
                      and not spec.sharded)         # ZeRO-sharded states x TP: not run against PyTorch here
            static(tensor.WHOLE_ROW + ("" if device == "gpu" else f" ({device})"), per * tensor.beyond_share(c),
                   Kind.PARAM, Device(device), "the norms (GPT: and the row-wise biases) are whole on every rank")
        for name in IDS:
            static(name, t_[name].expr, Kind.ACTIVATION, why=t_[name].why)
        for name, expr, why in hf.buffers(c):               # transformers' rotary buffers
            static(name, expr, Kind.PARAM, why=why)
        for name, expr, kind, why in tune.statics(c) + litgpt_loss.statics(c) + titan.statics(c):   # RoPE buffers,
            static(name, expr, kind, why=why)
        for name, expr, why in packing.inputs(c):          # what a packed batch carries
            static(name, expr, Kind.ACTIVATION, why=why)
        for name, expr, why in amp.scaler_state() if c.amp else ():
            static(name, expr, Kind.OPTIMIZER, why=why)
        if titan.on(c):
            static(titan.GRADIENTS, P * nbytes(c.grad_dtype), Kind.GRAD, why="torchtitan's train_step: "
                   "optimizers.zero_grad(set_to_none=False) (trainer.py l. 874; configs.py l. 66)")
        if s.framework == "ddp":
            static(ddp.BUCKETS, P * nbytes(c.grad_dtype), Kind.GRAD, why="DDP's flat gradient buckets, "
                   "allocated once (torch/csrc/distributed/c10d/reducer.cpp: initialize_buckets)")
        static("CUDA context + workspace", O, Kind.OVERHEAD,
               why="the runtime's context and workspaces (the article's 1-2 GB)")

    def _live_sum(self, landmark, which):
        """The bytes (SymPy) of the tensors ``which`` selects that are live at ``landmark``."""
        marks = self.compiled.mark_counts[landmark]
        return sp.Add(*(int(marks[j]) * self.tensors[n].expr for j, n in enumerate(self.names)
                        if marks[j] and which(self.tensors[n])))

    def sizes(self, values):
        """Every tensor's bytes at ``values``, in the order of ``self.names``: exact ints, in an int64 array
        where no total of the step can pass 2^63 (every tensor live at once, as many copies as any op holds),
        else in an array of Python ints (``dtype=object``), so that no sum ever wraps around."""
        try:
            out = [as_int(v) for v in self._tape(*(int(values[x.name]) for x in self.symbols))]
        except ArithmeticError:          # a split that is not whole bytes: named, one line
            raise split_refusal(self.names, lambda j: evaluate_expr(self.tensors[self.names[j]].expr, values),
                                values) from None
        bound = sum(out) * self.max_count
        return np.array(out, dtype=np.int64 if bound < 2**63 else object)

    @property
    def max_count(self) -> int:
        """The most copies of one tensor live at once, at any op or landmark."""
        counts = [int(self.compiled.counts.max(initial=0))] + [int(v.max(initial=0))
                                                               for v in self.compiled.mark_counts.values()]
        return max(counts + [1])

    def totals(self, sizes):
        """The GPU total after every op (an int64 array)."""
        return self.compiled.counts @ (sizes * self.gpu)

    def landmark(self, name, sizes, device="gpu") -> int:
        """The total on ``device`` at landmark ``name``."""
        return int(self.compiled.mark_counts[name] @ (sizes * self.masks[device]))

    def kind_masks(self) -> dict:
        """{kind: 0/1 vector over self.names} for each :class:`~memledger.step.vocab.Kind`."""
        return {k: np.array([self.tensors[n].kind is k for n in self.names], dtype=np.int64) for k in KIND_ORDER}

    def positions(self, n_layers) -> list:
        """An x for every sample, in block units: forward 0..L+1 (embedding, blocks, the loss), backward
        L+1..2L+2, optimizer 2L+2..2L+3; a block's ops spread over its unit, the lumped blocks 2..L-3
        at the end of their span (a figure draws a straight line across them)."""
        L, lumped = n_layers, self.structure.layers is None
        groups = {}
        for k, index in enumerate(self.compiled.ops):
            op = self.ops[index]
            groups.setdefault((op.phase, op.layer), []).append(k)
        x = [0.0] * len(self.compiled.ops)
        for (phase, layer), members in groups.items():
            if layer == LUMP:
                end = 0.5 + (L - 2) if phase is Phase.FORWARD else L + 1.5 + (L - 2)
                for m in members:
                    x[m] = end
                continue
            if layer is None:
                start, width = {Phase.FORWARD: (0.0, 0.5), Phase.LOSS: (L + 0.5, 1.0),
                                Phase.BACKWARD: (2 * L + 1.5, 0.5), Phase.OPTIMIZER: (2 * L + 2.0, 1.0)}[phase]
            else:
                i = L - 5 + layer if lumped and layer >= 3 else layer
                start, width = (0.5 + i, 1.0) if phase is Phase.FORWARD else (L + 1.5 + (L - 1 - i), 1.0)
            for j, m in enumerate(members):
                x[m] = start + width * (j + 1) / len(members)
        return x

    def live_at(self, sample, sizes, n_layers=None):
        """(name, bytes) of the GPU tensors live just after sample ``sample``, largest first; a tensor live in
        several blocks is one entry ("softmax output, 4 blocks"), the lumped middle blocks one more; a
        framework's per-block buffer names its blocks ("FSDP2 all-gather output (BF16), block 12"; given
        ``n_layers``)."""
        size = dict(zip(self.names, (int(b) for b in sizes * self.gpu)))
        named, blocks, which = {}, {}, {}
        for layer, name in self.compiled.live[sample]:
            if size.get(name):
                named[name] = named.get(name, 0) + size[name]
                blocks[name] = blocks.get(name, 0) + (layer is not None)
                if self.fsdp and isinstance(layer, int) and n_layers is not None:
                    which.setdefault(name, []).append(self.fsdp.block_index(name, layer, self.structure.layers
                                                                            is None, n_layers))
        indexed = self.fsdp.block_names if self.fsdp else ()
        label = {n: n + (f", {k} block{'s' if k > 1 else ''}" if k else "") for n, k in blocks.items()}
        for n in set(indexed) & set(which):
            if blocks[n] == len(which[n]):
                label[n] = n + (", block " if len(which[n]) == 1 else ", blocks ") + ", ".join(
                    map(str, sorted(which[n])))
        return tuple(sorted(((label[n], b) for n, b in named.items()), key=lambda kv: -kv[1]))

    def loss_saved(self) -> list:
        """The tensors the chunked loss keeps for backward (:func:`memledger.step.loss.saved_names`; under
        autocast :func:`memledger.step.amploss.saved_names`)."""
        if litgpt_loss.on(self.shape):
            return litgpt_loss.saved_names(self.shape)
        return (amploss if self.shape.amp else loss).saved_names(self.shape)

    def rows(self, values) -> list:
        """The step's rows with the landmarks each is live at (:attr:`memledger.step.timeline.Step.rows`): the
        tensors live the whole step, the gradients backward writes, the saved activations (L x each block's),
        the temporaries."""
        out = []

        def row(name, kind, phase, device, expr, live):
            out.append({"name": name, "kind": kind.value, "phase": phase.value, "device": device.value,
                        "bytes": evaluate_expr(expr, values), "formula": str(expr), "live": live})
        for _, name in self.static:
            x = self.tensors[name]
            row(name, x.kind, Lifetime.STEP, x.device, x.expr, set(LANDMARKS))
        g = self.grad_row
        grads = sp.ceiling(P / (t * N_d) if g.sharded else P / t) * g.bytes_per_param
        name = self.fsdp.name("sharded gradients", "block") + ", every unit" if self.fsdp else g.name
        if self.structure.bucket_view:  # DDP: the gradients are views into its buckets (rows of their own)
            grads, name = sp.Integer(0), g.name + " (views into DDP's gradient buckets)"
        if titan.on(self.shape):        # torchtitan: each new gradient added into the kept one (a row of its own)
            grads, name = sp.Integer(0), g.name + " (added into the kept ones)"
        # sharded (each tensor's shard rounded up), FSDP2's shards or tensor-parallel (some whole): what backward
        # writes adds up to it
        if g.sharded or self.fsdp or self.structure.tensor_parallel:
            grads = self._live_sum("after backward", lambda x: x.lifetime is Lifetime.GRADIENT)
        row(name, Kind.GRAD, Lifetime.GRADIENT, self.fsdp.device if self.fsdp else self.placement.gradients, grads,
            set() if self.structure.in_backward else {"after backward"})   # in backward: each freed in its hook
        if self.fsdp and (self.fsdp.k or not (self.fsdp.reshard and self.fsdp.root_reshard)):
            # units kept unsharded after forward, or (int k) their post-forward slices
            kept = self._live_sum("after forward", lambda x: x.kind is Kind.PARAM and x.lifetime is Lifetime.TEMPORARY)
            name = "post-forward slices" if self.fsdp.k else "unsharded parameters"
            row(self.fsdp.name(name, "block") + (", every unit" if self.fsdp.k else ", units not resharded"),
                Kind.PARAM, Lifetime.SAVED, Device.GPU, kept, {"after forward"})
        blocks = ["layer input"] if self.structure.recompute == "full" else [r.name for r in self.layer_rows]
        if self.structure.offload_activations:
            blocks = []
            for name, expr in offload.host_rows(self.tensors, self.shape, self.structure.recompute == "full"):
                row(f"L x {name}", Kind.ACTIVATION, Lifetime.SAVED, Device.CPU, L * expr, {"after forward"})
        for name in blocks:
            row("L x layer input (checkpoint)" if name == "layer input" else f"L x {name}", Kind.ACTIVATION,
                Lifetime.SAVED, Device.GPU, L * self.tensors[name].expr, {"after forward"})
        for r in self.outside_rows:
            if r.name not in IDS:
                row(r.name, Kind.ACTIVATION, Lifetime.SAVED, Device.GPU, self.tensors[r.name].expr, {"after forward"})
        for name in self.loss_saved():                     # what the chunked loss keeps for backward
            x = self.tensors[name]
            row(name, Kind.ACTIVATION, Lifetime.SAVED, x.device, x.expr, {"after forward"})
        seen = set()
        for op in self.ops:
            for _, name in op.allocs:
                x = self.tensors[name]
                if x.lifetime is Lifetime.TEMPORARY and name not in seen:
                    seen.add(name)
                    row(name, Kind.TRANSIENT, op.phase, x.device, x.expr, set())
        return out


def implementation(s: StepStructure) -> str:
    """The optimizer's implementation: fused, foreach or the for-loop as the conventions say; Adafactor's for-loop
    (its default on every device, memledger.step.structure); bitsandbytes' own kernel per tensor."""
    kind, conv = OPTIMIZER_OF[s.recipe], s.conventions
    if kind == "adafactor":
        return "for-loop"
    if kind in BNB_KINDS:
        return "bitsandbytes"           # one in-place kernel per tensor (memledger.step.bnb)
    return "fused" if conv.fused else ("foreach" if conv.foreach else "for-loop")


def _placement(s: StepStructure) -> Placement:
    """Where the gradients live and the optimizer steps (ZeRO-Offload's placement; FSDP2's CPUOffloadPolicy: the
    optimizer on the host)."""
    on = (s.offload_optimizer, s.offload_params, s.offload_placement)
    if s.fsdp and s.fsdp.offload is not None:
        return Placement(Device.GPU, Device.CPU)
    return Placement(Device(device_of("grad", *on)), Device(device_of("optimizer", *on)))


def _share(s: StepStructure):
    """A tensor of n elements' share on one rank: sharded by ZeRO over t x N_d ranks, or split over t."""
    grad_sharded = "grad" in ZERO_SHARDS[s.zero_stage]

    def share(n):
        return sp.ceiling(n / (t * N_d)) if grad_sharded else (sp.ceiling(n / t) if s.tensor_parallel else n)
    return share


def _saved_rows(s: StepStructure) -> tuple:
    """(a block's saved rows, the rows outside the blocks) of the activation inventory, as the step keeps them."""
    c = s.shape
    opts = s.conventions.inventory_options(c.style, c.dtype, c.dropout) | {"attention": c.attention,
                                                                           "rmsnorm": c.rmsnorm}
    mlp, norm = ("gelu", "LayerNorm") if c.gpt else ("swiglu", "RMSNorm")
    layer_rows = inventory(mlp, norm, c.dropout, gqa=c.gqa, head_dim=c.head_dim, parallel=c.parallel,
                           shared_norm=c.shared_norm, attention_dropout=c.attention_dropout, **opts)
    if s.recompute == "selective":          # the attention core's own tensors are recomputed, not kept
        layer_rows = kept_rows(layer_rows, "selective")
    layer_rows = hf.layer_rows(layer_rows, c)               # transformers' eager core: FP32 softmax, BF16 probabilities
    layer_rows = litgpt.layer_rows(layer_rows, c)           # LitGPT: new q, k; the fused output whole; SDPA's output
    layer_rows = gpt_style.layer_rows(layer_rows, c)        # transformers' GPT-NeoX under SDPA: the same
    layer_rows = layer_rows + packing.saved_rows(c)         # packed rows: SDPA's additive mask per block
    if c.amp:                               # FP16 autocast: FP16 copies and outputs (memledger.step.amp)
        layer_rows = amp.layer_rows(layer_rows, c)
    outside_rows = outside_inventory(c.style, **{k: opts[k] for k in ("dtype", "norm_stats", "rmsnorm",
                                                                        "attention")}, input_norm=c.input_norm)
    outside_rows = outside_rows + families.outside_rows(c)     # positions' ids (memledger.step.families)
    outside_rows = hf.outside_rows(c, outside_rows)     # transformers' cos, sin, shifted labels; no shared mask
    if c.amp:
        outside_rows = amp.outside_rows(outside_rows)
    outside_rows = packing.outside_rows(outside_rows, c, s.offload_activations)     # packed rows' masks
    return layer_rows, outside_rows


def _tensors(s: StepStructure, layer_rows, outside_rows) -> dict:
    """The table of named tensors the programs start from: the saved rows (one rank's share) and the residual
    stream's temporaries."""
    c = s.shape
    tensors = {}
    for r in layer_rows + outside_rows:       # one rank's share: Saved.rank_bytes, the ledger's rule
        tensors[r.name] = Tensor(r.name, r.rank_bytes(s.tensor_parallel, s.sequence_parallel), Kind.ACTIVATION,
                                 Lifetime.SAVED, why=r.why)
    for name, why in [("dX_out", "the gradient flowing back into the block's output"),
                      ("grad of the embedding output", "the first block's input gradient"),
                      ("block input", "the block's input, held by the caller until the block returns"),
                      ("attention residual sum", "x + attention, norm 2's input"),
                      ("final norm input", "the last block's output, until the LM head has run")]:
        tensors[name] = Tensor(name, BSd[0] * BSd[1] * BSd[2] * (4 if c.dtype == "fp32" else 2) /
                               (t if s.sequence_parallel else 1), Kind.TRANSIENT, Lifetime.TEMPORARY, why=why)
    if s.tensor_parallel and s.sequence_parallel:       # DTensor saves the all-gathered inputs
        tensor.sequence_parallel_rows(tensors, layer_rows, c)
    return tensors


def _outside_programs(c, chunked: bool) -> list:
    """(part, the function writing its program) of the programs outside the blocks: the chunked loss's or the
    plain one's, under FP16 autocast or not."""
    if chunked:
        forward_end = amploss.chunked_forward_end if c.amp else loss.chunked_forward_end
        backward_start = amploss.chunked_backward_start if c.amp else loss.chunked_backward_start
    else:
        forward_end = amp.forward_end if c.amp else outer.forward_end
        backward_start = amp.backward_start if c.amp else outer.backward_start
    if litgpt_loss.on(c):     # LitGPT's head and loss as finetune/full.py runs them (memledger.step.litgpt_loss)
        return [(Part.FORWARD_START, outer.forward_start), (Part.FORWARD_END, litgpt_loss.forward_end),
                (Part.BACKWARD_START, litgpt_loss.backward_start), (Part.BACKWARD_END, outer.backward_end)]
    if c.hf:            # transformers' model and loss (memledger.step.hf)
        return [(Part.FORWARD_START, hf.forward_start), (Part.FORWARD_END, hf.forward_end),
                (Part.BACKWARD_START, hf.backward_start), (Part.BACKWARD_END, outer.backward_end)]
    return [(Part.FORWARD_START, outer.forward_start), (Part.FORWARD_END, forward_end),
            (Part.BACKWARD_START, backward_start), (Part.BACKWARD_END, outer.backward_end)]


def _outside(p, s: StepStructure, outside_rows) -> tuple:
    """(the rows outside the blocks the loss keeps, {part: its program's ops})."""
    c = s.shape
    outside = {}
    chunked = c.loss_chunks > 1 or c.loss_impl == "litgpt"      # memledger.step.loss
    if litgpt_loss.on(c):
        outside_rows = [r for r in outside_rows if r.name not in ("log-softmax output (FP32)", "nll_loss total weight",
                                                                   "loss")]
    elif chunked:
        replaced = amploss.replaced_rows(c) if c.amp else loss.replaced_rows(c)
        outside_rows = [r for r in outside_rows if r.name not in replaced]
    for part, fn in _outside_programs(c, chunked):
        q = p.fork()
        if s.tensor_parallel:
            tensor.OUTSIDE[part.value](q, c, s.sequence_parallel)
        else:
            if part is Part.FORWARD_START:
                packing.forward_start(q, c)         # packed rows: the block-causal mask
            fn(q, c)
        outside[part] = packing.forward_end(q.ops, c, s.offload_activations) if part is Part.FORWARD_END else \
            q.ops
        if c.amp and part is Part.BACKWARD_END:
            outside[part] = amp.backward_end(outside[part])
    outside = tune.outside(outside, c, p.fork)     # torchtune's recipe around the model (memledger.step.torchtune)
    outside = titan.outside(outside, c, p.fork)    # torchtitan's train_step around it (memledger.step.torchtitan)
    return outside_rows, outside


def _blocks(p, s: StepStructure, share) -> tuple:
    """(one block's forward, its backward): the plain block, offloaded, under FP16 autocast or a parallel
    block; with DTensor's collectives under tensor parallelism."""
    c, tensors = s.shape, p.tensors
    if s.recompute == "full":
        x = residual_names(c)[0]
        tensors["layer input"] = Tensor("layer input", tensors[x].expr if x in tensors else 0, Kind.ACTIVATION,
                                        Lifetime.SAVED, why="the checkpoint")
    fwd, bwd = p.fork(), p.fork()
    if s.offload_activations:        # the saved tensors as pinned host copies (memledger.step.offload)
        offload.define_host(tensors, c, s.recompute == "full")
        offload.offloaded_forward(fwd, c, block_forward)
        offload.offloaded_backward(bwd, c, block_backward, share)
    elif c.amp:
        amp.block_forward(fwd, c)
        amp.block_backward(bwd, c, share)
    elif c.parallel:                # GPT-NeoX's and Phi's blocks (memledger.step.parallel); LitGPT's pythia
        (gpt_style.litgpt_forward if c.implementation == "litgpt" else gpt_style.hf_forward if c.hf
         else parallel.parallel_forward)(fwd, c)
        parallel.parallel_backward(bwd, c, share)
    else:
        block_forward(fwd, c)
        block_backward(bwd, c, share)
    if s.tensor_parallel:       # DTensor's collectives, and the gradients it leaves whole
        tensor.collectives(fwd, bwd, tensors, c, s.sequence_parallel)
        tensor.whole_gradients(tensors, c.grad_dtype, c.is_tied)
    return fwd, bwd


def _lumps(tensors, s: StepStructure, layer_rows, placement) -> None:
    """The lumped middle blocks' saved tensors and gradients (L - 4 blocks' worth) in ``tensors``."""
    c = s.shape
    saved = sum((tensors[r.name].expr for r in layer_rows), sp.Integer(0)) if s.recompute != "full" \
        else tensors["layer input"].expr
    grads = sum((tensors[f"grad {n}"].expr for n, _ in block_params(c)), sp.Integer(0))
    if s.offload_activations:
        tensors[SAVED_LUMP] = Tensor(SAVED_LUMP, (L - 4) * tensors[offload.HOST].expr, Kind.ACTIVATION,
                                     Lifetime.SAVED, Device.CPU)
    else:
        tensors[SAVED_LUMP] = Tensor(SAVED_LUMP, (L - 4) * saved, Kind.ACTIVATION, Lifetime.SAVED)
    tensors[GRADIENT_LUMP] = Tensor(GRADIENT_LUMP, (L - 4) * grads, Kind.GRAD, Lifetime.GRADIENT,
                                    placement.gradients)


@lru_cache(maxsize=128)
def build(s: StepStructure) -> Built:
    """The programs and compiled sizes of ``s``, built once per structure."""
    return Built(s)
