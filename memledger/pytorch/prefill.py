"""The reference decoder's prefill, measured: one forward pass over the prompt in eval mode under ``no_grad``.

What a serving loop's first step runs (transformers' ``generate``): the embedding, every block over the
B x S prompt, the final norm over all positions, the LM head on the last position only
(``logits_to_keep=1``) and that position's logits copied to FP32
(``outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)``, ``generation/utils.py`` ``_sample``).
No KV cache is written here: serving preallocates it (:mod:`memledger.ledger.prefill` books it beside).

The causal mask is built once before the blocks, as the decoder builds it: the reference's bool (S, S) mask,
or under ``RefConfig(softmax_fp32=True)`` transformers' additive float mask (``masking_utils.eager_mask``:
``torch.where(bool mask, 0, finfo.min)``, B x 1 x S x S in the compute dtype); SDPA gets none (``is_causal``).
:func:`memtracker_prefill` runs it at full scale under ``FakeTensorMode`` tracked by MemTracker (exact
storage bytes on the CPU backend).
"""
import torch

from .reference import RefConfig, make_model

__all__ = ["memtracker_prefill", "prefill"]


def _mask(c: RefConfig, batch: int, seq: int, dtype, device):
    if c.kernel != "eager":
        return None
    causal = torch.ones(seq, seq, dtype=torch.bool, device=device).triu(1)
    if not c.softmax_fp32:
        return causal
    keep = (~causal).expand(batch, 1, seq, seq)          # transformers' sdpa_mask: True where attended
    return torch.where(keep, torch.zeros((), device=device, dtype=dtype), torch.finfo(dtype).min)


def prefill(model, ids):
    """The last position's FP32 logits after one no-grad forward over ``ids`` (B x S)."""
    c = model.c
    with torch.no_grad():
        x = model.embed(ids)
        mask = _mask(c, ids.shape[0], ids.shape[1], x.dtype, ids.device)
        for block in model.blocks:
            x = block(x, mask)
        del mask
        h = model.norm(x)
        del x
        logits = model.head(h[:, -1:, :])
        del h
        return logits[:, -1, :].to(copy=True, dtype=torch.float32)


def memtracker_prefill(c: RefConfig, batch: int, seq: int, dtype: str = "bf16", trace: bool = False) -> dict:
    """MemTracker's totals of :func:`prefill` under ``FakeTensorMode``: {"before": weights and ids, "peak": the
    largest total, "after": with the FP32 logits, "trace": [(total, op), ...] with ``trace``}, CPU bytes."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .measure import _tracker_class
    loop = {"bf16": "bf16-pure-adamw", "fp32": "fp32-adamw"}[dtype]
    cpu = torch.device("cpu")
    with FakeTensorMode():
        model = make_model(c, loop).eval()         # parameters keep requires_grad: MemTracker hooks them
        ids = torch.randint(0, c.V, (batch, seq))
        tracker = _tracker_class()()
        tracker.trace = [] if trace else None
        tracker.track_external(model, ids)
        with tracker:
            before = tracker.get_tracker_snapshot("current")[cpu]["Total"]
            tracker._peak_mem[cpu] = before
            out = prefill(model, ids)
            after = tracker.get_tracker_snapshot("current")[cpu]["Total"]
        result = {"before": before, "peak": max(tracker._peak_mem[cpu], after), "after": after}
        if trace:
            result["trace"] = [(t[0], t[4]) for t in tracker.trace]
        del out
    return result
