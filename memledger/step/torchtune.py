"""torchtune's step outside its layers (``implementation="torchtune"``): the model's shared RoPE buffers, its q, k and v
projections' AdamW step counters, and what ``recipes/full_finetune_single_device.py`` holds around the model.

Read from torchtune 0.6.1:

* ``models/llama2/_component_builders.py`` l. 88-90: one ``RotaryPositionalEmbeddings`` shared by every layer;
  ``modules/position_embeddings.py`` l. 46-65: its buffers ``theta`` (d/H/2 FP32 values, l. 51) and ``cache``
  (max_seq_len x d/H/2 x (cos, sin), FP32, l. 65). ``max_seq_len``: 4096 (``llama2_7b``); a model for longer
  sequences needs at least S (the cache is sliced by position), so S where S > 4096.
* l. 94-97 of the builder: ``q_proj``, ``k_proj``, ``v_proj`` are separate ``nn.Linear``s where the reference decoder
  fuses them: two more parameter tensors a layer, each with AdamW's 4-byte ``step``.
* The recipe's loop: ``ignore_labels_cache = torch.full((B, 1), ignore_index)`` (int64, l. 346-348, the whole run);
  per iteration ``current_num_tokens = (labels != ignore_index).sum()`` (l. 692-695: a (B, S) bool mask, an int64
  count rebinding the previous iteration's), ``num_tokens += current_num_tokens`` (l. 696: ``0 + tensor``, a new
  int64), ``labels = batch.pop("labels")`` and, after the model's forward, ``labels = torch.hstack((labels[...,
  1:], ignore_labels_cache[:B]))`` (l. 642-644: a new (B, S) int64 tensor; the popped labels die as it is bound),
  which ``nll_loss`` keeps (unchunked: its ``reshape(-1)`` is a view) until its backward; ``del logits`` (l. 653),
  ``current_loss = loss * current_num_tokens`` (l. 699: FP32; ``MulBackward0`` keeps the count, not the loss, which
  dies), ``running_loss += current_loss`` (l. 700: ``0 + tensor``, FP32), ``current_loss.backward()`` (l. 701),
  ``training.scale_grads(model, 1 / num_tokens)`` (l. 706; ``training/_grad_scaler.py`` l. 24-31: ``p.grad *=
  scaler`` in place, the FP32 scaler a temporary), ``optimizer.step()``, ``zero_grad(set_to_none=True)``
  (l. 712-713), ``running_loss = 0``, ``num_tokens = 0`` (l. 754-755). ``current_num_tokens`` and ``current_loss``
  live into the next iteration, until they are rebound.
* ``CEWithChunkedOutputLoss`` (``modules/loss/ce_chunked_output_loss.py`` l. 69-72): ``labels.chunk(n, dim=1)``,
  each ``reshape(-1)``: with B > 1 a copy (:func:`memledger.step.loss._labels`), so the shifted labels die when
  ``_loss_step`` returns; at B = 1 views of them, released with the first chunk's ``nll_loss`` (the last to run
  backward).

Checked against torchtune's own model and recipe loop under ``FakeTensorMode``
(:func:`memledger.pytorch.torchtune_litgpt.library_step`, tests/pytorch/test_torchtune_litgpt.py).
"""
import sympy as sp

from ..core.symbols import B, H, S, d
from .vocab import Kind, OpRole

__all__ = ["LABELS", "PREVIOUS", "extra_step_counters", "forward_end", "forward_start",
           "optimizer", "optimizer_end", "optimizer_start",
           "outside", "shift_labels", "statics"]

#: The shifted labels ``_loss_step`` makes (``nll_loss`` keeps them).
LABELS = "shifted labels (torch.hstack, int64)"
COUNT, LOSS = "current_num_tokens (int64)", "current_loss (FP32)"
#: The previous iteration's ``current_num_tokens`` and ``current_loss``, rebound in this one.
PREVIOUS = ("previous iteration's current_num_tokens (int64)", "previous iteration's current_loss (FP32)")
NUM_TOKENS, RUNNING = "num_tokens (int64)", "running_loss (FP32)"
TARGETS = "target ids"


def on(c) -> bool:
    return getattr(c, "implementation", "reference") == "torchtune"


def statics(c, ropes=1) -> list:
    """(name, bytes, kind, why) of what torchtune's model and recipe hold the whole step; ``ropes``: how many
    ``RotaryPositionalEmbeddings`` the model holds (``llama2``: one shared; ``lora_llama2``: one a layer, L)."""
    if not on(c):
        return []
    half = d / H / 2
    positions = sp.Max(4096, S)
    shared = "one module shared by every layer" if ropes == 1 else "one module a layer (lora_llama2_self_attention)"
    return [("RoPE theta (FP32 buffer)", ropes * half * 4, Kind.PARAM, "RotaryPositionalEmbeddings.theta, d/H/2 FP32 "
             f"values, {shared}"),
            ("RoPE cache (FP32 buffer)", ropes * positions * half * 2 * 4, Kind.PARAM,
             "RotaryPositionalEmbeddings.cache: max_seq_len x d/H/2 x (cos, sin), FP32"
             + ("" if ropes == 1 else f", {shared}")),
            ("ignore_labels_cache (int64)", B * 8, Kind.ACTIVATION, "torch.full((B, 1), ignore_index): the recipe's, "
             "the whole run"),
            (PREVIOUS[0], 8, Kind.ACTIVATION, "the last iteration's token count, until this one rebinds it"),
            (PREVIOUS[1], 4, Kind.ACTIVATION, "the last iteration's current_loss, until this one rebinds it")]


