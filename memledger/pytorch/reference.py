"""The plain-PyTorch reference decoder and training loops the step timeline is checked against.

Fixed, so that anyone can rebuild it: a token embedding (learned
positions added where ``RefConfig.positions``), L blocks, a final norm, an LM head (tied to the embedding in the
GPT decoder, untied in the LLaMA decoder), and the loss
``F.cross_entropy(logits.float().view(-1, V), targets.view(-1))``.

* GPT block (the article's): LayerNorm -> fused QKV -> eager attention
  (scores * 1/sqrt(d/H), causal ``masked_fill`` with one shared (S, S) bool
  mask, softmax, dropout, @ v) -> output projection, dropout, residual;
  LayerNorm -> Linear(d, F) -> GeLU -> Linear(F, d) -> dropout, residual.
* LLaMA block: RMSNorm -> fused QKV (no bias; with one for Qwen2's shape) ->
  causal SDPA -> output projection, residual; RMSNorm -> down(silu(gate(h)) *
  up(h)), residual. The LLaMA decoder's LM head is untied unless ``tied``.
* A head size d_h other than d/H (``head_dim``, Gemma-7B): q, k and v are
  H*d_h (H_kv*d_h) wide and the output projection maps H*d_h back to d.
* Grouped-query attention (LLaMA blocks, ``n_kv_heads`` < ``n_heads``; one
  key/value head is multi-query): the fused projection is (H + 2 H_kv) * d/H
  wide and split into q, k, v, and K and V are **never expanded to H heads**.
  SDPA gets ``enable_gqa=True``; PyTorch's CPU flash kernel then reads each
  query head's key/value head in place (measured, PyTorch 2.13: it saves K and
  V at H_kv heads and returns their gradients at that width). The eager core
  folds the query heads of a group into one batch (q copied to
  (B, H_kv, G*S, d/H), K and V made contiguous at H_kv heads). This is the
  convention of :func:`memledger.activations.inventory.inventory` with ``gqa=True``;
  Hugging Face's ``repeat_kv`` (``transformers/models/llama/modeling_llama.py``:
  ``expand`` + ``reshape``, "the equivalent of torch.repeat_interleave") and
  the math SDPA's ``enable_gqa`` (``repeat_interleave``, the reference code in
  ``F.scaled_dot_product_attention``'s docstring) copy K and V to H heads
  instead: that is ``inventory(..., repeat_kv=True)``, not modelled here.

The loss may also run chunked, as torchtune's ``CEWithChunkedOutputLoss`` or LitGPT's
``chunked_cross_entropy`` (``RefConfig(loss_chunks=n, loss_impl=...)``, :meth:`Decoder.loss`;
:mod:`memledger.step.loss` models it).

Under tensor parallelism (``RefConfig(tp=t)``, :mod:`memledger.pytorch.distributed`) a block views
its column-split fused QKV output with H/t query and H_kv/t key/value heads.

Loops (:data:`LOOPS`): one per recipe of :data:`memledger.pytorch.optimizers.LOOP_OPTIMIZERS` (``fp32-adamw``,
``bf16-pure-adamw``, ``bf16-adamw`` with FP32 masters held by the optimizer, SGD with and without momentum,
Adafactor), each optimizer for-loop, foreach or fused, or stepped in backward. Measuring helpers live in
:mod:`memledger.pytorch.measure`. PyTorch is imported here only: ``import
memledger`` works without it.
"""
from contextlib import nullcontext
from dataclasses import dataclass
import math

import torch
from torch import nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from .offload import OffloadSaved
from .packing import block_causal_mask, masked_positions
from .optimizers import AMP_LOOPS, LOOP_OPTIMIZERS, Scaler, in_backward_hooks, make_optimizer

__all__ = ["LANDMARKS", "LOOPS", "LOSS_IMPLS", "Block", "Decoder", "FusedRMSNorm", "RefConfig", "Trainer", "make_model"]

LOOPS = tuple(LOOP_OPTIMIZERS)
#: The cross-entropies the decoder runs: torchtune's (FP32 upcast per chunk) and LitGPT's (no upcast).
LOSS_IMPLS = ("torchtune", "litgpt")
LANDMARKS = ("before forward", "after forward", "after backward", "after step")


