"""Tensor parallelism as DTensor runs it: the step's programs on one rank of ``parallelize_module``.

The plan is torchtitan's ``apply_tp`` for LLaMA (:func:`memledger.pytorch.distributed.tp_plan`): the fused QKV
projection and the MLP's input projections column-wise, the output and down projections row-wise, the
embedding vocabulary-parallel (``RowwiseParallel(input_layouts=Replicate())``), the LM head column-wise with
its output left sharded on the vocabulary, and the loss under ``loss_parallel()``
(``torch/distributed/tensor/parallel/loss.py``). What one rank allocates, besides a block run at H/t heads
and F/t hidden units (:func:`memledger.step.ops.widths_of`, :func:`memledger.step.ops.per_rank`):

* a row-wise layer's output is a partial sum (B*S*d), all-reduced into a new tensor (``funcol.all_reduce``
  copies before reducing); the partial sum goes once the reduced copy exists. The same for the input
  gradient of a column-wise layer in backward (the QKV, gate and up projections and the LM head);
* the vocabulary-parallel embedding masks the ids outside the rank's rows (``_MaskPartial._partition_value``:
  a bool mask, an int64 clone and the shifted ids, per token), looks the rest up into a partial sum and
  all-reduces it; its backward runs ``embedding_dense_backward`` on Replicate inputs, so **its gradient is
  the whole V x d on every rank** (and AdamW's step redistributes it to the rank's rows: each of
  ``lerp_`` and ``addcmul_`` reads a contiguous copy of those rows, V*d/t, two at once for ``addcmul_``);
* the loss (``_log_softmax``, ``_nll_loss_forward``, ``_nll_loss_and_log_softmax_backward``): every
  B*S*V tensor is B*S*V/t (FP32); the forward holds the FP32 logits, ``shifted`` and ``exp(shifted)`` or
  the log-softmax output at once, the backward ``zeros_like``, ``exp`` and their sum; each holds a few
  per-token tensors (maxima, sums, masked int64 targets), written out here op by op;
* the norms (and in GPT blocks the row-wise layers' biases) are replicated: their weights, gradients and
  optimizer states are whole on every rank (:data:`WHOLE`).

Read off MemTracker's log of :func:`memledger.pytorch.distributed.tp_step` (PyTorch 2.13, CPU) and checked
against it to the byte by ``tests/step/test_tensor.py``.
"""
import sympy as sp

from ..core.dtypes import nbytes
from ..core.symbols import B, L, S, V, d, t
from .norms import norm_backward, norm_forward
from .ops import BSd, ProgramOp, Ref, Tensor, final_input, residual_names
from .outer import final_norm_params
from .structure import Shape
from .vocab import Kind, Lifetime, OpRole, Scope

__all__ = ["BSd_t", "COLUMN_BACKWARD", "LOGITS", "OUTSIDE", "ROW_FORWARD", "SP_NORM_OUTPUT", "SP_TEMPORARIES",
           "UP_COPY", "WHOLE", "WHOLE_ROW", "backward_end", "backward_start", "beyond_share", "collectives",
           "forward_end", "forward_start", "param_share", "redistribute_embedding_gradient", "sequence_parallel_block",
           "sequence_parallel_rows", "whole_elements", "whole_gradients"]

#: One rank's logits: vocabulary-parallel.
LOGITS = (B, S, V / t)
#: A sequence-parallel activation: the rank's S/t positions.
BSd_t = (B, S / t, d)
#: Under SP the norms' outputs are the rank's S/t positions; what a column-wise layer saves is its own
#: all-gathered copy of the whole sequence (DTensor's ``redistribute(Shard(1) -> Replicate())`` output, an
#: input of the matmul autograd keeps): {the row it becomes: the norm's output}.
SP_NORM_OUTPUT = {"Q/K/V projection input": "norm 1 output (S/t)", "MLP input": "norm 2 output (S/t)",
                  "LM head input": "final norm output (S/t)"}
