"""Inference prefill, op by op: what ``generate``'s first forward allocates and frees over a B x S prompt.

The blocks are the reference decoder's: one fused QKV projection whose output q, k and v view until attention
returns (transformers' LLaMA runs ``q_proj``, ``k_proj`` and ``v_proj`` as three layers; with NF4 weights, three
``Linear4bit`` and their tables, which :class:`memledger.ledger.inference.Inference` books as resident).
The forward runs under ``torch.no_grad`` (nothing is saved for a backward pass), so every tensor dies with its
last Python reference. The programs follow :func:`memledger.pytorch.prefill.generate_prefill` (transformers'
LLaMA as ``generate`` runs it, on the reference decoder's modules; PyTorch 2.13, CPU, read off MemTracker's
log and checked against it to the byte by ``tests/step/test_prefill_memtracker.py``):

* before the blocks: the positions (``arange``, S int64), the embedding (B S d), the rotary tables
  (``LlamaRotaryEmbedding.forward``: ``inv_freq @ positions`` in FP32, ``cat((freqs, freqs))``, ``cos``/``sin``
  times ``attention_scaling``, cast to the compute dtype c: two 1 x S x d_h tables) and, for eager attention,
  transformers' additive B x 1 x S x S mask (``masking_utils.eager_mask``);
* per block: RMSNorm as ATen's composite ``rms_norm`` runs it (the FP32 upcast, its square, the mean, rsqrt,
  the normalized FP32 tensor, the cast back, times the weight); the fused QKV projection (q, k, v its views);
  ``apply_rotary_pos_emb`` on q and on k (``(x * cos) + (rotate_half(x) * sin)``: four x-sized temporaries and
  ``-x2`` at half width); the cache write (transformers' ``DynamicLayer.update``, ``cache_utils.py`` at
  004999d9: ``torch.cat([self.keys, key_states], dim=-2)`` onto an empty tensor, a copy of K and of V that the
  cache keeps, B H_kv S d_h c each); attention on the cache's K and V: SDPA (the CPU flash kernel's output and
  FP32 logsumexp, B H S) or the eager core (:mod:`memledger.ledger.prefill`'s scores moment); the output
  projection, the residual, RMSNorm, the gated MLP, the residual;
* after the blocks: the final norm over all positions, the LM head on the last position (``generate`` sets
  ``logits_to_keep=1`` where the model's forward takes it, ``generation/utils.py``; ``LlamaForCausalLM.forward``
  applies ``lm_head`` to ``hidden_states[:, slice(-logits_to_keep, None), :]``) or on all positions
  (``logits_to_keep=0``), and that position's logits copied to FP32
  (``outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)``).

Weights in the compute dtype (BF16, FP32) or the blocks' projections in bitsandbytes NF4 with double
quantization (``weights="nf4"``): each projection then runs bitsandbytes' prefill path on CUDA (M = B*S > 1536:
``_dequant_linear_fallback``, ``backends/cuda/ops.py`` l. 904-916 at 95f9af30; :mod:`memledger.states.bnb`):
two FP32 absmax arrays (n/64 values each: dequantized, plus the offset) and the weight in the compute dtype,
alive through ``F.linear`` (:func:`memledger.step.nf4.nf4_forward_ops`, shared with the QLoRA step). The resident
weights are the packed codes, the absmax and the ``QuantState``'s tables. LLM.int8 is not modelled op by op.

Every block runs the same ops and leaves only its KV cache behind, so where L > 4 blocks 2..L-3 are one op
(their cache) and blocks 0, 1, L-2 and L-1 run op by op, as the training step lumps them
(:mod:`memledger.step.trace`): the peak is exact and the time the same for any L.

:class:`Prefill` evaluates the totals after every op (resident: the weights, the ids and the FP32 ``inv_freq``
buffer, d_h/2 values) and names the op and block of the peak. Programs are lists of
:class:`memledger.step.ops.ProgramOp` over :class:`memledger.step.ops.Tensor` rows (:class:`~memledger.step.ops.Program`).
"""
from dataclasses import dataclass
from functools import cached_property

from ..core.dtypes import nbytes
from ..states.bnb import nf4_gemm_fallback, nf4_parts, nf4_table_bytes
from .nf4 import nf4_forward_ops
from .program import Program
from .vocab import Kind

__all__ = ["ATTENTIONS", "DTYPES", "LUMP", "WEIGHTS", "Prefill", "PrefillPeak", "explicit_blocks", "prefill_programs",
           "projection_shapes"]

