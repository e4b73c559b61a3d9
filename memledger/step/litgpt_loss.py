"""LitGPT's step outside its layers (``implementation="litgpt"``): the head and loss as ``litgpt/finetune/full.py``
runs them, its RoPE buffers, and what its loop keeps from one iteration to the next.

Read from LitGPT 0.5.13:

* ``finetune/full.py`` l. 230: ``model.max_seq_length = min(longest_seq_length, ...)``: the model's ``cos`` and
  ``sin`` buffers (``model.py`` l. 43-62, ``rope_cache``) are rebuilt for S positions: (S, d/H) FP32 each.
* l. 282-284: ``logits = model(input_ids)`` (the head unchunked: ``model.py`` l. 177-181, BF16 (B, S, V)), ``loss =
  chunked_cross_entropy(logits[..., :-1, :], targets[..., 1:])``, ``fabric.backward(loss / 1)`` (``bf16-true``:
  ``loss.backward()``); neither name is deleted, so the logits and the loss live through backward and the optimizer
  step into the next iteration, dying only as the new ones are bound (kept here the whole step: the previous
  iteration's, released where the new ones are bound).
* ``utils.py`` l. 333-351 (``chunked_cross_entropy``, the head not chunked): ``logits.reshape(-1, V)`` of the
  shifted view (at B > 1 a copy of B (S - 1) V, at B = 1 a view), ``targets.reshape(-1)`` (a copy of B (S - 1) ids at
  B > 1, a view of the batch's labels at B = 1), both ``split(128)``: N = ceil(B (S - 1) / 128) chunks, the last
  short; per chunk ``F.cross_entropy(reduction="none")`` in BF16 (its log-softmax saved, 2 T V bytes; nll_loss's
  per-token losses and total weight), then ``torch.cat(loss_chunks).sum() / non_masked_elems.maximum(
  torch.ones_like(non_masked_elems))``.
* Backward: ``loss / 1``'s and the division's gradients (scalars), each chunk's nll_loss and log_softmax gradients
  (the last chunk first, autograd's CPU engine running the node made last first), ``split``'s backward (one ``cat``
  of the chunks' gradients into B (S - 1) V), the slice's backward (zeros of B S V with the gradient copied in), the
  LM head's.

The chunks are booked as three groups (chunks 0..N-3, chunk N-2, chunk N-1: the same bytes as chunk by chunk): in
backward every full chunk reaches the same height (its two gradients beside the rest), so one full chunk run op by
op gives the peak exactly. Checked against LitGPT's own model and loop under ``FakeTensorMode``
(:func:`memledger.pytorch.torchtune_litgpt.library_step`, tests/pytorch/test_torchtune_litgpt.py).
"""
import sympy as sp

from ..core.symbols import B, H, S, V
from .norms import norm_backward, norm_forward
from .ops import BSd, Ref, Tensor, final_input
from .outer import final_norm_params
from .vocab import Kind, Lifetime, OpRole, Scope

__all__ = ["CHUNK", "PREVIOUS", "backward_start", "forward_end", "on", "saved_names", "statics"]

CHUNK = 128         # chunked_cross_entropy's chunk_size (utils.py l. 304)
LOGITS = "logits (BF16, kept into the next iteration)"
LOSS = "LitGPT's loss (kept into the next iteration)"
PREVIOUS = ("previous iteration's logits", "previous iteration's loss")
TARGETS = "shifted targets (reshape(-1): a copy at B > 1)"
GROUPS = ("chunks 0..N-3", "chunk N-2", "chunk N-1")


def on(c) -> bool:
    """LitGPT's model with full.py's loss: the head unchunked, the cross-entropy split by 128 tokens."""
    return getattr(c, "implementation", "reference") == "litgpt" and c.loss_chunks == 1


def _tokens():
    """(tokens of each group) and the group's chunk count: N - 2 full chunks, one full chunk, the last."""
    n = sp.ceiling(B * (S - 1) / CHUNK)
    full = sp.Min(n - 1, 1)                 # 0 where one chunk holds every token
    rest = sp.Max(n - 2, 0)
    last = B * (S - 1) - CHUNK * (n - 1)
    return (CHUNK * rest, CHUNK * full, last), (rest, full, 1)


