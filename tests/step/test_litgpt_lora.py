"""LoRA as LitGPT builds it (memledger/step/litgpt_lora.py) beside LitGPT's own LoRA model, measured.

The independent values are PyTorch's measurements of ``litgpt.lora.GPT`` under ``FakeTensorMode``
(:mod:`memledger.pytorch.litgpt_lora`: saved-tensor hooks, MemTracker) and arithmetic on LitGPT's source written out
here. Skips, saying why, where LitGPT is not installed.
"""
import pytest

pytest.importorskip("torch")

from memledger.pytorch.litgpt_lora import lora_layer_saved, missing  # noqa: E402
from memledger.step.litgpt_lora import fields, layer_rows, outside_rows  # noqa: E402

pytestmark = pytest.mark.skipif(missing() is not None, reason=missing() or "")

SMALL = dict(d=256, H=4, F=688, V=1000)
SEVEN_B = dict(d=4096, H=32, F=11008, V=32000)
QV = ("q_proj", "v_proj")
EVERY = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def booked(rows, shape, B, S, rank=8) -> int:
    """memledger's rows at these values."""
    values = {"B": B, "S": S, "d": shape["d"], "H": shape["H"], "F": shape["F"], "r": rank}
    total = sum(row.bytes for row in rows)
    return int(total.subs({s: values[s.name] for s in total.free_symbols}))


def measured(shape, B, S, targets, dropout, rank=8):
    lora = tuple(sorted(fields(targets, rank, dropout).items()))
    return lora_layer_saved(**shape, batch=B, seq=S, lora=lora)


MLP = ("gate_proj", "up_proj", "down_proj")
CASES = [(MLP, 0.05, 1, 32), (MLP, 0.0, 2, 32), (("o_proj",), 0.05, 1, 32),
         (QV, 0.05, 1, 200), (QV, 0.05, 2, 200), (QV, 0.0, 2, 64), (("q_proj", "k_proj", "v_proj"), 0.05, 1, 64),
         (("k_proj",), 0.05, 2, 48), (EVERY, 0.05, 2, 64), (EVERY, 0.0, 1, 64), (("o_proj",), 0.0, 1, 32)]


@pytest.mark.parametrize("targets, dropout, B, S", CASES)
def test_layer_is_litgpts_to_the_byte(targets, dropout, B, S):
    """A layer whose input requires grad, the first layer, and outside the layers (the final norm; the head's chunks
    keep nothing), at a small width: memledger's rows (the CPU's dropout keeps a noise tensor in BF16 for its mask)
    equal what LitGPT's LoRA model saves."""
    got = measured(SMALL, B, S, targets, dropout)
    rows = dict(targets=targets, dropout=dropout > 0, mask_dtype="bf16")
    assert got["layer"] == booked(layer_rows(**rows), SMALL, B, S)
    assert got["first"] == booked(layer_rows(**rows, first=True), SMALL, B, S)
    assert got["outside"] == booked(outside_rows(), SMALL, B, S)


def test_rank_scales_the_adapter_rows():
    """Rank 32 on q and v: only A's output (B, S, 2 r) grows, the rest is rank-free."""
    got = measured(SMALL, 1, 64, QV, 0.05, rank=32)
    assert got["layer"] == booked(layer_rows(QV, True, "bf16"), SMALL, 1, 64, rank=32)


def test_qv_layer_by_hand():
    """finetune/lora.py's defaults (r 8 on q and v, dropout 0.05) at B 1, S 200, d 256, H 4, F 688, written out from
    LitGPT's source: two RMSNorms (FP32 input, rstd, FP32 weight), the dropout's BF16 noise and output, after_A
    (B, S, 2r), after_B (B, S, 2d) and a clone of lora_ind (2d int64), q, k, the fused QKV output, the log-sum-exp,
    SDPA's output, the MLP's three (B, S, F)."""
    B, S, d, H, F, r = 1, 200, 256, 4, 688, 8
    norm = 4 * B * S * d + 4 * B * S + 4 * d
    qkv = 2 * B * S * d * 2 + 2 * B * S * 2 * r + 2 * B * S * 2 * d + 8 * 2 * d
    attention = 2 * B * S * d * 2 + 2 * B * S * 3 * d + 4 * B * H * S + 2 * B * S * d
    assert measured(SMALL, B, S, QV, 0.05)["layer"] == 2 * norm + qkv + attention + 3 * 2 * B * S * F


