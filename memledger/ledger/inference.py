"""Inference memory, for contrast with training: weights, the KV cache and a working buffer.

Serving keeps no gradients, no optimizer states and no activations for a
backward pass. What it keeps:

* weights: P parameters x bytes of the weight dtype (BF16: 2), split over tp;
* the KV cache: every layer keeps K and V for every token of every sequence,
  each B x S x H_kv x d_h: 2*L*B*S*H_kv*d_h*bytes (GQA-aware: H_kv key/value
  heads, not H; d*2*L*B*S*bytes for multi-head attention), split over tp;
* a working buffer, by this convention (stated, not measured): the transients
  of one layer's forward over the whole prompt (prefill, the largest step),
  with an attention kernel that materializes no S x S scores (FlashAttention):
  the layer's input and output (2BSd), Q, K, V and the attention output
  (BS(2q + 2kv)), the gated MLP's gate, up and product (3BSF; GeLU: 2BSF),
  all in the activation dtype, plus fp32 logits of the last position (4BV);
* the same runtime overhead as the training ledger (CUDA context, workspace).

``quantization``: bitsandbytes weights as transformers' ``BitsAndBytesConfig`` loads them
(:mod:`memledger.states.bnb`): ``"nf4"`` (``load_in_4bit``, ``bnb_4bit_quant_type="nf4"``; ``double_quant``:
``bnb_4bit_use_double_quant``) or ``"int8"`` (``load_in_8bit``, LLM.int8). Only the blocks' linear weights
are quantized; embeddings, norms, biases and the LM head stay in ``weight_dtype`` (the compute dtype; its
default in ``BitsAndBytesConfig`` is FP32, ``utils/quantization_config.py`` l. 448 and 469): transformers'
``replace_with_bnb_linear`` swaps ``nn.Linear`` (and ``Conv1D``) modules only (``integrations/bitsandbytes.py``
l. 162-210) and skips ``modules_to_not_convert``, by default ``get_keys_to_not_convert(model)``: tied weights,
the last module and the output embedding, i.e. the LM head (``quantizers/base.py`` l. 39-63; transformers
5.24.0), as ``llm_int8_skip_modules`` would. :attr:`Inference.footprint` is what
``model.get_memory_footprint()`` sums (``modeling_utils.py`` l. 3686-3703: parameters and buffers; a
LLaMA model's RoPE ``inv_freq`` buffer, d_h/2 FP32 values, is not booked).
The prefill dequantizes one layer's weight at a time: the largest
layer's transient is a row of its own beside the working buffer (an upper bound: it is booked as if it
coincided with the buffer's peak).

``attention``: ``"flash"`` or ``"sdpa"`` (no S x S tensor: the working-buffer convention above) or
``"eager"``: the working buffer is then at least eager attention's softmax moment
(:mod:`memledger.ledger.prefill`) in the compute dtype (``weight_dtype``, or ``kv_dtype`` where the weights are
FP8/int8), whose FP32 upcast depends on ``backend`` (``"cuda"`` or ``"cpu"``).

:attr:`Inference.prefill`: the whole prefill op by op (:mod:`memledger.step.prefill`), where it models the setup
(LLaMA blocks, BF16 or FP32 weights, or NF4 projections with double quantization computing in them, the KV
cache in the same dtype, one GPU; ``flash`` and ``sdpa`` run its SDPA program; resident: the weight rows, the ids
and RoPE's ``inv_freq``): the exact prefill peak and the op it is at, beside the rows (which stay the
convention above). ``logits_to_keep``: the LM head on the last position (1, ``generate``'s default) or on all
positions (0).
"""
from dataclasses import dataclass
from functools import cached_property

from ..core.choices import check_count, lookup
from ..core.dtypes import BYTES_PER_ELEMENT, nbytes
from ..core.rows import Row, Rows
from .ledger import DEFAULT_OVERHEAD
from .prefill import BACKENDS, eager_softmax_bytes
from .. import formulas
from ..models.features import ModelKey

