"""Saved activations of one transformer block: the itemized inventory and its sum.

Autograd keeps, from forward until the matching backward, every tensor a
backward formula needs. Listing them (name, why, shape, dtype) and summing
their sizes *derives* Korthikanti et al. (2022), Eq. 1, for a GPT block at
F = 4d with 16-bit activations and 1-byte dropout masks:

    bytes per layer = B*S*d*(34 + 5*H*S/d)

Two itemizations are kept: :data:`ARTICLE_INVENTORY` (the article's table, its
labels) and :func:`inventory` (Korthikanti Sec. 4.1: what autograd really
keeps). Same total, different rows; :data:`ARTICLE_INVENTORY` says, row by
row, which tensor it stands for. Variants: no dropout, FlashAttention
(no S^2 tensors), SwiGLU MLP (LLaMA), tensor/sequence parallelism and
selective or full recomputation (Korthikanti Table 2).
"""
from dataclasses import dataclass
from math import prod

import sympy as sp

from ..core.choices import RECOMPUTE, check_choice
from ..core.dtypes import nbytes
from ..models.parameters import Features, widths
from ..core.symbols import B, E, F, H, L, S, d, k, t

__all__ = ["ARTICLE_INVENTORY", "ATTENTION", "BHSS", "BSF", "RELABELLED", "BSd", "Saved", "activation_bytes",
           "closed_form", "core_row", "inventory", "kept_rows", "moe_rows", "norm_rows", "per_layer_bytes",
           "quadratic_share"]

@dataclass(frozen=True)
class Saved:
    """One tensor saved for backward.

    ``tp_sharded``: split across tensor-parallel ranks under any tensor parallelism (Megatron-LM's
    column/row-parallel layers; outside the blocks, the vocabulary-parallel logits);
    ``replicated``: never split (every tensor-parallel rank reads the whole batch: token ids, the causal
    mask, the loss scalars); any other row is split under sequence parallelism only (:meth:`rank_bytes`);
    ``dropout``: exists only because the block trains with dropout;
    ``weight_grad_of``: the projections whose weight gradient is the only reason
    it is kept (a frozen projection needs no saved input: see :mod:`memledger.ledger.lora`).
    """
    name: str
    why: str
    shape: tuple
    dtype: str = "bf16"
    block: str = "attention"
    tp_sharded: bool = False
    replicated: bool = False
    dropout: bool = False
    same_as: str = ""       # article rows: the autograd tensor this row stands for
    weight_grad_of: tuple = ()

    @property
    def bytes(self) -> sp.Expr:
        """Elements x bytes per element, e.g. B*S*d*2."""
        return prod(self.shape) * nbytes(self.dtype)

    def rank_bytes(self, tp: bool = False, sequence_parallel: bool = False) -> sp.Expr:
        """Bytes on one tensor-parallel rank: bytes/t if ``tp`` and the row is ``tp_sharded``, or under
        ``sequence_parallel`` unless ``replicated``; else all of it (Korthikanti et al. 2022, Table 2, Sec. 4.3)."""
        split = tp and not self.replicated and (self.tp_sharded or sequence_parallel)
        return self.bytes / t if split else self.bytes

    @property
    def quadratic(self) -> bool:
        """True for the attention-score-sized tensors (B x H x S x S)."""
        return sp.degree(prod(self.shape), S) == 2


BSd, BSF, BHSS = (B, S, d), (B, S, F), (B, H, S, S)


