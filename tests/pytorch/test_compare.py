"""memledger beside PyTorch, as the book's tables show it (memledger/pytorch/compare.py).

The independent values are PyTorch's own: the storages autograd saves and MemTracker's totals, and the
article's per-layer formula BSd(34 + 5HS/d) (Korthikanti et al. 2022, Eq. 1).
"""
import pytest

torch = pytest.importorskip("torch")

from memledger.pytorch.compare import compare_saved, ladder, ladder_table, memtracker_comparison  # noqa: E402
from memledger.pytorch.measure import saved_tensors  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402

pytestmark = pytest.mark.slow

SMALL = dict(d=64, L=2, H=4, F=256, V=1000)


@pytest.mark.parametrize("variant, loop, B", [
    (dict(dropout=0.1), "bf16-pure-adamw", 2),
    (dict(dropout=0.1), "bf16-adamw", 1),                       # q, k, v stay views of one storage
    (dict(dropout=0.1, native_dropout=True), "fp32-adamw", 3),
    (dict(style="llama"), "bf16-pure-adamw", 2),
    (dict(style="llama", rmsnorm="fused"), "fp32-adamw", 1),
])
def test_every_row_is_a_saved_storage(variant, loop, B):
    c = RefConfig(**SMALL, **variant)
    got = compare_saved(c, loop, B, 32)
    measured = saved_tensors(c, loop, B, 32)
    assert got.exact
    assert got.bytes("block") == sum(b for b, _, _ in measured[1])
    assert got.bytes("outside") == sum(b for b, _, _ in measured["outside"])
    assert len(got.block) == len(measured[1]) and "NO" not in got.table().text()


def test_views_are_paired_together():
    got = compare_saved(RefConfig(**SMALL, dropout=0.1), "bf16-pure-adamw", 1, 32)
    assert any(name.startswith("Q + K + V") for name, *_ in got.block)


def test_a_missing_storage_is_shown():
    """The math SDPA kernel keeps the whole fused QKV output at B = 1 in FP32 (a known gap of the inventory)."""
    got = compare_saved(RefConfig(**SMALL, attention="sdpa", dropout=0.1), "fp32-adamw", 1, 32)
    assert not got.exact and "NO" in got.table().text()


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_the_ladder_closes_the_gap(style):
    B, S = 2, 32
    c = RefConfig(**SMALL, style=style, dropout=0.1 if style == "gpt" else 0.0)
    rungs = ladder(c, "bf16-pure-adamw", B, S)
    measured = sum(b for b, _, _ in saved_tensors(c, "bf16-pure-adamw", B, S)[1])
    assert rungs[-1]["gap"] == 0 and all(r["measured"] == measured for r in rungs)
    if style == "gpt":      # the article's conventions are Eq. 1; then BF16 masks (one byte more each), then stats
        d, H = SMALL["d"], SMALL["H"]
        assert rungs[0]["predicted"] == B * S * d * 34 + 5 * B * H * S * S
        assert rungs[1]["predicted"] - rungs[0]["predicted"] == B * H * S * S + 2 * B * S * d
        assert rungs[2]["predicted"] - rungs[1]["predicted"] == 2 * 2 * 2 * B * S
    assert "PyTorch - memledger" in ladder_table({style: rungs}).text()


def test_memtracker_table_is_exact():
    got = memtracker_comparison(RefConfig(**SMALL, style="llama"), "bf16-adamw", 2, 64)
    assert got["measured"]["peak"] == got["step"].peak.bytes
    body = got["table"].rows + got["table"].totals
    assert all(row[3] == "0" for row in body)