__all__ = ["ATTENTIONS", "COMPUTE_DTYPES", "QUANTIZATIONS", "Inference", "quantized_shapes"]

QUANTIZATIONS = ("none", "nf4", "int8")
ATTENTIONS = ("flash", "sdpa", "eager")
#: bitsandbytes quantizes and computes in 16/32-bit floats only (functional.py l. 924-925).
COMPUTE_DTYPES = ("bf16", "fp16", "fp32")

def quantized_shapes(arch) -> tuple:
    """(out, in) of the linear weights bitsandbytes quantizes in one block: its projections (the LM head and the
    embeddings are kept). The model has L of each, so its sums are L times the block's (never a list of L x 7
    shapes: L goes up to 10^18)."""
    return tuple(formulas.projection_shapes(arch))


@dataclass(frozen=True)
class Inference:
    """Per-GPU memory of serving ``arch`` to ``batch_size`` sequences of ``seq_len`` tokens."""
    arch: object
    batch_size: int = 1
    seq_len: int = 2048
    weight_dtype: str = "bf16"
    kv_dtype: str = "bf16"
    tp: int = 1
    overhead_bytes: int = DEFAULT_OVERHEAD
    quantization: str = "none"
    double_quant: bool = True
    attention: str = "flash"
    backend: str = "cuda"
    logits_to_keep: int = 1

    def __post_init__(self):
        from ..models.architecture import Architecture
        from ..models.presets import get_preset
        arch = get_preset(self.arch) if isinstance(self.arch, str) else self.arch
        if not isinstance(arch, Architecture):
            raise TypeError(f"arch must be an Architecture or a preset name, got {self.arch!r}")
        object.__setattr__(self, "arch", arch)
        arch.check_modelled()
        for name in ("batch_size", "seq_len", "tp"):
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        object.__setattr__(self, "overhead_bytes", check_count("overhead_bytes", self.overhead_bytes, minimum=0))
        for name in ("weight_dtype", "kv_dtype"):           # whole bytes per element (no packed 4-bit types)
            lookup(BYTES_PER_ELEMENT, getattr(self, name), name)
        arch.check_tensor_parallel(self.tp)
        from ..core.choices import check_choice, check_flag
        check_choice("quantization", self.quantization, QUANTIZATIONS)
        check_choice("attention", self.attention, ATTENTIONS)
        check_choice("backend", self.backend, BACKENDS)
        check_flag("double_quant", self.double_quant)
        if not self.double_quant and self.quantization != "nf4":
            raise ValueError(f"double_quant=False applies to NF4 weights only, not quantization {self.quantization}")
        if self.quantization != "none":
            if self.weight_dtype not in COMPUTE_DTYPES:
                raise ValueError(f"weight_dtype is the compute dtype under quantization {self.quantization}: "
                                 f"bitsandbytes computes in {', '.join(COMPUTE_DTYPES)}, got {self.weight_dtype}")
            if self.tp > 1:
                raise ValueError(f"tp: {self.quantization} weights are modelled on one GPU (bitsandbytes quantizes "
                                 f"whole nn.Linear weights), got tp {self.tp}")
            if arch.n_experts:
                raise ValueError(f"quantization: {self.quantization} on mixture-of-experts blocks is not modelled")
        if not isinstance(self.logits_to_keep, int) or isinstance(self.logits_to_keep, bool) or self.logits_to_keep < 0:
            raise ValueError(f"logits_to_keep must be a whole number >= 0 (0: every position), got {self.logits_to_keep!r}")
        if self.logits_to_keep != 1 and self.prefill_unmodelled:
            raise ValueError(f"logits_to_keep sets the op-by-op prefill's LM head, not modelled here: "
                             f"{self.prefill_unmodelled}")

    @cached_property
    def rows(self) -> Rows:
        """Weights, KV cache, working buffer and overhead per GPU (group "inference"), exact bytes."""
        a, values = self.arch, dict(self.arch.values, B=self.batch_size, S=self.seq_len)
        kv = ("kv cache", nbytes(self.kv_dtype))            # memledger.activations.serving, compiled
        work = ModelKey("working buffer", a.features, (nbytes(self.kv_dtype),))
        c = nbytes(self.weight_dtype)
        buffer = -(-formulas.evaluate(work, values) // self.tp)
        buffer_name, buffer_formula = "working buffer (prefill, one layer)", f"ceiling(({formulas.text(work)})/t)"
        if self.attention == "eager":
            compute = self.weight_dtype if self.weight_dtype in COMPUTE_DTYPES else self.kv_dtype
            softmax = eager_softmax_bytes(a, self.batch_size, self.seq_len, compute, self.backend)
            if softmax > buffer:
                buffer, buffer_formula = softmax, f"eager softmax moment ({self.backend}, memledger.ledger.prefill)"
                buffer_name = "working buffer (prefill: eager attention's B*H*S*S scores)"
        if self.quantization == "none":
            weights = [(f"weights ({self.weight_dtype})", -(-a.params * c // self.tp), f"ceiling(P*{c}/t)")]
        else:
            weights = self._quantized_rows(c)
        sizes = weights + [(f"KV cache ({self.kv_dtype})", formulas.evaluate(kv, values) // self.tp,
                            f"floor(({formulas.text(kv)})/t)"),
                           (buffer_name, buffer, buffer_formula)]
        if self.quantization != "none":
            sizes.append(self._transient_row(c))
        sizes.append(("CUDA context + workspace", self.overhead_bytes, "O"))
        return Rows(Row(name, "inference", "gpu", size, formula=formula) for name, size, formula in sizes)

    def _quantized_rows(self, c: int) -> list:
        """The compute-dtype rest, then the quantized linear weights' parts (memledger.states.bnb)."""
        from ..states.bnb import int8_parts, nf4_parts, nf4_table_bytes
        shapes, L = quantized_shapes(self.arch), self.arch.n_layers      # each shape L times in the model
        n = L * sum(o * i for o, i in shapes)
        rows = [(f"weights ({self.weight_dtype}: embeddings, norms, biases, LM head)", (self.arch.params - n) * c,
                 f"(P - {n})*{c}")]
        if self.quantization == "nf4":
            parts = [nf4_parts(o * i, self.double_quant) for o, i in shapes]
            absmax = ("8-bit absmax per 64 + FP32 per 256 (double quantization)" if self.double_quant
                      else "FP32 absmax per 64")
            return rows + [("NF4 linear weights: packed 4-bit codes", L * sum(p["packed"] for p in parts),
                            "sum ceiling(n/2)"),
                           (f"NF4 linear weights: {absmax}", L * sum(p["absmax"] for p in parts),
                            "bitsandbytes quantize_4bit"),
                           ("NF4 QuantState code tables" + (" and offsets" if self.double_quant else ""),
                            L * len(shapes) * nf4_table_bytes(self.double_quant), "per weight, bitsandbytes QuantState")]
        parts = [int8_parts(o, i) for o, i in shapes]
        return rows + [("LLM.int8 linear weights (int8)", L * sum(p["int8"] for p in parts), "sum out*in"),
                       ("LLM.int8 row scales (SCB, FP32)", L * sum(p["scales"] for p in parts), "sum 4*out")]

    def _transient_row(self, c: int) -> tuple:
        """The largest layer's quantized-matmul transient during prefill (memledger.states.bnb)."""
        from ..states.bnb import int8_matmul_bytes, nf4_dequant_bytes
        tokens = self.batch_size * self.seq_len
        if self.quantization == "nf4":
            size = max(nf4_dequant_bytes(o * i, c, self.double_quant) for o, i in set(quantized_shapes(self.arch)))
            return ("NF4 dequantization (largest layer, prefill)", size, "out*in*c + 8*ceiling(out*in/64)")
        size = max(int8_matmul_bytes(tokens, i, o, self.weight_dtype) for o, i in set(quantized_shapes(self.arch)))
        return ("LLM.int8 matmul transients (largest layer, prefill; outliers not booked)", size,
                "max(2*T*in, 4*T*out) + T*in + 4*T")

    @property
    def prefill_unmodelled(self) -> str:
        """Why :attr:`prefill` is None ("" where the op-by-op prefill models this setup)."""
        a = self.arch
        if a.style != "llama" or a.n_experts or a.features.parallel:
            return "the op-by-op prefill models dense LLaMA blocks"
        if self.quantization == "int8":
            return "LLM.int8 weights' prefill is not modelled op by op"
        if self.quantization == "nf4" and not self.double_quant:
            return "NF4 without double quantization is not modelled op by op"
        if self.tp > 1:
            return "the op-by-op prefill runs on one GPU (tp 1)"
        if self.weight_dtype not in ("bf16", "fp32") or self.kv_dtype != self.weight_dtype:
            return "the op-by-op prefill runs BF16 or FP32 weights with the KV cache in their dtype"
        return ""

    @cached_property
    def prefill(self):
        """The prefill op by op (:class:`memledger.step.prefill.Prefill`), or None (:attr:`prefill_unmodelled`)."""
        if self.prefill_unmodelled:
            return None
        from ..step.prefill import Prefill
        resident = self.weights + self.batch_size * self.seq_len * 8 + self.arch.head_dim // 2 * 4
        return Prefill(self.arch, self.batch_size, self.seq_len, self.weight_dtype,
                       "eager" if self.attention == "eager" else "sdpa", self.logits_to_keep, resident,
                       "dense" if self.quantization == "none" else "nf4")

    @property
    def footprint(self) -> int:
        """What transformers' ``model.get_memory_footprint()`` reports: parameters (and buffers) only, so the
        packed codes or int8 weights without their absmax, scales or tables (module docstring)."""
        return sum(r.bytes for r in self.rows[:min(self._weight_rows, 2)])

    @property
    def _weight_rows(self) -> int:
        """How many rows, from the first, book weights."""
        return {"none": 1, "nf4": 4, "int8": 3}[self.quantization]

    @property
    def weights(self) -> int:
        """The weights: P x bytes of the weight dtype, split over tp (rounded up); quantized, every weight row."""
        return sum(r.bytes for r in self.rows[:self._weight_rows])

    @property
    def total(self) -> int:
        return self.rows.total()

    def to_dict(self) -> dict:
        return {"inputs": {"batch_size": self.batch_size, "seq_len": self.seq_len, "weight_dtype": self.weight_dtype,
                           "kv_dtype": self.kv_dtype, "tp": self.tp, "overhead_bytes": self.overhead_bytes,
                           "quantization": self.quantization, "double_quant": self.double_quant,
                           "attention": self.attention, "backend": self.backend, "logits_to_keep": self.logits_to_keep,
                           "n_params": self.arch.params, "n_kv_heads": self.arch.kv_heads,
                           "head_dim": self.arch.head_dim},
                "rows": [r.to_dict() for r in self.rows],
                "totals": {"gpu": self.total, "cpu": 0, "nvme": 0},
                "prefill": self._prefill_dict()}

    def _prefill_dict(self) -> dict:
        """The op-by-op prefill's peak ({"modelled": False, "why": ...} where it is not)."""
        p = self.prefill
        if p is None:
            return {"modelled": False, "why": self.prefill_unmodelled}
        return {"modelled": True, "logits_to_keep": self.logits_to_keep, "peak": p.peak.bytes, "op": p.peak.op,
                "block": p.peak.layer, "resident": p.resident_bytes, "after": p.after}