def norm_rows(norm, position, dtype="bf16", norm_stats=None, rmsnorm="fused", prefix=None, block=None):
    """What a norm keeps: its input, and optionally its per-token statistics.

    LayerNorm (ATen ``native_layer_norm``) keeps input, mean and rstd; RMSNorm
    (``_fused_rms_norm``) keeps input and an FP32 rstd. ``norm_stats``: None
    (not booked, as the article and Korthikanti), or the statistics' dtype
    (LayerNorm: the activation dtype on CPU, FP32 on CUDA). ``rmsnorm=
    "composite"`` (``nn.RMSNorm`` where no fused kernel runs, e.g. on CPU):
    an FP32 copy of the input (the input itself when it is FP32), the FP32
    rstd and the FP32 product x*rstd.
    """
    block = block or ("attention" if position == 1 else "mlp")
    prefix = prefix or f"{norm} {position}"
    tokens = (B, S)
    if norm == "RMSNorm" and rmsnorm == "hf":        # transformers' LlamaRMSNorm (memledger.step.hf)
        return [Saved(f"{prefix} input", "LlamaRMSNorm: hidden_states.to(torch.float32), saved by pow and the "
                      "product with rstd", BSd, "fp32", block=block),
                Saved(f"{prefix} rstd", "LlamaRMSNorm: torch.rsqrt(variance + eps), FP32, per token", tokens, "fp32",
                      block=block),
                Saved(f"{prefix} normalized", "LlamaRMSNorm: the normalized input cast back to BF16, saved by the "
                      "weight's product", BSd, dtype, block=block)]
    if norm == "RMSNorm" and rmsnorm in ("composite", "litgpt"):
        weight = [Saved(f"{prefix} weight (FP32 copy)", "LitGPT's RMSNorm: weight.float(), saved by the product with "
                        "x_normed", (d,), "fp32", block=block)] if rmsnorm == "litgpt" else []
        return weight + [Saved(f"{prefix} input", "composite RMSNorm: an FP32 copy of its input (pow, mul need it)",
                      BSd, "fp32", block=block),
                Saved(f"{prefix} rstd", "composite RMSNorm: 1/sqrt(mean(x^2) + eps), FP32, per token",
                      tokens, "fp32", block=block),
                Saved(f"{prefix} x*rstd", "composite RMSNorm: the FP32 normalized input, for the weight "
                      "gradient", BSd, "fp32", block=block)]
    rows = [Saved(f"{prefix} input", f"{norm} backward needs its input" +
                  ("" if norm_stats else " (its statistics are ignored here)"), BSd, dtype, block=block)]
    if norm_stats and norm == "LayerNorm":
        rows += [Saved(f"{prefix} {stat}", f"LayerNorm backward reuses the per-token {stat}", tokens,
                       norm_stats, block=block) for stat in ("mean", "rstd")]
    elif norm_stats:
        rows.append(Saved(f"{prefix} rstd", "RMSNorm backward reuses the per-token rstd (FP32)", tokens,
                          "fp32", block=block))
    return rows


ATTENTION = ("eager", "flash", "math")