#: The attention kernels the prefill runs: SDPA (flash: no S x S tensor) and transformers' eager core.
ATTENTIONS = ("sdpa", "eager")
#: The compute dtypes the prefill is checked in.
DTYPES = ("bf16", "fp32")
#: The blocks' projections: in the compute dtype, or bitsandbytes NF4 with double quantization.
WEIGHTS = ("dense", "nf4")
#: The ``layer`` of the program that stands for blocks 2..L-3 at once (:func:`prefill_programs`).
LUMP = "2..L-3"


def projection_shapes(arch) -> list:
    """(out, in) of one block's projections: the fused QKV, the output projection, gate, up, down."""
    d, F, H, kv, hd = arch.d_model, arch.d_ff, arch.n_heads, arch.kv_heads, arch.head_dim
    return [((H + 2 * kv) * hd, d), (d, H * hd), (F, d), (F, d), (d, F)]


@dataclass(frozen=True)
class PrefillPeak:
    """The prefill's largest total: its bytes, the op and the block (None: outside the blocks) it is at."""
    bytes: int
    op: str
    layer: object


def _dims(arch, B, S):
    H, kv, hd = arch.n_heads, arch.kv_heads, arch.head_dim
    return dict(B=B, S=S, d=arch.d_model, F=arch.d_ff, V=arch.vocab_size, H=H, kv=kv, hd=hd)


def _norm(p, x, where, n, c, free_input=False):
    """ATen's composite ``rms_norm`` on ``x`` (B S d): returns the name of its output. MemTracker never sees the
    weight's product beside the normalized tensor it multiplies (its moment holds one of them); the FP32
    temporaries go as ``rms_norm`` returns; ``free_input``: the caller drops ``x`` then too (the final norm)."""
    gone = [x] if free_input else []
    B, S, d = n["B"], n["S"], n["d"]
    t = {k: p.new(f"{where}: {k}", shape, dtype, why) for k, shape, dtype, why in (
        ("FP32 input", (B, S, d), "fp32", "input.float()"), ("square", (B, S, d), "fp32", "pow(2)"),
        ("mean", (B, S), "fp32", "mean(-1, keepdim=True)"), ("rstd", (B, S), "fp32", "rsqrt(mean + eps)"),
        ("normalized (FP32)", (B, S, d), "fp32", "x * rstd"), ("normalized", (B, S, d), c, "type_as(input)"),
        ("output", (B, S, d), c, "weight * normalized"))}
    if c == "fp32":                          # .float() and type_as are no-ops on an FP32 input
        p.op(f"{where}: pow(2)", alloc=[t["square"]])
    else:
        p.op(f"{where}: input.float()", alloc=[t["FP32 input"]])
        p.op(f"{where}: pow(2)", alloc=[t["square"]])
    p.op(f"{where}: mean", alloc=[t["mean"]])
    p.op(f"{where}: rsqrt", alloc=[t["rstd"]])
    p.op(f"{where}: x * rstd", free=[t["mean"]], alloc=[t["normalized (FP32)"]])
    if c == "fp32":
        p.op(f"{where}: * weight", free=[t["normalized (FP32)"]], alloc=[t["output"]])
        p.op("released", free=[t["square"], t["rstd"]] + gone)
    else:
        p.op(f"{where}: type_as(input)", free=[t["square"], t["FP32 input"]], alloc=[t["normalized"]])
        p.op(f"{where}: * weight", free=[t["normalized"]], alloc=[t["output"]])
        p.op("released", free=[t["normalized (FP32)"], t["rstd"]] + gone)
    return t["output"]


