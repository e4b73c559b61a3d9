"""The inventory against PyTorch's own saved tensors, row by row (docs/step.md, check 1).

For small configurations of the reference decoder (memledger/pytorch/reference.py) every
storage autograd saves (saved_tensors_hooks, each storage once, parameters
skipped) must be one inventory row of the same size, and every row one storage:
per block with :func:`memledger.activations.inventory.inventory`, outside the blocks with
:func:`memledger.activations.outside.outside_inventory`. Rows that are views of one storage
(q, k and v of the fused projection when no copy is made) count as one storage.
"""
from collections import Counter

import pytest

torch = pytest.importorskip("torch")

from memledger.activations.inventory import inventory  # noqa: E402
from memledger.models.architecture import Architecture  # noqa: E402
from memledger.activations.outside import outside_inventory  # noqa: E402
from memledger.core.exact import evaluate_expr  # noqa: E402
from memledger.pytorch.measure import live_after_forward, saved_tensors  # noqa: E402
from memledger.pytorch.reference import RefConfig, make_model  # noqa: E402

pytestmark = pytest.mark.slow

SHAPES = [dict(d=64, H=4, F=320, V=1000), dict(d=96, H=6, F=256, V=501), dict(d=48, H=2, F=200, V=777)]


def _kernel(c: RefConfig):
    if c.kernel == "eager":
        return "eager"
    return "math" if c.dropout else "flash"


def expected(c: RefConfig, loop, B, S):
    """(per-block sizes, outside sizes) that the inventory predicts, as sorted lists of bytes."""
    dtype = "fp32" if loop == "fp32-adamw" else "bf16"
    opts = dict(dtype=dtype, mask_dtype="bool" if c.native_dropout else dtype, norm_stats=dtype,
                rmsnorm=c.rmsnorm, attention=_kernel(c))
    mlp, norm = ("gelu", "LayerNorm") if c.style == "gpt" else ("swiglu", "RMSNorm")
    gqa = c.kv_heads != c.H
    rows = inventory(mlp, norm, bool(c.dropout), gqa=gqa, head_dim=c.hd * c.H != c.d, **opts)
    values = dict(B=B, S=S, d=c.d, H=c.H, H_kv=c.kv_heads, L=c.L, F=c.F, V=c.V, P=1, N_d=1, t=1, O=0, d_h=c.hd)

    def n(expr):
        return evaluate_expr(expr, values)
    sizes = {r.name: n(r.bytes) for r in rows}
    if c.recompute == "selective":      # the attention core is recomputed: its S x S tensors (and a flash
        # kernel's log-sum-exp, which the checkpointed SDPA call recomputes too) are not kept
        sizes = {name: b for name, b in sizes.items()
                 if name in {r.name for r in rows if not r.quadratic} and name != "softmax log-sum-exp"}
    # (the grouped eager core copies q, k and v at any B: no views)
    views = c.recompute == "selective" or opts["attention"] == "flash" or (B == 1 and opts["attention"] == "eager"
                                                                          and not gqa)
    if views:           # q, k, v stay views of the fused projection's output: one storage
        sizes["Q"] += sizes.pop("K") + sizes.pop("V")
    elif opts["attention"] == "math" and dtype == "fp32" and B == 1:
        # Known gap: an FP32 v is not copied by the math kernel and, at B = 1, the batched matmul
        # keeps a view of it, so the whole fused QKV output stays: 2*B*S*d*4 bytes more than row V.
        sizes["V"] *= 3
    outside = [n(r.bytes) for r in outside_inventory(c.style, **{k: opts[k] for k in ("dtype", "norm_stats",
                                                                                      "rmsnorm", "attention")})
               if r.name != "loss"]          # the loss is not saved (nll_loss saves its total weight)
    return sorted(sizes.values()), sorted(outside)