#: The up projection's own gathered copy of the MLP input (the gate projection's is the "MLP input" row).
UP_COPY = "MLP input, the up projection's all-gathered copy"
#: Temporaries of a block on the rank's S/t positions under SP (besides the norms'): the residual stream's
#: gradients and the row-wise layers' reduce-scattered outputs.
SP_TEMPORARIES = ("output projection output", "down-projection output", "gradient of norm 2's input",
                  "gradient of the attention residual sum", "gradient of norm 1's input",
                  "gradient of the MLP input via up", "gradient of the MLP input via gate", "gradient of the MLP input",
                  "gradient of norm 1's output")
#: Parameters a tensor-parallel plan leaves whole on every rank: the norms, the row-wise layers' biases.
WHOLE = ("norm1.weight", "norm1.bias", "norm2.weight", "norm2.bias", "final norm.weight", "final norm.bias",
         "proj.bias", "down.bias")
#: The row-wise layers' forward ops and the column-wise layers' backward ops in a block.
ROW_FORWARD = (OpRole.OUTPUT_PROJECTION, OpRole.DOWN_PROJECTION)
COLUMN_BACKWARD = (OpRole.QKV_PROJECTION_BACKWARD, OpRole.UP_PROJECTION_BACKWARD, OpRole.GATE_PROJECTION_BACKWARD)


def param_share(share):
    """The elements of a parameter (by its name in its module) on one rank: whole for :data:`WHOLE`, else
    ``share`` (ceil(n/t))."""
    return lambda key, n: n if key in WHOLE else share(n)


def _token(p, name, dtype, why):
    return p.new(name, (B, S), dtype, why)


def _mask_partition(p, where):
    """``_MaskPartial._partition_value`` on int64 ids: a bool mask of the ids outside the rank's range and the
    ids shifted by its offset (via a clone); returns (mask, shifted ids)."""
    lt, ge = (_token(p, f"{where}: ids {x} the rank's range", "bool", "a comparison") for x in ("below", "above"))
    mask = _token(p, f"{where}: mask of the ids outside the rank's rows", "bool", "(ids < lo) | (ids >= hi)")
    clone = _token(p, f"{where}: ids cloned", "int64", "tensor.clone() - offset")
    shifted = _token(p, f"{where}: ids shifted to the rank's rows", "int64", "clone - offset, masked to 0")
    p.op(f"{where}: ids < offset", alloc=[lt])
    p.op(f"{where}: ids >= offset + rows", alloc=[ge])
    p.op(f"{where}: mask", alloc=[mask])
    p.op(f"{where}: clone", free=[lt, ge], alloc=[clone])
    p.op(f"{where}: - offset", alloc=[shifted])
    p.op("released", free=[clone])
    return mask, shifted


def forward_start(p, c: Shape, sequence_parallel=False):
    """The causal mask (eager attention) and the vocabulary-parallel embedding: the masked lookup is a partial
    sum, all-reduced into the first block's input (reduce-scattered on the sequence under SP)."""
    if c.attention == "eager":
        ones = p.new("ones (S, S)", (S, S), "bool", "torch.ones before .triu(1)")
        p.op("torch.ones(S, S)", alloc=[ones])
        p.op("triu: the causal mask", alloc=["causal mask"])
        p.op("released", free=[ones])
    a = c.dtype
    mask, shifted = _mask_partition(p, "embedding")
    zero = p.new("embedding: index 0", (), "int64", "masked ids set to 0")
    partial = p.new("embedding output (partial sum)", BSd, a, "the rank's rows looked up, the others 0")
    fill = p.new("embedding: 0.0", (), a, "output[mask] = 0.0")
    p.op("embedding: shifted[mask] = 0", alloc=[zero])
    p.op("embedding (the rank's rows)", free=[zero], alloc=[partial])
    p.op("released", free=[shifted])
    p.op("embedding: output[mask] = 0", alloc=[fill])
    first = Ref(Scope.FIRST, residual_names(c)[0])
    if sequence_parallel:
        p.op("split", free=[mask, fill])
        _reduce_scatter(p, partial, first, "the embedding")
    else:
        p.op("all-reduce (sum): the embedding", free=[mask, fill], alloc=[first])
        p.op("released", free=[partial])


