"""Two texts' conventions: the Ultra-Scale Playbook (Hugging Face 2025) and the ZeRO paper.

Ultra-Scale Playbook (nanotron/ultrascale-playbook; read from its mirror
vinjn/nanotron-ultrascale-playbook ``index.html`` at 924e4d0b):
"Memory usage in Transformers" (lines 410-510): BF16 params 2N, grads 2N,
FP32 copy 4N, Adam 8N = 16N ("FP32 or BF16 w/o FP32 grad acc"), 20N with
FP32 gradient accumulation, table at lines 463-491 (1B: 16/20 GB, 7B:
112/140, 70B: 1120/1400, 405B: 6480/8100); activations
m_act = L seq bs h (34 + 5 n_heads seq / h) (line 507); ZeRO stages
2P + 2P + kP/N_d, 2P + (2 + k)P/N_d, (4 + k)P/N_d with k = 12 (lines 850-957);
the FP8 table (lines 2573-2648).

ZeRO (Rajbhandari et al. 2020, arXiv:1910.02054v3), read from a transcription
of its TeX source (stored file id 61929569292; the PDF was not available here).
Sec. 3.1: model states 2P + 2P + KP = 16P with K = 12 (GPT-2 1.5B: "at least
24 GB", 3 GB of fp16 parameters). Sec. 3.2: "the 1.5B parameter GPT-2 model
trained with sequence length of 1K and batch size of 32 requires about 60 GB
of memory" (footnote 4), "about 8 GB" with activation checkpointing. Footnote 4
in full: "The activation memory of a transformer-based model is proportional
to the number of transformer layers x hidden dimensions x sequence length x
batch size. For a GPT-2 like architecture the total activations is about
12 x hidden_dim x batch x seq_length x transformer_layers." The footnote counts
values and names no unit; reading them as 2-byte fp16 values is memledger's
(it gives 60.4 GB for 48 layers, hidden 1600). Sec. 5.1-5.3 (Figure 1):
7.5B at N_d = 64: 120 GB, 31.4 GB (P_os), 16.6 GB (P_os+g), 1.9 GB (P_os+g+p).
"""
import sympy as sp

from ..core.symbols import B, H, L, P, S, d, t
from .base import Convention, Erratum, G, Item, M

__all__ = ["ERRATA", "PLAYBOOK", "PLAYBOOK_20", "PLAYBOOK_FP8", "PLAYBOOK_FP8_REDUCTION", "PLAYBOOK_TABLE", "ZERO_K",
           "ZERO_PAPER", "playbook_activations", "zero_paper_activations"]

N = G * M / t        # the data-parallel degree N_d: the GPUs (G x M = dp x tp) over the tensor-parallel ones
#: The Playbook's table (index.html lines 463-491): billions of parameters -> (GB, GB with FP32 grad acc).
PLAYBOOK_TABLE = {1: (16, 20), 7: (112, 140), 70: (1120, 1400), 405: (6480, 8100)}
#: The Playbook's FP8 table (lines 2573-2648): approach -> (bytes per part as printed, printed total).
PLAYBOOK_FP8 = {
    "BF16 with FP32 mixed precision baseline": ((4, 4, 2, 2, 4, 4), 20),
    "The above without FP32 grad accumulation": ((4, 2, 2, 4, 4), 16),
    "Transformer engine": ((4, 4, 4, 4), 16),
    "FP8-LM's O3 level": ((2, 2, 1, 1, 1, 2), 9),
    "DeepSeek-V3": ((4, 4, 1, 2, 2, 2), 15),
    "Nanotron's FP8": ((2, 4, 1, 1, 1, 1), 10),
}
#: Percent reductions the FP8 table prints against the 20-byte baseline.
PLAYBOOK_FP8_REDUCTION = {"The above without FP32 grad accumulation": 20, "Transformer engine": 20,
                          "FP8-LM's O3 level": 55, "DeepSeek-V3": 25, "Nanotron's FP8": 50}
ZERO_K = 12


