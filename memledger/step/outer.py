"""The step's programs outside the blocks: embedding, final norm, LM head and loss, and the optimizer.

Same form as :mod:`memledger.step.block` (ops over the step's tensors). The loss keeps the logits' FP32
copy and ``log_softmax``'s output next to every saved activation at the end of the forward pass, and its
backward holds two more B*S*V FP32 tensors; the optimizer step of ``torch.optim.AdamW``
(``torch/optim/adam.py``) allocates, per parameter, ``exp_avg_sq.sqrt()`` and its quotient by the bias
correction (``foreach=False``), or one ``_foreach_sqrt`` copy of every moment at once (``foreach=True``);
with FP32 master weights the reference's loop (:meth:`memledger.pytorch.reference.Trainer.step`) first
converts each gradient to FP32, one parameter at a time.
"""
from typing import NamedTuple

from ..core.dtypes import nbits
from ..core.symbols import B, S, V, d
from ..core.vocabulary import State
from .families import alibi_released, embedding_backward, embedding_forward, extra_params
from .norms import norm_backward, norm_forward
from .ops import BSd, Ref, Tensor, final_input, gradient
from .structure import Shape
from .vocab import Action, Kind, Lifetime, OpRole, Scope

__all__ = ["LOGITS", "Param", "adamw", "backward_end", "backward_start", "cross_entropy", "define_grads",
           "final_norm_params", "forward_end", "forward_start", "head_params", "optimizer"]

LOGITS = (B, S, V)


class Param(NamedTuple):
    """A parameter tensor the optimizer step walks: ``elements`` on this rank; ``lump``: the middle blocks' as one."""
    name: str
    elements: object
    lump: bool = False
    step: OpRole = None     # the role of its optimizer step's op (the embedding's: TP redistributes its gradient)
    local: str = None       # its name in its module ("qkv.weight" for "block 3 qkv.weight"); None: ``name``

    @property
    def key(self) -> str:
        """The parameter's name in its module (a block's own, or the embedding's, the head's): what decides its
        shape and layout."""
        return self.local or self.name


def final_norm_params(c: Shape) -> list:
    """(name, elements) of the final norm's parameters."""
    return [("final norm.weight", d), ("final norm.bias", d)] if c.gpt else [("final norm.weight", d)]


def head_params(c: Shape) -> list:
    """(name, elements) of the parameters outside the blocks, in ``model.parameters()`` order after the blocks
    (the LM head's bias, Phi's; the families' last: :func:`memledger.step.families.extra_params`)."""
    return final_norm_params(c) + ([] if c.is_tied else [("head.weight", V * d)]) + (
        [("head.bias", V)] if c.head_bias else []) + extra_params(c)


def define_grads(p, c: Shape, share):
    """Gradient tensors of the embedding, the final norm and (untied) the LM head."""
    for name, n in [("embedding.weight", V * d)] + head_params(c):
        gradient(p, name, n, c, share)


def forward_start(p, c: Shape):
    """The causal mask (eager attention) and the embedding, whose output is the first block's input."""
    if c.attention == "eager" and c.packing != "eager":     # packed: memledger.step.packing builds it
        ones = p.new("ones (S, S)", (S, S), "bool", "torch.ones before .triu(1)")
        p.op("torch.ones(S, S)", alloc=[ones])
        p.op("triu: the causal mask", alloc=["causal mask"])
        p.op("released", free=[ones])
    embedding_forward(p, c)


def forward_end(p, c: Shape):
    """Final norm, LM head, FP32 upcast, log_softmax, nll_loss."""
    a = c.dtype
    norm_forward(p, c, "final", "LM head input")
    logits = p.new("logits", LOGITS, a, "the LM head's output")
    p.op("LM head", alloc=[logits], role=OpRole.LM_HEAD)
    alibi_released(p, c)
    if c.upcast:
        p.op("final norm input released", free=[final_input(c)], role=OpRole.FINAL_NORM_INPUT_RELEASED)
    src = logits
    if a != "fp32":
        src = p.new("logits in FP32", LOGITS, "fp32", "logits.float(): cross-entropy runs in FP32")
        p.op("logits.float()", alloc=[src])
        p.op("BF16 logits released", free=[logits])
    cross_entropy(p, src)


def cross_entropy(p, src):
    """``F.cross_entropy`` on the FP32 logits ``src``: log-softmax, then nll_loss (the loss and its total weight);
    ``src`` dies with the loss."""
    p.op("log_softmax", alloc=["log-softmax output (FP32)"], role=OpRole.LOSS_STARTS)
    p.op("nll_loss", alloc=["loss", "nll_loss total weight"])
    p.op("loss computed", free=[src], role=OpRole.LOSS_COMPUTED)