def forward_end(p, c: Shape, sequence_parallel=False):
    """Final norm, column-wise LM head (vocabulary-sharded logits), FP32 upcast, ``loss_parallel``'s
    log-softmax (all-reduced max and sum) and NLL (masked gather, all-reduced)."""
    src = _sharded_logits(p, c, sequence_parallel)
    _parallel_log_softmax(p)
    _parallel_nll(p)
    p.op("loss computed", free=[src], role=OpRole.LOSS_COMPUTED)


def _sharded_logits(p, c: Shape, sequence_parallel: bool) -> str:
    """The final norm and the column-wise LM head: the rank's V/t columns of the logits, upcast to FP32 where the
    model's dtype is not; returns the logits the loss reads."""
    a, f = c.dtype, "fp32"
    out = p.new(SP_NORM_OUTPUT["LM head input"], BSd_t, a, "all-gathered by the LM head") \
        if sequence_parallel else "LM head input"
    norm_forward(p, c, "final", out)
    if sequence_parallel:
        _all_gather(p, "LM head input", "the LM head's input")
    logits = p.new("logits", LOGITS, a, "the LM head's output: the rank's V/t columns")
    p.op("LM head", alloc=[logits], role=OpRole.LM_HEAD)
    if c.upcast or sequence_parallel:
        p.op("final norm input released", free=[final_input(c) if c.upcast else None,
                                                 out if sequence_parallel else None],
             role=OpRole.FINAL_NORM_INPUT_RELEASED)
    src = logits
    if a != "fp32":
        src = p.new("logits in FP32", LOGITS, f, "logits.float(): cross-entropy runs in FP32")
        p.op("logits.float()", alloc=[src])
        p.op("BF16 logits released", free=[logits])
    return src


def _parallel_log_softmax(p):
    """``loss_parallel``'s log-softmax over the rank's columns: max and sum of exp all-reduced (loss.py:
    ``_log_softmax``)."""
    f = "fp32"
    m0, m = (_token(p, f"log_softmax: {x}", f, "per token") for x in ("rank's max", "max (all-reduced)"))
    s0, s = (_token(p, f"log_softmax: {x}", f, "per token") for x in ("rank's sum of exp", "sum (all-reduced)"))
    lse = _token(p, "log_softmax: log of the sum", f, "per token")
    shifted = p.new("shifted logits", LOGITS, f, "x - max (loss.py: _log_softmax)")
    e = p.new("exp(shifted)", LOGITS, f, "summed over the rank's vocabulary")
    p.op("amax", alloc=[m0])
    p.op("all-reduce (max)", alloc=[m])
    p.op("x - max", free=[m0], alloc=[shifted])
    p.op("exp", alloc=[e])
    p.op("sum", alloc=[s0])
    p.op("all-reduce (sum)", free=[e], alloc=[s])
    p.op("log", free=[s0], alloc=[lse])
    p.op("shifted - log(sum)", alloc=["log-softmax output (FP32)"])
    p.op("released", free=[shifted, m, s, lse])


def _parallel_nll(p):
    """``loss_parallel``'s NLL: the targets outside the rank's columns masked, the gathered log-probabilities
    all-reduced, summed over the targets and divided by their count."""
    f = "fp32"
    ne = _token(p, "nll: target != ignore_index", "bool", "per token")
    safe = _token(p, "nll: safe target", "int64", "torch.where(target != ignore_index, target, 0)")
    p.op("target != ignore_index", alloc=[ne])
    p.op("safe target", alloc=[safe])
    p.op("released", free=[ne])
    mask, shifted_ids = _mask_partition(p, "nll")
    zero = p.new("nll: index 0", (), "int64", "masked targets set to 0")
    gathered = _token(p, "nll: gathered (partial)", f, "the rank's log-probabilities of the targets")
    fill = p.new("nll: 0.0", (), f, "result_partial[mask] = 0")
    reduced, neg, res = (_token(p, f"nll: {x}", f, "per token") for x in ("gathered (all-reduced)", "-gathered",
                                                                          "where(target != ignore_index)"))
    ne2, ne3 = (_token(p, f"nll: target != ignore_index ({x})", "bool", "per token") for x in ("2", "3"))
    count = p.new("nll: count of targets", (), "int64", "(target != ignore_index).sum()")
    total = p.new("nll: sum", (), f, "result.sum()")
    p.op("shifted[mask] = 0", alloc=[zero])
    p.op("gather", free=[zero], alloc=[gathered])
    p.op("gathered[mask] = 0", alloc=[fill])
    p.op("all-reduce (sum): the gathered log-probabilities", free=[mask, fill], alloc=[reduced])
    p.op("neg", alloc=[neg])
    p.op("target != ignore_index", alloc=[ne2])
    p.op("where", alloc=[res])
    p.op("target != ignore_index", free=[neg, ne2], alloc=[ne3])
    p.op("count", alloc=[count])
    p.op("released", free=[ne3])
    p.op("count to FP32", alloc=["nll_loss total weight"])
    p.op("result.sum()", free=[count], alloc=[total])
    p.op("sum / total weight", alloc=["loss"])
    p.op("released", free=[safe, shifted_ids, gathered, reduced, res, total])


