"""PyTorch's ``DistributedDataParallel`` in the step: its gradient buckets.

DDP's reducer keeps every gradient a second time, in flat buckets it allocates once and keeps for the whole run
(``torch/csrc/distributed/c10d/reducer.hpp``, PyTorch 2.13, lines 347-358: ``Bucket::gradients``, "gradients of
the bucket flattened into a 1-dimensional tensor"; ``reducer.cpp`` (pytorch/pytorch@ad78a7b3, cited by function:
the snapshot is too large to bring here for line numbers), ``Reducer::initialize_buckets``: ``bucket.gradients =
at::empty({offset}, options)``, offset the sum of the bucket's parameters' elements, in their dtype). After the
first iteration the buckets are rebuilt in the order the gradients became ready in backward
(``Reducer::rebuild_buckets``, ``compute_bucket_assignment_by_size``, declared in reducer.hpp lines 606-612;
with tensor indices, as the rebuild passes them, the buckets keep that order): a bucket closes as soon as it holds at least
its limit (the gradient that crosses it included), the first limit ``first_bucket_bytes_cap``, every later one
``bucket_bytes_cap``. ``torch/nn/parallel/distributed.py`` (PyTorch 2.13, ``_BucketCapacityConfig.create``, lines
86-115): ``bucket_cap_mb=None`` gives 25 MiB (``_DEFAULT_BUCKET_CAP_MB``, line 31) with a first bucket of
``dist._DEFAULT_FIRST_BUCKET_BYTES`` (1 MiB); an explicit ``bucket_cap_mb`` is every bucket's limit, the first's
too (``int(bucket_cap_mb * 2**20)`` bytes).

* ``gradient_as_bucket_view=False`` (the default): the buckets sit beside the gradients; backward copies each
  gradient into its bucket (``mark_variable_ready_dense``: ``at::mul_out(bucket_view, grad, 1/world)``) and the
  reduced bucket back (``copy_bucket_to_grad``). Every moment of the step holds P x (gradient bytes) more.
* ``gradient_as_bucket_view=True``: the gradients are views into the buckets. With ``zero_grad(set_to_none=True)``
  autograd still writes each gradient as a new tensor; the reducer's hook copies it into its bucket and points
  ``.grad`` at the bucket view (``mark_variable_ready_dense``: ``grad = bucket_view``), so that tensor is freed at
  once: gradients cost nothing beyond the buckets, and ``p.grad = None`` frees nothing.

Checked against PyTorch's own DDP with real tensors (``memledger.pytorch.ddp.ddp_step``,
``tests/step/test_ddp.py``).

Streams (the caching allocator's pools, ``memledger --measure reserved``): every tensor of DDP's step is allocated on
the default stream. The reducer is built, and its buckets allocated, where ``DistributedDataParallel`` is constructed
(``torch/nn/parallel/distributed.py:1437``, ``dist.Reducer(...)``) and rebuilt before the second forward
(``_pre_forward``, ``:1775``, ``self.reducer._rebuild_buckets()``), both on the current stream; the allreduce runs on
ProcessGroupNCCL's internal stream in place on the bucket and allocates nothing of the step's; DDP's side streams
are for inputs copied from another GPU (``torch/distributed/utils.py:105-117``: a CPU input is copied on the current
stream) and for its ``mixed_precision`` casts (``distributed.py:1090``), neither modelled. ProcessGroupNCCL no longer
calls ``recordStream`` on a collective's tensors: it keeps them referenced until the work is waited on
(``stashed_for_allocator_safety_``; ``TORCH_NCCL_AVOID_RECORD_STREAMS`` ignored, pytorch/pytorch#194701), and the
buckets live the whole step anyway, so no block's reuse is delayed.
Sympy-free where the replay needs it (:func:`bucket_limits`, :func:`assign_buckets`).
The buckets are listed gradient by gradient over every block (the step lumps blocks 2..L-3, the reducer does not):
up to :data:`memledger.core.choices.LAYERS_ONE_BY_ONE` blocks, past which ``n_layers`` is refused in one line.
"""
from dataclasses import replace

from ..core.choices import check_layers_one_by_one
from .vocab import Action, Lifetime, Phase

__all__ = ["BUCKETS", "DEFAULT_BUCKET_CAP_MB", "FIRST_BUCKET_BYTES", "MIB", "assign_buckets", "bucket_limits",
           "bucket_rows", "bucket_views", "expand_live", "expand_rows", "ready_order"]

MIB = 1024 * 1024
#: ``torch/nn/parallel/distributed.py`` line 31 and ``torch.distributed._DEFAULT_FIRST_BUCKET_BYTES`` (2.13).
DEFAULT_BUCKET_CAP_MB = 25
FIRST_BUCKET_BYTES = MIB
#: The static tensor standing for all the buckets in the compiled step (expanded into one row per bucket).
BUCKETS = "DDP gradient buckets"
#: What assigning the buckets walks (:func:`memledger.core.choices.check_layers_one_by_one` bounds it).
WALK = "assigning framework ddp's buckets (gradient by gradient, as the reducer fills them)"


def bucket_limits(bucket_cap_mb=None) -> tuple:
    """(first bucket's limit, every later bucket's limit) in bytes, as ``_BucketCapacityConfig.create`` sets them."""
    if bucket_cap_mb is None:
        return FIRST_BUCKET_BYTES, DEFAULT_BUCKET_CAP_MB * MIB
    cap = int(bucket_cap_mb * MIB)
    return cap, cap


