"""torchtitan's step (``implementation="torchtitan"``): its Llama3 model's per-layer RoPE caches, and what
``Trainer.train_step`` holds around the model (its gradients kept between steps, the token count, the loss summed
then divided, the gradients clipped).

Read from torchtitan 0.3.0:

* The block (``models/llama3/model.py`` l. 42-50, ``models/common/attention.py`` l. 787-871, 978-1010, ``rope.py``
  l. 255-268): fused ``wqkv`` split into contiguous q, k, v; ``ComplexRoPE`` on q.float() and k.float() (the FP32
  complex views saved); SDPA; ``nn.RMSNorm`` (composite). What it saves equals the reference decoder's block under
  the CPU conventions (:func:`memledger.pytorch.torchtitan_step.layer_saved`).
* Every layer's ``ComplexRoPE`` keeps its own ``cache`` buffer (``rope.py`` l. 111-114, 185-234: complex64,
  ``max_seq_len`` x d_h/2), ``max_seq_len`` set to ``training.seq_len`` by the trainer (``decoder.py`` l. 165-181):
  L x S x d_h/2 x 8 bytes. (Built without the trainer, at ``_8b``'s 131,072 positions, it is 64 MiB a layer:
  2 GiB over Llama3-8B's 32 layers.)
* ``train_step`` (``trainer.py`` l. 871-945): ``optimizers.zero_grad(set_to_none=disable_cuda_graphs)``, False by
  default (``config/configs.py`` l. 66): the gradients are zeroed in place and kept, every moment of the step; autograd
  then accumulates each new gradient into the kept one (``AccumulateGrad``: ``variable_grad += new_grad``), the new
  one freed at once, and the optimizer step frees none. ``local_valid_tokens = torch.tensor(0, dtype=torch.int64)``,
  ``+= (labels != IGNORE_INDEX).sum()`` (a (B, S) bool mask and an int64 sum, temporaries), the count alive until
  ``train_step`` returns.
* The loss (``_forward_backward_body`` l. 808-829, ``components/loss.py`` l. 32-65, 351-367): ``pred`` (the BF16
  logits) held by the caller until ``del pred`` after the loss; ``cross_entropy(pred.flatten(0, 1).float(), ...,
  reduction="sum")`` divided by the count (a new FP32 scalar, the sum dies); the loss alive until ``train_step``
  returns.
* ``dist_utils.clip_grad_norm_(params, max_norm, foreach=True)`` (``distributed/utils.py`` l. 599-676):
  ``torch.nn.utils.get_total_norm`` (``_foreach_norm``: one scalar a gradient, in its dtype; ``torch.stack`` of them;
  ``vector_norm``: the total) and ``clip_grads_with_norm_`` (``max_norm / (total + 1e-6)``, ``clamp``, then
  ``_foreach_mul_`` in place); the total norm alive until ``train_step`` returns.

Not booked: on one GPU ``parallelize_llama`` still wraps the model with ``apply_fsdp_to_decoder`` on a 1-rank mesh
(``models/llama3/parallelize.py`` l. 69-90), whose final norm and LM head unit keeps an unsharded BF16 copy from
forward into backward, 2 (V d + d) bytes (measured: tests/pytorch/test_torchtitan.py, a strict xfail).

Tensor parallelism (:func:`tp_layer_bytes`, one layer only): torchtitan 0.3.0 declares its plan on the configs
(``models/llama3/sharding.py`` l. 25-74, ``models/common/decoder_sharding.py``): ``wqkv``, ``w1``, ``w3`` column-wise,
``wo``, ``w2`` row-wise; with sequence parallelism (``enable_sequence_parallel``, True by default) the norms run
on S/t positions and the attention module and the feed-forward module each all-gather their input once at their
boundary (``in_dst_shardings`` Replicate, l. 190-200 and 283-289): fused QKV and w1/w3 share that copy, saved
whole. The whole step under TP (its vocabulary-parallel loss, ``components/loss.py`` l. 32-65) is not modelled.

Under ``recompute="full"`` (torchtitan's ``FullAC``, ``distributed/activation_checkpoint.py`` l. 166-182) the
reference's checkpointed block runs unchanged. Checked against torchtitan's own model and loop under ``FakeTensorMode``
(:func:`memledger.pytorch.torchtitan_step.titan_step`, tests/pytorch/test_torchtitan.py).
"""
from ..core.symbols import B, H, L, S, d
from .tensor import SP_NORM_OUTPUT
from .vocab import Kind, OpRole