def backward_start(p, c: Shape, sequence_parallel=False):
    """``_nll_loss_and_log_softmax_backward`` (the log-softmax's own backward computes nothing), the FP32
    upcast's and the LM head's backward (its input gradient all-reduced) and the final norm's."""
    a, f = c.dtype, "fp32"
    dl = p.new("gradient of the loss", (), f, "loss.backward() seeds a 1")
    go = p.new("loss gradient / total weight", (), f, "grad_output / total_weight")
    ne, ne2 = (_token(p, f"nll backward: target != ignore_index ({x})", "bool", "per token") for x in "12")
    safe = _token(p, "nll backward: safe target", "int64", "per token")
    zeros = p.new("grad_input = zeros_like(x)", LOGITS, f, "-1 scattered at the targets")
    maskf = _token(p, "nll backward: mask in FP32", f, "mask_buffer.to(grad_input.dtype)")
    update = _token(p, "nll backward: grad_update", f, "mask - 1.0")
    arange = _token(p, "nll backward: arange", "int64", "row indices of the scatter")
    g_out = _token(p, "nll backward: grad_output (masked)", f, "where(target != ignore_index, grad_output, 0)")
    zero = p.new("nll backward: index 0", (), "int64", "masked targets set to 0")
    e = p.new("exp(log-softmax output)", LOGITS, f, "(grad_input + exp(x)) * grad_output")
    total = p.new("grad_input + exp(x)", LOGITS, f, "before the product")
    g = p.new("log_softmax gradient", LOGITS, f, "(grad_input + exp(x)) * grad_output")
    p.op("loss.backward()", alloc=[dl], role=OpRole.LOSS_BACKWARD)
    p.op("grad / total weight", alloc=[go])
    p.op("target != ignore_index", alloc=[ne])
    p.op("safe target", alloc=[safe])
    p.op("zeros_like", free=[ne], alloc=[zeros])
    mask, shifted_ids = _mask_partition(p, "nll backward")
    p.op("shifted[mask] = 0", alloc=[zero])
    p.op("mask to FP32", free=[zero], alloc=[maskf])
    p.op("mask - 1", alloc=[update])
    p.op("arange", free=[maskf], alloc=[arange])
    p.op("target != ignore_index", alloc=[ne2])
    p.op("where", alloc=[g_out])
    p.op("exp", free=[ne2, go], alloc=[e])
    p.op("grad_input + exp(x)", alloc=[total])
    p.op("* grad_output", free=[e], alloc=[g])
    p.op("released", free=[zeros, total, safe, mask, shifted_ids, update, arange, g_out])
    p.op("released", free=["nll_loss total weight"])
    p.op("released", free=["log-softmax output (FP32)"])
    if a != "fp32":
        gb = p.new("logits gradient", LOGITS, a, "downcast to the logits' dtype")
        p.op("logits.float() backward", alloc=[gb])
        p.op("released", free=[g])
        g = gb
    partial = p.new("gradient of the LM head input (partial sum)", BSd, a, "the rank's columns' contribution")
    gfn = p.new("gradient of the LM head input", BSd_t if sequence_parallel else BSd, a,
                "reduce-scattered on the sequence" if sequence_parallel else "all-reduced")
    head = "grad head.weight"
    if c.is_tied:
        head = "LM head's contribution to the tied embedding gradient"
        x = p.tensors["grad embedding.weight"]
        p.tensors[head] = Tensor(head, x.expr, Kind.TRANSIENT, Lifetime.TEMPORARY, x.device,
                                 "waits in autograd's buffer for the embedding's contribution")
    p.op("LM head backward", alloc=[head, partial], role=OpRole.LM_HEAD_BACKWARD)
    p.op("released", free=[g, "LM head input"])
    if sequence_parallel:
        _reduce_scatter(p, partial, gfn, "the LM head's input gradient")
    else:
        p.op("all-reduce (sum): the LM head's input gradient", alloc=[gfn])
        p.op("released", free=[partial])
    grads = [f"grad {n}" for n, _ in final_norm_params(c)]
    norm_backward(p, c, "final", gfn, Ref(Scope.LAST, "dX_out"), grads)