def assign_buckets(sizes, limits) -> list:
    """Indices of ``sizes`` (bytes, in gradient-ready order) grouped into buckets as
    ``compute_bucket_assignment_by_size`` groups one dtype's tensors: a bucket closes once its size reaches its
    limit; the last, open one is kept."""
    first, rest = limits
    buckets, current, size, limit = [], [], 0, first
    for i, n in enumerate(sizes):
        current.append(i)
        size += n
        if size >= limit:
            buckets.append(current)
            current, size, limit = [], 0, rest
    if current:
        buckets.append(current)
    return buckets


def ready_order(ops, tensors, n_layers: int) -> list:
    """(block index or None, gradient name) of every parameter in the order backward writes their gradients
    (the order DDP's reducer rebuilds its buckets in), read off the step's programs (within an op, see
    :func:`_linear_bias_first`): the gradients written
    outside the blocks before and after them, each block's in its own program's order, blocks L-1 down to 0.
    ``ValueError`` naming n_layers past :data:`memledger.core.choices.LAYERS_ONE_BY_ONE` blocks, before any is listed."""
    check_layers_one_by_one(n_layers, WALK)
    before, block, after = ready_parts(ops, tensors)
    blocks = [(i, name) for i in reversed(range(n_layers)) for _, name in block]
    return before + blocks + after


def ready_parts(ops, tensors) -> tuple:
    """(before, block, after): the gradients of :func:`ready_order` written before the blocks, in one block, after
    them, as (None, name) pairs (the block's repeat for every block)."""
    from .trace import GRADIENT_LUMP
    before, block, after, seen_block = [], [], [], False
    for op in ops:
        if op.phase not in (Phase.LOSS, Phase.BACKWARD):
            continue
        for layer, name in sorted(op.allocs, key=_linear_bias_first):
            if tensors[name].lifetime is not Lifetime.GRADIENT or name == GRADIENT_LUMP:
                continue
            if layer is None:
                (after if seen_block else before).append((None, name))
            else:
                seen_block = True
                if (None, name) not in block:
                    block.append((None, name))
    return before, block, after


def _linear_bias_first(q) -> int:
    """Within one op, a linear layer's bias gradient is ready before its weight's: ``F.linear`` with a bias runs
    ``addmm(bias, x, weight.t())``, whose backward node has the bias's ``AccumulateGrad`` as a direct edge and
    the weight's behind a ``TBackward0`` node (measured: the reducer's rebuilt buckets); a norm's weight comes
    before its bias (``native_layer_norm_backward`` returns them in that order)."""
    name = q[1]
    return 0 if name.endswith(".bias") and "norm" not in name else 1


def bucket_rows(built, values: dict, bucket_cap_mb=None) -> list:
    """[(row name, bytes, formula, [parameter names])] of each DDP bucket, in the reducer's order."""
    from ..core.exact import evaluate_expr
    order = ready_order(built.ops, built.tensors, values["L"])
    size = {name: evaluate_expr(built.tensors[name].expr, values) for name in {n for _, n in order}}
    nbytes = [size[name] for _, name in order]
    out = []
    for k, members in enumerate(assign_buckets(nbytes, bucket_limits(bucket_cap_mb))):
        names = [order[i] for i in members]
        expr = sum(built.tensors[name].expr for _, name in names)
        label = [name.removeprefix("grad ") if layer is None else f"block {layer} {name.removeprefix('grad ')}"
                 for layer, name in names]
        out.append((f"DDP gradient bucket {k}", sum(nbytes[i] for i in members), str(expr), label))
    return out


def bucket_views(ops, tensors) -> list:
    """The step's ops with ``gradient_as_bucket_view=True``: each gradient backward writes is freed right after
    it is written (its contents copied into its bucket, ``.grad`` now a view of it); the lumped middle blocks
    keep none."""
    from .trace import GRADIENT_LUMP, Op
    out = []
    for op in ops:
        grads = tuple(q for q in op.allocs if tensors[q[1]].lifetime is Lifetime.GRADIENT)
        if op.phase not in (Phase.LOSS, Phase.BACKWARD) or op.action is not Action.RUN or not grads:
            out.append(op)
            continue
        kept = tuple(q for q in op.allocs if q[1] != GRADIENT_LUMP)
        out.append(replace(op, allocs=kept))
        written = tuple(q for q in kept if q in grads)
        if written:
            out.append(Op(op.phase, op.layer, "DDP: gradient copied into its bucket, .grad a view of it", written,
                          (), Action.RUN))
    return out


def expand_rows(rows, buckets) -> list:
    """The step's rows with the one row of all the buckets replaced by a row per bucket (live all step)."""
    out = []
    for r in rows:
        if r["name"] != BUCKETS:
            out.append(r)
            continue
        out += [dict(r, name=name, bytes=b, formula=formula) for name, b, formula, _ in buckets]
    return out


def expand_live(live, rows) -> tuple:
    """``live`` ((name, bytes) pairs) with the one entry of all the buckets replaced by each bucket's."""
    out = [(n, b) for n, b in live if n != BUCKETS]
    if len(out) < len(live):
        out += [(name, b) for name, b, _, _ in rows]
    return tuple(sorted(out, key=lambda kv: -kv[1]))