def statics(c) -> list:
    """(name, bytes, kind, why) of what LitGPT's model and loop hold the whole step."""
    if getattr(c, "implementation", "reference") != "litgpt":
        return []
    from .litgpt import rope_width
    out = [("RoPE cos and sin (FP32 buffers)", 2 * S * (rope_width(c) / H) * 4, Kind.PARAM, "GPT.cos, GPT.sin: "
            "(max_seq_length, rope_n_elem) FP32 each (rope_n_elem: d/H; pythia's a quarter of it); full.py sets "
            "max_seq_length to the longest sequence")]
    if on(c):
        out += [(PREVIOUS[0], B * S * V * 2, Kind.ACTIVATION, "the last iteration's logits, until the new ones are "
                 "bound"), (PREVIOUS[1], 2, Kind.ACTIVATION, "the last iteration's loss (BF16), until the new one "
                            "is bound")]
    return out


def saved_names(c) -> list:
    """What the loss keeps from forward to backward (the landmark's rows)."""
    return [f"log-softmax output, {g}" for g in GROUPS] + [f"nll_loss total weights, {g}" for g in GROUPS] + (
        [] if c.single else [TARGETS]) + ["tokens counted", LOSS]


def _temp(p, name, expr, why):
    p.tensors[name] = Tensor(name, expr, Kind.TRANSIENT, Lifetime.TEMPORARY, why=why)
    return name


def _saved(p, name, expr, why):
    p.tensors[name] = Tensor(name, expr, Kind.ACTIVATION, Lifetime.SAVED, why=why)
    return name


def forward_end(p, c):
    """The final norm, the LM head, ``chunked_cross_entropy`` (the shifted view flattened and split by 128 tokens),
    ``loss / 1``."""
    a = c.dtype
    T, count = _tokens()
    norm_forward(p, c, "final", "LM head input")
    p.op("x = ln_f(x): the final norm input released", free=[final_input(c)] if c.upcast else [],
         role=OpRole.FINAL_NORM_INPUT_RELEASED)
    p.new(LOGITS, (B, S, V), a, "the LM head's output: full.py never deletes it")
    p.op("LM head", alloc=[LOGITS], role=OpRole.LM_HEAD)
    p.op("logits = model(input_ids): the previous logits released", free=[PREVIOUS[0]])
    flat = None
    if not c.single:
        flat = p.new("shifted logits flattened", (B, S - 1, V), a, "logits[..., :-1, :].reshape(-1, V): a copy")
        p.op("shifted logits: reshape(-1, V)", alloc=[flat])
        _saved(p, TARGETS, B * (S - 1) * 8, "targets[..., 1:].reshape(-1): a copy, kept by nll_loss")
        p.op("shifted targets: reshape(-1)", alloc=[TARGETS])
    losses = []
    for g, t, k in zip(GROUPS, T, count):
        p.op(f"log_softmax, {g}", alloc=[_saved(p, f"log-softmax output, {g}", t * V * 2 if a == "bf16" else
                                                t * V * 4, "BF16: saved for backward")], role=(
            OpRole.LOSS_STARTS if g == GROUPS[0] else None))
        losses.append(p.new(f"per-token losses, {g}", (t,), a, "reduction='none'"))
        p.op(f"nll_loss, {g}", alloc=[losses[-1], _saved(p, f"nll_loss total weights, {g}", k * 2, "one 0-d "
                                                         "total weight a chunk, kept for backward")])
    mask = p.new("targets != ignore_index", (B, S - 1), "bool", "non_masked_elems' mask")
    n = p.new("non_masked_elems", (), "int64", ".sum()")
    cat = p.new("torch.cat(loss_chunks)", (B, S - 1), a, "the chunks' losses in one tensor")
    total = p.new("sum of the chunks' losses", (), a, ".sum()")
    one = p.new("ones_like(non_masked_elems)", (), "int64", "max(count, 1) without a host sync")
    p.op("targets != ignore_index", alloc=[mask])
    p.op("non_masked_elems: .sum()", alloc=[n])
    p.op("released", free=[mask])
    p.op("torch.cat(loss_chunks)", alloc=[cat])
    p.op(".sum()", alloc=[total])
    p.op("released", free=[cat])
    p.op("ones_like", alloc=[one])
    p.op("maximum", alloc=[_saved(p, "tokens counted", 8, "the divisor, saved by the division")])
    p.op("released", free=[one])
    _saved(p, LOSS, 2 if a == "bf16" else 4, "the loss, in the logits' dtype")
    p.op("division: the loss", alloc=[LOSS])
    p.op("chunked_cross_entropy returns", free=[total, n, flat] + losses, role=OpRole.LOSS_COMPUTED)
    p.op("loss bound: the previous loss released", free=[PREVIOUS[1]])
    p.op("loss / 1", alloc=[_saved(p, "loss", 2 if a == "bf16" else 4, "loss / gradient_accumulation_iters: "
                                   "a temporary of the loop until backward returns")])