def backward_end(p, c: Shape, sequence_parallel=False):
    """The embedding's backward: ``embedding_dense_backward`` on Replicate inputs, the whole V x d gradient
    (:func:`whole_gradients`); under SP its input gradient is first all-gathered."""
    g = "grad of the embedding output"
    if sequence_parallel:
        g = _all_gather(p, p.new("grad of the embedding output, all-gathered", BSd, c.dtype, "the whole sequence"),
                        "the embedding's output gradient")
        p.op("released", free=["grad of the embedding output"])
    if c.is_tied:           # the Replicate gradient is redistributed to the head's Shard(0) before the sum
        dense = p.new("embedding gradient (dense)", (V, d), c.grad_dtype, "embedding_dense_backward's output")
        rows = p.new("embedding gradient, the rank's rows", (sp.ceiling(V * d / t),), c.grad_dtype,
                     "redistribute(Replicate -> Shard(0)): a contiguous copy")
        p.op("embedding backward", alloc=[dense])
        p.op("released", free=[g])
        p.op("the rank's rows", alloc=[rows])
        p.op("tied weight: both gradients summed", alloc=["grad embedding.weight"])
        p.op("released", free=[dense, rows, "LM head's contribution to the tied embedding gradient"])
    else:
        p.op("embedding backward", alloc=["grad embedding.weight"])
        p.op("released", free=[g])
    p.op("loss released", free=["gradient of the loss", "loss"], role=OpRole.LOSS_RELEASED)


def _all_gather(p, out, what):
    """``all_gather_into_tensor`` (the ranks' shards stacked on dim 0), then ``torch.cat`` into the Shard(1)
    layout: ``out``, the whole sequence; the stacked buffer is released."""
    stacked = _like(p, f"all-gather output: {what}", out, "the ranks' shards on dim 0")
    p.op(f"all-gather: {what}", alloc=[stacked])
    p.op("cat: the sequence in order", alloc=[out])
    p.op("released", free=[stacked])
    return out


def _reduce_scatter(p, partial, out, what):
    """A partial sum reduce-scattered on the sequence: its shards made contiguous (``torch.cat`` of a split on
    dim 1: a copy of the whole), reduce-scattered into ``out`` (S/t); the copy and the partial sum released."""
    flat = _like(p, f"reduce-scatter input: {what}", partial, "cat of the split on the sequence")
    p.op(f"cat: {what} split on the sequence", alloc=[flat])
    p.op(f"reduce-scatter: {what}", alloc=[out])
    p.op("released", free=[flat])
    p.op("released", free=[partial])


def _like(p, name, other: str, why):
    """A temporary ``name`` of ``other``'s size."""
    p.tensors[name] = Tensor(name, p.tensors[other].expr, Kind.TRANSIENT, Lifetime.TEMPORARY, why=why)
    return name