def inventory(mlp: str = "gelu", norm: str = "LayerNorm", dropout: bool = True,
              flash_attention: bool = False, *, gqa: bool = False, head_dim: bool = False,
              repeat_kv: bool = False, moe: bool = False, capacity_factor=None, dtype: str = "bf16",
              mask_dtype: str = "bool", norm_stats: str = None, rmsnorm: str = "fused",
              attention: str = None, parallel: bool = False, shared_norm: bool = False,
              attention_dropout: bool = True) -> list:
    """What autograd keeps in one block (Korthikanti et al. 2022, Sec. 4.1).

    gelu + dropout gives 11BSd + 5BHS^2 (attention), 19BSd at F = 4d (MLP) and
    4BSd (two norms): B*S*d*(34 + 5*H*S/d). ``mlp="swiglu"`` is LLaMA's gated MLP;
    ``flash_attention`` keeps only fp32 log-sum-exp statistics instead of the
    S x S tensors (Dao et al. 2022).

    Real checkpoints (keyword options; the defaults give the rows above):
    ``gqa``: K and V are kept at the key/value width H_kv*d/H (grouped-query
    attention with a kernel that reads K/V per group, as FlashAttention-2 and
    PyTorch's SDPA with ``enable_gqa`` do); ``repeat_kv`` keeps the K that
    an eager implementation expands to all H heads before QK^T (Hugging Face's
    ``repeat_kv``; V likewise). ``head_dim``: Q and the output-projection input
    are H*d_h wide (Gemma-7B). ``moe``: :func:`moe_rows` replace the MLP rows
    after its input (needs ``mlp="swiglu"``). Encoder-only attention (BERT,
    no causal mask) saves the same tensors: the causal mask and BERT's
    padding mask are added to the scores without a gradient, so backward
    keeps neither per layer; BERT's post-LN blocks keep two LayerNorm inputs
    as pre-LN blocks do. Its extra rows (embedding LayerNorm, pooler) lie
    outside the blocks (:mod:`memledger.answers.pipeline`).

    Backend conventions (keyword options; the defaults are the article's, see
    :mod:`memledger.activations.backends`): ``dtype`` of the activations (``"fp32"`` for
    an FP32 model); ``mask_dtype`` of dropout masks (``"bool"``: the fused
    CUDA kernel, ``native_dropout``; CPU ``F.dropout`` keeps the activation
    dtype); ``norm_stats`` and ``rmsnorm`` (:func:`norm_rows`); ``attention``:
    ``"eager"``, ``"flash"`` (= ``flash_attention=True``) or ``"math"``
    (PyTorch's math SDPA on CPU: a 16-bit q, k, v upcast to FP32, the S x S
    tensors in FP32). Measured against PyTorch 2.13 in ``tests/pytorch/test_reference.py``.

    Model families (:mod:`memledger.models.features`; measured in ``tests/activations/test_family_inventory.py``):
    ``parallel`` (GPT-NeoX's ``use_parallel_residual``, x + attn(n1(x)) + mlp(n2(x))): the second norm reads
    the block input the first one keeps, so its input row goes (its statistics stay); ``shared_norm`` (Phi,
    with ``parallel``): one norm, whose output feeds Q/K/V and the MLP, so the second norm's rows and the MLP
    input row go. ALiBi (BLOOM) adds a bias to the scores that no backward reads (an add keeps nothing):
    no row. Multi-query attention (GPT-BigCode) is ``gqa`` at one key/value head. Rotary embeddings (full or
    partial) keep their cos/sin tables once per forward, outside the blocks, not here (as LLaMA's).
    ``attention_dropout=False`` (with ``dropout``): the probabilities' dropout runs at p = 0, which ATen returns as
    its input (``_dropout_impl``, ``aten/src/ATen/native/Dropout.cpp``): no attention dropout rows, the residual
    dropouts' masks stay (Phi-2: attention_dropout 0.0, resid_pdrop 0.1).
    """
    check_choice("mlp", mlp, ("gelu", "swiglu"))
    if moe and mlp != "swiglu":
        raise ValueError("moe needs the gated MLP: mlp='swiglu'")
    attention = attention or ("flash" if flash_attention else "eager")
    check_choice("attention", attention, ATTENTION)
    check_choice("rmsnorm", rmsnorm, ("fused", "composite", "hf", "litgpt"))
    if shared_norm and not parallel:
        raise ValueError("shared_norm (one norm per block) needs parallel=True")
    q, kv = widths(Features(gqa=gqa, head_dim=head_dim))
    kv_saved = q if repeat_kv else kv
    a, f = dtype, ("fp32" if attention == "math" else dtype)
    up = "math SDPA: upcast to FP32 (and q scaled), " if attention == "math" else ""
    rows = norm_rows(norm, 1, a, norm_stats, rmsnorm) + [
        Saved("Q/K/V projection input", "the Q, K, V weight gradients need their shared input" +
              (" (and the MLP's: one norm feeds both)" if shared_norm else ""), BSd, a,
              weight_grad_of=("q_proj", "k_proj", "v_proj") + (
                  (("up_proj",) if mlp == "gelu" else ("gate_proj", "up_proj")) if shared_norm else ())),
        Saved("Q", up + "backward of QK^T needs K, and vice versa", (B, S, q), f, tp_sharded=True),
        Saved("K", up + "backward of QK^T needs Q, and vice versa", (B, S, kv_saved), f, tp_sharded=True),
    ]
    if attention == "flash":
        rows.append(Saved("softmax log-sum-exp", "FlashAttention recomputes the S x S scores from Q, K and these",
                          (B, H, S), "fp32", tp_sharded=True))
    else:
        rows.append(Saved("softmax output", "softmax backward needs its output", BHSS, f, tp_sharded=True))
        if dropout and attention_dropout:
            rows += [
                Saved("attention dropout mask", "dropout backward needs the mask", BHSS,
                      "fp32" if attention == "math" else mask_dtype, tp_sharded=True, dropout=True),
                Saved("attention dropout output", "backward of (probabilities x V) needs the probabilities",
                      BHSS, f, tp_sharded=True, dropout=True),
            ]
    rows += [
        Saved("V", up + "backward of (probabilities x V) needs V", (B, S, kv_saved), f, tp_sharded=True),
        Saved("output projection input", "the output projection's weight gradient needs its input",
              (B, S, q), a, tp_sharded=True, weight_grad_of=("o_proj",)),
    ]
    if dropout:
        rows.append(Saved("attention residual dropout mask", "dropout backward needs the mask", BSd, mask_dtype,
                          dropout=True))
    if not shared_norm:
        second = norm_rows(norm, 2, a, norm_stats, rmsnorm)
        copies = norm == "RMSNorm" and rmsnorm in ("composite", "hf", "litgpt") and a != "fp32"   # an FP32 input copy
        if parallel and not copies:     # the second norm reads the block input, which the first one keeps
            second = [r for r in second if not r.name.endswith(" input")]
        rows += second + [
            Saved("MLP input", "the up-projection weight gradient needs its input", BSd, a, block="mlp",
                  weight_grad_of=("up_proj",) if mlp == "gelu" else ("gate_proj", "up_proj"))]
    if moe:
        rows += moe_rows(capacity_factor)
    elif mlp == "gelu":
        rows += [
            Saved("GeLU input", "GeLU backward needs its input", BSF, a, block="mlp", tp_sharded=True),
            Saved("down-projection input", "the down-projection weight gradient needs its input (GeLU output)",
                  BSF, a, block="mlp", tp_sharded=True, weight_grad_of=("down_proj",)),
        ]
    else:
        rows += [
            Saved("gate output", "SiLU backward needs its input", BSF, a, block="mlp", tp_sharded=True),
            Saved("SiLU output", "backward of SiLU(gate) x up needs both factors", BSF, a, block="mlp",
                  tp_sharded=True),
            Saved("up-projection output", "backward of SiLU(gate) x up needs both factors", BSF, a, block="mlp",
                  tp_sharded=True),
            Saved("down-projection input", "the down-projection weight gradient needs its input",
                  BSF, a, block="mlp", tp_sharded=True, weight_grad_of=("down_proj",)),
        ]
    if dropout:
        rows.append(Saved("MLP residual dropout mask", "dropout backward needs the mask", BSd, mask_dtype,
                          block="mlp", dropout=True))
    return rows