def backward_start(p, c):
    """``(loss / 1).backward()`` through the loss chunk by chunk (the last first), ``split``'s and the slice's
    backward, the LM head and the final norm; ends with the last block's ``dX_out``."""
    a = c.dtype
    T, count = _tokens()
    w = 2 if a == "bf16" else 4
    p.op("loss.backward()", alloc=[p.new("gradient of the loss", (), a, "loss.backward() seeds a 1")],
         role=OpRole.LOSS_BACKWARD)
    g0 = p.new("gradient of LitGPT's loss", (), a, "/ 1 backward")
    gs = p.new("gradient of the chunks' sum", (), a, "the division's backward")
    p.op("/ 1 backward", alloc=[g0])
    p.op("division backward", alloc=[gs])
    p.op("released", free=[g0, "tokens counted"])
    grads = []
    for g, t in reversed(list(zip(GROUPS, T))):        # the node made last runs first
        one = CHUNK * sp.Min(count[0], 1) if g == GROUPS[0] else t      # chunks 0..N-3: one chunk's at a time
        g1 = _temp(p, f"nll_loss gradient, {g}", one * V * w, "nll_loss backward: one chunk's (T, V)")
        g2 = _temp(p, f"log_softmax gradient, {g}", t * V * w, "log_softmax backward: waits for split's backward")
        p.op(f"nll_loss backward, {g}", alloc=[g1])
        p.op("released", free=[f"nll_loss total weights, {g}"] + ([gs, None if c.single else TARGETS]
                                                                  if g == GROUPS[0] else []),
             role=OpRole.LABELS_RELEASED if g == GROUPS[0] else None)
        if g == GROUPS[0]:      # each chunk in turn: its gradient replaces its log-softmax (chunk N-2's height)
            p.op(f"log_softmax backward, {g}", alloc=[g2], free=[g1, f"log-softmax output, {g}"])
        else:
            p.op(f"log_softmax backward, {g}", alloc=[g2])
            p.op("released", free=[g1, f"log-softmax output, {g}"])
        grads.append(g2)
    flat = p.new("gradient of the shifted logits", (B, S - 1, V), a, "split's backward: one cat")
    p.op("split backward: cat", alloc=[flat], free=grads)
    glog = p.new("gradient of the logits", (B, S, V), a, "slice_backward: zeros with the gradient copied in")
    p.op("slice backward", alloc=[glog])
    p.op("released", free=[flat])
    gfn = p.new("gradient of the LM head input", BSd, a, "the LM head's input gradient")
    p.op("LM head backward", alloc=["grad head.weight", gfn], role=OpRole.LM_HEAD_BACKWARD)
    p.op("released", free=[glog, "LM head input"])
    norm_backward(p, c, "final", gfn, Ref(Scope.LAST, "dX_out"), [f"grad {name}" for name, _ in final_norm_params(c)])
