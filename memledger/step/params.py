"""The parameter tensors of a step: ``model.parameters()`` order (what the optimizer walks) and
ZeRO-3's gathered units around each block (DeepSpeed stage 3, FSDP)."""
import sympy as sp

from . import outer as stepouter
from .ops import Tensor, block_params
from .structure import Shape
from ..core.symbols import L, d, t


def param_tensors(c: Shape, layers):
    """(name, elements) of every parameter tensor in ``model.parameters()`` order; the middle blocks as one lump."""
    block = block_params(c)
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
    block = sum(e for _, e in block_params(c))
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
