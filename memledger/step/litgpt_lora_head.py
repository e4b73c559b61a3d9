"""LitGPT's LoRA step outside its layers (``implementation="litgpt"``): the frozen head in 128-token chunks and
``chunked_cross_entropy`` over the chunks' list, as ``finetune/lora.py`` runs them, forward and backward.

Read from LitGPT 0.5.13 and MemTracker's allocation log of its own model (PyTorch 2.13, CPU):

* ``finetune/lora.py`` l. 354-365: ``logits = model(input_ids, lm_head_chunk_size=128)`` (``model.py`` l. 177-179:
  the frozen head on each ``x.split(128, dim=1)``: N = ceil(S / 128) chunks, the last S - 128 (N - 1) tokens, a list
  kept into the next iteration: the previous one goes when it is bound), ``logits[-1] = logits[-1][..., :-1, :]``,
  ``loss = chunked_cross_entropy(logits, targets[..., 1:])``, ``fabric.backward(loss / 1)``.
* ``utils.py`` l. 313-327 (a list of chunks): each chunk ``reshape(-1, V)`` (a view, but at B > 1 the last chunk's
  slice, which is copied), the targets ``split(128)`` and ``reshape(-1)`` (views at B = 1, copies kept by nll_loss
  at B > 1), one BF16 ``F.cross_entropy(reduction="none")`` per chunk (its log-softmax saved, 2 T V bytes; nll_loss's
  total weight), ``torch.cat(loss_chunks).sum() / non_masked_elems.maximum(...)``.
* Backward: the scalar divisions, each chunk's nll_loss and log_softmax backward (the last chunk first; each
  log-softmax gradient kept until its chunk's head backward), the last chunk's slice backward (zeros of its head
  chunk, B (T + 1) V), the head's input gradient chunk by chunk (the last first), ``split``'s backward (a ``cat``
  into B S d), the final norm's.

Chunks are booked in three groups (0..N-3, N-2, N-1: :data:`~memledger.step.litgpt_loss.GROUPS`), which reach the
same heights as chunk by chunk (every full chunk's backward reaches the same height; within the head's backward,
each chunk frees more (T V) than it makes (T d): the group's first chunk is its highest). ``(S - 1) % 128 == 0``
(a last head chunk of one token, dropped by ``zip``) is refused by :func:`check`.
"""
import sympy as sp

from ..core.symbols import B, S, V, d
from .litgpt_loss import GROUPS, PREVIOUS
from .litgpt_lora_block import norm_backward, norm_forward
from .ops import BSd, Ref, Tensor
from .vocab import Kind, Lifetime, OpRole, Scope

__all__ = ["CHUNK", "LOGITS", "LOSS", "backward_end", "backward_start", "check", "forward_end", "saved_names"]

CHUNK = 128
LOGITS = "logits (the head's chunks, kept into the next iteration)"
LOSS = "LitGPT's loss (kept into the next iteration)"


def check(seq_len: int) -> None:
    """``ValueError`` naming ``seq_len`` where ``zip`` drops the last head chunk (``(S - 1) % 128 == 0``, S > 1)."""
    if seq_len > 1 and (seq_len - 1) % CHUNK == 0:
        raise ValueError(f"seq_len {seq_len}: LitGPT's last head chunk holds one token, which the shift empties and "
                         "zip drops (a seq_len with (seq_len - 1) % 128 == 0 is not modelled yet)")


def _groups():
    """(loss tokens of each group per row, chunk count of each): N - 2 full chunks, one full chunk, the last."""
    n = sp.ceiling(S / CHUNK)
    full, rest = sp.Min(n - 1, 1), sp.Max(n - 2, 0)
    return (CHUNK * rest, CHUNK * full, S - 1 - CHUNK * (n - 1)), (rest, full, 1)


def saved_names(single: bool) -> list:
    """What the loss keeps from forward to backward."""
    return [f"log-softmax output, {g}" for g in GROUPS] + [f"nll_loss total weights, {g}" for g in GROUPS] + (
        [] if single else [f"targets (a copy), {g}" for g in GROUPS]) + ["tokens counted", LOSS]


def _saved(p, name, expr, why):
    p.tensors[name] = Tensor(name, expr, Kind.ACTIVATION, Lifetime.SAVED, why=why)
    return name


