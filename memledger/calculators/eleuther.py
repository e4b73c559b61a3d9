"""EleutherAI's "Transformer Math 101" (Anthony, Biderman, Schoelkopf 2023), as its calculator computes it.

The blog post's memory sections (blog.eleuther.ai/transformer-math, last
updated 2024-10-08) were read from a complete Chinese translation (stored file
id 51846161625), checked against two other transcriptions and an English
summary: they publish bytes per parameter (int8 1, fp16/bf16 2, fp32 4;
AdamW 12 = 4 + 4 + 4, 8-bit 6 = 4 + 1 + 1, SGD with momentum 8 = 4 + 4;
gradients 4 or 2), inference = 1.2 x the weights, Korthikanti's activation
rules and the ZeRO and 3D-parallel sums, no worked GB example. Those rules,
the inference factor and the post's two errata live in
:mod:`memledger.calculators.transformer_math`; tests/calculators/test_transformer_math.py
reproduces each from memledger.

The blog's formulas are implemented by the same authors in EleutherAI/cookbook
``calc/calc_transformer_mem.py`` (827ee3b2, 2026-03-15), which the cookbook's
``calc/README.md`` (line 96) points to as the blog's companion. Per GPU, with
N GPUs, tensor/pipeline degrees t, p and defaults as in its ``DEFAULTS``
(lines 217-252: mixed precision, 2-byte low / 4-byte high precision, 4-byte
gradients, AdamW, ZeRO stage 1):

    model     = 2P / (t p)            (/N under ZeRO-3)            lines 276-294 (erratum: /(t p) and /N)
    gradients = 4P                    (/N from ZeRO-2)             lines 300-309 (the blog: /p; memledger: /(t p))
    optimizer = 12P (AdamW: fp32 copy + m + v; SGD+momentum 8)     lines 314-333 (/N from ZeRO-1)
    activations, no checkpointing = S B d L (34 + 5 H S / d)        line 351 (Korthikanti Eq. 1)
    activations, "checkpoint-activations" = S B d L (16*2 + 2) = 34 S B d L        line 349
    communication buffers: 5e8 x 2 bytes (ZeRO >= 1, N > 1), +1e9 x 2 (ZeRO-3)  lines 339-343

So its default is 2 + 4 + 12 = 18 B/param; with 2-byte gradients (the blog's
fp16 option) 16. It counts its own parameters from the shape
(lines 267-272): 2Vd embeddings, d x S "positional" parameters, 8dL + 2d norm
parameters, 2(1 + kv)L d^2 attention, n_mlp L d^2 x expansion MLP. Prints GiB.
"""
import sympy as sp

from ..core.symbols import B, F, H, L, P, S, V, d, t
from .base import Convention, Erratum, G, Item, M
from .transformer_math import ERRATA as BLOG_ERRATA

__all__ = ["ERRATA", "OPTIMIZER_BYTES", "TRANSFORMER_MATH", "TRANSFORMER_MATH_16", "activation_bytes",
           "cookbook_params"]

N = G * M
OPTIMIZER_BYTES = {"adamw": 12, "sgd_momentum": 8, "muon": 8}


def cookbook_params(mlp_linears: int = 2) -> sp.Expr:
    """The calculator's own parameter count (lines 267-272), with kv ratio 1 (MHA) and F = expansion x d."""
    return 2 * V * d + d * S + 8 * d * L + 2 * d + 4 * L * d**2 + mlp_linears * L * d * F


def activation_bytes(recompute: str) -> sp.Expr:
    """Line 349/351: selective ("checkpoint-activations") 34SBdL, otherwise SBdL(34 + 5HS/d), 2-byte activations."""
    low = 2
    per = (16 * low + 2) if recompute != "none" else (16 * low + 2) + (2 * low + 1) * H * S / d
    return S * B * d * L * per


def _items(ledger, inputs, grad_bytes: int = 4, optimizer: str = "adamw") -> list:
    stage = ledger.zero_stage
    items = [
        Item("model (2 bytes/param)", "model_states", "gpu", 2 * P / t / (N if stage == 3 else 1), "param"),
        Item(f"gradients ({grad_bytes} bytes/param)", "model_states", "gpu",
             grad_bytes * P / (N if stage >= 2 else 1), "grad"),
        Item(f"optimizer ({optimizer}: {OPTIMIZER_BYTES[optimizer]} bytes/param)", "model_states", "gpu",
             OPTIMIZER_BYTES[optimizer] * P / (N if stage >= 1 else 1), "optimizer"),
    ]
    if stage >= 1 and ledger.dp * ledger.tp > 1:
        buffers = 5 * 10**8 * 2 + (10**9 * 2 if stage == 3 else 0)
        items.append(Item("ZeRO communication buffers", "overhead", "gpu", sp.Integer(buffers)))
    if ledger.arch is not None:
        items.append(Item("activations (Korthikanti Table 2)", "activations", "gpu",
                          activation_bytes(ledger.recompute)))
    return [Item(i.name, i.group, i.device, sp.ceiling(i.expr), i.role) for i in items]


