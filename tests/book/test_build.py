"""The book's checks: prose without typed quantities, committed outputs, every glued number and
equation against a source that is not the glue (the article's figure, a published number, or
arithmetic on the article's inputs written out here), and a clean strict build.

Each glued value is read back from the chapters' committed outputs (which nbval keeps equal to a
fresh run) and, in the slow build test, from the glue files of a clean strict build.
"""
from fractions import Fraction
from functools import cache
from html.parser import HTMLParser
from itertools import count
import json
from pathlib import Path
import re

import pytest
import sympy as sp

from memledger.article.book import CLAIM_BY_ID
from memledger.article.claims import CLAIMS

ROOT = Path(__file__).resolve().parents[2]
BOOK = ROOT / "book"
CHAPTERS = sorted(BOOK.glob("*.ipynb"))
UNITS = r"(?:GB|GiB|MB|MiB|TB|TiB|bytes|B/param|GB/s)"
#: a digit-led quantity with a unit, outside glue roles, math and “article quotations”
TYPED_QUANTITY = re.compile(r"(?<![\w{`.$])\d[\d,.]*\s?" + UNITS + r"\b")

# --- independent values: the article's inputs and published numbers, written out here -------------

P = 7 * 10**9                         # the article's nominal parameter count
BSD = 2048 * 4096                     # B x S x d at the spec (B = 1, S = 2048, d = 4096)
LAYERS = 32
ACT = LAYERS * BSD * 114              # L x BSd x (34 + 5HS/d), the article's per-layer formula at the spec
STATES = 16 * P                       # 2 + 2 + 4 + 4 + 4 bytes per parameter (article; ZeRO's K = 12)
OVERHEAD = 2 * 10**9                  # the upper end of the article's 1-2 GB, used in its sums
GB, GiB, MiB = 10**9, 2**30, 2**20
# what nvidia-smi reports (MiB): A100 80 GB, H100 80 GB HBM3, RTX 4090, H200 in public outputs (modal-labs/modal-client
# PR #2797, NVIDIA/nccl issue #1264, RLinf/RLinf issue #255; Modal's NVML table at thundergolfer.com for the H200)
A100_REAL, H100_REAL, RTX_REAL, H200_REAL = 81920 * MiB, 81559 * MiB, 24564 * MiB, 143771 * MiB
A100_40_REAL = 40960 * MiB
#: a fit leaves about 1 GB free (issue 17: "a margin under about 1 GB is no fit"); what a judged total may reach
MARGIN = 10**9
A100_ROOM, H100_ROOM, RTX_ROOM, H200_ROOM, A100_40_ROOM = (c - MARGIN for c in (
    A100_REAL, H100_REAL, RTX_REAL, H200_REAL, A100_40_REAL))
MODEL_FLOPS_TERMS = 1 + Fraction(2048, 6 * 4096) + Fraction(32000, 12 * 4096 * LAYERS)   # 1 + S/6d + V/12dL
MODEL_FLOPS_S2 = Fraction(2048, 6 * 4096)                                                 # the S^2 matmuls: S/6d
BLOCK = 12 * 4096**2 + 13 * 4096      # parameters of one GPT block at F = 4d (Korthikanti et al. 2022)
TP_LAYER = BSD * (10 + Fraction(24, 8) + Fraction(5 * 32 * 2048, 4096 * 8))   # Korthikanti Table 2 at t = 8