@dataclass(frozen=True)
class RefConfig:
    """Shape and variant of the reference decoder.

    ``dropout``: probability (0 -> no dropout call at all); ``native_dropout``:
    ``torch.native_dropout`` (the fused CUDA kernel's 1-byte mask) instead of
    ``F.dropout``; ``attention``: ``"eager"`` or ``"sdpa"``; None (the default)
    is the style's reference kernel (GPT eager, LLaMA SDPA; an eager LLaMA block
    is what the article backend's timeline models); ``n_kv_heads``: key/value
    heads of a LLaMA block (None: ``H``, multi-head); ``qkv_bias``: a LLaMA block's fused QKV
    projection has a bias (Qwen2); ``tied``: a LLaMA decoder's LM head shares the embedding's weight
    (Gemma; GPT decoders are tied unless ``untied``, and biased); ``untied``: a GPT decoder's own LM head
    (GPT-NeoX's ``embed_out``, Phi's ``lm_head``); ``head_bias``: a bias on an untied head (Phi's
    ``lm_head``, ``nn.Linear(d, V, bias=True)``); ``parallel``: the block's output is x + attn(norm1(x)) +
    mlp(norm2(x)) (GPT-NeoX's ``use_parallel_residual``; Hugging Face's ``GPTNeoXLayer`` sums ``mlp_output +
    attn_output + hidden_states``: two adds of the same sizes, and autograd still reaches the MLP branch first,
    its nodes being the newer); with ``shared_norm`` one norm feeds both branches (Phi's ``input_layernorm``);
    ``rmsnorm``: ``"composite"`` (``nn.RMSNorm``) or
    ``"fused"`` (ATen's ``_fused_rms_norm``, saving input and rstd as the CUDA
    kernel does); ``recompute``: ``"none"``, ``"selective"`` (the attention
    core, Korthikanti et al. 2022) or ``"full"`` (every block); ``head_dim``: the
    head size where it is not d/H (Gemma-7B: 256 with d = 3072, H = 16): q is
    H*d_h wide, k and v H_kv*d_h, and the output projection (H*d_h) x d; ``tp``: the blocks run
    under tensor parallelism of degree t (:mod:`memledger.pytorch.distributed`): the fused QKV
    projection is split column-wise, so each rank views its local output with H/t query and
    H_kv/t key/value heads (1, the default: the whole block). Only the views change; the model
    built is the same. ``loss_chunks``: n > 1 runs torchtune's chunked cross-entropy (:meth:`Decoder.loss`):
    the LM head on n chunks of the sequence, each chunk's logits upcast to FP32 and summed by
    ``F.cross_entropy(reduction="sum")``, the sum divided by the counted tokens (1, the default: one
    ``F.cross_entropy`` on all the FP32 logits). ``loss_impl="litgpt"``: LitGPT's ``chunked_cross_entropy``
    instead, on the logits as the model returns them (BF16: no upcast), the head applied per chunk of S/n
    tokens (``split``; S a multiple of n), one ``reduction="none"`` cross-entropy per chunk, concatenated,
    summed, divided by the counted tokens.
    ``offload_activations``: each block runs under ``save_on_cpu(pin_memory=True)``'s
    hooks (:class:`memledger.pytorch.offload.OffloadSaved`, FSDP's ``offload_wrapper``): its saved tensors
    are host copies, copied back node by node in backward; under full recomputation the checkpoint's input.
    ``positions``: n > 0 adds learned positions, an n x d ``nn.Embedding`` of ``arange(S)[None]`` added to the token
    embedding (GPT-BigCode's ``wpe``, ``models/gpt_bigcode/modeling_gpt_bigcode.py``: ``inputs_embeds +
    position_embeds``), registered last in ``model.parameters()``.
    ``softmax_fp32``: the eager core as transformers' ``eager_attention_forward`` runs it
    (``models/llama/modeling_llama.py`` l. 180-202, transformers 5.24.0): K and V repeated to H heads
    (``repeat_kv``), ``q @ k^T * scaling``, plus an additive float mask (B x 1 x S x S), softmax in FP32 cast back
    (``softmax(..., dtype=torch.float32).to(query.dtype)``, l. 197), ``@ v``.
    ``packed``: n >= 1 documents packed in each row (0, the default: one causal sequence):
    :meth:`Decoder.forward` takes the rows' document ids and builds one (B, S, S) block-causal boolean mask
    (:mod:`memledger.pytorch.packing`), passed to every block's SDPA as ``mask[:, None]`` (torchtune's
    ``_sdpa_or_flex_attention``), ``is_causal=False``; the eager core instead gets it inverted, (B, 1, S, S),
    for its ``masked_fill`` (Megatron-LM's ``attention_mask_func``).
    ``attention_dropout``: False runs the probabilities' dropout at p = 0, as ``PhiAttention`` does with Phi-2's
    ``attention_dropout`` 0.0 beside ``resid_pdrop`` 0.1 (``nn.functional.dropout(attn_weights,
    p=self.attention_dropout, training=self.training)``, ``models/phi/modeling_phi.py``): ATen's ``_dropout_impl``
    returns the input at p == 0 (``aten/src/ATen/native/Dropout.cpp``), so only the residual dropouts keep masks;
    SDPA gets ``dropout_p=0``.
    """
    d: int
    L: int
    H: int
    F: int
    V: int
    style: str = "gpt"
    dropout: float = 0.0
    native_dropout: bool = False
    attention: str = None
    rmsnorm: str = "composite"
    recompute: str = "none"
    n_kv_heads: int = None
    qkv_bias: bool = False
    tied: bool = False
    head_dim: int = None
    tp: int = 1
    loss_chunks: int = 1
    loss_impl: str = "torchtune"
    offload_activations: bool = False
    softmax_fp32: bool = False
    packed: int = 0
    parallel: bool = False          # x + attn(norm1(x)) + mlp(norm2(x)): GPT-NeoX's use_parallel_residual
    shared_norm: bool = False       # with parallel: one norm feeds both (Phi); no norm2
    alibi: bool = False             # eager core: a (1, H, 1, S) ALiBi bias added to the scores (BLOOM)
    input_norm: bool = False        # a LayerNorm on the embedding output (BLOOM's word_embeddings_layernorm)
    positions: int = 0              # n > 0: learned positions, an n x d embedding added to the tokens' (GPT-2's wpe)
    untied: bool = False            # a GPT decoder's LM head has its own weight (GPT-NeoX's embed_out, Phi's lm_head)
    head_bias: bool = False         # the LM head has a bias (Phi's lm_head: nn.Linear(d, V, bias=True))
    attention_dropout: bool = True  # False: the probabilities' dropout at p = 0 (Phi-2's attention_dropout 0.0)

    def __post_init__(self):
        if self.attention not in (None, "eager", "sdpa"):
            raise ValueError(f"attention must be eager or sdpa, got {self.attention!r}")
        if self.H % self.kv_heads:
            raise ValueError(f"H ({self.H}) must be divisible by n_kv_heads ({self.kv_heads})")
        if self.tp < 1 or self.H % self.tp or self.kv_heads % self.tp:
            raise ValueError(f"tp ({self.tp}) must divide H ({self.H}) and n_kv_heads ({self.kv_heads})")
        if not isinstance(self.loss_chunks, int) or self.loss_chunks < 1:
            raise ValueError(f"loss_chunks must be a whole number >= 1, got {self.loss_chunks!r}")
        if self.loss_impl not in LOSS_IMPLS:
            raise ValueError(f"loss_impl must be one of {', '.join(LOSS_IMPLS)}, got {self.loss_impl!r}")
        if not isinstance(self.packed, int) or self.packed < 0:
            raise ValueError(f"packed must be a whole number of documents per row >= 0, got {self.packed!r}")
        if self.packed and self.softmax_fp32:
            raise ValueError("packed: the eager core masks packed documents with masked_fill, not softmax_fp32's "
                             "additive mask")
        if self.style == "gpt" and (self.qkv_bias or self.tied):
            raise ValueError("qkv_bias, tied: refinements of LLaMA blocks (GPT blocks are tied and biased)")
        if self.style == "gpt" and self.kv_heads != self.H and self.kernel != "eager":
            raise ValueError("a GPT block with n_kv_heads (multi-query, GPT-BigCode) runs the eager core")
        if self.shared_norm and not self.parallel:
            raise ValueError("shared_norm needs parallel")
        if self.alibi and self.kernel != "eager":
            raise ValueError("alibi is added to the eager core's scores (attention='eager')")
        if not isinstance(self.positions, int) or self.positions < 0:
            raise ValueError(f"positions must be a whole number of learned positions >= 0, got {self.positions!r}")
        if self.untied and self.style != "gpt":
            raise ValueError("untied: a GPT decoder's own LM head (a LLaMA decoder is untied unless tied)")
        if self.head_bias and (self.tied or (self.style == "gpt" and not self.untied)):
            raise ValueError("head_bias: a bias on an untied LM head (Phi's lm_head)")

    @property
    def kernel(self) -> str:
        """``"eager"`` or ``"sdpa"``: the attention this block runs."""
        return self.attention or ("eager" if self.style == "gpt" else "sdpa")

    @property
    def hd(self) -> int:
        """The head size: ``head_dim``, or d/H."""
        return self.head_dim or self.d // self.H

    @property
    def kv_heads(self) -> int:
        return self.H if self.n_kv_heads is None else self.n_kv_heads

    @property
    def local_heads(self) -> tuple:
        """(query heads, key/value heads) one rank runs: H/t and H_kv/t."""
        return self.H // self.tp, self.kv_heads // self.tp


