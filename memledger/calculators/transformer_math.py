"""EleutherAI's "Transformer Math 101" blog post: its memory rules, its inference factor, its errata.

Anthony, Biderman, Schoelkopf, blog.eleuther.ai/transformer-math (published
2023-04-18, last updated 2024-10-08). No stored copy of the English page
reaches its memory sections; they were read from transcriptions, by stored
file id (the project's ``read_file`` tool):

* 51846161625: a complete Chinese translation (原文链接 blog.eleuther.ai/transformer-math,
  原文最后更新 2024-10-08, 访问日期 2026-04-26), every memory section: the text relied on;
* 53766551515: a Chinese adaptation of the training sections;
* 59193786935: Chinese reading notes that restate every formula;
* 44351774649: an English summary of the memory bullets (bytes per parameter, the 1.2 factor).

The post publishes rules and bytes per parameter, no worked GB example:

* "Inference / Model Weights": int8 1, fp16 and bf16 2, fp32 4 bytes/param;
  "Total Inference Memory" = 1.2 x Model Memory (:data:`INFERENCE_FACTOR`).
* "Training / Model Parameters": pure fp32 4, pure fp16 2; mixed precision 2
  plus a 4-byte fp32 copy "accounted for in the optimizer states".
  "Optimizer States": AdamW 12 = 4 + 4 + 4 (fp32 copy, momentum, variance),
  8-bit (bitsandbytes) 6 = 4 + 1 + 1, SGD with momentum 8 = 4 + 4.
  "Gradients": fp32 4, fp16 2.
* "Activations and Batch Size" (Korthikanti et al. 2022; fp16 activations, no
  sequence parallelism): :func:`activation_rule`.
* "Total Training Memory" and "Sharded Optimizers" (ZeRO-1/2/3) and "3D
  Parallelism": :data:`RULES`, in the post's own terms Model, Optimizer,
  Activation and Gradient Memory, N GPUs, pipeline size p and tensor size t.

Where the transcriptions disagree nothing is built on the passage: the
ZeRO-R + ZeRO-1 example's activation term (undivided in 51846161625 and
53766551515, over No. GPUs in 59193786935) and the last 3D formula's first
denominator (pp x tp in 51846161625 and 59193786935, pp + tp in 53766551515).
:data:`ERRATA` are the post's own rules contradicting what they describe.
"""
from fractions import Fraction

import sympy as sp

from ..core.symbols import B, H, L, S, d, t
from .base import Erratum, p_pp

__all__ = ["BLOG", "ERRATA", "INFERENCE_FACTOR", "N", "RULES", "Activation", "Gradient", "Live", "Model", "Optimizer",
           "activation_rule", "inference_bytes"]

#: "Total Memory_Inference ≈ 1.2 x Model Memory" ("Inference / Total Inference Memory").
INFERENCE_FACTOR = Fraction(6, 5)

#: The post's terms: the whole model's bytes of each kind, on N GPUs.
Model, Optimizer, Activation, Gradient, Live = sp.symbols("Model Optimizer Activation Gradient Live", positive=True)
N = sp.Symbol("N", positive=True, integer=True)

#: Each rule as the post writes it, by section.
RULES = {
    "total": Model + Optimizer + Activation + Gradient,                          # "Total Training Memory"
    "zero1": Model + Optimizer / N + Activation + Gradient,                      # "Sharded Optimizers"
    "zero2": Model + Activation + (Optimizer + Gradient) / N,
    "zero3": Activation + (Model + Optimizer + Gradient) / N + Live,             # + "(ZeRO-3 Live Params)"
    "model_3d": Model / (p_pp * t),                                              # "3D Parallelism"
    "gradients_3d": Gradient / p_pp,
    "dp_degree": N / (p_pp * t),                                                 # "Sharded Optimizers + 3D"
    "zero1_3d": Model / (p_pp * t) + Optimizer / N + Activation / t + Gradient / p_pp,
}


def activation_rule(recompute: str = "none") -> sp.Expr:
    """"Activations and Batch Size": sbhL(10 + 24/t + 5as/(ht)) bytes, selective sbhL(10 + 24/t),
    full 2sbhL; in memledger's symbols s = S, b = B, h = d, a = H."""
    rules = {"none": S * B * d * L * (10 + 24 / t + 5 * H * S / (d * t)),
             "selective": S * B * d * L * (10 + 24 / t), "full": 2 * S * B * d * L}
    try:
        return rules[recompute]
    except KeyError:
        raise ValueError(f"recompute must be one of {', '.join(rules)}, got {recompute!r}") from None


def inference_bytes(inference) -> int:
    """The post's rule of thumb for a :class:`memledger.ledger.inference.Inference`: 1.2 x its weights, rounded up."""
    weights = inference.weights
    return -(-weights * INFERENCE_FACTOR.numerator // INFERENCE_FACTOR.denominator)


BLOG = "Transformer Math 101 (blog)"

ERRATA = (
    Erratum(BLOG, "'3D Parallelism' (memory_gradients w/ parallelism) and the 'Sharded Optimizers + 3D "
                  "Parallelism' total",
            "Gradient Memory / Pipe-Parallel-Size",
            "Gradient Memory / (Pipe-Parallel-Size x Tensor-Parallel-Size), as the post divides the weights",
            "a tensor-parallel rank computes the gradients of its own weight shard only (Megatron-LM), so the "
            "gradients split like the weights: 7x10^9 parameters, 2-byte gradients, tp = 8, pp = 1: 14.00 GB per "
            "GPU by the post's rule, 14.00 / 8 = 1.75 GB held (memledger's ledger). The companion calculator "
            "(calc_transformer_mem.py lines 300-309) divides gradients by neither", "inconsistent"),
    Erratum(BLOG, "'Sharded Optimizers' (the ZeRO-R paragraph)",
            "ZeRO can also partition activations over data parallel ranks via ZeRO-R",
            "over the model-parallel ranks: activations / tp (ZeRO paper Sec. 6.1 and 8; the post's own 3D "
            "total divides Activation Memory by Tensor-Parallel-Size)",
            "P_a partitions activation checkpoints 'across all the model parallel process' and 'reduces the "
            "activation memory consumption by the MP degree'; the companion calculator (line 358) divides by "
            "tensor_parallel_size too. The article's 7B, B = 1, S = 2048, full recomputation, 8 data-parallel "
            "GPUs, tp = 1: each GPU keeps its 536,870,912 bytes of checkpoints (MP degree 1), not "
            "536,870,912 / 8 = 67,108,864", "inconsistent"),
)
