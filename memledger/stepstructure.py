"""What decides a step's programs: :class:`StepStructure` (read off a ledger), the parameter tensors
in ``model.parameters()`` order, and ZeRO-3's gathered units around each block.

Two ledgers with the same structure share compiled programs (:func:`memledger.stepbuild.build`); only
their numbers differ. B = 1 is part of the structure: q, k and v then stay views of the fused QKV
projection instead of being copied for the batched matmul.
"""
from dataclasses import dataclass

import sympy as sp

from . import stepouter
from .features import Features
from .recipes import RECIPES
from .stepops import Shape, Tensor, block_param_tensors
from .symbols import L, d, t


@dataclass(frozen=True)
class StepStructure:
    shape: Shape
    recipe: str
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    offload_placement: str
    recompute: str
    tensor_parallel: bool
    sequence_parallel: bool
    conventions: object
    layers: object          # L when L <= 4, else None (any larger L gives the same program)
    prefetch: bool = True

    @classmethod
    def of(cls, ledger, conv):
        arch = ledger.arch
        if arch is None:
            raise ValueError("the step timeline needs an architecture (a preset or --hidden/--layers/--heads)")
        if arch.features != Features.of(arch.style):
            raise ValueError("the step timeline models the reference decoder's GPT and LLaMA blocks; "
                             "GQA, MoE, learned positions and encoder refinements are not modelled op by op")
        if ledger.recompute == "selective":
            raise ValueError("recompute must be none or full for the step timeline (selective is not modelled "
                             "op by op)")
        recipe = RECIPES[ledger.recipe]
        act = next(c.dtype for c in recipe.components if c.role == "param")
        grad = next(c.dtype for c in recipe.components if c.role == "grad")
        kernel = conv.kernel(arch.style, ledger.dropout, ledger.flash_attention)
        if kernel == "math":
            raise ValueError("the math SDPA kernel (CPU, LLaMA blocks with dropout) is not modelled op by op; "
                             "use flash_attention or no dropout")
        opts = conv.inventory_options(arch.style, act, ledger.dropout, ledger.flash_attention)
        shape = Shape(arch.style, kernel, bool(ledger.dropout), conv.rmsnorm, act, conv.norm_stats is not None,
                      ledger.batch_size == 1, grad, opts["mask_dtype"], opts["norm_stats"])
        return cls(shape, ledger.recipe, ledger.zero_stage, ledger.offload_optimizer, ledger.offload_params,
                   ledger.offload_placement, ledger.recompute, ledger.tp > 1, ledger.sequence_parallel, conv,
                   arch.n_layers if arch.n_layers <= 4 else None)


def param_tensors(c: Shape, layers):
    """(name, elements) of every parameter tensor in ``model.parameters()`` order; the middle blocks as one lump."""
    block = block_param_tensors(c.style)
    out = [("embedding.weight", stepouter.V * d)]
    for i in layers:
        out += [(f"block {i} {n}", e) for n, e in block]
        if i == 0 and layers[-1] > 1 and layers != list(range(layers[-1] + 1)):
            out.append(("@blocks 1..L-2", (L - 2) * sum(e for _, e in block)))
            out += [(f"block L-1 {n}", e) for n, e in block]
            break
    return out + stepouter.head_params(c)


def zero3_units(tensors, programs, fwd, bwd, c, recipe, s):
    """ZeRO-3: every module's parameters are all-gathered before it runs, forward and backward (DeepSpeed
    stage 3, FSDP), and freed after; in backward its full gradients exist until reduce-scattered. The unit
    is one block (or the embedding, or the LM head); with prefetch the next unit is gathered meanwhile
    (DeepSpeed's ``stage3_prefetch_bucket_size``, FSDP's ``forward_prefetch``/``backward_prefetch``)."""
    pb, gb = recipe.role_bytes("param"), recipe.grad_bytes
    block = sum(e for _, e in block_param_tensors(c.style))
    split = t if s.tensor_parallel else 1
    copies = 2 if s.prefetch else 1
    units = {"block": block, "embedding or LM head": stepouter.V * d}
    for unit, n in units.items():
        tensors[f"ZeRO-3 gathered {unit} parameters"] = Tensor(
            f"ZeRO-3 gathered {unit} parameters", copies * sp.ceiling(n / split) * pb, "transient",
            f"all-gathered before the {unit} runs{' (and the next unit, prefetched)' if copies == 2 else ''}")
        tensors[f"ZeRO-3 {unit} gradients before reduce-scatter"] = Tensor(
            f"ZeRO-3 {unit} gradients before reduce-scatter", sp.ceiling(n / split) * gb, "transient",
            "the unit's full gradients until they are reduce-scattered to the shards")

    def wrap(ops, unit, backward):
        names = [f"ZeRO-3 gathered {unit} parameters"] + ([f"ZeRO-3 {unit} gradients before reduce-scatter"]
                                                         if backward else [])
        return [("ZeRO-3 all-gather", (), tuple(names))] + ops + [("ZeRO-3 release", tuple(names), ())]
    fwd.ops[:] = wrap(fwd.ops, "block", False)
    bwd.ops[:] = wrap(bwd.ops, "block", True)
    for key in ("forward start", "forward end", "backward start", "backward end"):
        programs[key] = wrap(programs[key], "embedding or LM head", key.startswith("backward"))
