"""What ``torch.compile``'s min-cut partitioner saves for the reference block, measured live, against memledger.

Each case compiles one reference block (``backend="aot_eager_decomp_partition"``: AOTAutograd, Inductor's
decompositions and ``min_cut_rematerialization_partition``, the graph run eagerly) at a small shape with real
tensors and catches every storage its compiled autograd function saves (saved_tensors_hooks on
``ctx.save_for_backward``; parameters skipped, the shared causal mask left outside the block). memledger's
rows for it (:mod:`memledger.activations.partitioned` on :func:`~memledger.activations.inventory.inventory`,
with the CPU run's conventions) must be those storages, size for size; the ledger's activations row (the
article's conventions: no norm statistics) their sum without the per-token statistics. Shape-independence:
several shapes (S below and above d) and LLaMA-2 7B's block (d 4096, H 32, F 11008) at a
short sequence. Inductor itself (a C++
compiler needed) saves the same storages. Slow: each compile takes 10-60 s on the CPU.
"""
import shutil

import pytest

torch = pytest.importorskip("torch")

from memledger.activations.inventory import inventory  # noqa: E402
from memledger.activations.partitioned import compiled_options, compiled_rows  # noqa: E402
from memledger.core.exact import evaluate_expr  # noqa: E402
from memledger.ledger.ledger import Ledger  # noqa: E402
from memledger.pytorch.compare import architecture_of  # noqa: E402
from memledger.pytorch.compiled import compiled_saved, eager_saved  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402

pytestmark = pytest.mark.slow

DTYPE = {"bf16": torch.bfloat16, "fp32": torch.float32}
#: (name, RefConfig fields, dtype, B, S)
CASES = [
    ("LLaMA, SDPA flash", dict(style="llama", d=64, H=4, F=176), "bf16", 2, 16),
    ("LLaMA, SDPA flash, another shape", dict(style="llama", d=96, H=6, F=256), "bf16", 3, 24),
    ("LLaMA, SDPA flash, FP32", dict(style="llama", d=48, H=2, F=200), "fp32", 2, 16),
    ("LLaMA GQA, SDPA flash", dict(style="llama", d=64, H=4, F=176, n_kv_heads=2), "bf16", 2, 16),
    ("LLaMA, eager core", dict(style="llama", d=64, H=4, F=176, attention="eager"), "bf16", 2, 16),
    ("GPT eager, no dropout", dict(d=64, H=4, F=256), "bf16", 2, 16),
    ("GPT eager, dropout", dict(d=96, H=6, F=384, dropout=0.1), "bf16", 3, 24),
    ("GPT eager, dropout, FP32", dict(d=48, H=2, F=192, dropout=0.1), "fp32", 2, 16),
    ("GPT eager, dropout, S >> d (the S x S tensors dominate)", dict(d=32, H=2, F=128, dropout=0.1), "bf16", 1,
     128),
    ("LLaMA-2 7B's block", dict(style="llama", d=4096, H=32, F=11008), "bf16", 1, 16),
]


def _config(fields):
    return RefConfig(L=1, V=128, **fields)


def _values(c, B, S):
    return dict(B=B, S=S, d=c.d, H=c.H, H_kv=c.kv_heads, L=1, F=c.F, V=c.V, d_h=c.hd)


def _rows(c, dtype, stats=True):
    """memledger's rows for the compiled block, under the CPU run's conventions (``stats``) or the article's."""
    mlp, norm = ("gelu", "LayerNorm") if c.style == "gpt" else ("swiglu", "RMSNorm")
    options = dict(dtype=dtype, mask_dtype=dtype, norm_stats=dtype if stats else None, rmsnorm="composite",
                   attention="eager" if c.kernel == "eager" else "flash")
    return compiled_rows(inventory(mlp, norm, bool(c.dropout), gqa=c.kv_heads != c.H, **compiled_options(options)))