def _all_reduced(ops, tensors, roles, after: int):
    """``ops`` with the output of each op of one of ``roles`` (its one temporary) made a partial sum and
    all-reduced into the tensor it was, ``after`` ops later (0: at once); the partial sum is then released."""
    out, pending = [], {}
    for k, op in enumerate(ops):
        if op.role in roles:
            name = next(n for n in op.allocs if isinstance(n, str)
                        and tensors[n].lifetime is Lifetime.TEMPORARY)
            x = tensors[name]
            partial = f"{name} (partial sum)"
            tensors[partial] = Tensor(partial, x.expr, Kind.TRANSIENT, Lifetime.TEMPORARY, x.device,
                                      "the rank's share, before the all-reduce")
            op = op._replace(allocs=tuple(partial if n == name else n for n in op.allocs))
            pending[k + after] = (name, partial)
        out.append(op)
        if k in pending:
            name, partial = pending.pop(k)
            out.append(ProgramOp("all-reduce (sum)", (), (name,)))
            out.append(ProgramOp("released", (partial,), ()))
    return out


def collectives(fwd, bwd, tensors, c: Shape, sequence_parallel=False):
    """A block's collectives. Without SP: all-reduces after each row-wise layer's forward (its output), and
    after each column-wise layer's backward has released its inputs (its input gradient). With SP
    (:func:`sequence_parallel_block`): reduce-scatters there, and all-gathers before each column-wise layer's
    forward (its input) and each row-wise layer's backward (its output gradient)."""
    if sequence_parallel:
        sequence_parallel_block(fwd, bwd, tensors, c.gpt)
    else:
        fwd.ops[:] = _all_reduced(fwd.ops, tensors, ROW_FORWARD, 0)
        bwd.ops[:] = _all_reduced(bwd.ops, tensors, COLUMN_BACKWARD, 1)
    if c.gpt:
        _partial_biases(fwd.ops, tensors, d * nbytes(c.dtype))


def _partial_biases(ops, tensors, size):
    """A row-wise layer's bias is Replicate and its matmul's output Partial: ``addmm`` reads the bias
    redistributed Replicate -> Partial (divided by t on every rank), a d-element temporary, released once
    the layer has run."""
    k = 0
    while k < len(ops):
        if ops[k].role in ROW_FORWARD:
            name = f"{ops[k].label} bias / t"
            tensors[name] = Tensor(name, size, Kind.TRANSIENT, Lifetime.TEMPORARY,
                                   why="redistribute(Replicate -> Partial) of the bias")
            ops.insert(k, ProgramOp("bias / t", (), (name,)))
            ops[k + 2] = ops[k + 2]._replace(frees=ops[k + 2].frees + (name,))
            k += 2
        k += 1


def sequence_parallel_rows(tensors, layer_rows, c: Shape):
    """Under SP, what DTensor saves: each column-wise layer's all-gathered input, the whole sequence (the QKV
    projection's, the gate's, the up projection's, the LM head's), where Megatron-LM saves the S/t shard and
    gathers it again in backward (the ledger's rows, Korthikanti et al. 2022 Sec. 4.2.2)."""
    from ..activations.inventory import Saved
    whole = B * S * d * nbytes(c.dtype)
    for name in SP_NORM_OUTPUT:
        if name in tensors:
            x = tensors[name]
            tensors[name] = Tensor(name, whole, x.kind, x.lifetime, x.device,
                                   "the column-wise layer's all-gathered input (DTensor saves it whole)")
    if c.gpt:               # one column-wise layer in the MLP: its copy is the MLP input row
        return
    tensors[UP_COPY] = Tensor(UP_COPY, whole, Kind.ACTIVATION, Lifetime.SAVED, why="saved by the up projection")
    k = next(i for i, r in enumerate(layer_rows) if r.name == "MLP input")
    layer_rows.insert(k + 1, Saved(UP_COPY, "the up projection's matmul saves its own gathered input",
                                   (B, S, d), c.dtype, block="mlp"))


def sequence_parallel_block(fwd, bwd, tensors, gpt=False):
    """A block's forward and backward under SP (``SequenceParallel`` norms; column-wise layers with
    ``input_layouts=Shard(1)``, row-wise with ``output_layouts=Shard(1)``), as MemTracker saw them."""
    for name in SP_TEMPORARIES:
        if name in tensors:
            x = tensors[name]
            tensors[name] = Tensor(name, x.expr.subs(S, S / t), x.kind, x.lifetime, x.device, x.why)
    for name, x in list(tensors.items()):
        if x.lifetime is Lifetime.TEMPORARY and name.startswith("norm ") and "S/t" not in name:
            tensors[name] = Tensor(name, x.expr.subs(S, S / t), x.kind, x.lifetime, x.device, x.why)
    whole = tensors["Q/K/V projection input"].expr
    outputs = {row: _temporary(tensors, n, whole / t, "the norm's output, the rank's positions")
               for row, n in SP_NORM_OUTPUT.items() if row != "LM head input"}
    fwd.ops[:] = _sequence_parallel_forward(fwd.ops, tensors, whole, outputs, gpt)
    bwd.ops[:] = _sequence_parallel_backward(bwd.ops, tensors, whole, gpt)


