"""The reference decoder's prefill, measured: one forward pass over the prompt in eval mode under ``no_grad``.

What a serving loop's first step runs (transformers' ``generate``): the embedding, every block over the
B x S prompt, the final norm over all positions, the LM head on the last position only
(``logits_to_keep=1``) and that position's logits copied to FP32
(``outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)``, ``generation/utils.py`` ``_sample``).
No KV cache is written by :func:`prefill` (the eager softmax moment of :mod:`memledger.ledger.prefill` is checked
on it); :func:`generate_prefill` is the whole of ``generate``'s first forward as transformers runs LLaMA, on the
reference's modules: rotary tables and ``apply_rotary_pos_emb``, a ``DynamicCache`` written block by block, SDPA
or the eager core, ``logits_to_keep`` (:mod:`memledger.step.prefill` models it op by op), optionally with NF4
projections (:func:`quantize_blocks`).

The causal mask is built once before the blocks, as the decoder builds it: the reference's bool (S, S) mask,
or under ``RefConfig(softmax_fp32=True)`` transformers' additive float mask (``masking_utils.eager_mask``:
``torch.where(bool mask, 0, finfo.min)``, B x 1 x S x S in the compute dtype); SDPA gets none (``is_causal``).
:func:`memtracker_prefill` runs it at full scale under ``FakeTensorMode`` tracked by MemTracker (exact
storage bytes on the CPU backend).
"""
import torch
import torch.nn.functional as F

from .record import recorded
from .reference import RefConfig, make_model

__all__ = ["LOGITS_TO_KEEP", "NF4Fallback", "generate_prefill", "memtracker_generate_prefill", "memtracker_prefill",
           "prefill", "quantize_blocks"]


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


@recorded
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


#: ``logits_to_keep`` values the serving prefill takes: 1 (``generate``'s default) or 0 (every position).
LOGITS_TO_KEEP = (1, 0)


def _rotate_half(x):
    """transformers' ``rotate_half``: (-x2, x1) concatenated on the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotary(model, positions, dtype):
    """``LlamaRotaryEmbedding.forward``: cos and sin (1, S, d_h) in the compute dtype, from the FP32 ``inv_freq``
    buffer (d_h/2) and the positions."""
    inv = model.inv_freq[None, :, None].float().expand(positions.shape[0], -1, 1)
    pos = positions[:, None, :].float()
    freqs = (inv.float() @ pos.float()).transpose(1, 2)
    emb = torch.cat((freqs, freqs), dim=-1)
    del inv, pos, freqs
    cos, sin = emb.cos() * 1.0, emb.sin() * 1.0
    del emb
    return cos.to(dtype=dtype), sin.to(dtype=dtype)


def _rope(x, cos, sin):
    """``apply_rotary_pos_emb`` on one of q, k: ``(x * cos) + (rotate_half(x) * sin)``, cos and sin unsqueezed to
    (1, 1, S, d_h)."""
    return (x * cos[:, None]) + (_rotate_half(x) * sin[:, None])


def _attention(block, q, k, v, mask):
    """The attention core on the cache's K and V: SDPA (``is_causal``, ``enable_gqa``) or transformers'
    ``eager_attention_forward`` (``repeat_kv``, scores, additive mask, FP32 softmax cast back, ``@ v``)."""
    c = block.c
    if c.kernel == "eager":
        return block._core(q, k, v, mask)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=c.kv_heads != c.H)


def _block(block, x, mask, cos, sin, cache):
    """One LLaMA decoder layer at prefill, as ``LlamaDecoderLayer.forward`` runs it on the reference's modules:
    norm, fused QKV (q, k, v its views), rotary on q and k, the cache write (``DynamicLayer.update``: ``torch.cat``
    onto an empty tensor, a copy), attention on the cache's K and V, output projection, residual, norm, gated MLP,
    residual."""
    c = block.c
    hd, (H, kv) = c.hd, c.local_heads
    h = block.norm1(x)
    qkv = block.qkv(h)
    del h
    B, S, _ = qkv.shape
    q, k, v = qkv.split([H * hd, kv * hd, kv * hd], dim=-1)
    q, k, v = (t.view(B, S, -1, hd).transpose(1, 2) for t in (q, k, v))
    q = _rope(q, cos, sin)
    k = _rope(k, cos, sin)
    empty = torch.tensor([], dtype=k.dtype, device=k.device)
    cache.append((torch.cat([empty, k], dim=-2), torch.cat([empty, v], dim=-2)))
    del k, v, empty
    k, v = cache[-1]
    a = _attention(block, q, k, v, mask)
    del q, k, v, qkv
    a = a.transpose(1, 2).contiguous()
    o = block.proj(a.reshape(B, S, H * hd))
    del a
    x = x + o
    del o
    h = block.norm2(x)
    g = F.silu(block.gate(h))
    u = block.up(h)
    del h
    m = g * u
    del g, u
    out = block.down(m)
    del m
    return x + out


def generate_prefill(model, ids, logits_to_keep: int = 1, mark=None):
    """What ``generate``'s first forward allocates over a B x S prompt, under ``torch.no_grad``, writing a
    ``DynamicCache``: the positions and rotary tables, the mask (eager), every block (:func:`_block`), the final
    norm over all positions, the LM head on the last ``logits_to_keep`` positions (0: all;
    ``LlamaForCausalLM.forward``: ``lm_head(hidden_states[:, slice(-k, None), :])``) and the last position's
    logits copied to FP32; returns (those logits, the cache). ``mark(name)`` is called at each block's start and
    end and before the head."""
    c = model.c
    if c.style != "llama":
        raise ValueError("the serving prefill runs LLaMA blocks")
    mark = mark or (lambda name: None)
    B, S = ids.shape
    with torch.no_grad():
        positions = torch.arange(S, device=ids.device).unsqueeze(0)
        x = model.embed(ids)
        cos, sin = _rotary(model, positions, x.dtype)
        mask = _mask(c, B, S, x.dtype, ids.device)
        cache = []
        for i, block in enumerate(model.blocks):
            mark(f"block {i}")
            x = _block(block, x, mask, cos, sin, cache)
        mark("head")
        del mask, cos, sin, positions
        h = model.norm(x)
        del x
        logits = model.head(h[:, -logits_to_keep:, :] if logits_to_keep else h)
        del h
        return logits[:, -1, :].to(copy=True, dtype=torch.float32), cache


class NF4Fallback(torch.nn.Module):
    """A block projection (out x in) in bitsandbytes NF4 with double quantization, as ``Linear4bit`` holds it
    (buffers: packed codes, 8-bit absmax per 64, FP32 per 256 absmax, and the ``QuantState``'s tables: the 16-value
    code, the 256-value dynamic map, the 0-d offset; :mod:`memledger.states.bnb`) and as prefill runs it on CUDA
    (``gemm_4bit``, :func:`memledger.pytorch.lora.gemm_4bit`: past M = B*S = 1536 rows ``_dequant_linear_fallback``,
    ``bitsandbytes/backends/cuda/ops.py`` l. 904-916 at 95f9af30: ``absmax_dq`` (FP32), ``absmax_dq +
    absmax_offset``, the weight dequantized to the input's dtype, then ``F.linear``, all three alive until it
    returns; else the fused kernel, the output only). Allocates what those kernels allocate, without NF4's values."""

    def __init__(self, inp: int, out: int, bias: bool = False):
        super().__init__()
        from .lora import nf4_sizes
        self.shape = (out, inp)
        packed, absmax, absmax2 = nf4_sizes(out * inp)
        for name, n, dtype in (("packed", packed, torch.uint8), ("absmax", absmax, torch.uint8),
                               ("absmax2", absmax2, torch.float32), ("code", 16, torch.float32),
                               ("absmax_code", 256, torch.float32)):
            self.register_buffer(name, torch.empty(n, dtype=dtype))
        self.register_buffer("offset", torch.zeros((), dtype=torch.float32))
        self.register_buffer("bias", torch.empty(out) if bias else None)

    def forward(self, x):
        from .lora import gemm_4bit
        return gemm_4bit(x, self.absmax.shape, self.shape, self.bias, self.offset)