VARIANTS = {
    "GPT eager, native_dropout (1-byte masks: Eq. 1)": dict(dropout=0.1, native_dropout=True),
    "GPT eager, CPU F.dropout (masks in the activation dtype)": dict(dropout=0.1),
    "GPT eager, no dropout": dict(),
    "GPT SDPA flash (no dropout)": dict(attention="sdpa"),
    "GPT SDPA math (dropout on CPU)": dict(attention="sdpa", dropout=0.1),
    "LLaMA, composite RMSNorm": dict(style="llama"),
    "LLaMA, fused RMSNorm": dict(style="llama", rmsnorm="fused"),
    "GPT selective recomputation": dict(recompute="selective", dropout=0.1, native_dropout=True),
    "LLaMA selective recomputation": dict(style="llama", recompute="selective"),
    # grouped-query attention (n_kv_heads: half the heads, a third, one = multi-query; see GQA_HEADS)
    "LLaMA GQA, SDPA enable_gqa (composite RMSNorm)": dict(style="llama", n_kv_heads="gqa"),
    "LLaMA GQA, SDPA enable_gqa (fused RMSNorm)": dict(style="llama", rmsnorm="fused", n_kv_heads="gqa"),
    "LLaMA GQA, grouped eager core": dict(style="llama", attention="eager", n_kv_heads="gqa"),
    "LLaMA eager core, multi-head": dict(style="llama", attention="eager"),
    "Qwen2's shape: GQA, QKV biases": dict(style="llama", n_kv_heads="gqa", qkv_bias=True),
    "Gemma's shape: GQA, tied LM head, eager": dict(style="llama", n_kv_heads="gqa", tied=True, attention="eager"),
    # a head size other than d/H (Gemma-7B: 16 x 256 != 3072; see HEAD_SIZE)
    "Gemma-7B's shape: head size != d/H, tied, SDPA": dict(style="llama", head_dim="wide", tied=True),
    "LLaMA GQA, head size != d/H, eager": dict(style="llama", n_kv_heads="gqa", head_dim="wide", attention="eager"),
    "GPT eager, head size != d/H, native_dropout": dict(head_dim="wide", dropout=0.1, native_dropout=True),
    "LLaMA selective recomputation, head size != d/H": dict(style="llama", head_dim="wide", recompute="selective"),
}
#: The key/value heads of the GQA variants for each of SHAPES (H = 4, 6, 2): GQA, GQA, MQA.
GQA_HEADS = {4: 2, 6: 3, 2: 1}
#: The head sizes of the "wide" variants for each of SHAPES (d/H = 16, 16, 24): H*d_h = 128, 144, 64 != d.
HEAD_SIZE = {4: 32, 6: 24, 2: 32}
CASES = [(name, shape, loop, B, S) for name in VARIANTS
         for shape, loop, B, S in [(SHAPES[0], "bf16-pure-adamw", 2, 24), (SHAPES[1], "fp32-adamw", 1, 40),
                                   (SHAPES[2], "bf16-adamw", 3, 16)]]


def _config(L, shape, variant):
    variant = dict(variant)
    if variant.get("n_kv_heads") == "gqa":
        variant["n_kv_heads"] = GQA_HEADS[shape["H"]]
    if variant.get("head_dim") == "wide":
        variant["head_dim"] = HEAD_SIZE[shape["H"]]
    return RefConfig(L=L, **shape, **variant)


@pytest.mark.parametrize("name, shape, loop, B, S", CASES)
def test_saved_tensors_are_the_inventory(name, shape, loop, B, S):
    c = _config(2, shape, VARIANTS[name])
    measured = saved_tensors(c, loop, B, S)
    block, outside = expected(c, loop, B, S)
    for layer in (0, 1):
        assert sorted(b for b, _, _ in measured[layer]) == block, (name, layer, measured[layer])
    assert sorted(b for b, _, _ in measured["outside"]) == outside, (name, measured["outside"])


def test_native_dropout_gives_the_articles_eq1():
    """With the fused kernel's 1-byte masks and no norm statistics, one block keeps BSd(34 + 5HS/d)."""
    c = RefConfig(d=64, L=2, H=4, F=256, V=1000, dropout=0.1, native_dropout=True)
    measured = saved_tensors(c, "bf16-pure-adamw", 2, 24)
    stats = 4 * 2 * 24 * 2                                     # two LayerNorms' mean and rstd, BF16 on CPU
    assert sum(b for b, _, _ in measured[1]) - stats == 2 * 24 * 64 * (34 + 5 * 4 * 24 // 64) + 2 * 24 * 64 * (
        5 * 4 * 24 % 64) // 64