def _temporary(tensors, name, expr, why):
    tensors[name] = Tensor(name, expr, Kind.TRANSIENT, Lifetime.TEMPORARY, why=why)
    return name


def _sequence_parallel_forward(ops, tensors, whole, outputs, gpt) -> list:
    """A block's forward ``ops`` under SP: the norms' outputs the rank's positions, an all-gather before each
    column-wise layer, a reduce-scatter after each row-wise one."""
    gathered = {OpRole.QKV_PROJECTION: "Q/K/V projection input", OpRole.GATE_PROJECTION: "MLP input",
                OpRole.UP_PROJECTION: UP_COPY}
    if gpt:
        gathered[OpRole.UP_PROJECTION] = "MLP input"
    out = []
    for op in ops:
        op = op._replace(allocs=tuple(outputs.get(n, n) if isinstance(n, str) else n for n in op.allocs))
        column = op.role if op.role in gathered else None
        if column:
            what = f"the {'QKV' if column is OpRole.QKV_PROJECTION else column} input"
            stacked = _temporary(tensors, f"all-gather output: {what}", whole, "the ranks' shards on dim 0")
            out += [ProgramOp(f"all-gather: {what}", (), (stacked,)),
                    ProgramOp("cat: the sequence in order", (), (gathered[column],)),
                    ProgramOp("released", (stacked,), ())]
        if op.role is OpRole.BLOCK_RETURNS:
            op = op._replace(frees=op.frees + (outputs["MLP input"],))
        if op.role in ROW_FORWARD:
            name = next(n for n in op.allocs if isinstance(n, str) and tensors[n].lifetime is Lifetime.TEMPORARY)
            partial = _temporary(tensors, f"{name} (partial sum)", whole, "the rank's share, before the reduce-scatter")
            flat = _temporary(tensors, f"reduce-scatter input: {name}", whole, "cat of the split on the sequence")
            out += [op._replace(allocs=tuple(partial if n == name else n for n in op.allocs)),
                    ProgramOp("cat: split on the sequence", (), (flat,)),
                    ProgramOp("reduce-scatter", (), (name,)), ProgramOp("released", (flat,), ()),
                    ProgramOp("released", (partial,), ())]
            continue
        out.append(op)
        if column is OpRole.QKV_PROJECTION:
            out.append(ProgramOp("released", (outputs["Q/K/V projection input"],), ()))
    return out


def _sequence_parallel_backward(ops, tensors, whole, gpt) -> list:
    """A block's backward ``ops`` under SP: an all-gather of each row-wise layer's output gradient, a
    reduce-scatter of each column-wise layer's input gradient."""
    out, pending = [], {}
    row_grads = {OpRole.DOWN_PROJECTION_BACKWARD: "gradient of the block output",
                 OpRole.OUTPUT_PROJECTION_BACKWARD: "gradient of the attention residual sum"}
    for k, op in enumerate(ops):
        if op.role in row_grads:
            what = row_grads[op.role]
            stacked = _temporary(tensors, f"all-gather output: {what}", whole, "the ranks' shards on dim 0")
            copy = _temporary(tensors, f"{what}, all-gathered", whole, "the row-wise layer's output gradient, whole")
            out += [ProgramOp(f"all-gather: {what}", (), (stacked,)),
                    ProgramOp("cat: the sequence in order", (), (copy,)), ProgramOp("released", (stacked,), ())]
            pending[k + 1] = ("free", copy)
        if op.role in COLUMN_BACKWARD:
            name = next(n for n in op.allocs if isinstance(n, str) and tensors[n].lifetime is Lifetime.TEMPORARY)
            partial = _temporary(tensors, f"{name} (partial sum)", whole, "the rank's share, before the reduce-scatter")
            op = op._replace(allocs=tuple(partial if n == name else n for n in op.allocs))
            pending[k + 1] = ("scatter", name, partial)
        if op.role is OpRole.UP_PROJECTION_BACKWARD and not gpt:
            pending.setdefault(("up", k + 1), UP_COPY)
        if ("up", k) in pending:
            op = op._replace(frees=op.frees + (pending.pop(("up", k)),))
        if k in pending and pending[k][0] == "free":
            op = op._replace(frees=op.frees + (pending.pop(k)[1],))
        out.append(op)
        if k in pending:
            _, name, partial = pending.pop(k)
            flat = _temporary(tensors, f"reduce-scatter input: {name}", whole, "cat of the split on the sequence")
            out += [ProgramOp("cat: split on the sequence", (), (flat,)), ProgramOp("reduce-scatter", (), (name,)),
                    ProgramOp("released", (flat,), ()), ProgramOp("released", (partial,), ())]
    return out


