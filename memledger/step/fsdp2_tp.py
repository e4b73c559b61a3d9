"""FSDP2 x TP on a 2-D (dp, tp) mesh, torchtitan's layout: ``parallelize_module`` over the "tp" sub-mesh
(:func:`memledger.pytorch.distributed.tp_plan`), then ``fully_shard`` per block and the root over the "dp"
sub-mesh.

FSDP2 shards what tensor parallelism leaves on the rank: a DTensor parameter's local tensor (its TP shard), on
dim 0 across the N dp ranks, padded to a multiple of N (``_fsdp_param.py``, ``_init_sharded_param``: for a
DTensor the local tensor is chunked, ``self._sharding_spec`` the 2-D (dp, tp) spec). So each unit's all-gather
output is the unit's TP-local parameters, padded; its reduce-scatter input their TP-local gradients. The rest
of the step is the tensor-parallel step's (:mod:`memledger.step.tensor`).

A parameter's TP-local tensor (the plan of ``tp_plan``): the column-wise layers (QKV, gate, up, the embedding and
the LM head) split on dim 0, t times fewer rows; the row-wise layers (output and down projections) on dim 1,
every row t times shorter; the norms and the row-wise layers' biases whole.
"""
import sympy as sp

from ..core.symbols import F, V, d, t
from .ops import qkv_width
from .tensor import WHOLE

__all__ = ["COLUMN_ROWS", "local"]

#: Dim 0 of a column-wise parameter's TP-local tensor (divided by t), by name; the QKV's is :func:`qkv_width`.
COLUMN_ROWS = {"qkv.weight": None, "qkv.bias": None, "gate.weight": F / t, "up.weight": F / t, "up.bias": F / t,
               "embedding.weight": V / t, "head.weight": V / t}


def local(key: str, n, c) -> tuple:
    """(dim 0, elements) of parameter ``key``'s (its name in its module) TP-local tensor, ``n`` its whole
    elements."""
    if key in WHOLE:
        return n, n
    if key in COLUMN_ROWS:
        rows = qkv_width(c) if key in ("qkv.weight", "qkv.bias") else COLUMN_ROWS[key]  # qkv_width: the rank's
        return rows, sp.cancel(n / t)
    if key in ("proj.weight", "down.weight"):       # row-wise: Shard(1), every row t times shorter
        return d, sp.cancel(n / t)
    raise AssertionError(f"no tensor-parallel layout for parameter {key!r}")
