"""Building a step's programs and rows from a ledger's choices (cached per structure).

:class:`StepStructure` holds the discrete choices (block style, kernels,
recipe, ZeRO, offload, recomputation, ...); :func:`build` turns one into the
flat op list (:mod:`memledger.step.trace`), the table of named tensors with
their SymPy sizes, and one compiled function that evaluates every size
exactly (:func:`memledger.core.exact.exact_function`). A :class:`~memledger.step.timeline.Step`
then only evaluates that function and adds integers.
"""
from functools import lru_cache

import numpy as np
import sympy as sp

from ..activations.inventory import inventory, kept_rows
from ..core.exact import exact_function, is_integral_polynomial
from ..core.exact import evaluate_expr
from ..states.placement import ZERO_SHARDS, device_of, state_specs
from ..activations.outside import outside_inventory
from ..states.recipes import RECIPES
from .block import layer_backward, layer_forward
from .ops import BSd, GRAD_KIND, Program, Tensor, block_params, io_names
from .recompute import checkpointed_forward, recompute_backward
from .params import param_tensors, zero3_units
from .structure import StepStructure, step_values
from . import outer as stepouter
from .trace import Compiled, explicit_layers, flatten, qualified_tensors
from ..core.symbols import L, N_d, P, t

IDS = ("input ids", "target ids")