def whole_gradients(tensors, grad_dtype: str, tied=False):
    """The gradients a rank holds whole: the replicated parameters' (:data:`WHOLE`) and, untied, the
    vocabulary-parallel embedding's, which DTensor's embedding backward returns Replicate (tied, the sum
    with the LM head's Shard(0) gradient is Shard(0))."""
    for key in WHOLE:                   # each a vector of d elements
        x = tensors.get(f"grad {key}")
        if x is not None and x.lifetime is Lifetime.GRADIENT:
            tensors[x.name] = Tensor(x.name, d * nbytes(grad_dtype), x.kind, x.lifetime, x.device, x.why)
    if tied:
        return
    x = tensors["grad embedding.weight"]
    tensors[x.name] = Tensor(x.name, V * d * nbytes(grad_dtype), x.kind, x.lifetime, x.device,
                             "whole on every rank: DTensor's embedding backward returns it Replicate")


def whole_elements(c: Shape):
    """Elements of the parameters every rank holds whole (:data:`WHOLE`): the norms, and in GPT blocks the
    norms' biases and the row-wise layers' biases."""
    per_norm = 2 * d if c.gpt else d
    return (2 * L + 1) * per_norm + (2 * L * d if c.gpt else 0)


#: The step's row for the model states of the parameters every rank holds whole (:func:`beyond_share`).
WHOLE_ROW = "replicated parameters' states (whole on every rank)"


def beyond_share(c: Shape):
    """Elements per rank beyond the ledger's ceil(P/t): each of :func:`whole_elements`' n is held whole, not
    n/t, so n (t - 1)/t more (t divides d)."""
    n = whole_elements(c)
    return n - n / t


def redistribute_embedding_gradient(ops, tensors, dtype: str):
    """AdamW's step on the embedding: its Replicate gradient read as the rank's Shard(0) rows, a contiguous
    copy per use: one for ``exp_avg.lerp_``, two at once for ``exp_avg_sq.mul_().addcmul_(grad, grad)``."""
    names = [f"embedding gradient, the rank's rows ({x})" for x in ("lerp_", "addcmul_ 1", "addcmul_ 2")]
    for n in names:
        tensors[n] = Tensor(n, sp.ceiling(V * d / t) * nbytes(dtype), Kind.TRANSIENT, Lifetime.TEMPORARY,
                            why="redistribute(Replicate -> Shard(0)): a contiguous copy of the rank's rows")
    k = next((i for i, op in enumerate(ops) if op.role is OpRole.EMBEDDING_STEP), None)
    if k is None:
        return
    ops[k:k] = [ProgramOp("exp_avg.lerp_(grad)", (), (names[0],)), ProgramOp("released", (names[0],), ()),
                ProgramOp("exp_avg_sq.addcmul_(grad, grad)", (), tuple(names[1:])),
                ProgramOp("released", tuple(names[1:]), ())]


#: The programs outside the blocks under tensor parallelism (each takes ``sequence_parallel``).
OUTSIDE = {"forward start": forward_start, "forward end": forward_end, "backward start": backward_start,
           "backward end": backward_end}
