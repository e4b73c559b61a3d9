"""A GPT-style family under a library's own code (issue 28): LitGPT's pythia (GPT-NeoX), ``implementation="litgpt"``.

LitGPT 0.5.13 ships pythia as ``Config.from_name("pythia-...")`` (``litgpt/config.py``): ``bias=True`` (every
linear and LayerNorm), ``norm_class_name="LayerNorm"`` (``torch.nn.LayerNorm``), ``mlp_class_name="GptNeoxMLP"``
(``litgpt/model.py`` l. 804-815: ``fc``, ``F.gelu(approximate="none")``, ``proj``), ``parallel_residual=True``,
``shared_attention_norm=False``, ``rotary_percentage=0.25`` (``rope_n_elem = int(0.25 * head_size)``), an untied
head without a bias. What its block runs beside memledger's reference GPT-NeoX block (:mod:`memledger.step.parallel`):

* ``Block.forward`` (l. 375-387): ``x_normed = norm_1(x)``, the attention, ``x_normed = norm_2(x)``, ``x =
  attention_output + x`` (a new tensor, before the MLP runs), ``return mlp(x_normed) + x``; the attention's output
  is a local until the block returns. The reference adds ``x + attn`` after its MLP (the same saved tensors, a
  different forward height).
* ``CausalSelfAttention.forward`` (l. 472-513, 566-570) as for LLaMA (:mod:`memledger.step.litgpt`): the fused
  ``qkv`` (with its bias), ``apply_rope`` on ``q[..., :rope_n_elem]`` and ``k[..., :rope_n_elem]`` (its temporaries
  ``rope_n_elem`` wide per head: :func:`rope_width`), ``torch.cat((q_roped, q[..., rope_n_elem:]))`` new q and k, v a
  view of the fused output (kept whole), SDPA's flash kernel, the output's reshape a copy.
* the model's ``cos`` and ``sin`` buffers (``rope_cache``, l. 43-62): (S, rope_n_elem) FP32 each
  (:func:`memledger.step.litgpt_loss.statics`).
* ``model.parameters()`` order within a block (:func:`block_params`): norm_1, attn (qkv, proj), norm_2, mlp (fc,
  proj), each weight before its bias.

Backward runs as the reference's parallel block (:func:`memledger.step.parallel.parallel_backward`, autograd's order
is the same: the adds allocate nothing) with LitGPT's attention backward (:func:`memledger.step.block.attention_backward`).
Checked against LitGPT's own model and ``finetune/full.py``'s loop under ``FakeTensorMode``
(tests/pytorch/test_gpt_style.py).

Refused (:func:`lacks`): another GPT-style family under LitGPT (Phi's shared norm, Falcon's), any under transformers'
code, recomputation, dropout.
"""
from . import litgpt
from .norms import norm_forward
from .ops import BSd, block_output, residual_names
from .vocab import OpRole

__all__ = ["litgpt_forward"]


def litgpt_forward(p, c):
    """LitGPT's parallel ``Block.forward`` (l. 375-387): its input is live; its output is the next block's input."""
    a = c.dtype
    norm_forward(p, c, "1", "Q/K/V projection input")
    litgpt.qkv_forward(p, c)            # the fused projection (its bias), the rotary code on rope_n_elem of each head
    litgpt.flash(p, c)
    attn = p.new("output projection output", BSd, a, "attention_output, a local of Block.forward until it returns")
    p.op("output projection", alloc=[attn], role=OpRole.OUTPUT_PROJECTION)
    norm_forward(p, c, "2", "MLP input")
    xm = residual_names(c)[1] if c.upcast else p.new("attention output + x", BSd, a, "x = attention_output + x: "
                                                     "a new tensor, until the block returns")
    p.op("attention_output + x", alloc=[xm])
    p.op("fc", alloc=["GeLU input"], role=OpRole.UP_PROJECTION)
    p.op("GeLU", alloc=["down-projection input"])
    mlp = p.new("down-projection output", BSd, a, "the MLP's output, until the sum is made")
    p.op("proj", alloc=[mlp], role=OpRole.DOWN_PROJECTION)
    p.op("mlp(x_normed) + x: the block's output", alloc=[block_output(c)])
    p.op("block returns", free=[mlp, attn, xm], role=OpRole.BLOCK_RETURNS)