def moe_rows(capacity_factor=None) -> list:
    """The MLP rows of a top-k mixture-of-experts layer (Mixtral; Hugging Face's
    ``MixtralSparseMoeBlock``), after the shared "MLP input" row.

    Capacity assumption: dropless routing (``capacity_factor=None``, as in
    Hugging Face and MegaBlocks) sends each token to exactly k experts, so the
    experts see k*B*S token rows in all, however unevenly they are loaded.
    With a capacity factor c (GShard, Switch, Megatron-LM's
    ``--moe-expert-capacity-factor`` with padding) each of the E expert buffers
    holds c*k*B*S/E rows, c*k*B*S in all. Router probabilities are kept in fp32
    (``softmax(..., dtype=torch.float)``).
    """
    tokens = k * B * S
    if capacity_factor is not None:
        try:
            c = sp.Rational(str(capacity_factor))
        except (TypeError, ValueError, sp.SympifyError):
            c = None
        if c is None or not c > 0 or isinstance(capacity_factor, bool):
            raise ValueError(f"capacity_factor must be a positive number, got {capacity_factor!r}")
        tokens = c * tokens
    routed_d, routed_F = (tokens, d), (tokens, F)
    return [
        Saved("router probabilities", "softmax backward needs its output (fp32)", (B, S, E), "fp32", block="mlp"),
        Saved("top-k expert indices", "top-k backward scatters into the chosen experts", (B, S, k), "int64",
              block="mlp"),
        Saved("routed expert inputs", "each expert's up/gate weight gradients need the tokens it received",
              routed_d, block="mlp"),
        Saved("expert gate outputs", "SiLU backward needs its input", routed_F, block="mlp", tp_sharded=True),
        Saved("expert SiLU outputs", "backward of SiLU(gate) x up needs both factors", routed_F, block="mlp",
              tp_sharded=True),
        Saved("expert up outputs", "backward of SiLU(gate) x up needs both factors", routed_F, block="mlp",
              tp_sharded=True),
        Saved("expert down-projection inputs", "the down-projection weight gradient needs its input", routed_F,
              block="mlp", tp_sharded=True),
        Saved("expert outputs", "the routing weight's gradient needs the expert's output", routed_d, block="mlp"),
        Saved("routing weights", "the expert output's gradient needs its routing weight", (tokens,), block="mlp"),
    ]