def backward_start(p, c: Shape, labels=None):
    """Backward through the loss, the LM head and the final norm; ends with the last block's ``dX_out``.
    ``labels``: the labels ``nll_loss`` kept, released with its total weight (transformers' shifted labels; the
    reference decoder's are the step's target ids)."""
    a = c.dtype
    dl = p.new("gradient of the loss", (), "fp32", "loss.backward() seeds a 1")
    g1 = p.new("nll_loss gradient", LOGITS, "fp32", "nll_loss backward: B*S*V FP32")
    g2 = p.new("log_softmax gradient", LOGITS, "fp32", "log_softmax backward: B*S*V FP32")
    p.op("loss.backward()", alloc=[dl], role=OpRole.LOSS_BACKWARD)
    p.op("nll_loss backward", alloc=[g1])
    p.op("released", free=["nll_loss total weight", labels], role=OpRole.LABELS_RELEASED)
    p.op("log_softmax backward", alloc=[g2])
    p.op("released", free=[g1, "log-softmax output (FP32)"])
    g = g2
    if a != "fp32":
        g = p.new("logits gradient", LOGITS, a, "downcast to the logits' dtype")
        p.op("logits.float() backward", alloc=[g])
        p.op("released", free=[g2])
    gfn = p.new("gradient of the LM head input", BSd, a, "the LM head's input gradient")
    head = "LM head's contribution to the tied embedding gradient" if c.is_tied else "grad head.weight"
    if c.is_tied:
        p.tensors[head] = Tensor(head, p.tensors["grad embedding.weight"].expr, Kind.TRANSIENT, Lifetime.TEMPORARY,
                                 p.placement.gradients, "waits in autograd's buffer for the embedding's contribution")
    if c.head_bias:         # addmm: the input gradient first, then the weight's and the bias's (Phi's lm_head)
        p.op("LM head backward", alloc=[gfn, head, "grad head.bias"], role=OpRole.LM_HEAD_BACKWARD)
    else:
        p.op("LM head backward", alloc=[head, gfn], role=OpRole.LM_HEAD_BACKWARD)
    p.op("released", free=[g, "LM head input"])
    grads = [f"grad {n}" for n, _ in final_norm_params(c)]
    norm_backward(p, c, "final", gfn, Ref(Scope.LAST, "dX_out"), grads)


def backward_end(p, c: Shape):
    """The embedding's backward (summed with the LM head's for a tied weight); the loss is released."""
    g = embedding_backward(p, c)
    if c.is_tied:
        dense = p.new("embedding gradient (dense)", (V, d), c.grad_dtype, "embedding_dense_backward's output")
        p.op("embedding backward", alloc=[dense])
        p.op("released", free=[g])
        p.op("tied weight: both gradients summed", alloc=["grad embedding.weight"])
        p.op("released", free=[dense, "LM head's contribution to the tied embedding gradient"])
    else:
        p.op("embedding backward", alloc=["grad embedding.weight"], role=OpRole.EMBEDDING_BACKWARD)
        p.op("released", free=[g])
    p.op("loss released", free=["gradient of the loss", "loss"], role=OpRole.LOSS_RELEASED)


def adamw(recipe) -> tuple:
    """(dtype of AdamW's moments, whether FP32 master weights take the update) of ``recipe``, read off its
    components' typed :class:`~memledger.core.vocabulary.State`: the moments' dtype is the second moment's where
    it is kept at 16 bits or more (a block-quantized 8-bit state is bitsandbytes' own update,
    :mod:`memledger.step.bnb`), None for a recipe without one."""
    moments = next((x.dtype for x in recipe.components if x.state is State.SECOND_MOMENT and nbits(x.dtype) >= 16),
                   None)
    return moments, any(x.state is State.MASTER and x.dtype == "fp32" for x in recipe.components)


def optimizer(p, params, state_dtype: str, master: bool, foreach: bool, grad_dtype: str, kept: bool = False,
              others=None):
    """AdamW's step over ``params`` (:class:`Param`; a lump stands for many blocks' tensors), its temporaries
    in ``state_dtype`` where the optimizer runs.

    ``master``: BF16 gradients are first converted to FP32 masters' gradients,
    one tensor at a time, the BF16 gradient freed after each; ``kept``: ``p.grad = None`` frees nothing (the
    gradients are views into DDP's buckets, :mod:`memledger.step.ddp`). ``others(p)``: another optimizer's
    temporaries (:func:`memledger.step.optim.temporaries`) instead of AdamW's.
    """
    where = p.placement.optimizer
    p.op("gradients collected", action=Action.COLLECT_GRADIENTS)
    if master:
        total = sum(x.elements for x in params)
        done, before = 0, None          # None: the gradients as collected, none converted yet
        for x in params:
            fp32 = p.new(f"FP32 gradient of {x.name}", (x.elements,), "fp32", "master.grad = p.grad.float()",
                         Kind.GRAD, where)
            rest = None if kept else p.new(f"BF16 gradients after {x.name}", (total - done - x.elements,),
                                           grad_dtype, "not yet converted", Kind.GRAD, where)
            released = dict(free=[before]) if before else dict(action=Action.FREE_COLLECTED_GRADIENTS)
            if x.lump:
                p.op(f"gradients to FP32: {x.name}", alloc=[rest, fp32], **released)
            else:
                p.op(f"gradient to FP32: {x.name}", alloc=[fp32])
                p.op("BF16 gradient released", alloc=[rest], **released)
            done, before = done + x.elements, rest
    if others is not None:
        others(p)
    elif foreach:
        one = p.new("torch.tensor(1.0)", (), "fp32", "foreach step-count increment", device=where)
        p.op("step counters += 1", alloc=[one])
        p.op("released", free=[one])
        sq = p.new("_foreach_sqrt(exp_avg_sq)", (sum(x.elements for x in params),), state_dtype,
                   "one square root per moment, all at once", device=where)
        p.op("_foreach_sqrt over every parameter", alloc=[sq])
        p.op("released", free=[sq])
    else:
        previous = None          # ``denom`` of the previous parameter lives until the next is assigned
        for x in params:
            if x.lump:
                continue
            s1 = p.new(f"sqrt(exp_avg_sq) of {x.name}", (x.elements,), state_dtype,
                       "AdamW(foreach=False): its square root", device=where)
            s2 = p.new(f"denom of {x.name}", (x.elements,), state_dtype,
                       "sqrt / bias correction + eps, a local until the next parameter's is assigned", device=where)
            p.op(f"AdamW step: {x.name}", alloc=[s1, s2], role=x.step)
            p.op("released", free=[s1, previous])
            previous = s2
        p.op("step done", free=[previous])
    p.op("gradients released", action=Action.RELEASE_GRADIENTS)