# --- chapter 14: real checkpoints, their config.json shapes written out, their counts as published ---------
# (Meta-Llama-3-8B, Mistral-7B-v0.1, Mixtral-8x7B-v0.1: safetensors total_size / 2 bytes; Qwen2.5-7B: Hub count;
# Gemma-7B: Gemma Team 2024, Table 2 non-embedding count + its tied 256000 x 3072 embedding)
LLAMA3 = dict(P=16_060_522_496 // 2, L=32, d=4096, H=32, q=4096, kv=8 * 128, F=14336, V=128256)
MISTRAL = dict(P=14_483_464_192 // 2, L=32, d=4096, H=32, q=4096, kv=8 * 128, F=14336, V=32000)
MIXTRAL = dict(MISTRAL, P=93_405_585_408 // 2, E=8, k=2)
QWEN = dict(P=7_615_616_512, L=28, d=3584, H=28, q=3584, kv=4 * 128, F=18944, V=152064)
GEMMA = dict(P=7_751_248_896 + 256000 * 3072, L=28, d=3072, H=16, q=16 * 256, kv=16 * 256, F=24576, V=256000)


def layer(m, B=1, S=4096, repeat_kv=False):
    """Saved bytes of one LLaMA-style block with FlashAttention (Korthikanti's inventory, Dao et al. 2022):
    BF16 norm inputs, Q/K/V input, Q, K, V, output-projection input, MLP input, four B x S x F gated-MLP
    tensors, and the FP32 log-sum-exp (B x H x S); a top-k MoE replaces the four by the router's FP32
    probabilities, int64 indices, the k routed copies of the input, four k x B x S x F expert tensors, the
    expert outputs and the routing weights."""
    kv = m["q"] if repeat_kv else m["kv"]
    attention = 2 * B * S * (4 * m["d"] + 2 * m["q"] + 2 * kv) + 4 * B * m["H"] * S
    if "E" not in m:
        return attention + 2 * B * S * 4 * m["F"]
    k = m["k"]
    return attention + 4 * B * S * m["E"] + 8 * B * S * k + 2 * 2 * k * B * S * m["d"] + 4 * 2 * k * B * S * m["F"] \
        + 2 * k * B * S


def outside(m, B=1, S=4096, mask=False):
    """What a decoder keeps outside its blocks until backward (the reference decoder of memledger/pytorch/reference.py, checked
    tensor by tensor in tests/pytorch/test_reference.py): input and target ids (int64), the final norm's and the LM head's
    BF16 inputs, the FP32 log-softmax of the logits, the loss and nll_loss's total weight (FP32 scalars), and
    with eager attention the (S, S) bool causal mask."""
    return 2 * 8 * B * S + 2 * 2 * B * S * m["d"] + 4 * B * S * m["V"] + 2 * 4 + (S * S if mask else 0)


ARTICLE = dict(d=4096, V=32000)
ARTICLE_OUTSIDE = outside(ARTICLE, 1, 2048, mask=True)


def zero3_total(m, B=1, S=4096, dp=8):
    """16 bytes per parameter sharded over dp (whole elements per rank), L layers, what lies outside them, the
    2 GB overhead: the sum of the rows at the end of the forward pass, the whole model counted."""
    return 16 * -(-m["P"] // dp) + m["L"] * layer(m, B, S) + outside(m, B, S) + OVERHEAD


def largest(fits):
    n = 0
    while fits(n + 1):
        n += 1
    return n


def fits_at_answer_not_beyond(total, capacity):
    """A check of a glued integer: total(n) fits in capacity, total(n + 1) does not."""
    def check(text):
        n = int(text.replace(",", ""))
        if not total(n) <= capacity < total(n + 1):
            return f"{n} is not the largest that fits: totals {total(n):,} and {total(n + 1):,} against {capacity:,}"
    return check


def fits_from_answer_not_below(total, capacity):
    """A check of a glued integer: total(n) fits in capacity, total(n - 1) does not (the smallest dp)."""
    def check(text):
        n = int(text.replace(",", ""))
        if not total(n) <= capacity < total(n - 1):
            return f"{n} is not the smallest that fits: totals {total(n):,} and {total(n - 1):,} against {capacity:,}"
    return check


def step_peak(foreach=False, **setup) -> int:
    """The peak of a training step from a Step built directly (the timeline that tests/step/test_timeline.py checks against
    PyTorch's MemTracker), not through memledger.fit's search or Ledger.judged_bytes; ``foreach``: AdamW(foreach=True)."""
    from memledger.ledger.ledger import Ledger
    from memledger.step.timeline import Step
    return Step(Ledger(**setup), foreach=foreach).peak.bytes


def counted_article(**changes):
    """The article's shape with its parameters counted from the tensors (no nominal 7x10^9): chapter 5's definition."""
    from memledger.models.presets import get_preset
    return get_preset("article-7b").with_changes(n_params=None, **changes)


def verdict_says(words, number):
    """A check of a glued verdict: its words, and the gigabytes in it against ``number()`` (bytes)."""
    def check(text):
        if not text.startswith(words):
            return f"{text!r} does not start with {words!r}"
        shown = Fraction(re.search(r"[\d.]+ GB", text).group(0)[:-3])
        if abs(shown * GB - number()) > GB // 200:
            return f"{text!r}: expected {number() / GB:.4f} GB"
    return check


def lazy(value, unit):
    """A check of a value computed on first use (a step's peak takes a moment to build)."""
    def check(text):
        shown, shown_unit, decimals = parse(text)
        want = Fraction(value())
        if shown_unit != unit or abs(shown - want) > Fraction(1, 2 * 10**decimals):
            return f"{text}, expected {float(want):.6g} {unit}"
    return check


#: the phrases memledger.fit names its measures by; the checks below recompute a sum (written out here) or a
#: step's peak (step_peak), so a glued measure must be the one its check assumes
SUM, PEAK = "the sum of the rows at the end of the forward pass", "the peak of a training step"


def measure_is(phrase):
    def check(text):
        if text != phrase:
            return f"fit judged by {text!r}, but its checks here assume {phrase!r}"
    return check


def llama2_zero3_peak(n):
    return step_peak(arch="llama2-7b", seq_len=4096, zero_stage=3, dp=8, flash_attention=True, batch_size=n)


def zero3_peak(preset, B=1, S=4096):
    """Chapter 14's setup (ZeRO-3 over 8, FlashAttention, BF16 AdamW): the step's peak, for the grouped-query
    presets whose steps tests/step/test_timeline.py checks against MemTracker at full scale."""
    return step_peak(arch=preset, seq_len=S, zero_stage=3, dp=8, flash_attention=True, batch_size=B)


MISTRAL_B80 = largest(lambda n: zero3_total(MISTRAL, B=n) <= H100_ROOM)


def llama3_ckpt_sum(n):
    """Llama 3 8B on one GPU, full checkpointing, S = 4096: 16 B/param, L BF16 block inputs, outside, overhead."""
    return 16 * LLAMA3["P"] + LLAMA3["L"] * 2 * n * 4096 * 4096 + outside(LLAMA3, n) + OVERHEAD


H200_CKPT = largest(lambda n: llama3_ckpt_sum(n) <= H200_ROOM)
LLAMA3_CKPT = dict(arch="llama3-8b", seq_len=4096, recompute="full", flash_attention=True)

# --- chapters 11 and 12: one training step of the reference loop (memledger/pytorch/reference.py), written out op by op for the
# article's shape with its parameters counted: GPT blocks of 12d^2 + 13d, a tied 32000 x d embedding, a final
# LayerNorm; the A100's 81,920 MiB as nvidia-smi reports it ---------------------------------------------------
D, VOC, HEADS = 4096, 32000, 32
P_COUNTED = LAYERS * BLOCK + VOC * D + 2 * D


def article_outside(B, S):
    """Outside the blocks of the article's shape, with eager attention's (S, S) causal mask."""
    return outside(ARTICLE, B, S, mask=True)


def act(B, S):
    """L x BSd(34 + 5HS/d): Korthikanti et al.'s Eq. 1, the article's activations."""
    return LAYERS * B * S * D * 34 + LAYERS * 5 * B * HEADS * S * S


#: BF16 gradients written in backward before block 0's attention: blocks 1..31, block 0's output projection, MLP
#: and second LayerNorm, the final LayerNorm, and the LM head's share of the tied embedding
GRADS_AT_BLOCK0 = 2 * (31 * BLOCK + 2 * D + (D * D + D) + (4 * D * D + 4 * D) + (4 * D * D + D) + 2 * D) + 2 * VOC * D


def recomputed_block0(S):
    """Block 0 recomputed, at its ``probabilities @ V`` backward (B = 1): softmax output, dropout output, 1-byte
    mask and the probabilities' gradient (7HS^2), eight S x d tensors, the causal mask, the ids, two scalars."""
    return 7 * HEADS * S * S + 8 * 2 * S * D + S * S + 16 * S + 8


def offload_full_sum(B, S):                       # weights and gradients on the GPU, L block inputs
    return 4 * P_COUNTED + LAYERS * 2 * B * S * D + article_outside(B, S) + OVERHEAD


def offload_full_peak(B, S):
    """The peak with offloading and full checkpointing: block 0's backward at B = 1 (long S), block 31's
    recomputation at S = 2048 (large B): 32 checkpoints, 7BHS^2, the fused QKV output and q, k, v copies
    (12BSd), dX, norm and attention outputs (6BSd), the LM head's and final norm's gradients."""
    if B == 1:
        return 2 * P_COUNTED + GRADS_AT_BLOCK0 + OVERHEAD + recomputed_block0(S)
    assert S == 2048
    return 2 * P_COUNTED + OVERHEAD + 2 * VOC * D + 4 * D + S * S + 8 + B * (16 * S + 82 * S * D + 7 * HEADS * S * S)


def offload_sum(S):                               # offloading alone: weights, gradients, all activations
    return 4 * P_COUNTED + act(1, S) + article_outside(1, S) + OVERHEAD


def offload_peak(S):                              # at the loss: no gradients yet, two more FP32 B x S x V tensors
    return 2 * P_COUNTED + act(1, S) + article_outside(1, S) + 2 * 4 * S * VOC + OVERHEAD


SEQ_SUM = largest(lambda s: offload_full_sum(1, s) <= A100_ROOM)
SEQ_PEAK = largest(lambda s: offload_full_peak(1, s) <= A100_ROOM)
SEQ_ALONE = largest(lambda s: offload_peak(s) <= A100_ROOM)


def offload_selective_sum(S):
    """Offloading and selective recomputation at B = 1: Korthikanti's 34 BSd per layer (Table 2, t = 1)."""
    return 4 * P_COUNTED + LAYERS * 34 * S * D + article_outside(1, S) + OVERHEAD


def offload_alone_sum(B, S=2048):                 # offloading alone: weights, gradients, every activation
    return 4 * P_COUNTED + act(B, S) + article_outside(B, S) + OVERHEAD


def offload_alone_peak(B, S=2048):                # at log_softmax's backward: no gradients, three FP32 B x S x V
    return 2 * P_COUNTED + act(B, S) + article_outside(B, S) + 2 * 4 * B * S * VOC + OVERHEAD


DESIGN_B = largest(lambda b: offload_full_peak(b, 2048) <= A100_ROOM)


def outside_tp8(B, sequence_parallel, S=2048):
    """Outside the blocks per rank under t = 8 (Korthikanti Sec. 4.3): ids, mask and loss scalars whole, the FP32
    log-softmax split by t, the final norm's and the LM head's inputs split only with sequence parallelism."""
    inputs = 2 * 2 * B * S * D
    return 16 * B * S + S * S + 8 + 4 * B * S * VOC // 8 + (inputs // 8 if sequence_parallel else inputs)


def tp8_sum(B, sequence_parallel):
    """The whole model under t = 8, counted: 16 B/param over 8, Table 2's per-layer bytes, outside, overhead."""
    per_layer = BSD * 114 // 8 if sequence_parallel else TP_LAYER
    return 16 * P_COUNTED // 8 + B * LAYERS * per_layer + outside_tp8(B, sequence_parallel) + OVERHEAD


def zero3_full_sum(dp):
    """ZeRO-3 with full checkpointing, the whole model counted: 16P/N_d (whole elements per rank), L block inputs."""
    return 16 * -(-P_COUNTED // dp) + 2 * LAYERS * BSD + article_outside(1, 2048) + OVERHEAD


@cache
def deepest_article_shape() -> int:
    """Chapter 2's exercise: the most layers of the article's shape whose ZeRO-3 (8 GPUs), fully checkpointed step
    peaks within an A100 less the margin, by the step built directly."""
    return largest(lambda n: step_peak(arch=counted_article(n_layers=n), zero_stage=3, dp=8, recompute="full")
                   <= A100_ROOM)


LLAMA13 = dict(arch="llama2-13b", seq_len=8192, zero_stage=3, dp=8, flash_attention=True)


@cache
def llama13_offload_batch() -> int:
    return largest(lambda b: step_peak(batch_size=b, recompute="full", offload_optimizer="cpu", **LLAMA13)
                   <= A100_40_ROOM)


class Measured:
    """A value only PyTorch can give: ``measure()`` returns (value, unit) from a PyTorch run in the test.
    Checked by the slow ``test_values_only_pytorch_gives``; the fast check skips it."""

    def __init__(self, measure):
        self.measure = measure


SMALL_GPT = dict(d=64, L=2, H=4, F=256, V=1000, dropout=0.1)       # chapter 12's small block, BF16, B = 2, S = 32


def measured_small_llama_peak() -> int:
    """MemTracker's peak of the project's hand-marked harness (memledger.pytorch.measure.memtracker_step, fake
    tensors) for chapter 21's small LLaMA-style decoder, FP32 AdamW, B 2, S 32: what memledger.measure's CPU
    measurement must find in a real loop."""
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    return memtracker_step(RefConfig(64, 2, 4, 160, 1000, "llama"), "fp32-adamw", 2, 32)["peak"]


@cache
def saved_storages(batch: int) -> dict:
    """What autograd saves in one forward pass of the small GPT decoder (saved-tensor hooks, PyTorch)."""
    from memledger.pytorch.measure import saved_tensors
    from memledger.pytorch.reference import RefConfig
    return saved_tensors(RefConfig(**SMALL_GPT), "bf16-pure-adamw", batch, 32)


@cache
def memtracker_llama(seq: int) -> dict:
    """MemTracker's totals of one LLaMA-2 7B step (pure BF16 AdamW, B = 1) under FakeTensorMode, PyTorch."""
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    return memtracker_step(RefConfig(4096, 32, 32, 11008, 32000, "llama"), "bf16-pure-adamw", 1, seq)


def memtracker_difference():
    """The largest difference between MemTracker and the timeline (CPU conventions) over landmarks and peaks."""
    from memledger.models.presets import get_preset
    from memledger.ledger.ledger import Ledger
    from memledger.step.timeline import LANDMARKS
    m = memtracker_llama(2048)
    step = Ledger(get_preset("llama2-7b"), recipe="bf16-pure-adamw", overhead_bytes=0).step("cpu")
    gaps = [m[k] - step.landmarks[k]["gpu"] for k in LANDMARKS] + [m["peak"] - step.peak.bytes]
    gaps += [m["phase peaks"][k] - v for k, v in step.phase_peaks().items()]
    return max(abs(g) for g in gaps), "bytes"


@cache
def memtracker_lab(style: str) -> dict:
    """MemTracker's step of chapter 18's lab decoders (FakeTensorMode, PyTorch): the lab's default (GPT blocks,
    d 1024, L 8, H 16, F 4096, V 32000, dropout 0.1, BF16 with FP32 masters, B 4, S 1024) and exercise 3's LLaMA
    blocks (d 256, L 4, H 8, F 688, V 32000, fused RMSNorm, pure BF16 AdamW, B 2, S 512)."""
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    if style == "gpt":
        return memtracker_step(RefConfig(1024, 8, 16, 4096, 32000, "gpt", dropout=0.1), "bf16-adamw", 4, 1024)
    return memtracker_step(RefConfig(256, 4, 8, 688, 32000, "llama", rmsnorm="fused"), "bf16-pure-adamw", 2, 512)


LLAMA2_TENSORS = 32 * 7 + 3                       # parameter tensors: 7 per block, embedding, final norm, head

# chapter 15's models: LLaMA-2 7B, GPT-3 175B (Brown et al. 2020) and LLaMA 65B (Touvron et al. 2023: d 8192,
# L 80, H 64, F 22016), with their projections (the 4d^2 + 3dF per layer QLoRA quantizes)
LLAMA = 6_738_415_616
LLAMA_ACT = 32 * 2 * 2048 * (4 * 11008 + 32 * 2048 + 8 * 4096)               # 2BS(4F + HS + 8d) per layer
GPT3 = 96 * (12 * 12288**2 + 13 * 12288) + 50257 * 12288 + 2048 * 12288 + 2 * 12288
PROJ7 = 32 * (4 * 4096**2 + 3 * 4096 * 11008)
PROJ65 = 80 * (4 * 8192**2 + 3 * 8192 * 22016)
P65 = PROJ65 + 80 * 2 * 8192 + 2 * 32000 * 8192 + 8192
A7 = 32 * 64 * (4 * (4096 + 4096) + 3 * (4096 + 11008))                     # rank 64 on every projection
A65 = 80 * 64 * (4 * (8192 + 8192) + 3 * (8192 + 22016))
ADAPT_32 = 2 + 2 + 4 + 4                  # QLoRA's BF16 adapters with paged_adamw_32bit (qlora.py line 198): FP32 m, v
# QLoRA's LoRA dropout (0.1 for 7B): each of the 7 adapted projections keeps a 1-byte mask and a BF16 dropped copy of
# its input (q, k, v, o, gate, up: d wide; down: F), and the plain inputs of the projections go (3 of width d, one F)
QLORA_ACT = LLAMA_ACT + 32 * 2048 * (3 * (6 * 4096 + 11008) - 2 * (3 * 4096 + 11008) + 7 * 2 * 64)
ADAM8 = LLAMA * (4 + 2 * (1 + Fraction(4, 256)))                               # FP32 master + 8-bit m, v
# Adafactor: a row and a column of FP32 per matrix, every element of a vector
ADAFACTOR = 4 * (32 * (4 * (4096 + 4096) + 3 * (11008 + 4096) + 2 * 4096) + 2 * (32000 + 4096) + 4096)
KV7 = 2 * 32 * 2048 * 4096 * 2                                                  # K and V, L x S x d, BF16
WORK7 = (2 * 2048 * 4096 + 2048 * 4 * 4096 + 3 * 2048 * 11008) * 2 + 4 * 32000   # memledger.ledger.inference's buffer


# what a whole model keeps outside its blocks (memledger/pytorch/reference.py's decoder): int64 token and target ids, the
# (S, S) bool causal mask, the final norm's and the LM head's BF16 inputs, the FP32 log-softmax (4BSV), two FP32
# scalars -- the same for the article's spec and LLaMA-2 7B (d 4096, V 32000, S 2048)
OUTSIDE = 2 * 8 * 2048 + 2048**2 + 2 * 2 * BSD + 4 * 2048 * 32000 + 8
RTX_SMI = 24564 * MiB                                                           # the RTX 4090 as nvidia-smi reports it
ZERO3_GPUS = -(-18 * P // (RTX_SMI - 4 * 32000 * 4096))                        # 4 P_max + 18P/N <= C


def nf4(n):
    """NF4 with double quantization: 4 bits, an int8 absmax per 64, an fp32 constant per 64 x 256."""
    return n // 2 + n // 64 + 4 * n // (64 * 256)


QLORA_NONE = nf4(PROJ7) + 2 * (LLAMA - PROJ7) + ADAPT_32 * A7 + QLORA_ACT + OVERHEAD
QLORA_FULL = nf4(PROJ7) + 2 * (LLAMA - PROJ7) + ADAPT_32 * A7 + 2 * 2048 * 4096 * 32 + OVERHEAD


# --- chapter 17: the knobs' ladder: LLaMA-2 7B at S = 16384, torchtune's BF16 full fine-tune (recipes/configs/llama2/
# 7B_full_low_memory.yaml), PyTorch's CUDA conventions; each peak from a step built here directly (Ledger.step,
# LoraLedger.step: the timelines tests/step checks against MemTracker), not through memledger.article.knobs ---------
KNOBS_S = 16384


def knob_step(S=KNOBS_S, arch="llama2-7b", conventions=None, **changes):
    """A step of torchtune's full fine-tune: BF16 AdamW, CUDA's conventions, torchtune's composite RMSNorm
    (torchtune/modules/rms_norm.py upcasts to FP32)."""
    conventions = conventions or {}
    from memledger.ledger.ledger import Ledger
    return Ledger(arch, recipe="bf16-pure-adamw", seq_len=S, flash_attention=True, **changes).step(
        "cuda", rmsnorm="composite", **conventions).peak


def lora_step(S=KNOBS_S, base="bf16", adapters="bf16-pure-adamw"):
    """torchtune's LoRA for LLaMA-2 7B (7B_lora_single_device.yaml): rank 8 on Q and V, adapters in BF16, the
    chunked loss (8 chunks) and every block checkpointed, no offloading."""
    from memledger.ledger.lora import LoraConfig, LoraLedger
    config = LoraConfig(rank=8, targets=("q_proj", "v_proj"), base=base, adapter_recipe=adapters)
    return LoraLedger("llama2-7b", config, seq_len=S, flash_attention=True, loss_chunks=8, recompute="full").step(
        "cuda", rmsnorm="composite").peak


def phase_is(peak):
    def check(text):
        if text != peak().phase:
            return f"{text!r}, but the step peaks in {peak().phase!r}"
    return check


def longest_multiple(peak, capacity, multiple=1024):
    """A check of a glued sequence length: a multiple of ``multiple`` whose peak fits, the next multiple's not."""
    def check(text):
        n = int(text.replace(",", ""))
        if n % multiple or not peak(n) <= capacity < peak(n + multiple):
            return f"{n}: peaks {peak(n):,} and {peak(n + multiple):,} against {capacity:,}"
    return check


TOP = dict(loss_chunks=8, recompute="full", optimizer_in_backward=True, offload_activations=True)   # every knob


def knobs_full(S):
    return knob_step(S, loss_chunks=8, recompute="full").bytes


def knobs_top(S):
    return knob_step(S, **TOP).bytes


def knobs_lora(S):
    return lora_step(S).bytes


def knobs_qlora(S):
    return lora_step(S, base="nf4").bytes


@cache
def knobs_longest(setup, capacity) -> int:
    """The longest multiple of 1,024 tokens whose peak leaves the GPU its margin, counted up one by one."""
    peak = {"top": knobs_top, "lora": knobs_lora, "qlora": knobs_qlora}[setup]
    return 1024 * largest(lambda n: peak(1024 * n) <= capacity)


L40S_REAL = 46068 * MiB                     # nvidia-smi's L40S total (tests/ledger/test_hardware.py's sources)
L40S_ROOM = L40S_REAL - MARGIN


# --- chapter 16: one LLaMA-2 7B run (8 GPUs, B 1, S 4096, FlashAttention) under each framework ----------------
LLAMA2 = dict(P=6_738_415_616, L=32, d=4096, H=32, q=4096, kv=4096, F=11008, V=32000)
SEVEN = dict(arch="llama2-7b", seq_len=4096, batch_size=1, dp=8, flash_attention=True)
FSDP2_RUN = dict(SEVEN, framework="fsdp2", recipe="fp32-adamw")
#: DeepSpeed's ZeRO defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size 5e8, stage3_max_live_parameters
#: 1e9, stage3_prefetch_bucket_size 5e7, stage3_param_persistence_threshold 1e5 elements; BF16 = 2 bytes
DS_IPG, DS_LIVE, DS_PREFETCH = 2 * 500_000_000, 2 * 10**9, 2 * 50_000_000
DS_PERSISTENT = 2 * (2 * LLAMA2["L"] + 1) * 4096          # the RMSNorm weights: the only tensors under 1e5 elements
#: Megatron-LM's distributed optimizer (dist_optimizer.md): BF16 weights 2P and FP32 main_grad 4P whole, FP32 masters
#: and Adam's moments 12P over the data-parallel ranks
MEGATRON_SUM = 2 * LLAMA2["P"] + 4 * LLAMA2["P"] + 12 * -(-LLAMA2["P"] // 8) + LLAMA2["L"] * layer(LLAMA2) \
    + outside(LLAMA2) + OVERHEAD
#: DDP replicates the book's loop (2 + 2 + 12 B/param) and adds its BF16 buckets (2P); the ids (16 B x S)
DDP_BEFORE = 16 * LLAMA2["P"] + 16 * 4096 + OVERHEAD


def ddp_bucket_count(cap_mib=None):
    """PyTorch's bucket assignment (torch/nn/parallel/distributed.py: 25 MiB, the first 1 MiB; an explicit cap is
    every bucket's): LLaMA-2 7B's BF16 gradients in the order backward makes them (the registration order
    reversed: embedding; per block norm 1, QKV, output projection, norm 2, gate, up, down; final norm; head), a
    bucket closing as soon as it reaches its limit."""
    d, F, V = 4096, 11008, 32000
    sizes = [V * d] + [d, 3 * d * d, d * d, d, F * d, F * d, d * F] * 32 + [d, V * d]
    cap = (cap_mib or 25) * MiB
    count, fill, limit = 0, 0, (cap if cap_mib else MiB)
    for size in reversed(sizes):
        fill += 2 * size
        if fill >= limit:
            count, fill, limit = count + 1, 0, cap
    return count + (fill > 0)


@cache
def fsdp_small_peak() -> int:
    """PyTorch's FSDP2 (fully_shard, FSDPMemTracker, a fake world of 8) on chapter 16's small decoder."""
    from memledger.pytorch.distributed import fsdp_step
    from memledger.pytorch.reference import RefConfig
    return fsdp_step(RefConfig(d=60, L=6, H=4, F=170, V=1001, style="llama"), "fp32-adamw", batch=2, seq=16,
                     world=8, param_dtype="bf16", reduce_dtype="fp32", track_first=False)["peak"]


def tp_forward_kept() -> int:
    """What the step (DTensor's plan, checked against MemTracker in tests/step/test_tensor.py) keeps from forward."""
    from memledger.ledger.ledger import Ledger
    from memledger.step.timeline import Step
    marks = Step(Ledger("llama2-7b", seq_len=4096, tp=8, sequence_parallel=True, flash_attention=True)).landmarks
    return marks["after forward"]["gpu"] - marks["before forward"]["gpu"]


#: chapter 21: published configs read by memledger check, each step rebuilt here from the setup its file describes
#: (tests/intake/configs, read by hand): LLaMA-2 7B on CUDA with torchtune's and LitGPT's composite RMSNorm
CONFIG_S = 4096


def config_lora(batch=2, seq=CONFIG_S, rank=8, targets=("q_proj", "v_proj"), quantized=False, litgpt=False):
    """torchtune's 7B_lora_single_device (2bd69062: rank 8 on q and v, BF16 adapters, no dropout, every block
    checkpointed, CEWithChunkedOutputLoss's 8 chunks) or, with ``quantized``, 7B_qlora_single_device (rank 8 on
    q, v, o and the MLP, NF4 with double quantization); with ``litgpt``, LitGPT's config_hub lora/qlora.yaml (rank
    32 on q and v, dropout 0.05, 512 tokens, the head in 128-token chunks, no recomputation; its QLoRA nf4 without
    double quantization and bitsandbytes' paged AdamW)."""
    from memledger.ledger.lora import LoraConfig, LoraLedger, qlora
    if quantized:
        config = qlora(rank, targets, "llama", double_quant=not litgpt, dropout=litgpt,
                       **({} if litgpt else {"adapter_recipe": "bf16-pure-adamw"}))
    else:
        config = LoraConfig(rank=rank, targets=targets, adapter_recipe="bf16-pure-adamw", dropout=litgpt)
    loss = dict(loss_chunks=seq // 128, loss_impl="litgpt") if litgpt else dict(loss_chunks=8, recompute="full")
    return LoraLedger("llama2-7b", config, batch_size=batch, seq_len=seq, **loss).step(
        "cuda", rmsnorm="composite").peak


QVO_MLP = ("q_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def config_low_memory():
    """torchtune's 7B_full_low_memory.yaml with optimizer_in_bwd false: BF16 weights, bitsandbytes' paged 32-bit
    AdamW, every block checkpointed and its checkpoints offloaded, batch 2 (its loss, LinearCrossEntropyLoss, is
    not modelled: the plain cross-entropy)."""
    from memledger.ledger.ledger import Ledger
    return Ledger("llama2-7b", recipe="bf16-adamw32-bnb", paged_optimizer=True, batch_size=2, seq_len=CONFIG_S,
                  recompute="full", offload_activations=True).step("cuda", rmsnorm="composite").peak


#: Megatron-LM's sequence parallelism (Korthikanti et al. 2022, Sec. 4.2.2): every saved tensor of a block on S/t
#: tokens, the final norm's and the LM head's inputs too, the vocabulary-parallel FP32 log-softmax 4BSV/t
TP_MEGATRON = LLAMA2["L"] * layer(LLAMA2) // 8 + 16 * 4096 + 2 * (2 * 4096 * 4096 // 8) + 4 * 4096 * 32000 // 8 + 8
THIRTEEN_FULL = dict(arch="llama2-13b", seq_len=8192, dp=8, flash_attention=True, recompute="full")


def thirteen_fsdp2_peak(n):
    return step_peak(**THIRTEEN_FULL, framework="fsdp2", recipe="fp32-adamw", batch_size=n)


#: chapter 20: LLaMA-2 7B, BF16 AdamW (for-loop), every block checkpointed, FlashAttention; the replay
#: (memledger/ledger/replay.py, the port held to PyTorch's own allocator tests in tests/ledger/test_caching.py)
GPU_SETUP = dict(arch="llama2-7b", seq_len=4096, recompute="full", flash_attention=True)


@cache
def gpu_replay(batch=4, overhead=0, **options):
    from memledger.ledger.ledger import Ledger
    from memledger.ledger.replay import replay
    return replay(Ledger(**GPU_SETUP, batch_size=batch, overhead_bytes=overhead), **options)


def gpu_allocated(text):
    """max_memory_allocated: the step's live tensors (the timeline, checked against MemTracker), each rounded up to a
    512-byte block or a whole unsplit block of under 1 MiB more: never below the peak, and the step has fewer than 64
    tensors live at its peak, so at most 64 MiB above it."""
    shown, unit, decimals = parse(text)
    peak = step_peak(**GPU_SETUP, batch_size=4, overhead_bytes=0)
    if unit != "GB" or not Fraction(peak, GB) - Fraction(1, 2 * 10**decimals) <= shown <= Fraction(peak + 64 * MiB, GB) \
            + Fraction(1, 2 * 10**decimals):
        return f"{text}: allocated must lie between the step's peak {peak / GB:.4f} GB and 64 MiB above it"


# the published measurements of chapter 20, as their sources print them (bytes: GB = 1e9, as each divides by 1e9;
# nvidia-smi's figures are NVML's used bytes // 1024**2)
TT_DOCS = 15_570_000_000, 15_870_000_000, 15_860_000_000, 17_040_000_000   # lora_finetune.rst lines 358-373
TT_QLORA, TT_LORA_INIT, TT_QLORA_INIT = 9_290_000_000, 13_980_000_000, 9_130_000_000   # qlora_finetune.rst 167-168
LG = dict(lora=21_300_000_000, lora_b2=29_070_000_000, lora_13b=38_120_000_000, qlora=14_140_000_000,
          qlora_dq=13_840_000_000)                                  # litgpt tutorials/resource-tables.md lines 53-59
LG_HUB = dict(lora=19_770_000_000, qlora=13_680_000_000)           # litgpt config_hub/finetune/README.md 33, 35
HF_BERT, HF_BERT_LOAD, HF_CONTEXT = 14949 * MiB, 2631 * MiB, 1343 * MiB   # model_memory_anatomy.md 178, 103, 87
QV, ALL7 = ("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def tt_step(rank, targets, quantized=False, landmark=None, load="torchtune-0914d5c", after_loading=False,
            measure="reserved"):
    """torchtune at 0914d5cfb: 7B_lora_single_device (batch 2, Alpaca cut at 512, every block checkpointed, plain
    cross-entropy, BF16 adapters and AdamW, dropout 0.05; torchtune's lora_llama2, implementation torchtune, proved in
    tests/pytorch/test_torchtune_lora.py) or 7B_qlora_single_device (NF4 with double quantization);
    no overhead row (the allocator's counters do not see the context); its max_memory_reserved over the whole run,
    the model built and loaded as torchtune at that commit did (``load``; None: the step alone), replayed; or
    (``after_loading``) ``measure`` at its largest before the first step. QLoRA: torchtune's own step
    (implementation torchtune: torchao's NF4Tensor, q, k, v dequantized in turn), as the published rows."""
    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.ledger.replay import replay_step
    config = LoraConfig(rank=rank, targets=targets, adapter_recipe="bf16-pure-adamw", dropout=True,
                        base="nf4" if quantized else "bf16")
    step = LoraLedger("llama2-7b", config, batch_size=2, seq_len=512, recompute="full", overhead_bytes=0,
                      implementation="torchtune").step("cuda", rmsnorm="composite")
    if landmark:
        return step.landmarks[landmark]["gpu"]
    replay = replay_step(step, load=load)
    if after_loading:
        return max(s[3 if measure == "allocated" else 4] for s in replay.series if s[0] == 0)
    return replay.reserved


def lg_step(rank, batch, seq, arch="llama2-7b", quant=None):
    """LitGPT finetune_lora: rank on query and value, dropout 0.05, no recomputation; LoRA: LitGPT's own LoRA step
    (implementation litgpt: its head in 128-token chunks, proved in tests/step/test_litgpt_lora_step.py); QLoRA: NF4
    and bitsandbytes' paged AdamW on the reference decoder, the head in equal chunks (1304 = 8 x 163, 512 = 4 x 128);
    its max_memory_allocated over the whole run, loading as LitGPT did when its tables were measured, replayed."""
    from memledger.ledger.lora import LoraConfig, LoraLedger, qlora
    from memledger.ledger.replay import replay_step
    if not quant:
        config = LoraConfig(rank=rank, targets=QV, adapter_recipe="bf16-pure-adamw", dropout=True)
        step = LoraLedger(arch, config, batch_size=batch, seq_len=seq, overhead_bytes=0,
                          implementation="litgpt").step("cuda")
        return replay_step(step, load="litgpt-00af8b0").allocated
    config = qlora(rank, QV, "llama", double_quant=quant == "dq", dropout=True)
    return replay_step(LoraLedger(arch, config, batch_size=batch, seq_len=seq, loss_chunks=8 if seq == 1304 else 4,
                                  loss_impl="litgpt", overhead_bytes=0).step("cuda", rmsnorm="composite"),
                       load="litgpt-00af8b0").allocated


def bert_large_ledger(**changes):
    """BERT-large (BertModel: 30522 x 1024 words, 512 positions, 2 token types, a LayerNorm, 24 layers of 4 (1024^2 +
    1024) + 2 x 2048 + 2 x 4 x 1024^2 + 4096 + 1024 parameters, a 1024 x 1024 pooler with bias)."""
    from memledger.ledger.ledger import Ledger
    from memledger.models.presets import get_preset
    arch = get_preset("bert-base-uncased").with_changes(d_model=1024, n_layers=24, n_heads=16, d_ff=4096)
    counted = 30522 * 1024 + 512 * 1024 + 2 * 1024 + 2048 + 24 * (4 * (1024**2 + 1024) + 2 * 2048 + 8 * 1024**2 + 4096
                                                                 + 1024) + 1024**2 + 1024
    assert arch.params == counted == 335_141_888
    return Ledger(arch, recipe="fp32-adamw", overhead_bytes=0, **changes)


def percent_off(predicted, measured):
    """A check of a glued relative error in percent: (predicted() - measured) / measured."""
    return lazy(lambda: Fraction(100 * (predicted() - measured), measured), "%")


PUBLISHED_ERRORS = {
    "tt_lora": (lambda: tt_step(8, QV), TT_DOCS[0]),
    "tt_lora_all_r64": (lambda: tt_step(64, ALL7 + ("lm_head",)), TT_DOCS[3]),
    "tt_qlora": (lambda: tt_step(8, ALL7, quantized=True), TT_QLORA),
    "tt_qlora_load": (lambda: tt_step(8, ALL7, quantized=True, after_loading=True), TT_QLORA_INIT),
    "tt_lora_load": (lambda: tt_step(8, QV, after_loading=True), TT_LORA_INIT),
    "lg_lora": (lambda: lg_step(8, 1, 1304), LG["lora"]),
    "lg_lora_13b": (lambda: lg_step(8, 1, 1304, arch="llama2-13b"), LG["lora_13b"]),
    "lg_qlora": (lambda: lg_step(8, 1, 1304, quant="nf4"), LG["qlora"]),
    "lg_hub_lora": (lambda: lg_step(32, 2, 512), LG_HUB["lora"]),
    "lg_hub_qlora": (lambda: lg_step(32, 2, 512, quant="nf4"), LG_HUB["qlora"]),
    "hf_bert": (lambda: bert_large_ledger(batch_size=4, seq_len=512).judged_bytes() + HF_CONTEXT, HF_BERT),
    # BERT-large's parameters through the allocator: the word embeddings in 60 x 2 MiB, 48 MLP weights of 16 MiB,
    # the positions and 97 weights of 4 MiB in 20 segments of 20 MiB, the small tensors in one 2 MiB segment
    "hf_bert_load": (lambda: 60 * 2 * MiB + 48 * 16 * MiB + 20 * 20 * MiB + 2 * MiB + HF_CONTEXT, HF_BERT_LOAD),
}


def published_within(text):
    """How many of the 16 published readings lie within 5 % of the predictions written out above (the torchtune LoRA
    rows of rank 8 on all and rank 64 on q and v, the LitGPT batch-2 and nf4-dq rows, computed the same way)."""
    errors = [Fraction(p() - m, m) for p, m in PUBLISHED_ERRORS.values()] + [
        Fraction(tt_step(8, ALL7 + ("lm_head",)) - TT_DOCS[1], TT_DOCS[1]),
        Fraction(tt_step(64, QV) - TT_DOCS[2], TT_DOCS[2]),
        Fraction(lg_step(8, 2, 1304) - LG["lora_b2"], LG["lora_b2"]),
        Fraction(lg_step(8, 1, 1304, quant="dq") - LG["qlora_dq"], LG["qlora_dq"])]
    n = sum(abs(e) <= Fraction(5, 100) for e in errors)
    if int(text.replace(",", "")) != n:
        return f"{text}: {n} of the readings lie within 5 %"

#: glue key -> (exact value, unit as printed), or a check: a function of the glued text that returns what is
#: wrong with it (None if nothing), for values no source prints (the largest batch that fits: it must fit, and
#: one more must not, by arithmetic written here). Sources: the article's arithmetic, vendors' data sheets,
#: the papers cited in the chapters.
# --- chapter 19: one LLaMA-2-7B layer (d 4096, H 32, F 11008), BF16, B 1, S 1024, in each library's own model code:
# the PyTorch measurements of docs/implementations.md (transformers 5.25, torchtune 0.6.1, LitGPT 0.5.13, each built
# from its config under FakeTensorMode, saved-tensor hooks by storage), and arithmetic on the shapes as the libraries'
# sources save them (transformers modeling_llama.py, torchtune modules/rms_norm.py, litgpt/model.py) -------------------
MC_B, MC_S, MC_D, MC_H = 1, 1024, 4096, 32
MC_BSD = MC_B * MC_S * MC_D
MC_LAYER = {"hf_sdpa": 190_980_096, "hf_eager": 392_175_616, "torchtune": 207_757_312, "litgpt": 232_955_904,
            "reference_cpu": 207_757_312, "reference_cuda": 157_425_664}
MC_TORCHTUNE_NORMS = 2 * (4 * MC_BSD + 4 * MC_B * MC_S + 4 * MC_BSD)    # FP32 input, FP32 statistic, FP32 x * rstd
H100_ROOM_MC = 81559 * MiB - MARGIN                                         # nvidia-smi's H100 80 GB, less the margin


def mc_peak(implementation, seq) -> int:
    """The peak of chapter 17's first rung (LLaMA-2 7B, BF16 AdamW, nothing checkpointed, FlashAttention) on CUDA,
    the step built from a Ledger with the library's implementation."""
    from memledger.ledger.ledger import Ledger
    return Ledger("llama2-7b", recipe="bf16-pure-adamw", seq_len=seq, flash_attention=True,
                  implementation=implementation).step("cuda").peak.bytes


def mc_chapter17(seq) -> int:
    """Chapter 17's first rung as its knob_step books it: the reference decoder with torchtune's composite norm."""
    return knob_step(seq).bytes


def mc_longest(implementation) -> int:
    return 1024 * largest(lambda n: mc_peak(implementation, 1024 * n) <= H100_ROOM_MC)


def mc_litgpt_more():
    """What LitGPT's 32 layers keep beyond torchtune's at torchtune's longest sequence, measured (PyTorch)."""
    from memledger.pytorch.torchtune_litgpt import layer_saved
    width = dict(d=4096, H=32, F=11008, V=32000, batch=1, seq=mc_longest("torchtune"))
    more = layer_saved("litgpt", "Llama-2-7b-hf", **width)["layer"] - layer_saved("torchtune", "llama2", **width)["layer"]
    return Fraction(32 * more, GB), "GB"


def mc_eager_measured():
    from memledger.pytorch.libraries import saved_per_layer
    width = dict(d=4096, H=32, F=11008, V=32000, batch=1, seq=2048)
    eager = saved_per_layer("hf", **width, attn="eager")["layer"] - saved_per_layer("hf", **width, attn="sdpa")["layer"]
    return Fraction(eager, 10**6), "MB"


def mc_fused_warning(text):
    """PyTorch's own warning from rms_norm_symint (aten/src/ATen/native/layer_norm.cpp) on mixed dtypes."""
    if "dispatch to fused implementation" not in text or "layer_norm.cpp" not in text:
        return f"{text!r} is not PyTorch's fallback warning from layer_norm.cpp"


EXPECTED = {
    "gpu.a100": (80, "GB"),                                                  # NVIDIA A100 80GB data sheet
    "gpu.rtx4090": (24, "GB"),                                               # NVIDIA RTX 4090 specifications
    "gpu.a100_mib": (81920, "MiB"), "gpu.a100_gib": (80, "GiB"),            # nvidia-smi's total (sources above)
    "gpu.a100_real": (Fraction(A100_REAL, GB), "GB"),
    "gpu.rtx4090_real": (Fraction(RTX_REAL, GB), "GB"), "gpu.h100_mib": (81559, "MiB"),
    "offload_only.gpu": (Fraction(4 * P + ACT + OVERHEAD, GB), "GB"),         # 14 + 14 + 30.6 + 2
    # chapter 2: GPT blocks of 12d^2 + 13d (Korthikanti et al. 2022), a tied 32000 x d embedding, a final LayerNorm
    "params.article_blocks": (Fraction(LAYERS * (12 * 4096**2 + 13 * 4096), 10**9), "billion"),
    "params.article_total": (Fraction(LAYERS * (12 * 4096**2 + 13 * 4096) + 32000 * 4096 + 2 * 4096, 10**9), "billion"),
    "spec.vocab": (32000, ""),                                               # LLaMA-2's vocabulary
    "params.llama2_7b": (6_738_415_616, ""),                                 # the released Llama-2-7b checkpoint
    "params.llama2_7b_b": (Fraction(6_738_415_616, 10**9), "billion"),
    # chapter 3
    "bf16.spacing": (Fraction(1, 2**7), ""),                                 # 7 fraction bits: spacing 2^-7 in [1, 2)
    "recipe.fp32_grads": (2 + 4 + 12, "B/param"),                            # HF "model memory anatomy": 18
    "recipe.sgd": (2 + 2 + 8, "B/param"),                                    # Transformer Math 101: master + momentum
    "recipe.adam8bit": (2 + 2 + 6, "B/param"),                               # Transformer Math 101: master + 1 + 1
    "states.gib": (Fraction(STATES, GiB), "GiB"),
    "states.llama2_7b": (Fraction(16 * 6_738_415_616, GB), "GB"),
    # chapter 4: Korthikanti's inventory at the spec, and its variants
    "act.layer_bytes": (BSD * 114, "bytes"),
    "act.layer_mib": (Fraction(BSD * 114, MiB), "MiB"),
    "act.layer_gib": (Fraction(BSD * 114, GiB), "GiB"),
    "act.total_gib": (Fraction(ACT, GiB), "GiB"),
    "act.nodrop_total": (Fraction(LAYERS * BSD * (32 + 2 * 32 * 2048 // 4096), GB), "GB"),   # no masks, one S^2 tensor less
    "act.flash_total": (Fraction(LAYERS * (BSD * 34 + 4 * 32 * 2048), GB), "GB"),            # 34 BSd + FP32 log-sum-exp
    "act.llama_total": (Fraction(LAYERS * 2 * 2048 * (4 * 11008 + 32 * 2048 + 8 * 4096), GB), "GB"),  # 2BS(4F + HS + 8d)
    # the FP32 log-softmax of the logits, 4BSV (Korthikanti Sec. 4.3), against full checkpointing's 2LBSd
    "logits.spec": (Fraction(4 * 2048 * 32000, GB), "GB"),
    "logits.vs_ckpt": (Fraction(4 * 32000, 2 * LAYERS * 4096), "x"),
    # chapter 5: the longest sequence with offloading and full checkpointing, by the sum (the whole model) and by
    # what fit judges for the nominal 7x10^9 (the larger of the step's peak and the sum), on nvidia-smi's A100
    "seq.full_sum": fits_at_answer_not_beyond(lambda s: offload_full_sum(1, s), A100_ROOM),
    "seq.full_peak": fits_at_answer_not_beyond(lambda s: offload_full_peak(1, s), A100_ROOM),
    # ... and with selective recomputation (the S x S tensors recomputed: live again in one layer's backward)
    "seq.selective_sum": fits_at_answer_not_beyond(offload_selective_sum, A100_ROOM),
    "seq.selective_peak": fits_at_answer_not_beyond(lambda s: step_peak(
        arch=counted_article(), seq_len=s, recompute="selective", offload_optimizer="cpu"), A100_ROOM),
    # chapter 5's definition of a fit: the counted parameters, the margin
    "params.counted": (P_COUNTED, ""), "fit.margin": (1, "GB"),
    # chapter 6: gradients, master, Adam and activations against the 66 GB beside the weights
    "headroom.times": (Fraction(STATES - 2 * P + ACT, 80 * GB - 2 * P), "x"),
    # what lies outside the blocks (the reference decoder), and the whole model's ledger
    "outside.total": (Fraction(ARTICLE_OUTSIDE, GB), "GB"),
    "outside.log_softmax": (Fraction(4 * 2048 * 32000, GB), "GB"),
    "ledger.model_total": (Fraction(STATES + ACT + ARTICLE_OUTSIDE + OVERHEAD, GB), "GB"),
    # chapter 7: full checkpointing keeps L x BSd x 2 (article); selective keeps 34 BSd per layer (Korthikanti)
    "ckpt.gib": (Fraction(2 * LAYERS * BSD, GiB), "GiB"),
    "ckpt.selective_total": (Fraction(34 * LAYERS * BSD, GB), "GB"),
    # extra FLOPs over the model FLOPs 72BLSd^2(1 + S/6d + V/12dL): one more forward of the two S^2 matmuls
    # (4BS^2d per layer), and Korthikanti's hardware-FLOPs formula (S/6d -> S/3d)
    "ckpt.selective_flops": (100 * MODEL_FLOPS_S2 / 3 / MODEL_FLOPS_TERMS, "%"),
    "ckpt.selective_flops_paper": (100 * MODEL_FLOPS_S2 / MODEL_FLOPS_TERMS, "%"),
    # chapter 8: ZeRO-Offload moves 2P down and 2P up per step (Ren et al. 2021); the article's links
    "offload.traffic": (Fraction(4 * P, GB), "GB"),
    "offload.seconds": (Fraction(4 * P, 32 * GB), "s"),
    "offload.seconds_duplex": (Fraction(2 * P, 32 * GB), "s"),
    "offload.article_seconds": (Fraction(84, 32), "s"),                      # the article's 84 GB at 32 GB/s
    "offload.zero_gpu": (Fraction(2 * P + 2 * LAYERS * BSD + OVERHEAD, GB), "GB"),
    "offload.zero_cpu": (Fraction((2 + 12) * P, GB), "GB"),
    "link.pcie4": (32, "GB/s"), "link.nvme3": (3, "GB/s"), "link.nvme7": (7, "GB/s"),
    "offload.nvme_gb": (Fraction(2 * 12 * P, GB), "GB"),                    # FP32 states read and written
    "offload.nvme_seconds_slow": (Fraction(24 * P, 3 * GB), "s"),
    "offload.nvme_seconds_fast": (Fraction(24 * P, 7 * GB), "s"),
    # chapter 9: the largest micro-batch of 2048-token sequences on nvidia-smi's A100, the whole model summed
    # (14 + 14 + 2 GB resident, the checkpoints or all activations and what lies outside the blocks per sequence),
    # and by the step's peak
    "together.max_batch": fits_at_answer_not_beyond(lambda n: offload_full_sum(n, 2048), A100_ROOM),
    "offload.max_batch": fits_at_answer_not_beyond(offload_alone_sum, A100_ROOM),
    "together.max_batch_peak": fits_at_answer_not_beyond(lambda n: offload_full_peak(n, 2048), A100_ROOM),
    # chapter 5's fit names AdamW's for-loop; CUDA's default foreach adds its temporaries at the peak
    "together.ckpt_over": lazy(lambda: Fraction(step_peak(arch=counted_article(), recompute="full") - A100_REAL, GB),
                               "GB"),
    "together.ckpt_over_foreach": lazy(lambda: Fraction(step_peak(True, arch=counted_article(), recompute="full")
                                                        - A100_REAL, GB), "GB"),
    "offload.max_batch_peak": fits_at_answer_not_beyond(offload_alone_peak, A100_ROOM),
    # chapter 1's design exercise: the same run, by the peak
    "ex1.design_batch": fits_at_answer_not_beyond(lambda n: offload_full_peak(n, 2048), A100_ROOM),
    "ex1.design_peak": (Fraction(offload_full_peak(DESIGN_B, 2048), GB), "GB"),
    "ex1.design_next": (Fraction(offload_full_peak(DESIGN_B + 1, 2048), GB), "GB"),
    "ex1.design_offload": fits_at_answer_not_beyond(offload_alone_peak, A100_ROOM),
    # chapter 2's: the deepest ZeRO-3 model of the shape on eight A100s; n GPT blocks, the tied embedding, a norm
    "ex2.layers": fits_at_answer_not_beyond(lambda n: step_peak(arch=counted_article(n_layers=n), zero_stage=3, dp=8,
                                                                recompute="full"), A100_ROOM),
    "ex2.params_b": lazy(lambda: Fraction(deepest_article_shape() * BLOCK + VOC * D + 2 * D, 10**9), "billion"),
    "ex2.peak": lazy(lambda: Fraction(step_peak(arch=counted_article(n_layers=deepest_article_shape()), zero_stage=3,
                                                dp=8, recompute="full"), GB), "GB"),
    "ex2.next": lazy(lambda: Fraction(step_peak(arch=counted_article(n_layers=deepest_article_shape() + 1),
                                                zero_stage=3, dp=8, recompute="full"), GB), "GB"),
    # chapter 4: the tensors one block keeps (Korthikanti Sec. 4.1: the Q/K/V input, Q, K, softmax output, its
    # dropout mask and output, V, the projection input, its dropout mask, the MLP input, the GeLU input and output,
    # the MLP dropout mask, two LayerNorm inputs), Eq. 1 at the spec
    "act.saved_count": (15, ""), "act.saved_mib": (Fraction(BSD * 114, MiB), "MiB"),
    # chapter 7's design exercise: LLaMA-2 13B, S = 8192, FlashAttention, ZeRO-3 over 8 A100 40GB (nvidia-smi)
    "gpu.a100_40_real": (Fraction(A100_40_REAL, GB), "GB"),
    "ex7.full_peak": lazy(lambda: Fraction(step_peak(recompute="full", **LLAMA13), GB), "GB"),
    "ex7.dp": fits_from_answer_not_below(lambda n: step_peak(recompute="full", **{**LLAMA13, "dp": n}), A100_40_ROOM),
    "ex7.batch": fits_at_answer_not_beyond(lambda b: step_peak(batch_size=b, recompute="full", offload_optimizer="cpu",
                                                               **LLAMA13), A100_40_ROOM),
    "ex7.batch_peak": lazy(lambda: Fraction(step_peak(batch_size=llama13_offload_batch(), recompute="full",
                                                      offload_optimizer="cpu", **LLAMA13), GB), "GB"),
    "ex7.next_peak": lazy(lambda: Fraction(step_peak(batch_size=llama13_offload_batch() + 1, recompute="full",
                                                     offload_optimizer="cpu", **LLAMA13), GB), "GB"),
    "ex7.selective_peak": lazy(lambda: Fraction(step_peak(recompute="selective", offload_optimizer="cpu", **LLAMA13),
                                                GB), "GB"),
    # chapter 8: DeepSpeed's offload keeps FP32 gradients on the host (16 B/param), its estimator x 1.5
    "offload.ds_host": (Fraction(16 * P, GB), "GB"), "offload.ds_estimate": (Fraction(24 * P, GB), "GB"),
    # chapter 10: DDP's buckets, one BF16 copy of every gradient
    "dp.buckets": (Fraction(2 * P, GB), "GB"),
    # AdamW on the host: read the 2-byte gradient, read and write 12 bytes of FP32 state, write the 2-byte weight,
    # at the 204.8 GB/s of 8 DDR4-3200 channels (Tom's Hardware, 2021-12-09)
    "host.bandwidth": (Fraction(2048, 10), "GB/s"),
    "cpu_adam.bytes": (Fraction(28 * P, GB), "GB"),
    "cpu_adam.seconds": (Fraction(28 * P, 204_800_000_000), "s"),
    # chapter 13: every convention's own arithmetic for the article's 7B (B = 1, S = 2048, one GPU)
    "calc.memledger": (Fraction(STATES + ACT + OUTSIDE, GB), "GB"),
    "calc.act.outside": (Fraction(OUTSIDE, GB), "GB"),
    "calc.low": (Fraction(2 * 4 * P, GB), "GB"),                            # accelerate: optimizer phase, 2 x fp32 size
    "calc.high": (Fraction(20 * P + ACT, GB), "GB"),                        # Playbook with FP32 grad accumulation
    "calc.ratio": (Fraction(20 * P + ACT, 8 * P), "x"),
    "calc.bpp.hf": (6 + 8 + 4, "B/param"),                                  # HF model_memory_anatomy.md: 18 bytes
    "calc.bpp.zero2": (2 + 2 + 4 + 4 + 8, "B/param"),                       # DeepSpeed stage_1_and_2.py l. 2445
    "calc.bpp.zero3": (18 + Fraction(4 * 32000 * 4096, P), "B/param"),     # stage3.py: 4 x largest layer + 18P/N
    "calc.bpp.accelerate": (8, "B/param"),
    "calc.largest": (32000 * 4096, ""),                                     # the embedding, V x d
    "calc.ds.printed": (Fraction(20 * P, GiB), "GiB"),                      # DeepSpeed prints x / 2^30 as "GB"
    "calc.ds.gb": (Fraction(20 * P, GB), "GB"),
    "calc.ds.cpu": (Fraction(4 * P * 3, 2 * GB), "GB"),                     # P x 4 x GPUs per node x 1.5
    "calc.ds.buffer": (Fraction(3, 2), ""),                                 # additional_buffer_factor=1.5
    "calc.acc.sum": (4 * (1 + Fraction(3, 2) + 2 + 2), "B/param"),          # model S, grads 1.5S, optimizer 2S, step 2S
    "calc.acc.printed": (Fraction(8 * P, GiB), "GiB"),
    # Megatron counts L(4d^2 + 2dF + 4d) + Vd + 2d: no biases, tied embedding (theoretical_memory_usage.py)
    "calc.megatron.params": (Fraction(32 * (4 * 4096**2 + 2 * 4096 * 16384 + 4 * 4096) + 32000 * 4096 + 2 * 4096,
                                      10**9), "billion"),
    "calc.act.ours": (Fraction(ACT, GB), "GB"),
    "calc.act.zero": (Fraction(24 * LAYERS * BSD, GB), "GB"),               # ZeRO Sec. 3.2: ~12 x hidden 2-byte values
    "calc.act.bekman": (Fraction(LAYERS * 28 * 2 * BSD + 4 * 2048 * 32000, GB), "GB"),   # 28 copies + fp32 logits
    "calc.act.copies": (28, ""),                                            # Bekman: Llama-3.1-8B, 28 copies
    # Megatron without SP: 1.05 x [SBd(10 + 24) L + 8SB + SBd + 2(SBV + SBd)]
    "calc.act.megatron": (Fraction(105, 100) * (34 * LAYERS * BSD + 8 * 2048 + BSD + 2 * (2048 * 32000 + BSD))
                          / GB, "GB"),
    "calc.act.meg_per": (10 + 24, ""), "calc.act.kept_per": (34 + 5 * 32 * 2048 // 4096, ""),
    # DeepSpeed memory.rst line 30 prints 15.93GB for t5-3b (2,851,598,336 parameters) on 8 GPUs
    "calc.ds.docs": (Fraction(4 * 2_851_598_336 + 16 * 2_851_598_336 // 8, GiB), "GiB"),
    "calc.ds.code": (Fraction(2 * 2_851_598_336 + 18 * 2_851_598_336 // 8, GiB), "GiB"),
    "calc.ex1.base": (Fraction(6_738_415_616 - 32000 * 4096, 10**9), "billion"),
    "calc.ex1.gb": (Fraction(8 * (6_738_415_616 - 32000 * 4096), GB), "GB"),
    "calc.ex1.gib": (Fraction(8 * (6_738_415_616 - 32000 * 4096), GiB), "GiB"),
    "calc.ex1.head": (32000 * 4096, ""),
    "gpu.rtx4090.smi": (24564, "MiB"),                                       # nvidia-smi (RLinf/RLinf issue #255)
    "calc.ex2.gpus": (ZERO3_GPUS, ""),
    "calc.ex2.at": (Fraction(4 * 32000 * 4096 + 18 * P // ZERO3_GPUS, GB), "GB"),
    "calc.ex2.before": (Fraction(4 * 32000 * 4096 + 18 * P // (ZERO3_GPUS - 1), GB), "GB"),
    "calc.ex3.cookbook": (Fraction(34 * LAYERS * BSD, GB), "GB"),
    "calc.ex3.full": (Fraction(2 * LAYERS * BSD, GB), "GB"),
    # errata appendix: accelerate's docs print 413.18 MB for bert-base-cased in float32 (model_size_estimator.md
    # line 127); ZeRO Sec. 3.2's GPT-2 1.5B (48 layers, hidden 1600, seq 1024, batch 32): one 2-byte checkpoint per
    # layer, plus one layer of its own ~12 x hidden 2-byte values recomputed
    "errata.acc.fp32": (Fraction("413.18"), "MiB"),
    "errata.zero.checkpoints": (Fraction(2 * 32 * 1024 * 1600 * 48, GB), "GB"),
    "errata.zero.with": (Fraction(2 * 32 * 1024 * 1600 * 48 + 2 * 12 * 1600 * 32 * 1024, GB), "GB"),
    # chapter 15: LLaMA-2 7B (6,738,415,616 parameters, d 4096, F 11008, H 32, L 32, V 32000) at B = 1, S = 2048
    "ft.full": (Fraction(16 * LLAMA + LLAMA_ACT + OVERHEAD, GB), "GB"),
    "ft.outside": (Fraction(OUTSIDE, GB), "GB"),
    "ft.pure.total": (Fraction(8 * LLAMA + LLAMA_ACT + OVERHEAD, GB), "GB"),     # 2 + 2 + 2 + 2, BF16 moments
    "ft.adam8.bpp": (2 + 2 + 4 + 2 * (1 + Fraction(4, 256)), "B/param"),  # bitsandbytes: uint8 + fp32 absmax / 256
    "ft.adam8.total": (Fraction(4 * LLAMA + ADAM8 + LLAMA_ACT + OVERHEAD, GB), "GB"),
    "ft.nomaster.total": (Fraction(4 * LLAMA + ADAM8 - 4 * LLAMA + LLAMA_ACT + OVERHEAD, GB), "GB"),
    "ft.adafactor.states": (Fraction(ADAFACTOR, 10**6), "MB"),
    "ft.adafactor.total": (Fraction(4 * LLAMA + ADAFACTOR + LLAMA_ACT + OVERHEAD, GB), "GB"),
    # LoRA (Hu et al. 2021, Sec. 7.1): |Theta| = 2 x (adapted matrices) x d x r
    "ft.lora.trainable": (2 * (2 * 32) * 4096 * 16, ""),
    "ft.lora.share": (Fraction(100 * 2 * 64 * 4096 * 16, LLAMA), "%"),
    "ft.lora.states": (Fraction(2 * LLAMA + 16 * 2 * 64 * 4096 * 16, GB), "GB"),
    "ft.gpt3.trainable": (2 * (2 * 96) * 12288 * 4, ""),                     # the paper's "18M"
    "ft.gpt3.frozen": (Fraction(2 * GPT3, GB), "GB"),                        # the paper's "350GB"
    "ft.gpt3.adapter_mb": (Fraction(2 * 2 * 192 * 12288 * 4, 10**6), "MB"),  # the paper's "35MB"
    # saved per layer: full 16BSd + 8BSF + 2BHS^2; LoRA on Q, V drops 2BSd + 2BSd + 2BSF, adds 2 x 2BSr
    "ft.lora.act": (Fraction(32 * 2048 * (12 * 4096 + 6 * 11008 + 2 * 32 * 2048 + 2 * 2 * 16), GB), "GB"),
    "ft.qlora.act": (Fraction(QLORA_ACT, GB), "GB"),
    # QLoRA (Dettmers et al. 2023, Sec. 3): 32/64 = 0.5 bits of constants, 8/64 + 32/(64 x 256) = 0.127
    "ft.nf4.bits": (4 + Fraction(8, 64) + Fraction(32, 64 * 256), "bits"),
    "ft.nf4.single": (Fraction(32, 64), "bits"),
    "ft.nf4.double": (Fraction(8, 64) + Fraction(32, 64 * 256), "bits"),
    "ft.qlora.base": (Fraction(nf4(PROJ7) + 2 * (LLAMA - PROJ7), GB), "GB"),
    "ft.lora.base": (Fraction(2 * LLAMA, GB), "GB"),
    "ft.q65.base": (Fraction(nf4(PROJ65) + 2 * (P65 - PROJ65), GB), "GB"),
    "ft.q65.total": (Fraction(nf4(PROJ65) + 2 * (P65 - PROJ65) + ADAPT_32 * A65 + 2 * 512 * 8192 * 80 + OVERHEAD,
                              GB), "GB"),
    "ft.qlora.none": (Fraction(QLORA_NONE, GB), "GB"),
    "ft.qlora.full": (Fraction(QLORA_FULL, GB), "GB"),
    "ft.qlora.margin": (Fraction(RTX_SMI - QLORA_FULL, GB), "GB"),
    "ft.qlora.none_verdict": verdict_says("does not fit: ", lambda: QLORA_NONE - RTX_SMI),
    "ft.qlora.full_verdict": verdict_says("fits, ", lambda: RTX_SMI - QLORA_FULL),
    "ft.qlora.adapter_bpp": (ADAPT_32, "B/param"),
    "ft.one_layer": (Fraction(LLAMA_ACT, 32 * GB), "GB"),
    "ft.serve.total": (Fraction(2 * LLAMA + KV7 + WORK7 + OVERHEAD, GB), "GB"),
    "ft.serve.kv": (Fraction(KV7, GB), "GB"),
    "ft.train_vs_serve": (Fraction(16 * LLAMA + LLAMA_ACT + OVERHEAD, 2 * LLAMA + KV7 + WORK7 + OVERHEAD), "x"),
    "ft.kv_ratio": (Fraction(16 * 4096 + 8 * 11008 + 2 * 32 * 2048, 4 * 4096), "x"),
    "ft.ex1.total": (Fraction(2 * LLAMA + 16 * A7 + 2 * 2048 * 4096 * 32 + OVERHEAD, GB), "GB"),
    "ft.ex1.trainable": (A7, ""),
    "ft.ex1.adapters": (Fraction(16 * A7, GB), "GB"),
    "ft.ex2.per_sequence": (Fraction(KV7 + WORK7, GB), "GB"),
    "ft.ex2.fixed": (Fraction(2 * LLAMA + OVERHEAD, GB), "GB"),
    "ft.ex2.batch": ((RTX_SMI - 2 * LLAMA - OVERHEAD) // (KV7 + WORK7), ""),
    "ft.ex3.gone": (Fraction(2 * 2 * 2048 * 4096, MiB), "MiB"),
    "ft.ex3.act": (Fraction(32 * 2048 * (16 * 4096 + 8 * 11008 + 2 * 32 * 2048 - 2 * 2 * 4096 + 3 * 2 * 16), GB), "GB"),
    # chapter 10: eight GPUs. Ring collectives send (N-1)/N of a tensor per GPU (Patarasuk & Yuan 2009); ZeRO's
    # per-GPU states 4P + 12P/N_d, 2P + 14P/N_d, 16P/N_d and traffic 2P, 3P (Rajbhandari et al. 2020, Sec. 5, 7);
    # Korthikanti et al. 2022, Table 2 and Sec. 4.2.3; the bubble (p - 1)/(vm) (Narayanan et al. 2021)
    "dp.sent": (Fraction(2 * P * 7 // 8 * 2, GB), "GB"),                     # BF16 gradients, all-reduced
    "zero1.states": (Fraction(4 * P + 12 * P // 8, GB), "GB"),
    "zero2.states": (Fraction(2 * P + 14 * P // 8, GB), "GB"),
    "zero3.states": (Fraction(16 * P // 8, GB), "GB"),
    "zero1.total": (Fraction(4 * P + 12 * P // 8 + ACT + OVERHEAD, GB), "GB"),
    "zero1.floor": (Fraction(4 * P, GB), "GB"),
    "zero2.floor": (Fraction(2 * P, GB), "GB"),
    "zero3.gather": (Fraction(4 * BLOCK, GB), "GB"),                        # DeepSpeed: 4 x largest_layer_params
    "zero3.sent": (Fraction(3 * P * 7 // 8 * 2, GB), "GB"),
    "zero3.ratio": (Fraction(3, 2), "x"),
    "tp.layer_mib": (Fraction(TP_LAYER, MiB), "MiB"),
    "tpsp.layer_mib": (Fraction(BSD * 114, 8 * MiB), "MiB"),                 # sbh(34 + 5as/h)/t
    "tp.total": (Fraction(16 * P // 8 + LAYERS * TP_LAYER + OVERHEAD, GB), "GB"),
    "tpsp.total": (Fraction(16 * P // 8 + ACT // 8 + OVERHEAD, GB), "GB"),
    "tp.sent": (Fraction(LAYERS * 4 * 2 * BSD * 7 // 8 * 2, GB), "GB"),      # 4 all-reduces of BSd per layer, BF16
    "pp.bubble": (Fraction(100 * 7, 32), "%"),
    "pp.bubble_interleaved": (Fraction(100 * 7, 2 * 32), "%"),
    "pp.first_act_interleaved": (Fraction(ACT, GB) * (1 + Fraction(7, 8 * 2)), "GB"),
    # p = 8: 4 blocks + the 32000 x d embedding; 8 micro-batches in flight of 4 layers, their int64 token ids and
    # 1-byte embedding dropout masks (Korthikanti Sec. 4.3)
    "pp.first": (Fraction(16 * (4 * BLOCK + 32000 * 4096) + ACT + 8 * (8 * 2048) + 8 * BSD + OVERHEAD, GB), "GB"),
    "ex.zero3_full_dp": (next(n for n in count(1) if zero3_full_sum(n) <= RTX_ROOM), ""),
    "ex.zero3_full_dp_peak": fits_from_answer_not_below(lambda n: step_peak(
        arch=counted_article(), zero_stage=3, dp=n, recompute="full"), RTX_ROOM),
    "ckpt.per_gpu": (Fraction(2 * LAYERS * BSD, GB), "GB"),
    "ex.tp_batch": fits_at_answer_not_beyond(lambda n: tp8_sum(n, False), A100_ROOM),
    "ex.tpsp_batch": fits_at_answer_not_beyond(lambda n: tp8_sum(n, True), A100_ROOM),
    "ex.tp_batch_peak": fits_at_answer_not_beyond(lambda n: step_peak(arch=counted_article(), batch_size=n, tp=8),
                                                  A100_ROOM),
    "ex.tpsp_batch_peak": fits_at_answer_not_beyond(lambda n: step_peak(
        arch=counted_article(), batch_size=n, tp=8, sequence_parallel=True), A100_ROOM),
    "ex.bubble_m": (7 * 20, ""),                                             # 7/m <= 1/20
    "ex.bubble_m_interleaved": (7 * 20 // 4, ""),                            # 7/(4m) <= 1/20
    "ex.interleaved_first": (Fraction(ACT, GB) * (1 + Fraction(7, 8 * 4)), "GB"),
    # chapter 14: counts as published, shapes from the configs, arithmetic above
    "gpu.l40s": (48, "GB"), "gpu.h100": (80, "GB"), "gpu.h200": (141, "GB"),  # NVIDIA L40S, H100, H200 data sheets
    "bert.positions": (512, ""),                                             # BERT's max_position_embeddings
    "real.llama3_params": (LLAMA3["P"], ""),
    "real.mixtral_b": (Fraction(MIXTRAL["P"], 10**9), "billion"),
    # active: six of the eight experts' 3dF per layer are idle for a token
    "real.mixtral_active_b": (Fraction(MIXTRAL["P"] - 32 * 6 * 3 * 4096 * 14336, 10**9), "billion"),
    "gqa.kv_mib": (Fraction(2 * 4096 * 8 * 128 * 2, MiB), "MiB"),
    "gqa.kv_repeat_mib": (Fraction(2 * 4096 * 32 * 128 * 2, MiB), "MiB"),
    "layer.llama3": (Fraction(layer(LLAMA3), GB), "GB"),
    "layer.llama3_repeat": (Fraction(layer(LLAMA3, repeat_kv=True), GB), "GB"),
    "kv.llama3": (Fraction(2 * 32 * 8192 * 8 * 128 * 2, GB), "GB"),         # 2 L B S H_kv d_h x 2 bytes
    "kv.llama3_mha": (Fraction(2 * 32 * 8192 * 32 * 128 * 2, GB), "GB"),
    "logits.llama3": (Fraction(4 * 4096 * LLAMA3["V"], GB), "GB"),         # 4BSV (Korthikanti Sec. 4.3)
    "logits.gemma": (Fraction(4 * 4096 * GEMMA["V"], GB), "GB"),
    "logits.gemma_layers": (Fraction(4 * 4096 * GEMMA["V"], layer(GEMMA)), "x"),
    "tied.gemma_params": (256000 * 3072, ""),
    "tied.gemma_extra": (Fraction(16 * 256000 * 3072, GB), "GB"),
    "embed.qwen_share": (Fraction(100 * 2 * 152064 * 3584, QWEN["P"]), "%"),
    "moe.states_ratio": (Fraction(MIXTRAL["P"], MISTRAL["P"]), "x"),
    "moe.states_mixtral": (Fraction(16 * MIXTRAL["P"], GB), "GB"),
    "moe.act_ratio": (Fraction(layer(MIXTRAL), layer(MISTRAL)), "x"),
    "fit.measure": measure_is(SUM), "fit.measure_peak": measure_is(PEAK),
    "fit.llama3_80": fits_at_answer_not_beyond(lambda n: zero3_peak("llama3-8b", B=n), H100_ROOM),
    "fit.llama3_rtx_peak": lazy(lambda: Fraction(zero3_peak("llama3-8b", S=1), GiB), "GiB"),  # > RTX_REAL: no length
    "gpu.rtx4090_gib": (Fraction(RTX_REAL, GiB), "GiB"),
    "fit.mistral_80_sum": fits_at_answer_not_beyond(lambda n: zero3_total(MISTRAL, B=n), H100_ROOM),
    "fit.mistral_room_sum": (Fraction(H100_REAL - zero3_total(MISTRAL, B=MISTRAL_B80), GB), "GB"),
    "fit.mistral_80": fits_at_answer_not_beyond(lambda n: zero3_peak("mistral-7b", B=n), H100_ROOM),
    "fit.mistral_room": lazy(lambda: Fraction(H100_REAL - zero3_peak("mistral-7b", B=largest(
        lambda n: zero3_peak("mistral-7b", B=n) <= H100_ROOM)), GB), "GB"),
    "logits.mistral_batch": (Fraction(MISTRAL_B80 * 4 * 4096 * MISTRAL["V"], GB), "GB"),     # logits.float()
    "fit.llama2_80": fits_at_answer_not_beyond(llama2_zero3_peak, H100_ROOM),
    "fit.llama2_room": lazy(lambda: Fraction(H100_REAL - llama2_zero3_peak(largest(
        lambda n: llama2_zero3_peak(n) <= H100_ROOM)), GB), "GB"),
    "fit.mixtral_states_gpu": (Fraction(16 * -(-MIXTRAL["P"] // 8), GB), "GB"),
    "act.llama3_seq": (Fraction(32 * layer(LLAMA3), GB), "GB"),
    # serving (memledger.ledger.inference's stated convention): 2P weights, the KV cache, one layer's prefill buffer
    # 2(2Sd + S(2q + 2kv) + 3SF) + 4V, the overhead
    "infer.llama3_total": (Fraction(2 * LLAMA3["P"] + 2 * 32 * 8192 * 1024 * 2 + 2 * (2 * 8192 * 4096 + 8192 * (
        2 * 4096 + 2 * 1024) + 3 * 8192 * 14336) + 4 * LLAMA3["V"] + OVERHEAD, GB), "GB"),
    "states.llama3": (Fraction(16 * LLAMA3["P"], GB), "GB"),
    "ex.llama3_tied_params": (128256 * 4096, ""),
    "ex.llama3_tied_saving": (Fraction(16 * 128256 * 4096, GB), "GB"),
    "ex.qwen_group": (28 // 4, ""),
    "ex.qwen_repeat_mib": (Fraction(layer(QWEN, repeat_kv=True) - layer(QWEN), MiB), "MiB"),
    "ex.qwen_cache": (Fraction(2 * 28 * 32768 * 4 * 128 * 2, GB), "GB"),
    "ex.qwen_cache_mha": (Fraction(2 * 28 * 32768 * 28 * 128 * 2, GB), "GB"),
    "gpu.h200_mib": (143771, "MiB"), "gpu.h200_real": (Fraction(H200_REAL, GB), "GB"),
    "ex.h200_batch": fits_at_answer_not_beyond(llama3_ckpt_sum, H200_ROOM),
    "ex.h200_room": (Fraction(H200_REAL - llama3_ckpt_sum(H200_CKPT), GB), "GB"),
    "ex.h200_peak_room": lazy(lambda: Fraction(H200_REAL - step_peak(**LLAMA3_CKPT), GB), "GB"),
    "ex.h200_verdict": verdict_says("no fit: ", lambda: H200_REAL - step_peak(**LLAMA3_CKPT)),
    "ex.h200_foreach": lazy(lambda: Fraction(step_peak(foreach=True, **LLAMA3_CKPT), GB), "GB"),
    "ex.h200_logits": (Fraction(H200_CKPT * 4 * 4096 * LLAMA3["V"], GB), "GB"),
    "ex.h200_per_param": (2 + 4 + 4 + 4 + 4, "B/param"),                 # BF16 weights, masters, m, v, FP32 grads
    "ex.h200_peak": lazy(lambda: Fraction(step_peak(**LLAMA3_CKPT), GB), "GB"),
    "ex.llama3_ckpt_seq": (Fraction(32 * 2 * 4096 * 4096, GB), "GB"),
    # chapter 11: the step of the article's run (B = 1, S = 2048, bf16-adamw, the article's conventions)
    "peak.a100": (80, "GiB"),                                                # nvidia-smi: 81,920 MiB
    "peak.params": (P_COUNTED, ""),
    "peak.plain_sum": (Fraction(16 * P_COUNTED + act(1, 2048) + article_outside(1, 2048) + OVERHEAD, GB), "GB"),
    # at log_softmax's backward: weights, masters, moments (14 B/param), every activation, two FP32 B x S x V
    "peak.plain": (Fraction(14 * P_COUNTED + act(1, 2048) + article_outside(1, 2048) + 2 * 4 * 2048 * VOC + OVERHEAD, GB),
                   "GB"),
    "peak.grads_booked": (Fraction(2 * P_COUNTED, GB), "GB"),
    "peak.logits_fp32": (Fraction(4 * 2048 * VOC, GB), "GB"),
    "peak.per_param": (2 + 4 + 4 + 4 + 4, "B/param"),                     # HF "model memory anatomy": 18
    "peak.adam_temps": (Fraction(2 * 4 * VOC * D, GB), "GB"),               # two FP32 temporaries of the embedding
    "peak.full_sum": (Fraction(16 * P_COUNTED + LAYERS * 2 * 2048 * D + article_outside(1, 2048) + OVERHEAD, GB), "GB"),
    "peak.full": (Fraction(18 * P_COUNTED + 2 * 4 * VOC * D + OVERHEAD + 16 * 2048, GB), "GB"),
    "peak.seq_sum": fits_at_answer_not_beyond(lambda s: offload_full_sum(1, s), A100_ROOM),
    "peak.seq": fits_at_answer_not_beyond(lambda s: offload_full_peak(1, s), A100_ROOM),
    "peak.seq_ratio": (Fraction(SEQ_SUM, SEQ_PEAK), "x"),
    "peak.seq_scores": (Fraction(7 * HEADS * SEQ_PEAK**2, GB), "GB"),
    "peak.batch_sum": fits_at_answer_not_beyond(lambda b: offload_full_sum(b, 2048), A100_ROOM),
    "peak.batch": fits_at_answer_not_beyond(lambda b: offload_full_peak(b, 2048), A100_ROOM),
    "ex.peak_alone_seq": fits_at_answer_not_beyond(offload_peak, A100_ROOM),
    "ex.peak_sum_seq": fits_at_answer_not_beyond(offload_sum, A100_ROOM),
    # AdamW as CUDA runs it by default (foreach): _foreach_sqrt of every FP32 second moment beside the 18 B/param
    "peak.foreach_temp": (Fraction(4 * P_COUNTED, GB), "GB"),
    "peak.foreach": (Fraction(22 * P_COUNTED + OVERHEAD + 16 * 2048, GB), "GB"),
    "peak.foreach_per_param": (2 + 4 + 4 + 4 + 4 + 4, "B/param"),
    "ex.peak_alone_peak": (Fraction(offload_peak(SEQ_ALONE), GB), "GB"),
    "ex.peak_alone_sum": (Fraction(offload_sum(SEQ_ALONE), GB), "GB"),
    # pure BF16 AdamW (2 + 2 + 2 + 2 B/param), full checkpointing: block 0's backward; the step: + two BF16
    # temporaries of the embedding
    "ex.pure_peak": (Fraction(6 * P_COUNTED + GRADS_AT_BLOCK0 + OVERHEAD + recomputed_block0(2048), GB), "GB"),
    "ex.pure_optimizer": (Fraction(8 * P_COUNTED + 2 * 2 * VOC * D + OVERHEAD + 16 * 2048, GB), "GB"),
    "ex.vocab_logits": (Fraction(4 * 8192 * 128256, GB), "GB"),             # 4BSV
    "ex.vocab_checkpoints": (Fraction(32 * 2 * 8192 * 4096, GB), "GB"),     # 2BSdL
    # chapter 12: PyTorch's own measurements, and arithmetic on the small block (B = 2, S = 32, d = 64, H = 4)
    "saved.rows": Measured(lambda: (len(saved_storages(2)[1]), "")),
    "saved.measured": Measured(lambda: (sum(b for b, _, _ in saved_storages(2)[1]), "bytes")),
    "saved.outside": Measured(lambda: (sum(b for b, _, _ in saved_storages(2)["outside"]), "bytes")),
    "saved.article": (2 * 32 * 64 * (34 + Fraction(5 * 4 * 32, 64)), "bytes"),    # Eq. 1
    "ladder.gpt_masks": ((2 - 1) * (2 * 4 * 32 * 32 + 2 * 2 * 32 * 64), "bytes"),   # 3 masks, 1 byte more each
    "ladder.gpt_stats": (2 * 2 * 2 * (2 * 32), "bytes"),                       # 2 norms x mean, rstd x BF16 x BS
    "ladder.llama_flash": (2 * 2 * 4 * 32 * 32 - 4 * 2 * 4 * 32, "bytes"),      # - BF16 softmax + FP32 log-sum-exp
    "ladder.llama_composite": (2 * (8 - 2) * 2 * 32 * 64, "bytes"),            # FP32 copy + FP32 x*rstd vs BF16 input
    "mt.before": (Fraction(6 * 6_738_415_616 + 4 * LLAMA2_TENSORS + 16 * 2048, GB), "GB"),   # BF16 w, m, v; counters
    "mt.after_forward": Measured(lambda: (Fraction(memtracker_llama(2048)["after forward"], GB), "GB")),
    "mt.peak": Measured(lambda: (Fraction(memtracker_llama(2048)["peak"], GB), "GB")),
    "mt.diff": Measured(memtracker_difference),
    "cuda.rmsnorm": (Fraction(65 * (8 - 2) * 2048 * 4096, GB), "GB"),          # 2L + 1 norms, composite vs fused
    "cuda.foreach_temp": (Fraction(2 * 6_738_415_616, GB), "GB"),            # _foreach_sqrt of the BF16 moments
    "cuda.counters": (4 * LLAMA2_TENSORS, "B"),                               # FP32 step per tensor on the host
    "alloc.round": (512, "B"),                                                # PyTorch docs, CUDA semantics
    "ex12.b1_storages": Measured(lambda: (len(saved_storages(1)[1]), "")),
    "ex12.masks": (Fraction(LAYERS * (32 * 2048 * 2048 + 2 * 2048 * 4096), GB), "GB"),
    "ex12.peak_4096": Measured(lambda: (Fraction(memtracker_llama(4096)["peak"], GB), "GB")),
    # chapter 18: the caching allocator's constants as c10/cuda/CUDACachingAllocator.cpp prints them (pytorch/pytorch
    # at 001074d25084fdb87a799823e395a50f5ec044d3, lines as cited), requests worked through its rules here, and
    # MemTracker's own measurement of the lab's step
    "meas.h200_mib": (143771, "MiB"),                                        # nvidia-smi's H200 total (sources above)
    "meas.margin": (1, "GB"),                                                # issue 17: under about 1 GB is no fit
    "meas.min_block": (512, "B"),                                            # kMinBlockSize, lines 118-119
    "meas.small_size": (Fraction(1048576, MiB), "MiB"),                      # kSmallSize, line 120
    "meas.small_buffer": (Fraction(2097152, MiB), "MiB"),                    # kSmallBuffer, lines 121-122
    "meas.min_large": (Fraction(10485760, MiB), "MiB"),                      # kMinLargeAlloc, lines 123-124
    "meas.large_buffer": (Fraction(20971520, MiB), "MiB"),                   # kLargeBuffer, lines 48-49
    "meas.round_large": (Fraction(2097152, MiB), "MiB"),                     # kRoundLarge, line 125
    "meas.unsplit_request": (11, "MiB"),
    "meas.unsplit_block": (12, "MiB"),              # 11 MiB: a segment rounded up to 2 MiB; 1 MiB left, not more: unsplit
    "meas.expandable_block": (11, "MiB"),           # expandable segments split every block (a multiple of 512 B)
    "meas.logits_a": (Fraction(4 * 2048 * 32000, MiB), "MiB"),               # 4BSV, itself a multiple of 2 MiB
    "meas.logits_b": (2 * -(-4 * 2049 * 32000 // (2 * MiB)), "MiB"),         # rounded up to 2 MiB
    "meas.logits_both": (Fraction(4 * 2048 * 32000, MiB) + 2 * -(-4 * 2049 * 32000 // (2 * MiB)), "MiB"),
    "meas.logits_expandable": (20 * -(-4 * 2049 * 32000 // (20 * MiB)), "MiB"),   # pages of 20 MiB (the note)
    "meas.lab_peak": Measured(lambda: (Fraction(memtracker_lab("gpt")["peak"], GB), "GB")),
    "ex18.block_a": (10 * MiB + 512, "B"),                                   # split: 2 MiB - 512 B remain
    "ex18.segment_a": (12, "MiB"),
    "ex18.block_b": (12 * MiB, "B"),                                         # 1 MiB - 512 B remain: the whole block
    "ex18.segment_b": (12, "MiB"),
    "ex18.expandable_b": (11 * MiB + 512, "B"),
    "ex18.vocab": (LLAMA3["V"], ""),
    "ex18.logits": (Fraction(4 * 4096 * LLAMA3["V"], MiB), "MiB"),
    "ex18.logits_longer": (2 * -(-4 * 4097 * LLAMA3["V"] // (2 * MiB)), "MiB"),
    "ex18.logits_both": (Fraction(4 * 4096 * LLAMA3["V"], MiB) + 2 * -(-4 * 4097 * LLAMA3["V"] // (2 * MiB)), "MiB"),
    "ex18.logits_expandable": (20 * -(-4 * 4097 * LLAMA3["V"] // (20 * MiB)), "MiB"),
    "ex18.lab_peak": Measured(lambda: (Fraction(memtracker_lab("llama")["peak"], MiB), "MiB")),
    # chapter 17: the knobs' ladder (see knob_step above)
    "knobs.context": (4096, ""),            # LLaMA-2's context length (Touvron et al. 2023, Table 1: 4k)
    "knobs.seq": (KNOBS_S, ""), "knobs.margin": (1, "GB"), "knobs.a100": (Fraction(A100_REAL, GB), "GB"),
    "knobs.chunks": (8, ""),                                   # CEWithChunkedOutputLoss(num_output_chunks=8)
    "knobs.vocab": (32000, ""), "knobs.lora_rank": (8, ""),   # LLaMA-2's vocabulary; torchtune's lora_rank
    "knobs.logits_fp32": (Fraction(4 * KNOBS_S * 32000, GB), "GB"),                     # 4BSV
    "knobs.foreach_temp": (Fraction(2 * LLAMA, GB), "GB"),     # _foreach_sqrt of every BF16 second moment
    "knobs.base_peak": lazy(lambda: Fraction(knob_step().bytes, GB), "GB"),
    "knobs.base_phase": phase_is(knob_step),
    "knobs.chunked_saved": lazy(lambda: Fraction(knob_step().bytes - knob_step(loss_chunks=8).bytes, GB), "GB"),
    "knobs.ckpt_saved": lazy(lambda: Fraction(knob_step(loss_chunks=8).bytes - knobs_full(KNOBS_S), GB), "GB"),
    "knobs.ckpt_peak": lazy(lambda: Fraction(knobs_full(KNOBS_S), GB), "GB"),
    "knobs.ckpt_phase": phase_is(lambda: knob_step(loss_chunks=8, recompute="full")),
    "knobs.fused_peak": lazy(lambda: Fraction(knob_step(loss_chunks=8, recompute="full", conventions=dict(
        foreach=False, fused=True)).bytes, GB), "GB"),
    "knobs.inbwd_peak": lazy(lambda: Fraction(knob_step(**dict(TOP, offload_activations=False)).bytes, GB), "GB"),
    "knobs.inbwd_saved": lazy(lambda: Fraction(knobs_full(KNOBS_S) - knob_step(**dict(
        TOP, offload_activations=False)).bytes, GB), "GB"),
    "knobs.inbwd_phase": phase_is(lambda: knob_step(**dict(TOP, offload_activations=False))),
    "knobs.offload_saved": (Fraction(32 * 2 * KNOBS_S * 4096, GB), "GB"),    # the checkpoints: L x 2BSd
    "knobs.offload_peak": lazy(lambda: Fraction(knobs_top(KNOBS_S), GB), "GB"),
    "knobs.lora_peak": lazy(lambda: Fraction(knobs_lora(KNOBS_S), GB), "GB"),
    "knobs.lora_saved": lazy(lambda: Fraction(knobs_full(KNOBS_S) - knobs_lora(KNOBS_S), GB), "GB"),
    "knobs.qlora_peak": lazy(lambda: Fraction(lora_step(base="nf4").bytes, GB), "GB"),
    # NF4 with double quantization of the 7 projections instead of their BF16 weights: at the peak, in the loss,
    # no layer is dequantized
    "knobs.qlora_saved": (Fraction(2 * PROJ7 - nf4(PROJ7), GB), "GB"),
    "ex17.vocab": (LLAMA3["V"], ""),
    "ex17.llama3_logits": (Fraction(4 * KNOBS_S * LLAMA3["V"], GB), "GB"),
    "ex17.llama3_saved": lazy(lambda: Fraction(knob_step(arch="llama3-8b").bytes
                                               - knob_step(arch="llama3-8b", loss_chunks=8).bytes, GB), "GB"),
    "ex17.l40s_room": (Fraction(L40S_ROOM, GB), "GB"), "ex17.rtx": (Fraction(RTX_REAL, GB), "GB"),
    "ex17.seq_top": longest_multiple(knobs_top, L40S_ROOM),
    "ex17.seq_qlora": longest_multiple(knobs_qlora, L40S_ROOM),
    "ex17.top_peak": lazy(lambda: Fraction(knobs_top(knobs_longest("top", L40S_ROOM)), GB), "GB"),
    "ex17.top_next": lazy(lambda: Fraction(knobs_top(knobs_longest("top", L40S_ROOM) + 1024), GB), "GB"),
    "ex17.qlora_peak": lazy(lambda: Fraction(knobs_qlora(knobs_longest("qlora", L40S_ROOM)), GB), "GB"),
    "ex17.qlora_next": lazy(lambda: Fraction(knobs_qlora(knobs_longest("qlora", L40S_ROOM) + 1024), GB), "GB"),
    "ex17.rtx_lora": longest_multiple(knobs_lora, RTX_ROOM),
    "ex17.rtx_qlora": longest_multiple(knobs_qlora, RTX_ROOM),
    "ex17.states_floor": (Fraction(6 * LLAMA, GB), "GB"),
    # chapter 21 (memledger check on published configs): each step built here from the file's setup
    "config.seq": (CONFIG_S, ""), "config.rtx": (Fraction(RTX_REAL, GB), "GB"),
    "config.lora_peak": lazy(lambda: Fraction(config_lora().bytes, GB), "GB"),
    "config.lora_phase": phase_is(config_lora),
    "config.qlora_peak": lazy(lambda: Fraction(config_lora(targets=QVO_MLP, quantized=True).bytes, GB), "GB"),
    "config.litgpt_lora_peak": lazy(lambda: Fraction(config_lora(seq=512, rank=32, litgpt=True).bytes, GB), "GB"),
    "config.litgpt_qlora_peak": lazy(lambda: Fraction(config_lora(seq=512, rank=32, litgpt=True,
                                                                  quantized=True).bytes, GB), "GB"),
    "config.litgpt_seq": (512, ""),                          # litgpt config_hub llama-2-7b: max_seq_length 512
    # accelerate's zero_stage3_offload_config.json: fp16.enabled, and "auto" micro-batch, reduce, prefetch and
    # persistence sizes
    "config.ds_refused": (5, ""),
    "config.low_loss": lambda text: None if text == "LinearCrossEntropyLoss" else f"{text!r}: the loss the newest "
                                    "torchtune configs name (loss._component_ in 7B_full_low_memory.yaml at bd2a0fc7)",
    "ex21.qlora_batch": fits_at_answer_not_beyond(lambda n: config_lora(n, targets=QVO_MLP, quantized=True).bytes,
                                                  RTX_ROOM),
    "ex21.qlora_batch_peak": lazy(lambda: Fraction(config_lora(9, targets=QVO_MLP, quantized=True).bytes, GB), "GB"),
    "ex21.qlora_batch_next": lazy(lambda: Fraction(config_lora(10, targets=QVO_MLP, quantized=True).bytes, GB), "GB"),
    "ex21.paged_peak": lazy(lambda: Fraction(config_low_memory().bytes, GB), "GB"),
    "ex21.l40s": (Fraction(L40S_REAL, GB), "GB"),
    # memledger.measure on the CPU: MemTracker's peak of chapter 12's harness for the same small LLaMA decoder and loop
    "config.measured_peak": Measured(lambda: (measured_small_llama_peak(), "bytes")),
    "config.measured_difference": (0, "bytes"),          # BF16 weights, m and v: 2 + 2 + 2 B/param
    # BF16 weights and bitsandbytes' blockwise 8-bit m and v: 1 byte an element and an FP32 absmax per 256
    # (bitsandbytes optim/optimizer.py init_state, block size 256): 2 + 2 x (1 + 4/256) B/param
    "ex17.states_8bit": (Fraction(2 * LLAMA, GB) + 2 * Fraction(LLAMA * (256 + 4), 256 * GB), "GB"),
    "ex17.peft_peak": lazy(lambda: Fraction(lora_step(adapters="fp32-adamw").bytes, GB), "GB"),
    "ex17.peft_more": lazy(lambda: Fraction(lora_step(adapters="fp32-adamw").bytes - knobs_lora(KNOBS_S), GB), "GB"),
    # chapter 16: the steps (tests/step/test_fsdp2.py and test_ddp.py hold them to PyTorch's FSDP2 and DDP), the
    # defaults of DeepSpeed's and PyTorch's sources, arithmetic above, PyTorch's FSDPMemTracker
    "fw.plain_peak": lazy(lambda: Fraction(step_peak(**SEVEN, zero_stage=3), GB), "GB"),
    "fw.ddp_peak": lazy(lambda: Fraction(step_peak(**SEVEN, framework="ddp"), GB), "GB"),
    "fw.fsdp2_peak": lazy(lambda: Fraction(step_peak(**FSDP2_RUN), GB), "GB"),
    "fw.fsdp2_noreshard": lazy(lambda: Fraction(step_peak(**FSDP2_RUN, reshard_after_forward=False), GB), "GB"),
    # FP32 shards and AdamW's two moments on them (12P/N; no BF16 copy), the ids, the overhead
    "fw.fsdp2_before": (Fraction(12 * LLAMA2["P"] // 8 + 16 * 4096 + OVERHEAD, GB), "GB"),
    "fw.ds_sum": (Fraction(zero3_total(LLAMA2) + DS_IPG + DS_PERSISTENT, GB), "GB"),
    "fw.mg_sum": (Fraction(MEGATRON_SUM, GB), "GB"),
    "fw.a100": (Fraction(A100_REAL, GB), "GB"),
    "fw.proof_peak": Measured(lambda: (fsdp_small_peak(), "bytes")),
    "fw.ddp_cap": (25, "MiB"), "fw.ddp_first": (1, "MiB"),       # _DEFAULT_BUCKET_CAP_MB; _DEFAULT_FIRST_BUCKET_BYTES
    "fw.ddp_buckets": (Fraction(2 * LLAMA2["P"], GB), "GB"),
    "fw.ddp_count": (ddp_bucket_count(), ""),
    "fw.ddp_after": (Fraction(DDP_BEFORE + 2 * LLAMA2["P"], GB), "GB"),      # + the BF16 gradients
    "fw.ddp_view_after": (Fraction(DDP_BEFORE, GB), "GB"),                  # the gradients are the buckets
    "fw.ddp_view_peak": lazy(lambda: Fraction(step_peak(**SEVEN, framework="ddp", gradient_as_bucket_view=True), GB),
                             "GB"),
    "fw.ds_ipg": (Fraction(DS_IPG, GB), "GB"), "fw.ds_live": (Fraction(DS_LIVE, GB), "GB"),
    "fw.ds_prefetch": (Fraction(DS_PREFETCH, GB), "GB"),
    "fw.ds_subgroup": (Fraction(4 * -(-LLAMA2["P"] // 8), GB), "GB"),        # min(sub_group_size 1e9, P/N) FP32
    "fw.mg_main_grad": (Fraction(4 * LLAMA2["P"], GB), "GB"),
    "fw.tp_megatron": (Fraction(TP_MEGATRON, GB), "GB"),
    "fw.tp_dtensor": lazy(lambda: Fraction(tp_forward_kept(), GB), "GB"),
    "fw.tp_copy": (Fraction(2 * 4096 * 4096, MiB), "MiB"),                  # 2BSd, the whole sequence
    "fw.tp_extra_layer": (Fraction(3 * 2 * 4096 * 4096 - 2 * 2 * 4096 * 4096 // 8, MiB), "MiB"),
    # torchtitan's apply_tp (81c12433, llama3/infra/parallelize.py): one PrepareModuleInput for attention (wq, wk, wv
    # share it) and one for the feed-forward (w1, w3 share it): two 2BSd inputs a layer against Megatron's two slices
    "fw.tp_titan_extra_layer": (Fraction(2 * 2 * 4096 * 4096 - 2 * 2 * 4096 * 4096 // 8, MiB), "MiB"),
    "fw.tp_titan": lazy(lambda: Fraction(tp_forward_kept() - 32 * 2 * 4096 * 4096, GB), "GB"),
    "fw.ex_a100": (Fraction(A100_40_REAL, GB), "GB"),
    "fw.ex_batch": fits_at_answer_not_beyond(thirteen_fsdp2_peak, A100_40_ROOM),
    "fw.ex_peak": lazy(lambda: Fraction(thirteen_fsdp2_peak(largest(
        lambda n: thirteen_fsdp2_peak(n) <= A100_40_ROOM)), GB), "GB"),
    "fw.ex_next": lazy(lambda: Fraction(thirteen_fsdp2_peak(largest(
        lambda n: thirteen_fsdp2_peak(n) <= A100_40_ROOM) + 1), GB), "GB"),
    "fw.ex_plain_full": lazy(lambda: Fraction(step_peak(**THIRTEEN_FULL, zero_stage=3, batch_size=1), GB), "GB"),
    "fw.ex_noreshard_more": (Fraction(2 * LLAMA2["P"], GB), "GB"),          # every unit's BF16 parameters
    "fw.ex_bf16_model": (Fraction(2 * LLAMA2["P"], GB), "GB"),
    "fw.ex_wide_count": (ddp_bucket_count(100), ""),
    "fw.ex_wide_bytes": (Fraction(2 * LLAMA2["P"], GB), "GB"),
    # chapter 20: the replay of GPU_SETUP; the published readings above against the steps written out here
    "gpu.batch": (4, ""), "gpu.seq": (4096, ""),
    "gpu.peak": lazy(lambda: Fraction(step_peak(**GPU_SETUP, batch_size=4, overhead_bytes=0), GB), "GB"),
    "gpu.allocated": gpu_allocated,
    "gpu.rounding": lazy(lambda: Fraction(gpu_replay().allocated - step_peak(**GPU_SETUP, batch_size=4,
                                                                             overhead_bytes=0), MiB), "MiB"),
    "gpu.reserved": lazy(lambda: Fraction(gpu_replay().reserved, GB), "GB"),
    "gpu.free": lazy(lambda: Fraction(sum(s["free_size"] for s in gpu_replay().segments), GB), "GB"),
    "gpu.segments": lambda text: None if int(text) == len(gpu_replay().segments) else f"{text} segments",
    # Adam's moments are created in the first step's optimizer: the moments of the second step's find the cache
    "gpu.reserved_phase": lambda text: None if text == "optimizer" else f"{text!r}: reserved peaks in the optimizer",
    "gpu.allocated_phase": lambda text: None if text == "optimizer" else f"{text!r}: allocated peaks in the optimizer",
    "gpu.exp_reserved": lazy(lambda: Fraction(gpu_replay(expandable_segments=True).reserved, GB), "GB"),
    "gpu.exp_free": lazy(lambda: Fraction(sum(s["free_size"] for s in gpu_replay(expandable_segments=True).segments),
                                          GB), "GB"),
    "gpu.exp_segments": lambda text: None if int(text) == len(gpu_replay(expandable_segments=True).segments) else text,
    "gpu.fit_peak": fits_at_answer_not_beyond(lambda n: step_peak(**GPU_SETUP, batch_size=n), H200_ROOM),
    "gpu.fit_allocated": fits_at_answer_not_beyond(lambda n: gpu_replay(n, 2 * 10**9).judged("allocated"), H200_ROOM),
    "gpu.fit_reserved": fits_at_answer_not_beyond(lambda n: gpu_replay(n, 2 * 10**9).judged("reserved"), H200_ROOM),
    "gpu.fit_reserved_measure": lambda text: None if "max_memory_reserved" in text else f"{text!r} names no reserved",
    **{f"pub.{key}_err": percent_off(*value) for key, value in PUBLISHED_ERRORS.items()},
    "pub.tt_qlora_measured": (Fraction(TT_QLORA, GB), "GB"),
    "pub.tt_qlora_predicted": lazy(lambda: Fraction(tt_step(8, ALL7, quantized=True), GB), "GB"),
    "pub.tt_qlora_step": lazy(lambda: Fraction(tt_step(8, ALL7, quantized=True, load=None), GB), "GB"),
    "pub.tt_qlora_load_predicted": lazy(lambda: Fraction(tt_step(8, ALL7, quantized=True, after_loading=True), GB),
                                        "GB"),
    "pub.tt_qlora_load_alloc": lazy(lambda: Fraction(tt_step(8, ALL7, quantized=True, after_loading=True,
                                                             measure="allocated"), GB), "GB"),
    "pub.tt_qlora_today": lazy(lambda: Fraction(tt_step(8, ALL7, quantized=True, load="torchtune",
                                                        after_loading=True), GB), "GB"),
    "pub.tt_qlora_load": (Fraction(TT_QLORA_INIT, GB), "GB"),
    "pub.tt_lora_init_alloc": (Fraction(13_960_000_000, GB), "GB"),     # qlora_finetune.rst line 157 (bd2a0fc)
    "pub.nf4_levels": (Fraction(4096 * 11008 * 16 * 2, GB), "GB"),       # n x 16 BF16 values, n = 4096 x 11008
    "pub.lg_saving_measured": (Fraction(LG["lora"] - LG["qlora"], GB), "GB"),
    # LLaMA-2 7B in BF16 less its LitGPT bnb.nf4 model: 6,476,005,376 block-projection weights at 4 bits with an FP32
    # absmax per 64, the embeddings, head and norms (524,820,480 bytes) in BF16
    "pub.lg_saving_weights": (Fraction(2 * LLAMA2["P"] - (6_476_005_376 // 2 + 4 * 6_476_005_376 // 64 + 524_820_480),
                                       GB), "GB"),
    "pub.tt_qlora_weights": lazy(lambda: Fraction(tt_step(8, ALL7, quantized=True, landmark="before forward"), GB),
                                 "GB"),
    "pub.lg_qlora_measured": (Fraction(LG["qlora"], GB), "GB"),
    "pub.lg_qlora_predicted": lazy(lambda: Fraction(lg_step(8, 1, 1304, quant="nf4"), GB), "GB"),
    "pub.bf16_weights": (Fraction(2 * LLAMA2["P"], GB), "GB"),
    "pub.count": (16, ""),
    "pub.within": published_within,
    "pub.matching": (15, ""),            # every row but the BERT run (the step does not model BERT's blocks)
    "ex20.split_reserved": lazy(lambda: Fraction(gpu_replay(max_split_size_mb=256).reserved, GB), "GB"),
    "ex20.split_allocated": lazy(lambda: Fraction(gpu_replay(max_split_size_mb=256).allocated, GB), "GB"),
    "ex20.split_direction": lambda text: None if text == ("lower" if gpu_replay(max_split_size_mb=256).reserved
                                                          < gpu_replay().reserved else "not lower") else text,
    "ex20.rtx": (Fraction(RTX_REAL, GB), "GB"),
    # chapter 19: the libraries' own layers (docs/implementations.md's PyTorch figures), their sources' arithmetic
    "mc.seq": (MC_S, ""),
    **{f"mc.{key}": (Fraction(value, 10**6), "MB") for key, value in MC_LAYER.items()},
    "mc.spread": (Fraction(MC_LAYER["hf_eager"], MC_LAYER["reference_cuda"]), "x"),
    "mc.spread_sdpa": (Fraction(MC_LAYER["litgpt"], MC_LAYER["reference_cuda"]), "x"),
    "mc.trap_mask": (Fraction(2 * MC_B * MC_S**2, MiB), "MiB"),                 # a BF16 (B, 1, S, S) additive mask
    "mc.fused_warning": mc_fused_warning,
    # transformers' LlamaRMSNorm: FP32 input (pow), FP32 rstd, the BF16 normalized tensor; torchtune's F.rms_norm on an
    # FP32 input (composite): FP32 input, rstd, FP32 x * rstd; LitGPT's: the same and weight.float() (d FP32)
    "mc.norm_hf": (Fraction(2 * (4 * MC_BSD + 4 * MC_B * MC_S + 2 * MC_BSD), 10**6), "MB"),
    "mc.norm_torchtune": (Fraction(MC_TORCHTUNE_NORMS, 10**6), "MB"),
    "mc.norm_litgpt": (Fraction(MC_TORCHTUNE_NORMS + 2 * 4 * MC_D, 10**6), "MB"),
    "mc.composite_extra": (Fraction(MC_LAYER["reference_cpu"] - MC_LAYER["reference_cuda"], 10**6), "MB"),
    # LitGPT: v a view of the fused (B, S, 3d) QKV output; the output projection's input a 2BSd copy
    "mc.litgpt_qkv": (Fraction(2 * 3 * MC_BSD, 10**6), "MB"),
    "mc.litgpt_attention_extra": (Fraction(2 * 2 * MC_BSD + 2 * MC_BSD, 10**6), "MB"),
    "mc.litgpt_extra": (Fraction(MC_LAYER["litgpt"] - MC_LAYER["torchtune"], 10**6), "MB"),
    "mc.bsd": (Fraction(2 * MC_BSD, 10**6), "MB"),
    # eager attention: softmax(..., dtype=torch.float32) output (4BHS^2) and .to(query.dtype)'s probabilities (2BHS^2)
    "mc.eager_softmax": (Fraction(4 * MC_B * MC_H * MC_S**2, 10**6), "MB"),
    "mc.eager_probs": (Fraction(2 * MC_B * MC_H * MC_S**2, 10**6), "MB"),
    "mc.eager_extra": (Fraction(MC_LAYER["hf_eager"] - MC_LAYER["hf_sdpa"], 10**6), "MB"),
    "mc.h100": (Fraction(81559 * MiB, GB), "GB"),
    "mc.ft_reference": longest_multiple(lambda n: mc_peak("reference", n), H100_ROOM_MC),
    "mc.ft_hf": longest_multiple(lambda n: mc_peak("hf", n), H100_ROOM_MC),
    "mc.ft_torchtune": longest_multiple(lambda n: mc_peak("torchtune", n), H100_ROOM_MC),
    "mc.ft_torchtune_peak": lazy(lambda: Fraction(mc_peak("torchtune", mc_longest("torchtune")), GB), "GB"),
    "mc.ft_torchtune_left": lazy(lambda: Fraction(H100_ROOM_MC - mc_peak("torchtune", mc_longest("torchtune")), GB),
                                 "GB"),
    "mc.ft_litgpt_more": Measured(mc_litgpt_more),
    # torchtune's own step beyond chapter 17's (the reference decoder with a composite norm) at torchtune's answer
    "mc.ft_torchtune_beyond": lazy(lambda: Fraction(mc_peak("torchtune", mc_longest("torchtune")) - mc_chapter17(
        mc_longest("torchtune")), 10**6), "MB"),
    "mc.ft_litgpt": longest_multiple(lambda n: mc_peak("litgpt", n), H100_ROOM_MC),
    "mc.ft_litgpt_peak": lazy(lambda: Fraction(mc_peak("litgpt", mc_longest("litgpt")), GB), "GB"),
    "ex19.torchtune_b2": (Fraction(529_131_904, 10**6), "MB"),       # docs/implementations.md, B 2, S 1304
    "ex19.booked_b2": (Fraction(529_131_904, 10**6), "MB"),
    "ex19.eager_formula": (Fraction(6 * 32 * 2048**2, 10**6), "MB"),
    "ex19.eager_measured": Measured(mc_eager_measured),
    "ex19.trap": (Fraction(2 * 2 * 1304**2, 10**6), "MB"),
}

#: equation key -> the right-hand side as the article (and its source paper) writes it
EQUATIONS = {
    "eq.activations": "B*S*d*(34 + 5*H*S/d)",         # Korthikanti et al. 2022, Eq. 1
    "eq.states": "(2 + 2 + 4 + 4 + 4)*P",              # the article; ZeRO: (2 + 2 + K) Psi, K = 12
    "eq.checkpoint": "L*B*S*d*2",                      # the article's full checkpointing
    "eq.distopt": "6 + 12/N_d",                        # Megatron-LM dist_optimizer.md lines 16-20
    "eq.lora": "4*L*d*r",                              # LoRA on Q and V: 2 x 2 x d x r per layer (Hu et al. 2021)
    "eq.kv": "4*B*H_kv*L*S*d_h",                       # K and V of every layer and token, BF16
    "eq.act_per_kv": "4 + 2*F/d + H*S/(2*d)",          # (16d + 8F + 2HS) / 4d: a LLaMA block's saved bytes per token
    # chapter 10
    "eq.dp_traffic": "2*(N_d - 1)*P/N_d",              # ring all-reduce (Patarasuk & Yuan 2009); ZeRO Sec. 7.1: 2 Psi
    "eq.zero1": "(2 + 2)*P + 12*P/N_d",                # ZeRO Sec. 5, Fig. 1: P_os, K = 12
    "eq.zero2": "2*P + (2 + 12)*P/N_d",                # P_os+g
    "eq.zero3": "(2 + 2 + 12)*P/N_d",                  # P_os+g+p
    "eq.tp_layer": "S*B*d*(10 + 24/t + 5*H*S/(d*t))",  # Korthikanti et al. 2022, Table 2 (s, b, h, a = S, B, d, H)
    "eq.tpsp_layer": "S*B*d*(34/t + 5*H*S/(d*t))",     # Table 2, tensor + sequence parallel
    "eq.pp_interleaved": "L*(1 + (p - 1)/(p*v))",      # Korthikanti Sec. 4.2.3: the interleaved first stage
    "eq.bubble": "(p - 1)/(v*m)",                      # Narayanan et al. 2021, Sec. 2.2
}
_SYMBOLS = {name: sp.Symbol(name) for name in ("B", "S", "d", "H", "L", "P", "V", "F", "N_d", "t", "p", "m", "v")}

_NUMBER = re.compile(r"^(?P<number>-?[\d,]*\.?\d+)\s*(?P<unit>.*)$")


def parse(text: str):
    """("30.6 GB") -> (Fraction(153, 5), "GB", 1): the number, its unit and its printed decimals."""
    match = _NUMBER.match(text.strip().strip("'\""))
    assert match, f"not a number with a unit: {text!r}"
    number = match["number"].replace(",", "")
    decimals = len(number.partition(".")[2])
    unit = {"×": "x"}.get(match["unit"], match["unit"])
    return Fraction(number), unit, decimals


def _article_agrees(claim, shown: Fraction, decimals: int) -> bool:
    """Whether a printed value of ``claim`` says what the article says, given the claim's relation."""
    want = claim.value
    if claim.relation == ">":
        return shown > want
    if claim.relation == "<":
        return shown < want
    step = Fraction(1, 10**claim.digits)
    slack = step if "truncat" in claim.note else step / 2          # truncation: up to one printed digit
    if claim.relation == "~":
        slack = max(slack, claim.tolerance * want)
    return abs(shown - want) <= slack + Fraction(1, 2 * 10**decimals)


def problems(glued: dict, measure: bool = False) -> list:
    """Every glued value that disagrees with its independent source, or has none; values only PyTorch can
    give (:class:`Measured`) are checked only with ``measure``."""
    found = []
    for (chapter, key), data in sorted(glued.items()):
        where = f"{chapter}: {key}"
        expected = EXPECTED.get(key)
        if isinstance(expected, Measured):
            if not measure:
                continue
            expected = expected.measure()
        if key in EQUATIONS:
            rhs = sp.sympify(data["text/plain"], locals=_SYMBOLS)
            if sp.expand(rhs - sp.sympify(EQUATIONS[key], locals=_SYMBOLS)) != 0:
                found.append(f"{where}: {data['text/plain']} is not {EQUATIONS[key]}")
            continue
        if callable(EXPECTED.get(key)):
            problem = EXPECTED[key](data["text/plain"].strip("'\""))
            if problem:
                found.append(f"{where}: {problem}")
            continue
        shown, unit, decimals = parse(data["text/plain"])
        if key in CLAIM_BY_ID:
            claim = CLAIM_BY_ID[key]
            if unit != claim.unit:
                found.append(f"{where}: unit {unit!r}, the article's is {claim.unit!r}")
            elif claim.status == "erratum":
                if _article_agrees(claim, shown, decimals) or data["text/plain"].strip("'") not in claim.note:
                    found.append(f"{where}: an erratum must print the value its note's arithmetic gives")
            elif not _article_agrees(claim, shown, decimals):
                found.append(f"{where}: {data['text/plain']} disagrees with the article's {claim.stated} {claim.unit}")
        elif key in EXPECTED:
            value, expected_unit = expected
            if unit != expected_unit or abs(shown - Fraction(value)) > Fraction(1, 2 * 10**decimals):
                found.append(f"{where}: {data['text/plain']}, expected {float(value):.6g} {expected_unit}")
        else:
            found.append(f"{where}: no independent value to check it against (add it to EXPECTED)")
    return found


def committed_glue() -> dict:
    """(chapter, key) -> {"text/plain": ..., ...}: what the chapters' committed outputs glue."""
    glued = {}
    for path in CHAPTERS:
        for cell in json.loads(path.read_text())["cells"]:
            for output in cell.get("outputs", []):
                record = output.get("metadata", {}).get("scrapbook")
                if record:
                    prefix = record["mime_prefix"]
                    glued[(path.stem, record["name"])] = {k[len(prefix):]: v for k, v in output["data"].items()}
    return glued


# --- fast checks ---------------------------------------------------------------------------------

def markdown_cells(path):
    return ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"]


def strip_allowed(text):
    text = re.sub(r"\{glue:?\w*\}`[^`]*`", "", text)               # glued values
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", "", text, flags=re.S)  # math
    text = re.sub(r"“[^”]*”", "", text)                             # quotations of the article
    text = re.sub(r"```.*?```", "", text, flags=re.S)               # code blocks
    return re.sub(r"`[^`]*`", "", text)                             # inline code


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_hand_typed_quantities_in_prose(path):
    typed = [hit for cell in markdown_cells(path) for hit in TYPED_QUANTITY.findall(strip_allowed(cell))]
    assert typed == [], "glue these from memledger, or quote the article in “…”"


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_outputs_are_committed(path):
    cells = [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code" and "".join(c["source"]).strip()]
    assert cells and all(c["execution_count"] is not None for c in cells), "run scripts/execute_notebooks.py"


@pytest.mark.parametrize("path", [p for p in CHAPTERS if p.stem[0].isdigit()], ids=lambda p: p.stem)
def test_chapter_shape(path):
    prose = "\n".join(markdown_cells(path))
    for part in ("What you'll learn", "## Takeaways", "## Exercises"):
        assert part in prose
    assert "```{code-cell}" not in prose
    source = path.read_text()
    assert '"name": "fig-' in source, "each chapter has at least one named figure"
    assert "import memledger as ml" in source


#: what a reader should not have to read: evaluation machinery, argument-order tuples, the CLI's entry point,
#: private names
PLUMBING = re.compile(r"exact_function|vectorized_function|ml\.evaluate\b|\bARGS\b|\bmain\(\[|import _|\b_[a-z]\w*\(")


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_no_library_plumbing_in_chapters(path):
    code = ["".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]
    assert [line for cell in code for line in cell.splitlines() if PLUMBING.search(line)] == []


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_figures_have_alt_text_and_captions(path):
    for cell in json.loads(path.read_text())["cells"]:
        if "mystnb" in cell["metadata"] and "figure" in cell["metadata"]["mystnb"]:
            meta = cell["metadata"]["mystnb"]
            assert meta["figure"]["caption"].strip() and meta["figure"]["name"].startswith("fig-")
            assert len(meta.get("image", {}).get("alt", "")) > 20, meta["figure"]["name"]


def toc_chapters() -> list:
    """The notebooks the built book publishes: those ``_toc.yml`` lists (``only_build_toc_files: true``)."""
    toc = (ROOT / "_toc.yml").read_text()
    return [ROOT / f"{name}.ipynb" for name in re.findall(r"file:\s*(\S+)", toc) if (ROOT / f"{name}.ipynb").exists()]


def numbered_figures(paths) -> list:
    """The figures the built book numbers: a code cell's ``mystnb.figure`` with a name (MyST-NB wraps its image in a
    numbered, referenceable figure) and ``{figure}`` directives in Markdown cells."""
    found = []
    for path in paths:
        for cell in json.loads(path.read_text())["cells"]:
            figure = cell["metadata"].get("mystnb", {}).get("figure", {})
            if cell["cell_type"] == "code" and figure.get("name") and any(
                    "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})
                    for o in cell.get("outputs", [])):
                found.append(figure["name"])
            if cell["cell_type"] == "markdown":
                found += re.findall(r"[`:]{3,}\{figure\}[^\n]*\n:name:\s*(\S+)", "".join(cell["source"]))
    return found


def test_the_book_has_at_least_forty_figures():
    """Issue 31: at least 40 numbered figures in the published chapters, each name used once."""
    names = numbered_figures(toc_chapters())
    assert len(names) == len(set(names)), "a figure name is used twice"
    assert len(names) >= 40, f"{len(names)} figures"


#: the figures issue 31 added (name -> chapter), each of which the prose refers to with {numref} (the older ones predate the rule)
ISSUE_31_FIGURES = {
    "fig-spec-shares": "02_spec", "fig-states-master": "03_model_states",
    "fig-activations-variants": "04_activations", "fig-activations-same-tokens": "05_batch_and_sequence",
    "fig-ledger-waterfall": "06_full_ledger", "fig-checkpointing-trade": "07_checkpointing",
    "fig-offload-per-rank": "08_offloading", "fig-together-peaks": "09_together", "fig-sum-and-peak": "11_peak",
    "fig-cpu-cuda-landmarks": "12_pytorch", "fig-calculators-per-param": "13_calculators",
    "fig-real-models-logits": "14_real_models", "fig-real-models-batch": "14_real_models",
    "fig-lora-rank": "15_finetuning",
    "fig-fsdp2-world": "16_frameworks", "fig-fsdp2-unit-life": "16_frameworks",
    "fig-knobs-forward-peak": "17_knobs", "fig-reserved-lengths": "18_measure",
}


@pytest.mark.parametrize("name", sorted(ISSUE_31_FIGURES))
def test_new_figures_are_drawn_and_referenced_from_the_prose(name):
    path = BOOK / f"{ISSUE_31_FIGURES[name]}.ipynb"
    assert name in numbered_figures([path]), f"{name}: no figure cell with an image (run scripts/execute_notebooks.py)"
    prose = "\n".join(markdown_cells(path))
    assert f"{{numref}}`{name}`" in prose, f"refer to {name} with {{numref}}"
    # every {numref} in the chapters names a figure that exists
    names = set(numbered_figures(toc_chapters()))
    for cell in markdown_cells(path):
        for ref in re.findall(r"\{numref\}`(?:[^`<]*<)?(fig-[\w-]+)>?`", cell):
            assert ref in names, f"{{numref}} to a missing figure {ref}"


_MATH = re.compile(r"\$\$(.*?)\$\$|\$([^$]*)\$", re.S)


def math_symbols(tex: str) -> set:
    """The letters a piece of LaTeX names: ``B``, ``H_kv`` (``H_{kv}``), ``P_max`` (``P_\\text{max}``), ``Delta``;
    words in ``\\text{...}`` and commands (``\\times``) are not symbols; juxtaposed letters (``BSd``) are several."""
    tex = re.sub(r"_\\text\{([^}]*)\}", r"_{\1}", tex)
    tex = re.sub(r"\\(?:text|mathrm|operatorname)\{[^}]*\}", " ", tex)
    tex = re.sub(r"\\(Delta|Psi)", r" \1 ", tex)
    tex = re.sub(r"\\[A-Za-z]+", " ", tex)
    found = set()
    for m in re.finditer(r"(Delta|Psi)|([A-Za-z])(?:_(?:\{([A-Za-z ]+)\}|([A-Za-z])))?", tex):
        sub = m.group(3) or m.group(4)
        found.add(m.group(1) or m.group(2) + ("_" + sub.replace(" ", "") if sub else ""))
    return found


@pytest.mark.parametrize("path", [p for p in CHAPTERS if p.stem[0].isdigit()], ids=lambda p: p.stem)
def test_every_symbol_in_the_chapters_is_on_the_notation_page(path):
    from memledger.core.symbols import MODEL_NOTATION, NOTATION, PROSE_NOTATION
    listed = {s.name for s, _, _ in NOTATION + MODEL_NOTATION} | {name for name, _, _ in PROSE_NOTATION}
    used = set()
    for cell in markdown_cells(path):
        cell = re.sub(r"```.*?```", "", cell, flags=re.S)
        for m in _MATH.finditer(re.sub(r"`[^`]*`", "", cell)):
            used |= math_symbols(m.group(1) or m.group(2))
    assert used - listed == set(), "add them to memledger.core.symbols (the notation appendix)"


def test_math_symbols_are_read_as_the_notation_names_them():
    assert math_symbols(r"4P_\text{max} + \lfloor 18P/N \rfloor") == {"P_max", "P", "N"}
    assert math_symbols(r"2 L B S H_{kv} d_h") == {"L", "B", "S", "H_kv", "d_h"}
    assert math_symbols(r"BSd\,(34 + 5HS/d)") == {"B", "S", "d", "H"}
    assert math_symbols(r"\Delta w = -0.001") == {"Delta", "w"}


@pytest.mark.slow
def test_every_glued_value_agrees_with_an_independent_source():
    glued = committed_glue()
    assert len(glued) > 80
    assert problems(glued) == []


@pytest.mark.slow
def test_values_only_pytorch_gives():
    """The glued values that PyTorch measures (saved tensors, MemTracker), measured again here."""
    pytest.importorskip("torch")
    glued = {k: v for k, v in committed_glue().items() if isinstance(EXPECTED.get(k[1]), Measured)}
    assert len(glued) >= 8
    assert problems(glued, measure=True) == []


def test_the_article_figures_are_all_still_printed():
    """The audit appendix prints every claim; the chapters glue at least the article's headline figures."""
    keys = {key for _, key in committed_glue()}
    for claim_id in ("states.total", "act.total", "ledger.total", "ckpt.ledger", "offload.gpu", "offload.cpu"):
        assert claim_id in keys


# --- the build (slow; fixture ``build`` in conftest.py, one clean strict build shared with tests/book/test_browser.py) ---


def build_glue(build) -> dict:
    glued = {}
    for path in (build / "jupyter_execute").rglob("*.glue.json"):
        for key, output in json.loads(path.read_text()).items():
            glued[(path.name.removesuffix(".glue.json"), key)] = output["data"]
    return glued


@pytest.mark.slow
def test_built_pages_glue_the_checked_values(build):
    glued = build_glue(build)
    assert {k for k in glued} == set(committed_glue())
    assert problems(glued) == []


@pytest.mark.slow
def test_build_publishes_every_chapter(build):
    for path in CHAPTERS:
        assert (build / "html" / "book" / f"{path.stem}.html").exists()
    assert (build / "html" / "index.html").exists()


@pytest.mark.slow
def test_audit_lists_every_claim(build):
    page = (build / "html" / "book" / "audit.html").read_text()
    missing = [c.id for c in CLAIMS if c.id not in page]
    assert missing == []


@pytest.mark.slow
def test_notation_table_is_html_with_math(build):
    page = (build / "html" / "book" / "notation.html").read_text()
    assert "| symbol |" not in page and "<table" in page
    assert page.count('<span class="math notranslate nohighlight">') >= 11


class _Assets(HTMLParser):
    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "script" and attrs.get("src"):
            self.urls.append(attrs["src"])
        if tag == "link" and attrs.get("rel") in ("stylesheet", "preload", "modulepreload") and attrs.get("href"):
            self.urls.append(attrs["href"])


@pytest.mark.slow
def test_site_loads_nothing_from_the_network(build):
    for page in (build / "html").rglob("*.html"):
        parser = _Assets()
        parser.feed(page.read_text())
        remote = [u for u in parser.urls if re.match(r"^(https?:)?//", u)]
        assert remote == [], page.name
    for asset in ("vendor/require.js", "vendor/html-manager/embed-amd.js", "vendor/mathjax/tex-mml-chtml.js"):
        assert (build / "html" / asset).exists()


@pytest.mark.slow
def test_math_and_widgets_use_the_vendored_copies(build):
    page = (build / "html" / "book" / "09_together.html").read_text()
    assert 'src="../_static/../vendor/require.js' in page
    assert 'src="../_static/../vendor/html-manager/embed-amd.js' in page
    assert "application/vnd.jupyter.widget-state+json" in page      # the explorer's state is embedded
    assert "needs a running" in page or "running Jupyter kernel" in page
    assert "../vendor/mathjax/tex-mml-chtml.js" in (build / "html" / "book" / "04_activations.html").read_text()


@pytest.mark.slow
def test_static_calculator_is_in_the_page(build):
    page = (build / "html" / "book" / "09_together.html").read_text()
    assert 'class="memledger-calculator"' in page and 'class="memledger-calculator-data"' in page
    assert "_static/memledger-calculator.js" in page


@pytest.mark.slow
def test_built_book_numbers_as_many_figures_as_the_chapters_name(build):
    """The built pages number every named figure (``Fig. N``), as many as the fast count finds: at least 40."""
    numbered = [n for page in (build / "html" / "book").glob("*.html")
                for n in re.findall(r'<span class="caption-number">Fig\. [\d.]+ </span>', page.read_text())]
    assert len(numbered) == len(numbered_figures(toc_chapters())) >= 40
