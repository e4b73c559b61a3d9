"""LitGPT's LoRA step (``LoraLedger(..., implementation="litgpt").step(...)``, ``memledger step --lora-rank ...
--implementation litgpt``): ``finetune/lora.py``'s loop over ``litgpt.lora.GPT``, op by op.

The programs: :mod:`memledger.step.litgpt_lora_block` (a layer, and the first layer's own programs, run as block 0 by
:func:`memledger.step.trace.flatten`), :mod:`memledger.step.litgpt_lora_head` (the head's chunks and the loss),
:mod:`memledger.step.outer` (the embedding; ``torch.optim.AdamW`` over the adapters, ``model.parameters()``'s order:
each layer's ``qkv.lora_A``, ``qkv.lora_B``). What the loop holds the whole step is
:func:`memledger.step.litgpt_lora.landmarks`' "before forward": the frozen base and the adapters (BF16), AdamW's
moments and step counters, the batch, ``cos`` and ``sin``, each layer's ``_lora_ind`` buffer, the previous
iteration's logits and loss.

Scope: adapters on the fused QKV projection (any of q, k, v: ``lora_query``, ``lora_key``, ``lora_value``), with or
without dropout, a BF16 base, BF16 adapters under ``torch.optim.AdamW`` (``bf16-true``, recipe bf16-pure-adamw),
no recomputation; the rest is refused in one line (:func:`check`). Checked against LitGPT's own model and loop
under ``FakeTensorMode`` (tests/step/test_litgpt_lora_step.py): every landmark, phase peak and the peak.
"""
from typing import NamedTuple

import sympy as sp

from ..core.symbols import B, F, H, L, O, S, V, d
from ..core.exact import evaluate_expr
from ..core.vocabulary import Role
from ..states.recipes import get_recipe
from . import outer
from .build import IDS, Built
from .litgpt_loss import PREVIOUS
from .litgpt_lora import QKV, adapter_tensors, layer_rows, outside_rows
from .litgpt_lora_block import block_backward, block_forward
from .litgpt_lora_head import check as check_seq, forward_end, backward_start, backward_end, saved_names
from .ops import Program, Tensor
from .outer import Param
from .trace import GRADIENT_LUMP, SAVED_LUMP, FirstBlock, Part, explicit_layers, flatten
from .vocab import Device, Kind, Lifetime

__all__ = ["LitgptLoraBuilt", "check"]

#: The temporaries every program names beside the saved rows (B x S x d each, BF16).
TRANSIENTS = [("dX_out", "the gradient flowing back into the layer's output"),
              ("grad of the embedding output", "never made: the embedding's output needs no gradient"),
              ("block input", "the layer's input, held by the caller until the layer returns"),
              ("attention residual sum", "x = attention_output + x, norm 2's input"),
              ("final norm input", "the last layer's output, until the final norm returns")]


def check(targets, seq_len: int, recipe: str, base: str) -> list:
    """What the step does not model yet under LitGPT's LoRA (phrases for a one-line refusal); ``ValueError`` naming
    ``seq_len`` where the last head chunk is dropped."""
    check_seq(seq_len)
    return [what for what, off in [
        ("adapters beyond the fused QKV projection (lora_projection, lora_mlp)", set(targets) - set(QKV)),
        (f"adapter_recipe {recipe} (finetune/lora.py's bf16-true: bf16-pure-adamw)", recipe != "bf16-pure-adamw"),
        ("an NF4 base (QLoRA) in the step", base != "bf16")] if off]


def _params(targets, layers) -> list:
    """The adapters' :class:`~memledger.step.outer.Param` in ``model.parameters()`` order, blocks 1..L-2 as one lump
    where ``layers`` skips some."""
    block = adapter_tensors(targets)
    params = []
    for i in layers:
        params += [Param(f"block {i} {n}", e) for n, e in block]
        if i == 0 and layers != list(range(layers[-1] + 1)):
            params.append(Param("@blocks 1..L-2", (L - 2) * sum(e for _, e in block), lump=True))
            params += [Param(f"block L-1 {n}", e) for n, e in block]
            break
    return params


class GradRow(NamedTuple):
    """The adapters' gradients as :meth:`~memledger.step.build.Built.rows` books them."""
    name: str
    bytes_per_param: object
    sharded: bool = False


def _one_rank(name):
    return name