@pytest.mark.parametrize("style, loop, B", [("gpt", "bf16-adamw", 2), ("llama", "fp32-adamw", 1)])
def test_full_recomputation_keeps_the_block_input(style, loop, B):
    """Checkpointed blocks keep only their input (held by the checkpoint, not by saved-tensor hooks)."""
    c = RefConfig(d=64, L=3, H=4, F=320, V=1000, style=style, recompute="full")
    live = live_after_forward(c, loop, B, 24)
    a = 4 if loop == "fp32-adamw" else 2
    assert [b for b, _, _ in live[1]] == [B * 24 * 64 * a]      # block 1 made block 2's input
    assert [b for b, _, _ in live[2]] == [B * 24 * 64 * a]      # block 2 made the final norm's input


@pytest.mark.parametrize("style, F, kv, bias, tied, hd", [
    ("gpt", 320, None, None, None, None), ("llama", 256, None, None, None, None), ("llama", 256, 2, None, None, None),
    ("llama", 256, 1, None, None, None), ("llama", 256, 2, True, None, None), ("llama", 256, 1, True, True, None),
    ("gpt", 320, None, None, None, 24), ("llama", 256, None, None, True, 32), ("llama", 256, 2, None, None, 8)])
def test_reference_parameters_are_the_architectures(style, F, kv, bias, tied, hd):
    c = RefConfig(d=64, L=3, H=4, F=F, V=1000, style=style, n_kv_heads=kv, qkv_bias=bool(bias), tied=bool(tied),
                  head_dim=hd)
    model = make_model(c, "bf16-pure-adamw")
    arch = Architecture(64, 3, 4, F, 1000, style, n_kv_heads=kv, qkv_bias=bias, tied_embeddings=tied, head_size=hd)
    assert sum(p.numel() for p in model.parameters()) == arch.computed_params


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("kv", [2, 1])
def test_grouped_attention_is_attention_with_repeated_heads(attention, kv):
    """The GQA block computes what multi-head attention computes with each key/value head repeated for its
    group (``repeat_interleave``, as ``F.scaled_dot_product_attention(..., enable_gqa=True)`` documents):
    the reference's grouping is the convention's, only the memory differs."""
    torch.manual_seed(0)
    c = RefConfig(d=64, L=1, H=4, F=128, V=100, style="llama", n_kv_heads=kv, attention=attention)
    block = make_model(c, "fp32-adamw").blocks[0]
    x = torch.randn(2, 12, 64)
    mask = torch.ones(12, 12, dtype=torch.bool).triu(1)
    q, k, v = block.qkv(block.norm1(x)).split([64, 16 * kv, 16 * kv], dim=-1)
    q, k, v = (t.view(2, 12, -1, 16).transpose(1, 2) for t in (q, k, v))
    full = torch.nn.functional.scaled_dot_product_attention(q, k.repeat_interleave(4 // kv, 1),
                                                            v.repeat_interleave(4 // kv, 1), is_causal=True)
    assert torch.allclose(block._core(q, k, v, mask), full, atol=1e-5)


def test_reference_refuses_grouped_gpt_blocks():
    # GPT blocks take key/value heads (GPT-BigCode's multi-query) on the eager core only
    with pytest.raises(ValueError, match="n_kv_heads"):
        RefConfig(d=64, L=1, H=4, F=128, V=100, n_kv_heads=2, attention="sdpa")
    with pytest.raises(ValueError, match="divisible"):
        RefConfig(d=64, L=1, H=4, F=128, V=100, style="llama", n_kv_heads=3)


def test_inventory_defaults_unchanged():
    """The backend options are additive: the defaults give the article's rows (Eq. 1)."""
    assert inventory() == inventory(dtype="bf16", mask_dtype="bool", norm_stats=None, rmsnorm="fused")
    assert Counter(r.dtype for r in inventory()) == Counter({"bf16": 12, "bool": 3})