class _FusedRMSNormFn(torch.autograd.Function):
    """RMSNorm that saves (input, FP32 rstd) like the CUDA kernel (derivatives.yaml: _fused_rms_norm)."""

    @staticmethod
    def forward(ctx, x, weight, eps):
        out, rstd = torch.ops.aten._fused_rms_norm(x, [x.shape[-1]], weight, eps)
        ctx.save_for_backward(x, rstd, weight)
        return out

    @staticmethod
    def backward(ctx, grad):
        x, rstd, weight = ctx.saved_tensors
        dx, dw = torch.ops.aten._fused_rms_norm_backward(grad, x, [x.shape[-1]], rstd, weight, [True, True])
        return dx, dw, None


class FusedRMSNorm(nn.RMSNorm):
    def forward(self, x):
        return _FusedRMSNormFn.apply(x, self.weight, self.eps or torch.finfo(x.dtype).eps)


class Block(nn.Module):
    """One GPT or LLaMA block as this module fixes it."""

    def __init__(self, c: RefConfig):
        super().__init__()
        self.c = c
        gpt = c.style == "gpt"
        norm = nn.LayerNorm if gpt else (FusedRMSNorm if c.rmsnorm == "fused" else nn.RMSNorm)
        self.norm1 = norm(c.d)
        self.norm2 = None if c.shared_norm else norm(c.d)
        self.qkv = nn.Linear(c.d, (c.H + 2 * c.kv_heads) * c.hd, bias=gpt or c.qkv_bias)
        self.proj = nn.Linear(c.H * c.hd, c.d, bias=gpt)
        if gpt:
            self.up, self.down = nn.Linear(c.d, c.F), nn.Linear(c.F, c.d)
        else:
            self.gate, self.up = nn.Linear(c.d, c.F, bias=False), nn.Linear(c.d, c.F, bias=False)
            self.down = nn.Linear(c.F, c.d, bias=False)

    def _drop(self, x):
        c = self.c
        if c.style != "gpt" or not c.dropout:
            return x
        return torch.native_dropout(x, c.dropout, True)[0] if c.native_dropout else F.dropout(x, c.dropout)

    def _drop_probs(self, x):
        """The attention probabilities' dropout: the block's, or (``attention_dropout=False``) F.dropout at p = 0."""
        c = self.c
        if c.attention_dropout or c.style != "gpt" or not c.dropout:
            return self._drop(x)
        return F.dropout(x, 0.0)

    def _core(self, q, k, v, mask, alibi=None):
        c = self.c
        scale = 1 / math.sqrt(c.hd)
        kv = c.local_heads[1]
        if c.kernel == "eager" and c.softmax_fp32:         # transformers' eager_attention_forward
            B, H, S, hd = q.shape
            if kv != H:                                     # repeat_kv: expand + reshape (a copy)
                k, v = (t[:, :, None].expand(B, kv, H // kv, S, hd).reshape(B, H, S, hd) for t in (k, v))
            scores = torch.matmul(q, k.transpose(2, 3)) * scale
            if mask is not None:
                scores = scores + mask
            scores = F.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
            return self._drop_probs(scores) @ v
        if c.kernel == "eager" and c.kv_heads != c.H:        # grouped: no K/V copies to H heads
            B, H, S, hd = q.shape
            q = q.reshape(B, kv, H // kv * S, hd)
            k, v = k.contiguous(), v.contiguous()
            scores = (q @ k.transpose(-1, -2)).view(B, H, S, S) * scale
            if alibi is not None:
                scores = scores + alibi
            probs = self._drop_probs(scores.masked_fill(mask, float("-inf")).softmax(-1))
            return (probs.view(B, kv, H // kv * S, S) @ v).view(B, H, S, hd)
        if c.kernel == "eager":
            scores = (q @ k.transpose(-1, -2)) * scale
            if alibi is not None:
                scores = scores + alibi
            return self._drop_probs(scores.masked_fill(mask, float("-inf")).softmax(-1)) @ v
        p = c.dropout if c.style == "gpt" and c.attention_dropout else 0.0
        if c.packed:                    # packed documents: the block-causal mask, (B, 1, S, S)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], dropout_p=p,
                                                  enable_gqa=c.kv_heads != c.H)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True,
                                              enable_gqa=c.kv_heads != c.H)

    def forward(self, x, mask, alibi=None):
        c = self.c
        hd = c.hd
        H, kv = c.local_heads
        h1 = self.norm1(x)
        qkv = self.qkv(h1)
        if not c.shared_norm:
            del h1                      # (a local would outlive its use: the blocks' lifetimes are measured)
        B, S, _ = qkv.shape             # under sequence parallelism x holds S/t positions, qkv all S
        if c.kv_heads == c.H:
            q, k, v = qkv.view(B, S, 3, H, hd).permute(2, 0, 3, 1, 4)
        else:
            q, k, v = qkv.split([H * hd, kv * hd, kv * hd], dim=-1)
            q, k, v = (t.view(B, S, -1, hd).transpose(1, 2) for t in (q, k, v))
        if c.recompute == "selective":
            a = checkpoint(self._core, q, k, v, mask, alibi, use_reentrant=False)
        else:
            a = self._core(q, k, v, mask, alibi)
        if c.parallel:          # GPT-NeoX: x + attn(ln1(x)) + mlp(ln2(x)); Phi: one norm, h1 feeds both
            attn = self._drop(self.proj(a.transpose(1, 2).reshape(B, S, H * hd)))
            h = h1 if c.shared_norm else self.norm2(x)
        else:
            x = x + self._drop(self.proj(a.transpose(1, 2).reshape(B, S, H * hd)))
            h = self.norm2(x)
        if c.style == "gpt":
            out = self._drop(self.down(F.gelu(self.up(h))))
        else:
            out = self.down(F.silu(self.gate(h)) * self.up(h))
        return x + attn + out if c.parallel else x + out


class Decoder(nn.Module):
    """Embedding, blocks, final norm, LM head (tied in GPT, untied in LLaMA), FP32 cross-entropy (or, with
    ``loss_chunks``/``loss_impl``, torchtune's or LitGPT's chunked cross-entropy: :meth:`loss`)."""

    def __init__(self, c: RefConfig):
        super().__init__()
        self.c = c
        self.embed = nn.Embedding(c.V, c.d)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.L))
        gpt = c.style == "gpt"
        self.norm = nn.LayerNorm(c.d) if gpt else (FusedRMSNorm(c.d) if c.rmsnorm == "fused" else nn.RMSNorm(c.d))
        self.head = nn.Linear(c.d, c.V, bias=c.head_bias)
        self.input_norm = nn.LayerNorm(c.d) if c.input_norm else None
        if (gpt and not c.untied) or c.tied:
            self.head.weight = self.embed.weight
        self.pos = nn.Embedding(c.positions, c.d) if c.positions else None       # last in model.parameters()

    def forward(self, ids, documents=None):
        S = ids.shape[1]
        mask = None
        if self.c.packed and self.c.kernel == "eager":     # masked_fill's (B, 1, S, S) mask, shared by every block
            mask = masked_positions(documents)
        elif self.c.packed:             # built once per forward, shared by every block (memledger.pytorch.packing)
            mask = block_causal_mask(documents)
        elif self.c.kernel == "eager":
            mask = torch.ones(S, S, dtype=torch.bool, device=ids.device).triu(1)   # built once, shared
        x = self.embed(ids)
        if self.pos is not None:        # GPT-BigCode's (and GPT-2's) wpe: arange(S)[None], embedded, added
            x = x + self.pos(torch.arange(S, device=ids.device)[None])
        if self.input_norm is not None:
            x = self.input_norm(x)
        alibi = self._alibi(S, x) if self.c.alibi else None
        for block in self.blocks:
            extra = () if alibi is None else (alibi,)
            with OffloadSaved() if self.c.offload_activations else nullcontext():
                if self.c.recompute == "full":
                    x = checkpoint(block, x, mask, *extra, use_reentrant=False)
                else:
                    x = block(x, mask, *extra)
        h = self.norm(x)
        n = self.c.loss_chunks
        if n > 1 and self.c.loss_impl == "litgpt":     # litgpt/model.py GPT.forward: x.split(lm_head_chunk_size)
            return [self.head(chunk) for chunk in h.split(S // n, dim=1)]
        if n > 1:                       # torchtune TransformerDecoder.chunked_output: one head call per chunk
            return [self.head(chunk) for chunk in h.tensor_split(n, dim=1)]
        return self.head(h)

    def _alibi(self, S, x):
        """BLOOM's ALiBi bias, slope_h * (key position), (1, H, 1, S) in the activation dtype, built once per forward
        (Press et al. 2022; ``build_alibi_tensor`` in ``modeling_bloom.py``: slopes 2^(-8(h+1)/H) for H a power of
        two times the key positions; it equals -slope_h * (query - key) up to a constant along each softmax row)."""
        H = self.c.local_heads[0]
        slopes = torch.tensor([2 ** (-8 * (h + 1) / self.c.H) for h in range(H)], dtype=torch.float32,
                              device=x.device)
        positions = torch.arange(S, dtype=torch.float32, device=x.device)
        return (slopes.view(1, H, 1, 1) * positions.view(1, 1, 1, S)).to(x.dtype)

    def loss(self, ids, targets, documents=None):
        """``F.cross_entropy`` on the FP32 logits; with ``loss_chunks`` n > 1 torchtune's
        ``CEWithChunkedOutputLoss.forward`` (``torchtune/modules/loss/ce_chunked_output_loss.py`` l. 84-102, its
        default ``ignore_index`` -100): tokens counted, labels split like the logits, one FP32
        ``F.cross_entropy(..., reduction="sum")`` per chunk (l. 48-50), summed, divided by the count."""
        if self.c.loss_impl == "litgpt":
            return self._litgpt_loss(ids, targets, documents)
        if self.c.loss_chunks == 1:
            return F.cross_entropy(self._logits(ids, documents).float().view(-1, self.c.V), targets.view(-1))
        logits = self._logits(ids, documents)
        total_elements = (targets != -100).sum()
        labels = [chunk.reshape(-1) for chunk in targets.tensor_split(self.c.loss_chunks, dim=1)]
        logits = [chunk.reshape(-1, chunk.size(-1)) for chunk in logits]
        total_loss = 0.0
        for logits_chunk, labels_chunk in zip(logits, labels):
            total_loss += F.cross_entropy(logits_chunk.float(), labels_chunk, ignore_index=-100, reduction="sum")
        return total_loss / total_elements

    def _logits(self, ids, documents):
        """The forward pass; a packed batch's document ids go with the ids (subclasses without packing take
        the ids alone)."""
        return self(ids) if documents is None else self(ids, documents)

    def _litgpt_loss(self, ids, targets, documents=None):
        """LitGPT's ``chunked_cross_entropy`` (``litgpt/utils.py`` l. 302-337, at 26857050), default
        ``ignore_index`` -100, on the logits in their own dtype."""
        logits = self._logits(ids, documents)
        if self.c.loss_chunks == 1:             # chunk_size 0: one cross-entropy, no upcast
            return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1), ignore_index=-100)
        logit_chunks = [chunk.reshape(-1, chunk.size(-1)) for chunk in logits]
        target_chunks = [chunk.reshape(-1) for chunk in targets.split(logits[0].size(1), dim=1)]
        loss_chunks = [F.cross_entropy(logit_chunk, target_chunk, ignore_index=-100, reduction="none")
                       for logit_chunk, target_chunk in zip(logit_chunks, target_chunks)]
        non_masked_elems = (targets != -100).sum()
        return torch.cat(loss_chunks).sum() / non_masked_elems.maximum(torch.ones_like(non_masked_elems))


def make_model(c: RefConfig, loop: str) -> Decoder:
    """The decoder in the loop's dtype, created under ``torch.set_default_dtype`` (``.to`` fails on fake tensors)."""
    if loop not in LOOPS:
        raise ValueError(f"loop must be one of {', '.join(LOOPS)}, got {loop!r}")
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.float32 if LOOP_OPTIMIZERS[loop][0] == "fp32" else torch.bfloat16)
    try:
        return Decoder(c)
    finally:
        torch.set_default_dtype(before)