def _temp(p, name, expr, why):
    p.tensors[name] = Tensor(name, expr, Kind.TRANSIENT, Lifetime.TEMPORARY, why=why)
    return name


def forward_end(p, c):
    """The final norm (frozen), the head's chunks, ``chunked_cross_entropy``, ``loss / 1``."""
    a = c.dtype
    T, count = _groups()
    head_in = p.new("LM head input", BSd, a, "the final norm's output: the frozen head keeps none")
    norm_forward(p, c, "final", head_in, also_free=["final norm input"])
    p.new(LOGITS, (B, S, V), a, "the list of the head's chunks: finetune/lora.py never deletes it")
    p.op("LM head, chunk by chunk (frozen)", alloc=[LOGITS], role=OpRole.LM_HEAD)
    p.op("logits bound: the previous list released", free=[head_in, PREVIOUS[0]])
    copy = None
    if not c.single:
        copy = _temp(p, "last chunk's logits, reshaped (a copy)", B * T[2] * V * 2, "the slice is not contiguous")
        p.op("logit chunks: reshape(-1, V)", alloc=[copy])
        for g, t in zip(GROUPS, T):
            p.op(f"target chunks: reshape(-1), {g}", alloc=[_saved(p, f"targets (a copy), {g}", B * t * 8,
                                                                    "a strided split's reshape, kept by nll_loss")])
    losses = []
    for g, t, k in zip(GROUPS, T, count):
        p.op(f"log_softmax, {g}", alloc=[_saved(p, f"log-softmax output, {g}", B * t * V * 2, "saved for backward")],
             role=OpRole.LOSS_STARTS if g == GROUPS[0] else None)
        losses.append(p.new(f"per-token losses, {g}", (B * t,), a, "reduction='none'"))
        p.op(f"nll_loss, {g}", alloc=[losses[-1], _saved(p, f"nll_loss total weights, {g}", k * 2,
                                                         "one 0-d total weight a chunk")])
    _reduce(p, c, losses + ([copy] if copy else []))


def _reduce(p, c, frees):
    """``torch.cat(loss_chunks).sum() / non_masked_elems.maximum(ones_like(...))``; ``frees`` go as
    ``chunked_cross_entropy`` returns; then ``loss / 1``."""
    a = c.dtype
    mask = p.new("targets != ignore_index", (B, S - 1), "bool", "non_masked_elems' mask")
    n = p.new("non_masked_elems", (), "int64", ".sum()")
    cat = p.new("torch.cat(loss_chunks)", (B, S - 1), a, "the chunks' losses in one tensor")
    total = p.new("sum of the chunks' losses", (), a, ".sum()")
    one = p.new("ones_like(non_masked_elems)", (), "int64", "")
    p.op("targets != ignore_index", alloc=[mask])
    p.op("non_masked_elems: .sum()", alloc=[n])
    p.op("torch.cat(loss_chunks)", alloc=[cat], free=[mask])
    p.op(".sum()", alloc=[total])
    p.op("ones_like", alloc=[one], free=[cat])
    p.op("maximum", alloc=[_saved(p, "tokens counted", 8, "the divisor, saved by the division")])
    _saved(p, LOSS, 2, "the loss (BF16)")
    p.op("division: the loss", alloc=[LOSS], free=[one])
    p.op("chunked_cross_entropy returns", free=[total, n] + frees, role=OpRole.LOSS_COMPUTED)
    p.op("loss / 1; the previous loss released", alloc=[_saved(p, "loss", 2, "loss / 1: until backward returns")],
         free=[PREVIOUS[1]])


def _sum_gradient(p, count):
    """The gradient of the chunks' sum (2 bytes), split by which group's first nll_loss backward frees it (the chunk
    processed last: chunk 0): three tensors whose sizes add up to 2 for every N."""
    rest, full = count[0], count[1]
    sizes = (2 * sp.Min(rest, 1), 2 * (full - sp.Min(rest, 1)), 2 * (1 - full))
    return [_temp(p, f"gradient of the chunks' sum, freed with {g}", s, "the division's backward")
            for g, s in zip(GROUPS, sizes)]