def playbook_activations() -> sp.Expr:
    return L * S * B * d * (34 + 5 * H * S / d)


def zero_paper_activations() -> sp.Expr:
    """ZeRO footnote 4 (Sec. 3.2): "about 12 x hidden_dim x batch x seq_length x transformer_layers" values,
    counted here as 2 bytes each (the footnote states no unit; 2 bytes reproduces its "about 60 GB")."""
    return 2 * 12 * d * B * S * L


def _zero_states(stage, fp32_grads=False) -> list:
    shard = {0: (), 1: ("optimizer",), 2: ("optimizer", "grad"), 3: ("optimizer", "grad", "param")}[stage]
    parts = [("BF16 parameters", "param", 2), ("BF16 gradients", "grad", 2),
             ("FP32 parameters + Adam m, v (k = 12)", "optimizer", ZERO_K)]
    if fp32_grads:
        parts.insert(2, ("FP32 gradient accumulator", "grad", 4))
    return [Item(name, "model_states", "gpu", sp.ceiling(b * P / (N if role in shard else 1)), role)
            for name, role, b in parts]


def _playbook_items(ledger, inputs, fp32_grads=False) -> list:
    items = _zero_states(ledger.zero_stage, fp32_grads)
    if ledger.arch is not None:
        act = playbook_activations() if ledger.recompute == "none" else None
        if act is not None:
            items.append(Item("activations L S B d (34 + 5HS/d)", "activations", "gpu", sp.ceiling(act)))
    return items


def _zero_items(ledger, inputs) -> list:
    items = _zero_states(ledger.zero_stage)
    if ledger.arch is not None and ledger.recompute == "none":
        items.append(Item("activations, about 12 d B S L 2-byte values", "activations", "gpu",
                          zero_paper_activations()))
    return items


ERRATA = (
    Erratum("ZeRO paper", "Sec. 3.2, activation checkpointing example (1.5B GPT-2, seq 1K, batch 32)",
            "about 8 GB with activation checkpointing", "5.03 GB of checkpoints (+ 1.26 GB for one layer)",
            "one 2-byte checkpoint per layer is 2 x 32 x 1024 x 1600 x 48 = 5,033,164,800 bytes; recomputing one "
            "layer adds 60.4 GB / 48 = 1.26 GB: 6.29 GB. The paper gives no formula for its 8 GB", "unstated"),
)

PLAYBOOK = Convention(
    "playbook", "The Ultra-Scale Playbook (16 B/param, no FP32 grad accumulation)",
    "nanotron/ultrascale-playbook index.html lines 410-510 and 850-957 (mirror vinjn/nanotron-ultrascale-playbook)",
    _playbook_items, reads=("zero_stage", "dp", "recompute", "batch_size", "seq_len"),
    differs="the same 16 B/param as memledger; ZeRO shards divide P exactly (no per-rank rounding); activations "
            "always Korthikanti Eq. 1 for a GPT block with dropout, whatever the MLP or norm")
PLAYBOOK_20 = Convention(
    "playbook-fp32-accum", "The Ultra-Scale Playbook with FP32 gradient accumulation (20 B/param)",
    "nanotron/ultrascale-playbook index.html lines 441-491, 859-866",
    lambda ledger, inputs: _playbook_items(ledger, inputs, fp32_grads=True), reads=PLAYBOOK.reads,
    differs="adds a 4-byte FP32 gradient accumulator: 20 B/param")
ZERO_PAPER = Convention(
    "zero-paper", "ZeRO (Rajbhandari et al. 2020): (2 + 2 + 12)P and ~12 d B S L activations",
    "Rajbhandari et al. 2020, arXiv:1910.02054, Sec. 3.1-3.2 and 5",
    _zero_items, reads=("zero_stage", "dp", "recompute", "batch_size", "seq_len"), errata=ERRATA,
    differs="model states as memledger (16 B/param, K = 12); activations a rough 24 d B S L bytes, no S^2 "
            "attention term and no dropout masks")
