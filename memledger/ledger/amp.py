"""The ledger's row for FP16 autocast (recipe ``fp16-amp-adamw``, :mod:`memledger.step.amp`): autocast's FP16
copies of the weights, alive at the end of the forward pass.

``torch.autocast`` caches the FP16 cast of every FP32 leaf weight an autocast matmul reads
(``aten/src/ATen/autocast_mode.cpp`` ``cached_cast``, 008ec6b1 l. 120-146) and clears the cache when the region
exits (``clear_cache``, l. 87-90), but autograd has saved each copy for its matmul's input gradient: at the end
of the forward pass every linear's weight exists a second time in FP16, 2 bytes per element:

    bytes = 2 * (L * (q*d + 2*kv*d + d*q + m*F*d) + V*d)

with q = H*d_h, kv = H_kv*d_h, m = 3 (SwiGLU) or 2 (GeLU), the LM head's V*d (the embedding's weight where
tied: the head's F.linear casts it). Measured by MemTracker (tests/step/test_amp.py), where the step
books each copy from its linear's forward to its backward. A bias's FP16 copy is cached too, but ``addmm`` does not
save it: it goes with the cache when the region exits, before the end of the forward pass (MemTracker, QKV biases).
Under full recomputation the checkpoint saves no block's copy either (only the cache held them): the LM head's V*d
is left, and each block's copies come back with its recomputation in backward (:mod:`memledger.step.amp`).
"""
from ..core.rows import Row
from ..core.vocabulary import Device, Group

__all__ = ["AMP_ROW", "weight_copies", "weight_copy_row"]

AMP_ROW = "autocast FP16 weight copies (saved by autograd)"


def weight_copies(ledger) -> int:
    """Bytes of autocast's FP16 copies of ``ledger``'s linear weights (biases' copies die with the cache)."""
    v, f = ledger.values, ledger.arch.features
    if f.moe:
        raise ValueError(f"recipe {ledger.recipe}: autocast's weight copies of a mixture of experts are not modelled")
    d, L, F, V = v["d"], v["L"], v["F"], v["V"]
    q, kv = v["H"] * v["d_h"], v["H_kv"] * v["d_h"]
    block = q * d + 2 * kv * d + d * q + (2 if f.gpt else 3) * F * d
    if ledger.recompute == "full":      # the checkpointed blocks' copies went with the cache: the head's is saved
        return 2 * V * d
    return 2 * (L * block + V * d)


def weight_copy_row(ledger) -> Row:
    """The row :attr:`memledger.ledger.ledger.Ledger.rows` adds under FP16 autocast."""
    return Row(AMP_ROW, Group.ACTIVATIONS, Device.GPU, weight_copies(ledger), "",
               "2*(L*(2*H*d_h*d + 2*H_kv*d_h*d + m*F*d) + V*d) (autocast_mode.cpp cached_cast)")