def extra_step_counters(c, L) -> int:
    """AdamW's step tensors beyond the reference decoder's: q, k, v separate (two more tensors a layer)."""
    return 2 * L if on(c) else 0


def forward_start(p, c):
    """The recipe's token count (rebinding the previous one) and ``num_tokens``, before the model runs."""
    mask = p.new("labels != ignore_index (recipe)", (B, S), "bool", "current_num_tokens' mask")
    p.new(COUNT, (), "int64", "(labels != ignore_index).sum(): lives into the next iteration")
    p.new(NUM_TOKENS, (), "int64", "num_tokens += current_num_tokens: 0 + a tensor, a new one")
    p.op("recipe: labels != ignore_index", alloc=[mask])
    p.op("recipe: current_num_tokens = .sum()", alloc=[COUNT])
    p.op("released (the previous count rebound)", free=[mask, PREVIOUS[0]])
    p.op("recipe: num_tokens += current_num_tokens", alloc=[NUM_TOKENS])


def shift_labels(p, c):
    """``torch.hstack((labels[..., 1:], ignore_labels_cache[:B]))``: the popped labels die as it is bound."""
    p.new(LABELS, (B, S), "int64", "the labels shifted: nll_loss keeps them (views of them at B = 1 with chunks)")
    p.op("recipe: labels shifted (torch.hstack)", alloc=[LABELS])
    p.op("released (the popped labels)", free=[TARGETS])


def forward_end(p, c):
    """After ``_loss_step`` returns: ``current_loss = loss * current_num_tokens`` (the loss dies), ``running_loss``."""
    p.new(LOSS, (), "fp32", "loss * current_num_tokens: lives into the next iteration")
    p.new(RUNNING, (), "fp32", "running_loss += current_loss: 0 + a tensor, a new one")
    if c.loss_chunks > 1 and not c.single:
        p.op("_loss_step returns (the shifted labels: their chunks are copies)", free=[LABELS])
    p.op("recipe: current_loss = loss * current_num_tokens", alloc=[LOSS])
    p.op("released (del loss; the previous current_loss rebound)", free=["loss", PREVIOUS[1]])
    p.op("recipe: running_loss += current_loss", alloc=[RUNNING])


def optimizer_start(p):
    """``scale_grads(model, 1 / num_tokens)``: the FP32 scaler, a temporary; the gradients scaled in place."""
    scaler = p.new("1 / num_tokens (FP32)", (), "fp32", "training.scale_grads' scaler")
    p.op("recipe: scale_grads(model, 1 / num_tokens)", alloc=[scaler])
    p.op("released", free=[scaler])


def optimizer_end(p):
    """``running_loss = 0``, ``num_tokens = 0`` (l. 754-755) after the step."""
    p.op("recipe: running_loss = 0, num_tokens = 0", free=[RUNNING, NUM_TOKENS])


def outside(ops_of: dict, c, fork) -> dict:
    """``ops_of`` ({part name: the reference's ops}) with the recipe's ops: the count before the model, the labels
    shifted after it returns (before the loss), their release with ``nll_loss``'s backward (or the first chunk's at
    B = 1), ``current_loss`` and ``running_loss`` after the loss, the loss no longer released with its gradient."""
    if not on(c):
        return ops_of
    out = dict(ops_of)
    q = fork()
    forward_start(q, c)
    out["forward start"] = q.ops + list(ops_of["forward start"])
    ops = list(ops_of["forward end"])
    first = next(i for i, op in enumerate(ops) if op.role is OpRole.LOSS_STARTS)
    q = fork()
    shift_labels(q, c)
    r = fork()
    forward_end(r, c)
    out["forward end"] = ops[:first] + q.ops + ops[first:] + r.ops
    ops = list(ops_of["backward start"])
    if c.loss_chunks == 1 or c.single:      # nll_loss keeps the shifted labels (or views of them): released with it
        at = [i for i, op in enumerate(ops) if op.role is OpRole.LABELS_RELEASED][-1]    # chunk 0's: the last
        ops[at] = ops[at]._replace(frees=tuple(n for n in ops[at].frees if n != TARGETS) + (LABELS,))
    out["backward start"] = ops
    out["backward end"] = [op._replace(frees=tuple(n for n in op.frees if n != "loss"))
                           if op.role is OpRole.LOSS_RELEASED
                           else op for op in ops_of["backward end"]]
    return out


def optimizer(ops: list, c, fork) -> list:
    """The optimizer step's ops between ``scale_grads`` and ``running_loss = 0, num_tokens = 0``."""
    if not on(c):
        return ops
    a, b = fork(), fork()
    optimizer_start(a)
    optimizer_end(b)
    return a.ops + list(ops) + b.ops