def backward_start(p, c):
    """``(loss / 1).backward()`` to the last layer's ``dX_out``: the divisions, the chunks' nll_loss and log_softmax
    (the last first), the last chunk's slice, the head chunk by chunk, ``split``, the final norm."""
    a = c.dtype
    T, count = _groups()
    seed = p.new("gradient of the loss", (), a, "loss.backward() seeds a 1")
    g0 = p.new("gradient of LitGPT's loss", (), a, "/ 1 backward")
    p.op("loss.backward()", alloc=[seed], role=OpRole.LOSS_BACKWARD)
    p.op("/ 1 backward", alloc=[g0])
    gs = _sum_gradient(p, count)
    p.op("division backward", alloc=gs)
    p.op("released", free=[g0, "tokens counted"])
    grads = {}
    for g, t, k, gsum in reversed(list(zip(GROUPS, T, count, gs))):       # the node made last runs first
        one = CHUNK * sp.Min(k, 1) if g == GROUPS[0] else t                 # 0..N-3: one chunk's at a time
        g1 = _temp(p, f"nll_loss gradient, {g}", B * one * V * 2, "nll_loss backward: one chunk's (T, V)")
        grads[g] = _temp(p, f"log_softmax gradient, {g}", B * t * V * 2, "kept until its head chunk's backward")
        p.op(f"nll_loss backward, {g}", alloc=[g1])
        p.op("released", free=[f"nll_loss total weights, {g}", gsum] + ([] if c.single else
                                                                         [f"targets (a copy), {g}"]),
             role=OpRole.LABELS_RELEASED if g == GROUPS[0] else None)
        if g == GROUPS[0]:      # chunk by chunk, each gradient replacing its log-softmax: chunk N-2's height
            p.op(f"log_softmax backward, {g}", alloc=[grads[g]], free=[g1, f"log-softmax output, {g}"])
            continue
        p.op(f"log_softmax backward, {g}", alloc=[grads[g]])
        p.op("released", free=[g1, f"log-softmax output, {g}"])
    _head_backward(p, c, T, count, grads)


def _head_backward(p, c, T, count, grads):
    """The last chunk's slice backward, the frozen head's input gradient chunk by chunk (the last first), split's
    backward, the final norm's backward into the last layer's ``dX_out``."""
    a = c.dtype
    zeros = _temp(p, "gradient of the last head chunk", B * (T[2] + 1) * V * 2, "slice_backward: zeros, copied in")
    p.op("logits[-1][..., :-1, :] backward", alloc=[zeros])
    p.op("released", free=[grads[GROUPS[2]]])
    outs = [_temp(p, f"LM head input gradient, {GROUPS[2]}", B * (T[2] + 1) * d * 2, "the frozen head's")]
    p.op(f"LM head backward, {GROUPS[2]}", alloc=outs[-1:], role=OpRole.LM_HEAD_BACKWARD)
    p.op("released", free=[zeros])
    outs.append(_temp(p, f"LM head input gradient, {GROUPS[1]}", B * T[1] * d * 2, "the frozen head's"))
    p.op(f"LM head backward, {GROUPS[1]}", alloc=outs[-1:])
    p.op("released", free=[grads[GROUPS[1]]])
    first = CHUNK * sp.Min(count[0], 1)
    outs += [_temp(p, f"LM head input gradient, {GROUPS[0]}: the first", B * first * d * 2, "the frozen head's"),
             _temp(p, f"LM head input gradient, {GROUPS[0]}: the rest", B * (T[0] - first) * d * 2, "")]
    p.op(f"LM head backward, {GROUPS[0]}: the first", alloc=outs[-2:-1])
    p.op(f"LM head backward, {GROUPS[0]}: the rest", alloc=outs[-1:], free=[grads[GROUPS[0]]])
    g = p.new("gradient of the LM head input", BSd, a, "split backward: a cat of the chunks' gradients")
    p.op("split backward: cat", alloc=[g])
    p.op("released", free=outs)
    norm_backward(p, c, "final", g, Ref(Scope.LAST, "dX_out"))


def backward_end(p, c):
    """Backward returns: the seeded gradient goes, and ``loss / 1`` with ``del``."""
    p.op("backward returns", free=["gradient of the loss", "loss"], role=OpRole.LOSS_RELEASED)