def _expected(c, dtype, B, S):
    """Sorted (bytes, dtype) the rows predict; a flash kernel's q, k and v are views of one storage, as the
    eager core's are at B = 1 (multi-head: no copy for the batched matmul), compiled as eager."""
    rows = _rows(c, dtype)
    sizes = {r.name: (evaluate_expr(r.bytes, _values(c, B, S)), r.dtype) for r in rows}
    if c.kernel == "sdpa" or (B == 1 and c.kv_heads == c.H):
        sizes["Q"] = (sizes["Q"][0] + sizes.pop("K")[0] + sizes.pop("V")[0], sizes["Q"][1])
    torch_dtype = {"bf16": "bfloat16", "fp32": "float32", "bool": "bool"}
    return sorted((n, torch_dtype[t]) for n, t in sizes.values())


def _measured(saved):
    """Sorted (bytes, dtype) of the block's own storages (the shared causal mask lies outside the blocks)."""
    return sorted((n, t) for n, t, _, what in saved if what != "mask")


@pytest.mark.parametrize("name, fields, dtype, B, S", CASES, ids=[c[0] for c in CASES])
def test_compiled_block_saves_the_rows(name, fields, dtype, B, S):
    c = _config(fields)
    measured = _measured(compiled_saved(c, DTYPE[dtype], B, S))
    assert measured == _expected(c, dtype, B, S), name


@pytest.mark.parametrize("name, fields, dtype, B, S", [CASES[0], CASES[6]], ids=["LLaMA", "GPT, dropout"])
def test_ledger_books_the_compiled_block(name, fields, dtype, B, S):
    """The ledger's activations row (one block, the article's conventions: no norm statistics) is what the
    compiled block saves without its per-token statistics, and less than the eager block where SiLU is
    recomputed."""
    c = _config(fields)
    measured = compiled_saved(c, DTYPE[dtype], B, S)
    per_token = sum(n for n, _, shape, _ in measured if shape == (B, S, 1))
    block = sum(n for n, _, _, what in measured if what != "mask")
    ledger = Ledger(architecture_of(c), batch_size=B, seq_len=S, recipe="bf16-pure-adamw", overhead_bytes=0,
                    dropout=bool(c.dropout), flash_attention=c.kernel == "sdpa", scope="layers", compile=True)
    assert ledger.group_total("activations") == block - per_token
    eager = Ledger(architecture_of(c), batch_size=B, seq_len=S, recipe="bf16-pure-adamw", overhead_bytes=0,
                   dropout=bool(c.dropout), flash_attention=c.kernel == "sdpa", scope="layers")
    silu = B * S * c.F * 2 if c.style == "llama" else 0
    assert eager.group_total("activations") - ledger.group_total("activations") == silu


def test_compiled_llama_block_against_eager():
    """Measured, both sides: the compiled LLaMA block keeps its input and a BF16 normalized input per norm
    instead of the composite RMSNorm's two FP32 copies, and no SiLU output."""
    c = _config(CASES[0][1])
    B, S = 2, 16
    eager, compiled = eager_saved(c, torch.bfloat16, B, S), compiled_saved(c, torch.bfloat16, B, S)
    fp32_copies = [n for n, t, shape, _ in eager if t == "float32" and shape == (B, S, c.d)]
    assert len(fp32_copies) == 4 and not [n for n, t, shape, _ in compiled if t == "float32" and shape[-1] == c.d]
    bsf = B * S * c.F * 2
    assert sum(1 for n, *_ in eager if n == bsf) == 4 and sum(1 for n, *_ in compiled if n == bsf) == 3


@pytest.mark.skipif(shutil.which("g++") is None, reason="Inductor's CPU backend compiles C++")
def test_inductor_saves_what_aot_eager_decomp_partition_saves():
    """Inductor's partition_fn runs its joint-graph passes, then the same partitioner: the same storages (the
    view a storage is first seen through may differ: the flash output as (B, H, S, d/H) or (B*S, d))."""
    c = _config(CASES[0][1])

    def storages(saved):
        return sorted((n, t, what) for n, t, _, what in saved)
    inductor = compiled_saved(c, torch.bfloat16, 2, 16, backend="inductor")
    assert storages(inductor) == storages(compiled_saved(c, torch.bfloat16, 2, 16))