def _printed(ledger, inputs, rows) -> str:
    total = sum(r.bytes for r in rows if r.device == "gpu")
    return f"Per-GPU Memory Required for Training: {total / 1024**3:.2f} GiB"


ERRATA = (
    Erratum("EleutherAI cookbook", "calc/calc_transformer_mem.py line 313 (comment)",
            "8-bit ADAM (2 + 2 + 2 = 6)", "4 + 1 + 1 = 6",
            "bitsandbytes keeps 1-byte m and v (plus block constants) and the fp32 copy is 4 bytes, as the blog "
            "itemizes it (sources.md): same total, different parts", "inconsistent"),
    Erratum("EleutherAI cookbook", "calc/calc_transformer_mem.py lines 348-349 (--checkpoint-activations)",
            "S B d L (16 x 2 + 2) = 34 S B d L with checkpointing", "2 S B d L (full recomputation)",
            "34 S B d L is Korthikanti's selective recomputation at t = 1 (10 + 24/t); full checkpointing keeps "
            "only each layer's 2-byte input, 2 S B d L", "inconsistent"),
    Erratum("EleutherAI cookbook", "calc/calc_transformer_mem.py line 268",
            "positional_params = hidden_size x sequence_length", "0 for rotary or ALiBi models",
            "the script adds d x S learned-position parameters to every model, e.g. 4096 x 4096 = 16,777,216 for "
            "its own LLaMA-7B example (line 438), which has rotary embeddings", "inconsistent"),
    Erratum("EleutherAI cookbook", "calc/calc_transformer_mem.py lines 286-294 (ZeRO-3 model memory)",
            "per_gpu_model_mem = P x 2 / (tensor_parallel_size x pipeline_parallel_size), then /= num_gpus",
            "P x 2 / num_gpus: num_gpus = dp x tp x pp (its line 264), and the blog's ZeRO-3 rule is "
            "Model Memory / No. GPUs",
            "the weights are split by tp x pp and then again by every GPU, tp x pp included: 7x10^9 parameters, "
            "2 bytes, 64 GPUs with tp = 8: 14x10^9 / 8 / 64 = 27,343,750 bytes, where each GPU holds "
            "14x10^9 / 64 = 218,750,000", "inconsistent"),
)

TRANSFORMER_MATH = Convention(
    "eleuther", "EleutherAI Transformer Math 101 (cookbook calc_transformer_mem.py defaults)",
    "EleutherAI/cookbook calc/calc_transformer_mem.py lines 264-389 (827ee3b2); blog.eleuther.ai/transformer-math "
    "(2024-10-08), memory sections read from a Chinese translation (stored file id 51846161625): bytes per "
    "parameter, the 1.2 x inference factor, Korthikanti's activation rules, ZeRO and 3D-parallel sums "
    "(memledger.calculators.transformer_math)",
    _items, reads=("zero_stage", "dp", "tp", "recompute", "batch_size", "seq_len"), printed=_printed,
    errata=ERRATA + BLOG_ERRATA,
    differs="fp32 gradients by default (2 + 4 + 12 = 18 B/param); ZeRO divides by all GPUs with no rounding; "
            "1 GB of ZeRO bucket buffers; activations from Korthikanti Eq. 1 for a GPT block whatever the MLP; "
            "'checkpointing' books 34 SBdL, not 2 SBdL; tensor parallelism splits the weights but not the "
            "gradients, and under ZeRO-3 the weights twice")
TRANSFORMER_MATH_16 = Convention(
    "eleuther-fp16-grads", "Transformer Math 101 with 2-byte gradients (16 B/param)",
    "EleutherAI/cookbook calc/calc_transformer_mem.py --bytes-per-grad-ele 2; blog 'Gradients' section",
    lambda ledger, inputs: _items(ledger, inputs, grad_bytes=2), reads=TRANSFORMER_MATH.reads, printed=_printed,
    differs="2 + 2 + 12 = 16 B/param, memledger's recipe; otherwise as 'eleuther'")