_ART = "as the article lists it"
#: The article's per-layer table, its labels, with F written as 4d as there.
ARTICLE_INVENTORY = [
    Saved("LayerNorm input", _ART, BSd, same_as="LayerNorm 1 input"),
    Saved("Q projection output", _ART, BSd, same_as="Q"),
    Saved("K projection output", _ART, BSd, same_as="K"),
    Saved("V projection output", _ART, BSd, same_as="V"),
    Saved("attention scores QK^T/sqrt(d_h)", _ART, BHSS, same_as="attention dropout output"),
    Saved("softmax output", _ART, BHSS, same_as="softmax output"),
    Saved("attention dropout mask", _ART, BHSS, "bool", same_as="attention dropout mask"),
    Saved("attention output softmax x V", _ART, BSd, same_as="output projection input"),
    Saved("output projection output", _ART, BSd, same_as="Q/K/V projection input"),
    Saved("residual dropout mask", _ART, BSd, "bool", same_as="attention residual dropout mask"),
    Saved("LayerNorm input", _ART, BSd, block="mlp", same_as="LayerNorm 2 input"),
    Saved("up projection output", _ART, (B, S, 4 * d), block="mlp", same_as="GeLU input"),
    Saved("GeLU output", _ART, (B, S, 4 * d), block="mlp", same_as="down-projection input"),
    Saved("down projection output", _ART, BSd, block="mlp", same_as="MLP input"),
    Saved("residual dropout mask", _ART, BSd, "bool", block="mlp", same_as="MLP residual dropout mask"),
]

#: Article rows whose label names a tensor autograd does not keep; the tensor
#: of the same size that it does keep is in ``same_as``.
RELABELLED = {
    "attention scores QK^T/sqrt(d_h)": "softmax backward needs only its output, so the pre-softmax scores "
                                       "are freed; the dropout output (the operand of probabilities x V) is kept",
    "output projection output": "no backward formula reads it (the next op is dropout, which keeps a mask); "
                                "the LayerNorm output feeding Q/K/V is kept instead",
    "down projection output": "no backward formula reads it; the LayerNorm output feeding the MLP is kept instead",
}


def closed_form() -> sp.Expr:
    """Korthikanti et al. (2022), Eq. 1: B*S*d*(34 + 5*H*S/d) bytes per layer."""
    return B * S * d * (34 + 5 * H * S / d)


def core_row(row: Saved) -> bool:
    """Whether ``row`` is saved by the attention core itself, ``softmax(QK^T/sqrt(d_h)) V``: the S x S
    tensors (softmax output, dropout mask and output) or a flash kernel's log-sum-exp. Selective
    recomputation drops exactly these (Korthikanti Sec. 5: the core is recomputed in backward; with a flash
    kernel the checkpointed call recomputes its statistics too, measured in ``tests/pytorch/test_reference.py``)."""
    return row.quadratic or row.name == "softmax log-sum-exp"


def kept_rows(rows, recompute: str = "none") -> list:
    """The rows of ``rows`` a layer keeps under ``recompute`` "none" (all) or "selective" (all but
    :func:`core_row`); "full" keeps only the layer input, a row of its own (:func:`per_layer_bytes`)."""
    check_choice("recompute", recompute, ("none", "selective"))
    return [r for r in rows if not core_row(r)] if recompute == "selective" else list(rows)


def per_layer_bytes(rows, recompute: str = "none", tp: bool = False, sequence_parallel: bool = False,
                    dtype: str = "bf16") -> sp.Expr:
    """Saved bytes of one layer, summed (and expanded) from ``rows``.

    selective: drop the attention core's tensors, the S x S ones (Korthikanti Sec. 5) and a flash
    kernel's log-sum-exp (:func:`kept_rows`); full: keep only the layer input, BSd in the activation
    ``dtype`` (2BSd in 16 bits). With ``tp`` the tensor-parallel rows are divided by t, and with
    ``sequence_parallel`` all rows are (Korthikanti Table 2).
    """
    check_choice("recompute", recompute, RECOMPUTE)
    if sequence_parallel and not tp:
        raise ValueError("sequence parallelism needs tensor parallelism (tp > 1)")
    if recompute == "full":
        kept = [Saved("layer input", "the checkpoint: backward re-runs the layer's forward from it", BSd, dtype,
                      tp_sharded=False)]
    else:
        kept = kept_rows(rows, recompute)
    return sp.expand(sum(r.rank_bytes(tp, sequence_parallel) for r in kept))


def activation_bytes(rows, recompute: str = "none", tp: bool = False, sequence_parallel: bool = False,
                     dtype: str = "bf16") -> sp.Expr:
    """All L layers: L x :func:`per_layer_bytes` (full checkpointing: L*B*S*d*2 in 16 bits)."""
    return L * per_layer_bytes(rows, recompute, tp, sequence_parallel, dtype)


def quadratic_share(rows) -> sp.Expr:
    """Fraction of a layer's saved bytes held by the S x S tensors: 5HS/(34d + 5HS) for Eq. 1."""
    quad = sum(r.bytes for r in rows if r.quadratic)
    return sp.factor(quad / sum(r.bytes for r in rows))