def quantize_blocks(model):
    """The blocks' projections as bitsandbytes NF4 (:class:`NF4Fallback`), as transformers'
    ``replace_with_bnb_linear`` swaps them; embeddings, norms and the LM head stay."""
    for block in model.blocks:
        for name in ("qkv", "proj", "gate", "up", "down"):
            old = getattr(block, name)
            setattr(block, name, NF4Fallback(old.in_features, old.out_features, bias=old.bias is not None))
    return model


@recorded
def memtracker_generate_prefill(c: RefConfig, batch: int, seq: int, dtype: str = "bf16",
                                logits_to_keep: int = 1, nf4: bool = False) -> dict:
    """MemTracker's run of :func:`generate_prefill` under ``FakeTensorMode`` (CPU bytes): {"before": weights, the
    ``inv_freq`` buffer and the ids, "peak", "after": with the FP32 logits and the cache, "trace": [(total, op),
    ...] after every op, "marks": [(name, index into trace), ...]}; ``nf4``: the blocks' projections in NF4
    (:func:`quantize_blocks`)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from .measure import _tracker_class
    loop = {"bf16": "bf16-pure-adamw", "fp32": "fp32-adamw"}[dtype]
    cpu = torch.device("cpu")
    with FakeTensorMode():
        model = make_model(c, loop).eval()
        if nf4:
            before_dtype = torch.get_default_dtype()
            torch.set_default_dtype(torch.float32 if dtype == "fp32" else torch.bfloat16)
            try:
                quantize_blocks(model)
            finally:
                torch.set_default_dtype(before_dtype)
        ids = torch.randint(0, c.V, (batch, seq))
        tracker = _tracker_class()()
        tracker.trace = []
        tracker.track_external(model, ids)
        marks = []
        with tracker:
            model.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, c.hd, 2, dtype=torch.int64).float() / c.hd))
            before = tracker.get_tracker_snapshot("current")[cpu]["Total"]
            tracker._peak_mem[cpu] = before
            start = len(tracker.trace)
            out = generate_prefill(model, ids, logits_to_keep, lambda name: marks.append((name, len(tracker.trace))))
            after = tracker.get_tracker_snapshot("current")[cpu]["Total"]
        trace = [(t[0], t[4]) for t in tracker.trace[start:]]
        result = {"before": before, "peak": max(tracker._peak_mem[cpu], after), "after": after, "trace": trace,
                  "marks": [(name, k - start) for name, k in marks]}
        del out
    return result
