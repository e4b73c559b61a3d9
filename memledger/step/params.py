"""The parameter tensors of a step: ``model.parameters()`` order (what the optimizer walks) and
ZeRO-3's gathered units around each block (DeepSpeed stage 3, FSDP)."""
import sympy as sp

from ..core.symbols import L, V, d, t
from .ops import ProgramOp, Tensor, block_params
from .outer import Param, head_params
from .structure import Shape
from .vocab import Kind, Lifetime, OpRole

__all__ = ["param_tensors", "zero3_units"]


def param_tensors(c: Shape, layers) -> list:
    """:class:`~memledger.step.outer.Param` of every parameter tensor in ``model.parameters()`` order; blocks
    1..L-2 as one lump where ``layers`` (the blocks run op by op) skips some."""
    block = block_params(c)
    out = [Param("embedding.weight", V * d, step=OpRole.EMBEDDING_STEP)]
    for i in layers:
        out += [Param(f"block {i} {n}", e, local=n) for n, e in block]
        if i == 0 and layers[-1] > 1 and layers != list(range(layers[-1] + 1)):
            out.append(Param("@blocks 1..L-2", (L - 2) * sum(e for _, e in block), lump=True))
            out += [Param(f"block L-1 {n}", e, local=n) for n, e in block]
            break
    outer_params = [Param(n, e) for n, e in head_params(c)]
    if c.implementation == "litgpt":    # GPT.__init__ (litgpt/model.py l. 28-35): lm_head before transformer (wte, h, ln_f)
        head = [x for x in outer_params if x.name == "head.weight"]
        return head + out + [x for x in outer_params if x.name != "head.weight"]
    return out + outer_params


def zero3_units(tensors, outside: dict, fwd, bwd, c, recipe, s):
    """ZeRO-3: every module's parameters are all-gathered before it runs, forward and backward (DeepSpeed
    stage 3, FSDP), and freed after; in backward its full gradients exist until reduce-scattered. The unit
    is one block (or the embedding, or the LM head); with prefetch the next unit is gathered meanwhile
    (DeepSpeed's ``stage3_prefetch_bucket_size``, FSDP's ``forward_prefetch``/``backward_prefetch``).
    ``outside``: {(phase, part): ops} of the programs outside the blocks."""
    pb, gb = recipe.role_bytes("param"), recipe.grad_bytes
    split = t if s.tensor_parallel else 1
    copies = 2 if s.prefetch else 1
    units = {"block": sum(e for _, e in block_params(c)), "embedding or LM head": V * d}
    for unit, n in units.items():
        tensors[f"ZeRO-3 gathered {unit} parameters"] = Tensor(
            f"ZeRO-3 gathered {unit} parameters", copies * sp.ceiling(n / split) * pb, Kind.TRANSIENT,
            Lifetime.TEMPORARY, why=f"all-gathered before the {unit} runs"
                                    f"{' (and the next unit, prefetched)' if copies == 2 else ''}")
        tensors[f"ZeRO-3 {unit} gradients before reduce-scatter"] = Tensor(
            f"ZeRO-3 {unit} gradients before reduce-scatter", sp.ceiling(n / split) * gb, Kind.TRANSIENT,
            Lifetime.TEMPORARY, why="the unit's full gradients until they are reduce-scattered to the shards")

    def wrap(ops, unit, backward):
        names = (f"ZeRO-3 gathered {unit} parameters",) + (
            (f"ZeRO-3 {unit} gradients before reduce-scatter",) if backward else ())
        return [ProgramOp("ZeRO-3 all-gather", (), names)] + ops + [ProgramOp("ZeRO-3 release", names, ())]
    fwd.ops[:] = wrap(fwd.ops, "block", False)
    bwd.ops[:] = wrap(bwd.ops, "block", True)
    for key in outside:
        outside[key] = wrap(outside[key], "embedding or LM head", key.backward)