__all__ = ["COUNT", "GRADIENTS", "LOSS", "backward_start", "forward_end", "forward_start", "on", "optimizer", "outside",
           "statics", "tp_layer_bytes"]

COUNT = "local_valid_tokens (int64)"
LOSS = "loss / global_valid_tokens (FP32)"
SUM_GRAD = "gradient of the summed loss (FP32)"
NORM = "total gradient norm (clip_grad_norm_)"
#: The static row of the gradients ``zero_grad(set_to_none=False)`` keeps.
GRADIENTS = "gradients, zeroed and kept (zero_grad(set_to_none=False))"


def on(c) -> bool:
    return getattr(c, "implementation", "reference") == "torchtitan"


def statics(c) -> list:
    """(name, bytes, kind, why) of what torchtitan's model holds the whole step: each layer's RoPE cache."""
    if not on(c):
        return []
    return [("RoPE caches (complex64 buffers, every layer)", L * S * d / H / 2 * 8, Kind.PARAM,
             "ComplexRoPE.cache of each layer: training.seq_len x d_h/2 complex64 (rope.py l. 111-114, 185-234)")]


def forward_start(p, c):
    """``local_valid_tokens = torch.tensor(0)``; ``+= (labels != IGNORE_INDEX).sum()``: before the model runs."""
    mask = p.new("labels != IGNORE_INDEX (trainer)", (B, S), "bool", "the count's mask")
    total = p.new("(labels != IGNORE_INDEX).sum() (int64)", (), "int64", "added into the count in place")
    p.new(COUNT, (), "int64", "torch.tensor(0, dtype=torch.int64): alive until train_step returns")
    p.op("trainer: local_valid_tokens = torch.tensor(0)", alloc=[COUNT])
    p.op("trainer: labels != IGNORE_INDEX", alloc=[mask])
    p.op("trainer: .sum()", alloc=[total])
    p.op("released (the mask)", free=[mask])
    p.op("trainer: local_valid_tokens += (in place)", free=[total])


def forward_end(ops: list, p) -> list:
    """``ops`` (the reference's final norm, LM head and FP32 cross-entropy) with torchtitan's loss: the BF16 logits
    kept until ``del pred``, the summed loss divided by the count (the sum dies)."""
    p.new(LOSS, (), "fp32", "the loss: alive until train_step returns")
    out = []
    for op in ops:
        out.append(op._replace(frees=tuple(n for n in op.frees if n != "logits")))
        if op.role is OpRole.LOSS_COMPUTED:
            q = p.fork()
            q.op("loss / global_valid_tokens", alloc=[LOSS])
            q.op("released (the summed loss; del pred: the BF16 logits)", free=["loss", "logits"])
            out += q.ops
    return out


def backward_start(ops: list, p) -> list:
    """``ops`` with the division's backward: the summed loss's gradient, a new FP32 scalar, until nll_loss's
    backward has run."""
    p.new(SUM_GRAD, (), "fp32", "DivBackward0's output")
    out = []
    for op in ops:
        out.append(op)
        if op.role is OpRole.LOSS_BACKWARD:
            q = p.fork()
            q.op("division backward", alloc=[SUM_GRAD])
            out += q.ops
        if op.role is OpRole.LABELS_RELEASED:
            out.append(op._replace(label="released (the summed loss's gradient)", frees=(SUM_GRAD,), allocs=(),
                                   role=None))
    return out