class LitgptLoraBuilt(Built):
    """The programs and compiled sizes of a LoRA :class:`~memledger.step.lora.LoraStructure` under LitGPT's code."""

    def __init__(self, s):
        self.shape = c = s.shape
        self.structure = s
        spec, recipe = s.lora, get_recipe(s.recipe)
        targets, dropout = spec.targets, spec.dropout
        self.masters = frozenset()      # bf16-pure-adamw only (check): no FP32 master weights
        mask = "bool" if c.mask_dtype == "bool" else c.dtype
        self.layer_rows = layer_rows(targets, dropout, mask, c.dtype)
        self.first_rows = layer_rows(targets, dropout, mask, c.dtype, first=True)
        self.outside_rows = outside_rows()
        tensors = {row.name: Tensor(row.name, row.bytes, Kind.ACTIVATION, Lifetime.SAVED, why=row.why)
                   for row in self.layer_rows + self.first_rows + self.outside_rows}
        tensors |= {n: Tensor(n, B * S * d * 2, Kind.TRANSIENT, Lifetime.TEMPORARY, why=why) for n, why in TRANSIENTS}
        self.placement = Program(tensors).placement
        p = Program(tensors, self.placement)
        outside = {}
        for part, make in {Part.FORWARD_START: outer.forward_start, Part.FORWARD_END: forward_end,
                           Part.BACKWARD_START: backward_start, Part.BACKWARD_END: backward_end}.items():
            q = p.fork()
            make(q, c)
            outside[part] = q.ops
        fwd, bwd, fwd0, bwd0 = p.fork(), p.fork(), p.fork(), p.fork()
        block_forward(fwd, c, targets, dropout)
        block_backward(bwd, c, targets, dropout, _one_rank)
        block_forward(fwd0, c, targets, dropout, first=True)
        block_backward(bwd0, c, targets, dropout, _one_rank, first=True)
        moments, master = outer.adamw(recipe)
        params = _params(targets, explicit_layers(s.layers or 5))
        opt = p.fork()
        outer.optimizer(opt, params, moments, master and c.grad_dtype != "fp32", s.conventions.foreach, c.grad_dtype)
        saved = sum((tensors[row.name].expr for row in self.layer_rows), sp.Integer(0))
        tensors[SAVED_LUMP] = Tensor(SAVED_LUMP, (L - 4) * saved, Kind.ACTIVATION, Lifetime.SAVED)
        grads = sum((tensors[f"grad qkv.lora_{m}"].expr for m in "AB"), sp.Integer(0))
        tensors[GRADIENT_LUMP] = Tensor(GRADIENT_LUMP, (L - 4) * grads, Kind.GRAD, Lifetime.GRADIENT)
        self.ops = flatten(s.layers or 5, c, outside, fwd.ops, bwd.ops, opt.ops, first=FirstBlock(fwd0.ops, bwd0.ops))
        self.tensors = tensors
        self._statics(recipe, targets)
        self._compile()

    def rows(self, values) -> list:
        """:meth:`~memledger.step.build.Built.rows`, a layer's saved tensors the first layer does not keep (its input
        needs no gradient) booked L - 1 times."""
        out = super().rows(values)
        first = {row.name for row in self.first_rows}
        booked = {f"L x {row.name}": row.name for row in self.layer_rows if row.name not in first}
        for row in out:
            name = booked.get(row["name"])
            if name:
                expr = (L - 1) * self.tensors[name].expr
                row.update(name=f"(L - 1) x {name} (not in the first layer)", bytes=evaluate_expr(expr, values),
                           formula=str(expr))
        return out

    def loss_saved(self) -> list:
        """What the loss keeps for backward (:func:`memledger.step.litgpt_lora_head.saved_names`)."""
        return [n for n in saved_names(self.shape.single) if n in self.tensors]

    def _statics(self, recipe, targets):
        """What ``finetune/lora.py``'s loop holds the whole step."""
        t_ = self.tensors
        self.static = []

        def static(name, expr, kind, why=""):
            t_[name] = Tensor(name, expr, kind, Lifetime.STEP, Device.GPU, why)
            self.static.append((None, name))
        n = len(targets)
        frozen = 2 * V * d + d + L * (2 * d + 4 * d * d + 3 * d * F)
        static("frozen base weights (bf16; no grads, no states)", 2 * frozen, Kind.PARAM, "requires_grad=False")
        P = L * sum(e for _, e in adapter_tensors(targets))
        self.adapter_params = P
        grad = recipe.grad_component
        self.grad_row = GradRow(f"LoRA adapters: {grad.name}", grad.bytes_for(1))
        for x in recipe.components:
            if x is not grad:
                kind = Kind.PARAM if x.role == Role.PARAM else Kind.OPTIMIZER
                static(f"LoRA adapters: {x.name}", x.bytes_for(P), kind, "the adapter recipe's component")
        static("Adam step counters", 4 * L * len(adapter_tensors(targets)), Kind.OPTIMIZER,
               "one 0-d FP32 step tensor per adapter tensor (torch.optim.AdamW)")
        for name in IDS:
            static(name, B * S * 8, Kind.ACTIVATION, "the batch (int64), held by the loop")
        static("RoPE cos and sin (FP32 buffers)", 2 * S * (d / H) * 4, Kind.PARAM, "max_seq_length set to S")
        if 0 < n < len(QKV):
            static("_lora_ind buffers", L * n * d * 8, Kind.PARAM, "LoRAQKVLinear.lora_ind: n d int64 a layer")
        static(PREVIOUS[0], B * S * V * 2, Kind.ACTIVATION, "the last iteration's chunks, until the new list is bound")
        static(PREVIOUS[1], 2, Kind.ACTIVATION, "the last iteration's loss, until the new one is bound")
        static("CUDA context + workspace", O, Kind.OVERHEAD, "the runtime's context and workspaces")
