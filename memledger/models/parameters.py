"""Parameter counts, derived part by part from the tensors a transformer holds.

Each part is a sum of weight and bias shapes, in the symbols of
:mod:`memledger.core.symbols`; the whole count is their sum, never a typed total.
What decides which tensors exist is a :class:`Features` record (discrete
choices, read from a ``config.json`` by :mod:`memledger.models.hf_config`):

* attention: Q and O of width ``q`` = d (or H*d_h where the config gives a
  head size, as Gemma-7B does), K and V of width ``kv`` = q*H_kv/H
  (grouped-query; H_kv = 1 is multi-query, Shazeer 2019; Ainslie et al. 2023);
  biases on all four (GPT-2, BERT) or on Q, K, V only (Qwen2);
* MLP: GeLU, two d x F matrices with biases (GPT-2, BERT), or gated
  (SwiGLU/GeGLU), three bias-free d x F matrices (LLaMA, Mistral, Gemma);
  mixture of experts: E gated MLPs and a bias-free d x E router (Mixtral);
* norms: LayerNorm (weight and bias, 2d) or RMSNorm (weight, d);
* embeddings: tokens Vd, an untied output layer another Vd, learned positions
  and token types (GPT-2, BERT); BERT's pooler d^2 + d and its embedding
  LayerNorm in place of a final one.

Model families (``transformers`` modeling code): GPT-NeoX and GPT-BigCode are GPT blocks (biased LayerNorm
blocks, GeLU MLP) with an untied ``embed_out`` (GPT-NeoX) or multi-query K/V (GPT-BigCode); Phi has one
LayerNorm per block (``PhiDecoderLayer.input_layernorm``) and a biased ``lm_head``; BLOOM adds
``word_embeddings_layernorm`` to the final norm; T5 is L encoder blocks (self-attention, MLP, two RMSNorms)
and L_dec decoder blocks (self-attention, cross-attention, MLP, three RMSNorms), bias-free, a ReLU MLP of two
d x F matrices (T5 1.0) or a gated-GeLU one of three (T5 1.1), a final RMSNorm per stack, an N_rb x H
relative-position bias in each stack's first block, one shared V x d embedding (``T5Model.shared``) and an
LM head tied to it unless ``tie_word_embeddings`` is false.

At the defaults (``Features("gpt")``, ``Features("llama")``) this is
12d^2 + 13d per GPT block at F = 4d and L(4d^2 + 3dF + 2d) + 2Vd + d for
LLaMA (Touvron et al. 2023), as before. Megatron-LM's
``compute_weight_and_optimizer_memory`` (``megatron/training/theoretical_memory_usage.py``)
gives the same grouped-query and MoE attention/MLP terms but omits the router.
"""
import sympy as sp

from .features import STYLES, Features, swiglu_width  # noqa: F401  (re-exported)
from ..core.symbols import E, F, H, H_kv, L, L_dec, N_pos, N_rb, N_tt, V, d, d_h, k

__all__ = ["active_param_count_expr", "block_params_expr", "block_parts", "norm_params", "param_count_expr", "param_parts",
           "widths"]

def widths(features) -> tuple:
    """(q, kv): the widths of the Q (and O) and of the K and V projections."""
    f = Features.of(features)
    q = H * d_h if f.head_dim else d
    kv = (H_kv * d_h if f.head_dim else H_kv * d / H) if f.gqa else q
    return q, kv


def norm_params(features) -> sp.Expr:
    """One norm: LayerNorm weight + bias 2d, RMSNorm weight d."""
    return 2 * d if Features.of(features).gpt else d


def block_parts(features="gpt", experts=E) -> dict:
    """Parameters of one block by part.

    gpt:   attention 4d^2 + 4d (Q, K, V, O with biases), MLP 2dF + F + d, two LayerNorms 4d.
    llama: attention 4d^2, gated MLP 3dF (gate, up, down), two RMSNorms 2d.
    GQA: K and V are d x kv; MoE: ``experts`` gated MLPs (E; k for the active
    count), plus a router d x E under the name "router".
    """
    f = Features.of(features)
    q, kv = widths(f)
    attention = 2 * d * q + 2 * d * kv
    if f.has_qkv_bias:
        attention += q + 2 * kv
    if f.gpt:
        attention += d                                  # output-projection bias
    mlp = (3 if f.is_gated else 2) * d * F + (F + d if f.gpt else 0)
    parts = {"attention": attention, "MLP": experts * mlp if f.moe else mlp,
             "norms": (1 if f.shared_norm else 2) * norm_params(f)}
    if f.moe:
        parts["router"] = d * E
    return parts


def block_params_expr(features="gpt") -> sp.Expr:
    """Parameters of one transformer block: 12d^2 + 13d for gpt at F = 4d."""
    return sum(block_parts(features).values())


def param_parts(features="gpt", experts=E) -> dict:
    """Whole-model parameters by part: L blocks, the final norm, the embeddings (and BERT's pooler).

    gpt:   tied embedding Vd (+ learned positions), final LayerNorm 2d.
    llama: untied input and output embeddings 2Vd, final RMSNorm d.
    Learned positions are n_positions*d, token types n_token_types*d (symbols).
    """
    f = Features.of(features)
    positions = N_pos if f.positions else 0
    block = block_parts(f, experts)
    parts = {name: L * expr for name, expr in block.items()}
    parts["norms"] += norm_params(f)                  # final norm, or BERT's embedding LayerNorm
    if f.input_norm:                                  # BLOOM: word_embeddings_layernorm as well
        parts["norms"] += norm_params(f)
    if f.encoder_decoder:                             # T5: decoder blocks add cross-attention and its norm
        parts["attention"] += L_dec * 2 * block["attention"]
        parts["MLP"] += L_dec * block["MLP"]
        parts["norms"] += L_dec * 3 * norm_params(f) + norm_params(f)
    parts["embeddings"] = V * d * (1 if f.is_tied else 2) + positions * d + (N_tt * d if f.token_types else 0)
    if f.head_bias:
        parts["embeddings"] += V                      # Phi: lm_head.bias
    if f.relative_bias:
        parts["relative position bias"] = N_rb * H * (2 if f.encoder_decoder else 1)
    if f.pooler:
        parts["pooler"] = d**2 + d
    return parts


def param_count_expr(features="gpt") -> sp.Expr:
    """Whole-model parameter count.

    gpt:   L(4d^2 + 2dF + F + 9d) + Vd + n_positions*d + 2d = 12Ld^2 + 13Ld + Vd + ... at F = 4d.
    llama: L(4d^2 + 3dF + 2d) + 2Vd + d (Touvron et al. 2023).
    """
    return sum(param_parts(features).values())


def active_param_count_expr(features) -> sp.Expr:
    """Parameters one token passes through: k of the E experts (the router stays whole)."""
    return sum(param_parts(features, experts=k).values())