class Trainer:
    """One model, its optimizer (:data:`memledger.pytorch.optimizers.LOOP_OPTIMIZERS`: AdamW, SGD, Adafactor) and
    (``bf16-adamw``, ``bf16-sgd``, ``bf16-sgd-momentum``) its FP32 masters; :meth:`step` runs one training step.

    ``foreach``/``fused``: the optimizer's implementation (neither: the for-loop); ``in_backward``: one optimizer
    per parameter, stepped in its post-accumulate-grad hook (torchtune's ``optimizer_in_bwd``; no masters).
    ``amp`` (None: as the loop says, :data:`~memledger.pytorch.optimizers.AMP_LOOPS`): the forward and the loss
    under ``torch.autocast(dtype=torch.float16)`` on FP32 weights (the "after forward" landmark after the
    region exits, its weight cache cleared), ``scaler.scale(loss).backward()``, ``scaler.step(opt)``,
    ``scaler.update()`` with ``torch.amp.GradScaler`` (PyTorch's AMP recipe, ``torch/amp/grad_scaler.py``)."""

    def __init__(self, model: Decoder, loop: str, foreach: bool = False, fused: bool = False,
                 in_backward: bool = False, amp: bool = None):
        self.model, self.loop = model, loop
        self.amp = loop in AMP_LOOPS if amp is None else amp
        if self.amp and (loop not in AMP_LOOPS or in_backward):
            raise ValueError(f"amp: FP16 autocast with a GradScaler runs loop {', '.join(AMP_LOOPS)} (FP32 weights), "
                             f"not {loop}{' with in_backward' if in_backward else ''}")
        self.scaler = Scaler("cpu") if self.amp else None
        self.extras = []            # tensors the loop keeps beside the model and optimizer: GradScaler's
        self.params = [p for p in model.parameters() if p.requires_grad]      # a frozen base (LoRA) has none
        self.masters = []
        _, masters, kind = LOOP_OPTIMIZERS[loop]
        if foreach and fused:
            raise ValueError("foreach and fused exclude each other")
        implementation = "fused" if fused else ("foreach" if foreach else "for-loop")
        if masters:
            if in_backward:
                raise ValueError(f"in_backward steps the model's own parameters: {loop} keeps FP32 masters")
            with torch.no_grad():
                self.masters = [p.detach().float() for p in self.params]
            for m in self.masters:
                m.requires_grad_(True)
        self.in_backward = in_backward
        if in_backward:
            self.opt = None
            self.per_param = {p: make_optimizer(kind, [p], implementation) for p in self.params}
            self.optimizers = list(self.per_param.values())
            self.hooks = in_backward_hooks(self.params, self.per_param)
        else:
            self.opt = make_optimizer(kind, self.masters or self.params, implementation)
            self.optimizers = [self.opt]

    def init_state(self):
        """Create the optimizer's state as a first step would (zero gradients, one ``opt.step()``); with ``amp``
        GradScaler's scale and growth tracker (``_lazy_init_scale_growth_tracker``, as its first ``scale()``)."""
        if self.amp:
            self.scaler._lazy_init_scale_growth_tracker(self.params[0].device)
            self.extras = [self.scaler._scale, self.scaler._growth_tracker]
        for opt in self.optimizers:
            for p in opt.param_groups[0]["params"]:
                p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)

    def step(self, ids, targets, landmark=lambda name: None, documents=None):
        """Forward, ``loss.backward()``, optimizer step, ``zero_grad(set_to_none=True)``;
        ``landmark(name)`` is called at each of :data:`LANDMARKS`; ``documents``: the rows' document ids
        (``RefConfig.packed``)."""
        landmark("before forward")
        with torch.autocast(ids.device.type, dtype=torch.float16) if self.amp else nullcontext():
            loss = self.model.loss(ids, targets, documents) if documents is not None else self.model.loss(ids, targets)
        landmark("after forward")
        (self.scaler.scale(loss) if self.amp else loss).backward()
        del loss
        landmark("after backward")
        if self.amp:                # unscale_, found_inf checked, opt.step(), the scale updated
            self.scaler.step(self.opt)
            self.scaler.update()
            self.opt.zero_grad(set_to_none=True)
        elif self.in_backward:
            pass                    # every parameter was stepped, and its gradient freed, in backward
        elif self.masters:
            for p, m in zip(self.params, self.masters):
                m.grad = p.grad.float()
                p.grad = None
            self.opt.step()
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)
            for m in self.masters:
                m.grad = None
        else:
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
        landmark("after step")