class Built:
    """The programs and rows of one :class:`StepStructure`, and the compiled sizes."""

    def __init__(self, s: StepStructure):
        self.s = c = s.shape
        conv = s.conventions
        recipe = RECIPES[s.recipe]
        sharded = ZERO_SHARDS[s.zero_stage]
        grad_sharded = "grad" in sharded

        def share(n):
            return sp.ceiling(n / (t * N_d)) if grad_sharded else (sp.ceiling(n / t) if s.tensor_parallel else n)
        opts = conv.inventory_options(c.style, c.dtype, c.dropout) | {"attention": c.attention}
        mlp, norm = ("gelu", "LayerNorm") if c.gpt else ("swiglu", "RMSNorm")
        layer_rows = inventory(mlp, norm, c.dropout, gqa=c.gqa, head_dim=c.head_dim, **opts)
        if s.recompute == "selective":          # the attention core's own tensors are recomputed, not kept
            layer_rows = kept_rows(layer_rows, "selective")
        outside_rows = outside_inventory(c.style, **{k: opts[k] for k in ("dtype", "norm_stats", "rmsnorm",
                                                                            "attention")})
        tensors = {}

        for r in layer_rows + outside_rows:       # one rank's share: Saved.rank_bytes, the ledger's rule
            tensors[r.name] = Tensor(r.name, r.rank_bytes(s.tensor_parallel, s.sequence_parallel), "activation",
                                     r.why)
        act = tensors
        for name, why in [("dX_out", "the gradient flowing back into the block's output"),
                          ("grad of the embedding output", "the first block's input gradient"),
                          ("block input", "the block's input, held by the caller until the block returns"),
                          ("attention residual sum", "x + attention, norm 2's input"),
                          ("final norm input", "the last block's output, until the LM head has run")]:
            act[name] = Tensor(name, BSd[0] * BSd[1] * BSd[2] * (4 if c.dtype == "fp32" else 2) /
                               (t if s.sequence_parallel else 1), "transient", why)
        p = Program(tensors)
        stepouter.define_grads(p, c, share)
        programs = {}
        for key, fn in [("forward start", stepouter.forward_start), ("forward end", stepouter.forward_end),
                        ("backward start", stepouter.backward_start), ("backward end", stepouter.backward_end)]:
            q = Program(tensors)
            fn(q, c)
            programs[key] = q.ops
        fwd, bwd = Program(tensors), Program(tensors)
        if s.recompute == "full":
            tensors["layer input"] = Tensor("layer input", tensors[io_names(c)[0]].expr if io_names(c)[0] in
                                            tensors else 0, "activation", "the checkpoint")
            checkpointed_forward(fwd, c)
            recompute_backward(bwd, c, share)
        else:
            layer_forward(fwd, c)
            layer_backward(bwd, c, share)
        if s.zero_stage == 3:
            zero3_units(tensors, programs, fwd, bwd, c, recipe, s)
        layers = explicit_layers(s.layers or 5)
        opt = Program(tensors)
        state_dtype = next((x.dtype for x in recipe.components if "second moment" in x.name), None)
        master = any(x.name == "FP32 master weights" for x in recipe.components) and c.grad_dtype != "fp32"
        params = param_tensors(c, layers) if not grad_sharded else [("flat partition", sp.ceiling(P / (t * N_d)))]
        if state_dtype is not None:
            stepouter.optimizer(opt, [(n, share(e)) if not grad_sharded else (n, e) for n, e in params],
                                state_dtype, master, conv.foreach, c.grad_dtype)
        programs["optimizer"] = opt.ops
        saved = sum((tensors[r.name].expr for r in layer_rows), sp.Integer(0)) if s.recompute != "full" \
            else tensors["layer input"].expr
        grads = sum((tensors[f"grad {n}"].expr for n, _ in block_params(c)
                     if f"grad {n}" in tensors), sp.Integer(0))
        lumps = {"saved": "@saved tensors of blocks 2..L-3", "grads": "@gradients of blocks 2..L-3"}
        tensors[lumps["saved"]] = Tensor(lumps["saved"], (L - 4) * saved, "activation", "blocks 2..L-3")
        tensors[lumps["grads"]] = Tensor(lumps["grads"], (L - 4) * grads, GRAD_KIND, "blocks 2..L-3")
        tensors["@gradients"] = Tensor("@gradients", sp.Integer(0), GRAD_KIND, "every gradient, collected")
        self.ops = flatten(s.layers or 5, c, programs, fwd.ops, bwd.ops, lumps)
        self.tensors, self.layer_rows, self.outside_rows, self.recipe = tensors, layer_rows, outside_rows, recipe
        self.structure = s
        self._static_rows(recipe, sharded)
        names = sorted(qualified_tensors(self.ops, self.static), key=str)
        self.kinds = {n: tensors[n[1]].kind for n in names}
        self.compiled = Compiled(self.ops, self.static, self.kinds)
        self.names = self.compiled.names
        self.masks = {dev: np.array([self.device_of((None, n)) == dev for n in self.names], dtype=np.int64)
                      for dev in ("gpu", "cpu", "nvme")}
        self.gpu = self.masks["gpu"]
        exprs = [sp.sympify(tensors[n].expr) for n in self.names]
        whole = [i for i, e in enumerate(exprs) if is_integral_polynomial(e)]
        other = [i for i in range(len(exprs)) if i not in set(whole)]
        self.symbols = tuple(sorted(set().union(*(e.free_symbols for e in exprs)), key=lambda x: x.name))
        self._groups = [(whole, sp.lambdify(self.symbols, [exprs[i] for i in whole], modules="math", cse=True)),
                        (other, exact_function(self.symbols, tuple(exprs[i] for i in other)))]

    def _static_rows(self, recipe, sharded):
        """Model states (no backward-written gradient), step counters, ids, overhead: live the whole step."""
        s, c, conv = self.structure, self.s, self.structure.conventions
        t_ = self.tensors
        placement = (s.offload_optimizer, s.offload_params, s.offload_placement)
        self.device = {}
        self.static = []
        first_grad = True
        for spec in state_specs(recipe, s.zero_stage, *placement):
            if spec.role == "grad" and first_grad:
                first_grad = False
                self.grad_device, self.grad_row = spec.device, spec
                continue
            t_[spec.name] = Tensor(spec.name, spec.expr(), spec.role, "a model state (the recipe's component)")
            self.device[spec.name] = spec.device
            self.static.append((None, spec.name))
        opt_device = device_of("optimizer", *placement)
        self.opt_device = opt_device
        if conv.step_counters and any("moment" in x.name for x in recipe.components):
            per_block = len(block_params(c))
            count = per_block * L + len(stepouter.head_params(c)) + 1
            t_["Adam step counters"] = Tensor("Adam step counters", 4 * count, "optimizer",
                                              "one 0-d FP32 step tensor per parameter tensor (torch.optim.Adam)")
            self.device["Adam step counters"] = "cpu" if conv.step_counters == "host" else opt_device
            self.static.append((None, "Adam step counters"))
        for name in IDS:
            t_[name] = Tensor(name, t_[name].expr, "activation", t_[name].why)
            self.static.append((None, name))
        from ..core.symbols import O
        t_["CUDA context + workspace"] = Tensor("CUDA context + workspace", O, "overhead",
                                                "the runtime's context and workspaces (the article's 1-2 GB)")
        self.static.append((None, "CUDA context + workspace"))

    def device_of(self, name) -> str:
        n = name[1]
        if n in self.device:
            return self.device[n]
        kind = self.tensors[n].kind
        if kind == GRAD_KIND and (n.startswith("FP32 gradient") or n.startswith("BF16 gradients after")):
            return self.opt_device
        if kind == GRAD_KIND or n in ("@gradients", "LM head's contribution to the tied embedding gradient"):
            return self.grad_device
        if n.startswith(("sqrt(", "denom of", "_foreach")) or n == "torch.tensor(1.0)":
            return self.opt_device
        return "gpu"

    def values(self, ledger) -> dict:
        """Symbol name -> number (:func:`memledger.step.structure.step_values`)."""
        return step_values(ledger)

    def sizes(self, values):
        """Every tensor's bytes at ``values``, in the order of ``self.names``: exact ints, in an int64 array
        where no total of the step can pass 2^63 (every tensor live at once, as many copies as any op holds),
        else in an array of Python ints (``dtype=object``), so that no sum ever wraps around."""
        args = [values[x.name] for x in self.symbols]
        out = [0] * len(self.names)
        for indices, fn in self._groups:
            if indices:
                for i, v in zip(indices, fn(*args)):
                    out[i] = int(v)
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
        """{kind: 0/1 vector over self.names}: param, grad, optimizer, activation, transient, overhead."""
        def kind(n):
            k = self.tensors[n].kind
            if k == GRAD_KIND:
                return "grad"
            return k if k in ("param", "optimizer", "activation", "overhead") else "transient"
        kinds = [kind(n) for n in self.names]
        return {k: np.array([x == k for x in kinds], dtype=np.int64)
                for k in ("param", "optimizer", "grad", "activation", "transient", "overhead")}

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
            if isinstance(layer, str):                              # the lump
                end = 0.5 + (L - 2) if phase == "forward" else L + 1.5 + (L - 2)
                for m in members:
                    x[m] = end
                continue
            if layer is None:
                start, width = {"forward": (0.0, 0.5), "loss": (L + 0.5, 1.0), "backward": (2 * L + 1.5, 0.5),
                                "optimizer": (2 * L + 2.0, 1.0)}[phase]
            else:
                i = L - 5 + layer if lumped and layer >= 3 else layer
                start, width = (0.5 + i, 1.0) if phase == "forward" else (L + 1.5 + (L - 1 - i), 1.0)
            for j, m in enumerate(members):
                x[m] = start + width * (j + 1) / len(members)
        return x

    def live_at(self, sample, sizes):
        """(name, bytes) of the GPU tensors live just after sample ``sample``, largest first; a tensor live in
        several blocks is one entry ("softmax output, 4 blocks"), the lumped middle blocks one more."""
        size = dict(zip(self.names, (int(b) for b in sizes * self.gpu)))
        named, blocks = {}, {}
        for layer, name in self.compiled.live[sample]:
            if size.get(name):
                named[name] = named.get(name, 0) + size[name]
                blocks[name] = blocks.get(name, 0) + (layer is not None)
        label = {n: n.lstrip("@") + (f", {k} block{'s' if k > 1 else ''}" if k else "") for n, k in blocks.items()}
        return tuple(sorted(((label[n], b) for n, b in named.items()), key=lambda kv: -kv[1]))

    def rows(self, values) -> list:
        """The step's rows with the landmarks each is live at (see docs/step.md)."""
        all_marks = {"before forward", "after forward", "after backward", "after step"}
        ev = lambda e: evaluate_expr(e, values)  # noqa: E731
        out = []

        def row(name, kind, phase, device, expr, live):
            out.append({"name": name, "kind": kind, "phase": phase, "device": device, "bytes": ev(expr),
                        "formula": str(expr), "live": live})
        for q in self.static:
            tensor = self.tensors[q[1]]
            kind = tensor.kind if tensor.kind in ("param", "grad", "optimizer", "overhead") else "activation"
            row(q[1], kind, "whole step", self.device_of(q), tensor.expr, all_marks)
        g = self.grad_row
        grads = sp.ceiling(P / (t * N_d) if g.sharded else P / t) * g.bytes_per_param
        if g.sharded:   # each tensor's shard rounded up, as backward writes them: the row is what they add up to
            static = {q[1] for q in self.static}
            marks = self.compiled.mark_counts["after backward"]
            grads = sp.Add(*(int(marks[j]) * self.tensors[n].expr for j, n in enumerate(self.names)
                             if marks[j] and n not in static and self.tensors[n].kind == GRAD_KIND))
        row(g.name, "grad", "backward to optimizer step", self.grad_device, grads, {"after backward"})
        if self.structure.recompute == "full":
            row("L x layer input (checkpoint)", "activation", "forward to backward", "gpu",
                L * self.tensors["layer input"].expr, {"after forward"})
        else:
            for r in self.layer_rows:
                row(f"L x {r.name}", "activation", "forward to backward", "gpu", L * self.tensors[r.name].expr,
                    {"after forward"})
        for r in self.outside_rows:
            if r.name not in IDS:
                row(r.name, "activation", "forward to backward", "gpu", self.tensors[r.name].expr, {"after forward"})
        seen = set()
        for op in self.ops:
            for q in op.allocs:
                tensor = self.tensors[q[1]]
                optimizer_grad = tensor.kind == GRAD_KIND and op.phase == "optimizer"
                if (tensor.kind == "transient" or optimizer_grad) and q[1] not in seen:
                    seen.add(q[1])
                    row(q[1], "transient", op.phase, self.device_of(q), tensor.expr, set())
        return out


@lru_cache(maxsize=128)
def build(s: StepStructure) -> Built:
    return Built(s)