def _rope(p, width, where, n, c):
    """``apply_rotary_pos_emb`` on one of q, k (B S ``width``): returns the rotated tensor's name."""
    B, S = n["B"], n["S"]
    xc = p.new(f"{where} * cos", (B, S, width), c, "x * cos")
    neg = p.new(f"{where}: -x2", (B, S, width // 2), c, "rotate_half: the second half negated")
    rot = p.new(f"{where}: rotate_half", (B, S, width), c, "torch.cat((-x2, x1))")
    rs = p.new(f"{where}: rotate_half * sin", (B, S, width), c, "rotate_half(x) * sin")
    out = p.new(f"{where} rotated", (B, S, width), c, "(x * cos) + (rotate_half(x) * sin)")
    p.op(f"{where} * cos", alloc=[xc])
    p.op(f"{where}: -x2", alloc=[neg])
    p.op(f"{where}: rotate_half (cat)", alloc=[rot])
    p.op("released", free=[neg])
    p.op(f"{where}: rotate_half * sin", alloc=[rs])
    p.op(f"{where}: rotary sum", free=[rot], alloc=[out])
    p.op("released", free=[xc, rs])
    return out


def _start(p, n, c, attention):
    """Positions, embedding, rotary tables (and the eager mask): returns (hidden, the tables, the positions and
    mask), the last two held until the blocks have run."""
    B, S, d, hd = n["B"], n["S"], n["d"], n["hd"]
    pos = p.new("position ids", (S,), "int64", "torch.arange(S).unsqueeze(0)")
    x = p.new("embedding output", (B, S, d), c, "the first block's input")
    pos32 = p.new("positions (FP32)", (S,), "fp32", "position_ids[:, None, :].float()")
    freqs = p.new("inv_freq @ positions", (S, hd // 2), "fp32", "the rotary angles")
    emb = p.new("rotary angles cat", (S, hd), "fp32", "torch.cat((freqs, freqs), dim=-1)")
    cos_t, sin_t = (p.new(f"{f}(angles)", (S, hd), "fp32", f"emb.{f}()") for f in ("cos", "sin"))
    cos32, sin32 = (p.new(f"{f} * attention_scaling", (S, hd), "fp32", "FP32 table") for f in ("cos", "sin"))
    p.op("positions (arange)", alloc=[pos])
    p.op("embedding", alloc=[x])
    p.op("positions.float()", alloc=[pos32])
    p.op("inv_freq @ positions", alloc=[freqs])
    p.op("cat(freqs, freqs)", alloc=[emb])
    p.op("cos", free=[freqs, pos32], alloc=[cos_t])
    p.op("cos * attention_scaling", alloc=[cos32])
    p.op("sin", free=[cos_t], alloc=[sin_t])
    p.op("sin * attention_scaling", alloc=[sin32])
    if c == "fp32":                                      # .to(float32) returns the table itself
        p.op("released", free=[sin_t, emb])
        tables = [cos32, sin32]
    else:
        cos, sin = (p.new(f"{f} table", (S, hd), c, f"{f}.to(dtype)") for f in ("cos", "sin"))
        p.op("cos.to(dtype)", free=[sin_t, emb], alloc=[cos])
        p.op("sin.to(dtype)", alloc=[sin])
        p.op("released", free=[cos32, sin32])
        tables = [cos, sin]
    mask = []
    if attention == "eager":
        ones = p.new("ones (S, S)", (S, S), "bool", "torch.ones(S, S)")
        causal = p.new("causal (S, S)", (S, S), "bool", ".triu(1)")
        keep = p.new("~causal", (S, S), "bool", "True where attended")
        zero = p.new("0-d zero", (), c, "torch.zeros(())")
        low = p.new("0-d finfo.min", (), c, "torch.where wraps the Python scalar in a 0-d tensor")
        m = p.new("additive mask", (B, S, S), c, "torch.where(keep, 0, finfo.min), B x 1 x S x S")
        p.op("mask: ones", alloc=[ones])
        p.op("mask: triu", alloc=[causal])
        p.op("released", free=[ones])
        p.op("mask: ~causal", alloc=[keep])
        p.op("mask: zero", alloc=[zero])
        p.op("mask: finfo.min", alloc=[low])
        p.op("mask: where", alloc=[m])
        p.op("released", free=[zero, low, keep, causal])
        mask = [m]
    return x, tables, [pos] + mask


def _attention_sdpa(p, n, c, where):
    """SDPA's CPU flash kernel: the output (B H S d_h, laid out B S H d_h) and the FP32 logsumexp (B H S)."""
    B, S, H, hd = n["B"], n["S"], n["H"], n["hd"]
    out = p.new(f"{where}: attention output", (B, S, H * hd), c, "SDPA's output")
    lse = p.new(f"{where}: logsumexp", (B, H, S), "fp32", "the flash kernel's second output")
    p.op(f"{where}: SDPA (flash)", alloc=[out, lse])
    return out, [lse]


def _attention_eager(p, n, c, where):
    """transformers' ``eager_attention_forward``: ``repeat_kv`` copies under grouped-query attention, the
    scores, scaled, plus the mask, the softmax in FP32 (:mod:`memledger.ledger.prefill`), cast back, ``@ v``."""
    B, S, H, kv, hd = n["B"], n["S"], n["H"], n["kv"], n["hd"]
    free_after = []
    if kv != H:
        k2, v2 = (p.new(f"{where}: repeat_kv {x}", (B, H, S, hd), c, "expand + reshape: a copy") for x in "KV")
        p.op(f"{where}: repeat_kv K", alloc=[k2])
        p.op(f"{where}: repeat_kv V", alloc=[v2])
        free_after = [k2, v2]
    # matmul folds (B, H) into one batch dimension: the rotated q keeps the QKV output's B S H d_h layout, so
    # for B > 1 it is copied first (B = 1 folds as a view)
    qc = p.new(f"{where}: q copy", (B, H, S, hd), c, "matmul's reshape of q to (B H) x S x d_h") if B > 1 else None
    raw = p.new(f"{where}: q @ k^T", (B, H, S, S), c, "the scores")
    scaled = p.new(f"{where}: scores * scaling", (B, H, S, S), c, "scaled")
    masked = p.new(f"{where}: scores + mask", (B, H, S, S), c, "masked")
    soft = p.new(f"{where}: softmax (FP32)", (B, H, S, S), "fp32", "softmax(..., dtype=float32)")
    out = p.new(f"{where}: attention output", (B, H, S, hd), c, "probs @ v")
    if qc:
        p.op(f"{where}: q copy", alloc=[qc])
    p.op(f"{where}: q @ k^T", alloc=[raw])
    p.op(f"{where}: * scaling", free=[qc], alloc=[scaled])
    p.op(f"{where}: + mask", free=[raw, scaled], alloc=[masked])
    if c == "fp32":                 # an FP32 input is softmaxed as is; .to(float32) returns it
        p.op(f"{where}: softmax", alloc=[soft])
        p.op("released", free=[masked])
        probs = soft
    else:
        copy = p.new(f"{where}: scores in FP32", (B, H, S, S), "fp32", "input_.toType(float32)")
        probs = p.new(f"{where}: probabilities", (B, H, S, S), c, "softmax(...).to(dtype)")
        p.op(f"{where}: scores to FP32", alloc=[copy])
        p.op(f"{where}: softmax", alloc=[soft])
        p.op(f"{where}: .to(dtype)", free=[copy], alloc=[probs])
        p.op("released", free=[soft, masked])
    p.op(f"{where}: probs @ v", alloc=[out])
    p.op("released", free=[probs] + free_after)
    return out, []


def _linear(p, c, nf4, label, out, shape, rows):
    """One block projection writing ``out`` over ``rows`` = B*S input rows; NF4 (``shape`` = (out, in)):
    bitsandbytes' ``gemm_4bit`` (:mod:`memledger.step.nf4`): past 1536 rows (or an input width not a multiple of
    64) ``_dequant_linear_fallback``: the absmax dequantized to FP32, plus the offset (a second FP32 array), the
    weight dequantized to the compute dtype, ``F.linear``, the three released as it returns; else the fused
    kernel, which writes the output only."""
    if not nf4:
        p.op(label, alloc=[out])
        return
    nf4_forward_ops(p, c, label, out, shape, fallback=nf4_gemm_fallback(rows, shape[1]))


def _block(p, n, c, x, i, attention, nf4=False):
    """Block ``i``: returns (its output's name, its two cache tensors' names)."""
    B, S, d, F, H, kv, hd = (n[k] for k in ("B", "S", "d", "F", "H", "kv", "hd"))
    where = f"block {i}"
    h = _norm(p, x, f"{where} norm 1", n, c)
    qkv = p.new(f"{where}: QKV output", (B, S, (H + 2 * kv) * hd), c, "q, k, v are its views")
    _linear(p, c, nf4, f"{where}: QKV projection", qkv, ((H + 2 * kv) * hd, d), B * S)
    p.op("released", free=[h])
    q = _rope(p, H * hd, f"{where}: q", n, c)
    k = _rope(p, kv * hd, f"{where}: k", n, c)
    K, V = (p.new(f"KV cache: block {i} {x}", (B, S, kv * hd), c, "DynamicLayer.update: torch.cat onto an empty "
                  "tensor", kind=Kind.ACTIVATION) for x in "KV")
    p.op(f"{where}: cache write K (cat)", alloc=[K])
    p.op(f"{where}: cache write V (cat)", alloc=[V])
    p.op("released", free=[k])
    if attention == "eager":
        a, extra = _attention_eager(p, n, c, where)
    else:
        a, extra = _attention_sdpa(p, n, c, where)
    p.op("released", free=extra + [q, qkv])
    if attention == "eager":        # SDPA's output is laid out B S H d_h already: no copy
        out_t = p.new(f"{where}: attention output, transposed", (B, S, H * hd), c, ".transpose(1, 2).contiguous()")
        p.op(f"{where}: transpose(1, 2).contiguous()", alloc=[out_t])
        p.op("released", free=[a])
        a = out_t
    o = p.new(f"{where}: output projection", (B, S, d), c, "o_proj")
    x1 = p.new(f"{where}: attention residual sum", (B, S, d), c, "x + o")
    _linear(p, c, nf4, f"{where}: output projection", o, (d, H * hd), B * S)
    p.op("released", free=[a])
    p.op(f"{where}: residual add", alloc=[x1])
    p.op("released", free=[o])
    h2 = _norm(p, x1, f"{where} norm 2", n, c)
    gate, silu, up, prod = (p.new(f"{where}: {k}", (B, S, F), c, k) for k in (
        "gate projection", "SiLU(gate)", "up projection", "SiLU(gate) * up"))
    down = p.new(f"{where}: down projection", (B, S, d), c, "down")
    out = p.new(f"{where}: output", (B, S, d), c, "x + MLP(x)")
    _linear(p, c, nf4, f"{where}: gate projection", gate, (F, d), B * S)
    p.op(f"{where}: SiLU", alloc=[silu])
    p.op("released", free=[gate])
    _linear(p, c, nf4, f"{where}: up projection", up, (F, d), B * S)
    p.op("released", free=[h2])
    p.op(f"{where}: SiLU(gate) * up", alloc=[prod])
    p.op("released", free=[silu, up])
    _linear(p, c, nf4, f"{where}: down projection", down, (d, F), B * S)
    p.op("released", free=[prod])
    p.op(f"{where}: residual add", alloc=[out])
    p.op("block returns", free=[down, x1, x])
    return out, (K, V)


def _end(p, n, c, x, logits_to_keep):
    """The final norm, the LM head on the kept positions, the last position's logits in FP32."""
    B, S, V, d = n["B"], n["S"], n["V"], n["d"]
    h = _norm(p, x, "final norm", n, c, free_input=True)
    kept = S if logits_to_keep == 0 else min(logits_to_keep, S)
    logits = p.new("logits", (B, kept, V), c, f"lm_head on the last {kept} position(s)")
    last = p.new("next-token logits (FP32)", (B, V), "fp32", "logits[:, -1, :].to(copy=True, dtype=float32)")
    # the kept positions of B > 1 rows are not one (B kept) x d view unless kept is 1 or S: matmul copies them
    copy = p.new("LM head input copy", (B, kept, d), c, "matmul's reshape of the sliced positions") \
        if B > 1 and 1 < kept < S else None
    if copy:
        p.op("LM head input copy", alloc=[copy])
    p.op("LM head", alloc=[logits])
    p.op("released", free=[h, copy])
    p.op("last position's logits to FP32", alloc=[last])
    p.op("released", free=[logits])
    return last


def explicit_blocks(n_layers: int) -> list:
    """The blocks the prefill runs op by op: all when L <= 4, else 0, 1, L-2, L-1 (the step's choice,
    :func:`memledger.step.trace.explicit_layers`, not imported: it loads SymPy)."""
    return list(range(n_layers)) if n_layers <= 4 else [0, 1, n_layers - 2, n_layers - 1]


def _lump(p, n, c, n_layers):
    """Blocks 2..L-3 as one op: what they leave behind, their KV cache (the hidden state they pass on is the
    size of the one they take). Every block runs the same ops, and block i's total after any op is block 0's plus
    i times one block's cache (the only tensors a block leaves), so the largest over blocks 2..L-3 is below block
    L-2's at the same op: the peak stays exact, and the programs the same length whatever L (as the step lumps
    them, :mod:`memledger.step.trace`)."""
    B, S, kv, hd = n["B"], n["S"], n["kv"], n["hd"]
    cache = p.new(f"KV cache: blocks {LUMP}", (n_layers - 4, 2, B, S, kv * hd), c, "the K and V that blocks 2..L-3 "
                  "write (DynamicLayer.update)", kind=Kind.ACTIVATION)
    p.op(f"blocks {LUMP} (their KV cache)", alloc=[cache])


def prefill_programs(arch, batch_size: int, seq_len: int, dtype: str = "bf16", attention: str = "sdpa",
                     logits_to_keep: int = 1, weights: str = "dense", lump: bool = True) -> list:
    """[(layer or None, :class:`Program`)]: the start, each block, the end (module docstring); with ``lump``
    (and L > 4) blocks 2..L-3 are one program of layer :data:`LUMP` (:func:`_lump`), so any L takes the time of
    five blocks."""
    n, c = _dims(arch, batch_size, seq_len), dtype
    tensors = {}
    start = Program(tensors)
    x, tables, shared = _start(start, n, c, attention)
    programs = [(None, start)]
    L = arch.n_layers
    for i in explicit_blocks(L) if lump else range(L):
        if lump and i == L - 2 and L > 4:
            p = start.fork()
            _lump(p, n, c, L)
            programs.append((LUMP, p))
        p = start.fork()
        x, _ = _block(p, n, c, x, i, attention, weights == "nf4")
        programs.append((i, p))
    end = start.fork()
    end.op("released", free=tables + shared)
    _end(end, n, c, x, logits_to_keep)
    programs.append((None, end))
    return programs


class Prefill:
    """The prefill of ``arch`` over ``batch_size`` prompts of ``seq_len`` tokens, op by op (module docstring).

    ``resident``: what is live before it (weights, ids, ``inv_freq``: :attr:`resident_bytes`, given or computed
    from the parameter count in ``dtype``)."""

    def __init__(self, arch, batch_size: int = 1, seq_len: int = 2048, dtype: str = "bf16",
                 attention: str = "sdpa", logits_to_keep: int = 1, resident: int = None, weights: str = "dense"):
        from ..core.choices import check_choice, check_count
        if getattr(arch, "style", "llama") != "llama" or getattr(arch, "n_experts", 0):
            raise ValueError("prefill: the op-by-op prefill models LLaMA blocks (dense, RMSNorm, rotary, gated MLP)")
        check_choice("attention", attention, ATTENTIONS)
        check_choice("dtype", dtype, DTYPES)
        check_choice("weights", weights, WEIGHTS)
        if not isinstance(logits_to_keep, int) or isinstance(logits_to_keep, bool) or logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be a whole number >= 0 (0: every position), got {logits_to_keep!r}")
        self.arch, self.dtype, self.attention, self.logits_to_keep = arch, dtype, attention, logits_to_keep
        self.weights = weights
        self.batch_size = check_count("batch_size", batch_size)
        self.seq_len = check_count("seq_len", seq_len)
        ids = self.batch_size * self.seq_len * 8
        self.resident_bytes = (self.weight_bytes + ids + arch.head_dim // 2 * 4 if resident is None else resident)

    @property
    def weight_bytes(self) -> int:
        """The parameters in ``dtype``; under NF4 the blocks' projections as packed codes, double-quantized
        absmax and each ``QuantState``'s tables (:func:`memledger.states.bnb.nf4_parts`, ``nf4_table_bytes``)."""
        a, c = self.arch, nbytes(self.dtype)
        if self.weights == "dense":
            return a.params * c
        quantized = sum(o * i for o, i in projection_shapes(a)) * a.n_layers
        parts = [nf4_parts(o * i) for o, i in projection_shapes(a)]
        return (a.params - quantized) * c + a.n_layers * sum(x["packed"] + x["absmax"] + nf4_table_bytes()
                                                              for x in parts)

    @cached_property
    def programs(self) -> list:
        return prefill_programs(self.arch, self.batch_size, self.seq_len, self.dtype, self.attention,
                                self.logits_to_keep, self.weights)

    @cached_property
    def moments(self) -> list:
        """[(total, layer, op label, allocates?)] after every op (layer: the block, None outside the blocks,
        :data:`LUMP` for the one op that stands for blocks 2..L-3 where L > 4)."""
        tensors = self.programs[0][1].tensors
        live, total, out = set(), self.resident_bytes, []
        for layer, p in self.programs:
            for op in p.ops:
                for name in op.frees:
                    live.remove(name)
                    total -= int(tensors[name].expr)
                for name in op.allocs:
                    live.add(name)
                    total += int(tensors[name].expr)
                out.append((total, layer, op.label, bool(op.allocs)))
        return out

    @cached_property
    def peak(self) -> PrefillPeak:
        total, layer, label, _ = max(self.moments, key=lambda m: m[0])
        return PrefillPeak(total, label, layer)

    @property
    def after(self) -> int:
        """The total once the prefill has returned: the resident bytes, the cache and the FP32 logits."""
        return self.moments[-1][0]
