"""The families' block inventories (memledger.activations.inventory) against PyTorch's saved tensors, to the byte.

The reference decoder (memledger/pytorch/reference.py) grows each family's block: GPT-NeoX's parallel residual
(two norms), Phi's one norm feeding attention and MLP in parallel, BLOOM's ALiBi bias and embedding LayerNorm,
GPT-BigCode's multi-query attention in a GPT block. Every storage autograd saves in a block (saved-tensor hooks,
each storage once, parameters skipped) must be one inventory row of its size and dtype, and every row one
storage (:func:`memledger.pytorch.compare.compare_saved`).
"""
import pytest

from memledger.activations.inventory import inventory, per_layer_bytes
from memledger.core.exact import evaluate_expr

FAMILIES = {
    "gpt_neox (parallel residual, two LayerNorms)": dict(parallel=True),
    "phi (one LayerNorm, parallel attention and MLP)": dict(parallel=True, shared_norm=True),
    "phi-2 (attention_dropout 0.0: the residual dropouts only)": dict(parallel=True, shared_norm=True,
                                                                      attention_dropout=False),
    "bloom (ALiBi, embedding LayerNorm)": dict(alibi=True, input_norm=True),
    "gpt_bigcode (multi-query attention)": dict(n_kv_heads=1),
}
SHAPE = dict(d=64, L=2, H=4, F=256, V=500)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("loop, B, S, dropout", [("bf16-pure-adamw", 2, 24, 0.1), ("fp32-adamw", 1, 16, 0.0)])
def test_family_block_is_the_inventory(name, loop, B, S, dropout):
    pytest.importorskip("torch")
    from memledger.pytorch.compare import compare_saved
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(**SHAPE, dropout=dropout, native_dropout=True, **FAMILIES[name])
    result = compare_saved(c, loop, B, S)
    assert result.exact, (name, result.table().text() if hasattr(result.table(), "text") else result.block,
                          result.unbooked)
    assert result.bytes("block") == result.bytes("block", "predicted")
    assert result.bytes("outside") == result.bytes("outside", "predicted")


def _bytes(rows, **values):
    return evaluate_expr(per_layer_bytes(rows), dict(B=2, S=24, d=64, H=4, H_kv=1, F=256, d_h=16, **values))


def test_parallel_blocks_keep_less():
    # GPT-NeoX keeps one BSd less than a sequential block (norm 2's input is the block input); Phi two
    # (no second norm input, no separate MLP input): 2 bytes x B x S x d each in BF16
    sequential, neox, phi = (_bytes(inventory(parallel=p, shared_norm=s)) for p, s in
                             ((False, False), (True, False), (True, True)))
    assert sequential - neox == 2 * 24 * 64 * 2 and sequential - phi == 2 * (2 * 24 * 64 * 2)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_ledger_books_the_measured_blocks(name):
    """The ledger's activation row (the article's conventions: 1-byte masks, no norm statistics) is L times the
    block PyTorch measures with the fused kernel's masks, less the LayerNorms' BF16 mean and rstd."""
    pytest.importorskip("torch")
    from memledger.ledger.ledger import Ledger
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import saved_tensors
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(**SHAPE, dropout=0.1, native_dropout=True, **FAMILIES[name])
    B, S = 2, 24
    measured = saved_tensors(c, "bf16-pure-adamw", B, S)
    norms = 1 if c.shared_norm else 2
    block = sum(b for b, _, _ in measured[1]) - norms * 2 * B * S * 2
    ledger = Ledger(architecture_of(c), batch_size=B, seq_len=S, recipe="bf16-pure-adamw", overhead_bytes=0,
                    dropout=True)
    row = next(r for r in ledger.rows if r.name == "activations")
    assert row.bytes == c.L * block