@pytest.mark.slow
@pytest.mark.parametrize("B, S", [(1, 1304), (2, 512)])
def test_llama2_7b_width_layer(B, S):
    """LLaMA-2 7B's width, finetune/lora.py's defaults (the published LitGPT rows' setup)."""
    got = measured(SEVEN_B, B, S, QV, 0.05)
    rows = dict(targets=QV, dropout=True, mask_dtype="bf16")
    assert got["layer"] == booked(layer_rows(**rows), SEVEN_B, B, S)
    assert got["first"] == booked(layer_rows(**rows, first=True), SEVEN_B, B, S)


@pytest.mark.parametrize("L, B, S", [(2, 1, 200), (4, 2, 64)])
def test_lora_ledger_books_litgpts_layers(L, B, S):
    """``LoraLedger(..., implementation="litgpt")`` (``memledger ledger --lora-rank 8 --implementation litgpt``)
    books L - 1 layers whose input requires grad and the first, each as LitGPT's LoRA model saves it (its mask in
    BF16 here: the CPU's dropout noise)."""
    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.reference import RefConfig
    from memledger.step.litgpt_lora import activations
    got = measured(SMALL, B, S, QV, 0.05)
    arch = architecture_of(RefConfig(**SMALL, L=L, style="llama"))
    config = LoraConfig(rank=8, targets=QV, adapter_recipe="bf16-pure-adamw", dropout=True)
    ledger = LoraLedger(arch, config, B, S, implementation="litgpt")
    row = next(r for r in ledger.rows if r.name == "activations")
    cpu = activations(QV, True, mask_dtype="bf16").subs({"L": L})
    values = {"B": B, "S": S, "d": SMALL["d"], "H": SMALL["H"], "F": SMALL["F"], "r": 8, "L": L}
    assert int(cpu.subs({s: values[s.name] for s in cpu.free_symbols})) == (L - 1) * got["layer"] + got["first"]
    masks = (L - 1) * B * S * SMALL["d"]          # CUDA's bool mask: one byte an element where the CPU's noise has two
    assert row.bytes == (L - 1) * got["layer"] + got["first"] - masks


def litgpt_landmarks(shape, L, B, S, targets, dropout, rank=8):
    from memledger.pytorch.litgpt_lora import lora_step
    lora = tuple(sorted(fields(targets, rank, dropout).items()))
    return lora_step(**shape, L=L, batch=B, seq=S, lora=lora)


def memledger_landmarks(shape, L, B, S, targets, dropout, rank=8):
    from memledger.step.litgpt_lora import landmarks
    values = {"B": B, "S": S, "L": L, "r": rank} | shape
    return {k: int(v.subs({s: values[s.name] for s in v.free_symbols}))
            for k, v in landmarks(targets, dropout > 0, "bf16").items()}


@pytest.mark.parametrize("targets, dropout, L, B, S", [(QV, 0.05, 2, 1, 200), (QV, 0.05, 2, 2, 200),
                                                       (QV, 0.05, 3, 2, 129), (EVERY, 0.05, 2, 1, 64),
                                                       (EVERY, 0.0, 2, 2, 64), (("q_proj", "k_proj", "v_proj"),
                                                                                0.05, 2, 1, 300)])
def test_step_landmarks_are_litgpts(targets, dropout, L, B, S):
    """Every landmark of LitGPT's LoRA step as finetune/lora.py runs it (MemTracker on its own model: the head in
    128-token chunks, the chunks' list and the loss kept into the next iteration, the lora_ind buffers, AdamW over the
    adapters) equals memledger's (:func:`memledger.step.litgpt_lora.landmarks`: the layers' saved rows, the loss's,
    the statics) to the byte."""
    got = litgpt_landmarks(SMALL, L, B, S, targets, dropout)
    assert {k: got[k] for k in ("before forward", "after forward", "after backward", "after step")} == \
        memledger_landmarks(SMALL, L, B, S, targets, dropout)


@pytest.mark.slow
@pytest.mark.parametrize("B, S, rank", [(1, 1304, 8), (2, 512, 32)])
def test_llama2_7b_width_step_landmarks(B, S, rank):
    """LLaMA-2 7B's width (two layers, V 32000), the published LitGPT rows' setups (r 8 at B 1, S 1304; the hub's
    r 32 at B 2, S 512): every landmark equal to the byte."""
    got = litgpt_landmarks(SEVEN_B, 2, B, S, QV, 0.05, rank)
    assert {k: got[k] for k in ("before forward", "after forward", "after backward", "after step")} == \
        memledger_landmarks(SEVEN_B, 2, B, S, QV, 0.05, rank)