def outside(ops_of: dict, c, fork) -> dict:
    """``ops_of`` ({part name: the reference's ops}) with the trainer's count before the model, its loss, and the
    loss no longer released with its gradient (it lives until ``train_step`` returns)."""
    if not on(c):
        return ops_of
    out = dict(ops_of)
    q = fork()
    forward_start(q, c)
    out["forward start"] = q.ops + list(ops_of["forward start"])
    out["forward end"] = forward_end(list(ops_of["forward end"]), fork())
    out["backward start"] = backward_start(list(ops_of["backward start"]), fork())
    out["backward end"] = [op._replace(frees=tuple(n for n in op.frees if n != "loss"))
                           if op.role is OpRole.LOSS_RELEASED else op for op in ops_of["backward end"]]
    return out


def clip(p, n_tensors, grad_dtype: str):
    """``clip_grad_norm_(foreach=True)``: one norm a gradient, stacked, the total; the clip coefficient's three
    scalars; the gradients scaled in place."""
    norms = p.new("_foreach_norm: one norm a gradient", (n_tensors,), grad_dtype, "get_total_norm's norms")
    stacked = p.new("torch.stack(norms)", (n_tensors,), grad_dtype, "get_total_norm")
    p.new(NORM, (), grad_dtype, "vector_norm of the stacked norms: grad_norm, alive until train_step returns")
    plus = p.new("total_norm + 1e-6", (), grad_dtype, "clip_grads_with_norm_")
    coef = p.new("max_norm / (total_norm + 1e-6)", (), grad_dtype, "clip_grads_with_norm_")
    clamped = p.new("clamp(clip_coef, max=1.0)", (), grad_dtype, "clip_grads_with_norm_")
    p.op("clip_grad_norm_: _foreach_norm", alloc=[norms])
    p.op("torch.stack", alloc=[stacked])
    p.op("vector_norm", alloc=[NORM])
    p.op("released (the norms)", free=[stacked, norms])
    p.op("total_norm + 1e-6", alloc=[plus])
    p.op("max_norm / (total_norm + 1e-6)", alloc=[coef])
    p.op("released", free=[plus])
    p.op("clamp(max=1.0)", alloc=[clamped])
    p.op("released; _foreach_mul_ (in place)", free=[coef, clamped])


def optimizer(ops: list, c, fork, n_tensors) -> list:
    """The optimizer step's ops after ``clip_grad_norm_``, then ``train_step`` returning: the loss, the count and
    the norm released."""
    if not on(c):
        return ops
    a, b = fork(), fork()
    clip(a, n_tensors, c.grad_dtype)
    b.op("train_step returns", free=[LOSS, COUNT, NORM])
    return a.ops + list(ops) + b.ops


def tp_layer_bytes(rows, sequence_parallel: bool = True):
    """One layer's saved bytes on one rank under torchtitan's tensor parallelism (the rows: the layer's inventory,
    :class:`~memledger.activations.inventory.Saved`): each row's rank share (``Saved.rank_bytes``: /t where the
    row is split on heads or F, and under SP on the sequence), except that under SP the two inputs gathered at the
    attention and feed-forward boundaries are saved whole (B S d each) where Megatron-LM saves the S/t shard:
    sum(rank_bytes) + (1 - 1/t) (|QKV input| + |MLP input|). At LLaMA-2 7B, B 1, S 4096, t 8: 56 MiB a layer
    above Megatron's slice. Measured: :func:`memledger.pytorch.torchtitan_step.tp_layer_saved`."""
    total = sum(r.rank_bytes(True, sequence_parallel) for r in rows)
    if sequence_parallel:
        total += sum(r.bytes - r.rank_bytes(True, True) for r in rows if r.name in SP_NORM_OUTPUT)
    return total
