"""LoRA and QLoRA checked against PyTorch: saved tensors (saved-tensor hooks) and state bytes, byte for byte.

A small block in plain PyTorch (no peft): separate q/k/v/o projections, non-causal attention, GeLU or SwiGLU
MLP, dropout for the GPT style. Norms are one autograd Function that saves its input and fp32 statistics, as
fused norm kernels do; dropout is ``torch.native_dropout`` (a bool mask, as on CUDA). The inventory leaves
the statistics out, so the test adds them (B*S fp32 values per statistic). A frozen NF4 projection is a
Function that saves only the packed weight, as bitsandbytes' MatMul4Bit does.
"""
import math

import pytest
import sympy as sp

from memledger.activations.inventory import inventory, per_layer_bytes
from memledger.models.architecture import Architecture
from memledger.ledger.lora import (
    NF4_DOUBLE_QUANT,
    LoraConfig,
    activation_rows,
    r_sym,
    state_rows,
)
from memledger.core.symbols import B, F, H, S, V, d
from memledger.models.tensors import parameter_tensors

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.slow
DIMS = {"B": 2, "S": 6, "d": 32, "H": 4, "F": 48, "r": 4}


def dropout(x, p):
    """``torch.native_dropout``, what F.dropout runs on CUDA: it saves a bool mask (CPU's F.dropout saves a
    mask in the input's dtype instead)."""
    return torch.native_dropout(x, p, True)[0]


class Norm(torch.autograd.Function):
    """LayerNorm (rms=False) or RMSNorm: saves the input and fp32 statistics, recomputes in backward."""

    @staticmethod
    def _ref(x, w, b):
        x32 = x.float()
        if b is None:
            rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)
            return (x32 * rstd * w.float()).to(x.dtype), (rstd,)
        mean = x32.mean(-1, keepdim=True)
        rstd = torch.rsqrt((x32 - mean).pow(2).mean(-1, keepdim=True) + 1e-5)
        return ((x32 - mean) * rstd * w.float() + b.float()).to(x.dtype), (mean, rstd)

    @staticmethod
    def forward(ctx, x, w, b):
        y, stats = Norm._ref(x, w, b)
        ctx.has_bias = b is not None
        ctx.save_for_backward(x, w, *((b,) if b is not None else ()), *stats)
        return y

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors[:2]
        b = ctx.saved_tensors[2] if ctx.has_bias else None
        with torch.enable_grad():
            x_ = x.detach().requires_grad_()
            w_ = w.detach().requires_grad_(w.requires_grad)
            b_ = None if b is None else b.detach().requires_grad_(b.requires_grad)
            y, _ = Norm._ref(x_, w_, b_)
            inputs = [x_] + [t for t in (w_, b_) if t is not None and t.requires_grad]
            grads = list(torch.autograd.grad(y, inputs, g))
        dx = grads.pop(0)
        dw = grads.pop(0) if w.requires_grad else None
        db = grads.pop(0) if b is not None and b.requires_grad else None
        return dx, dw, db


def quantize_nf4(w):
    """NF4 with double quantization, laid out as bitsandbytes stores it: packed 4-bit codes (two per byte),
    8-bit absmax per 64 weights, fp32 constant per 256 absmax values, one fp32 offset."""
    levels = torch.tensor([-1.0, -0.6962, -0.5251, -0.3949, -0.2844, -0.1848, -0.0911, 0.0, 0.0796, 0.1609, 0.2461,
                           0.3379, 0.4407, 0.5626, 0.7230, 1.0])
    flat = w.detach().float().flatten()
    n = flat.numel()
    blocks = torch.nn.functional.pad(flat, (0, -n % 64)).view(-1, 64)
    absmax = blocks.abs().amax(1).clamp_min(1e-12)
    codes = (blocks / absmax[:, None]).unsqueeze(-1).sub(levels).abs().argmin(-1).flatten()[:n].to(torch.uint8)
    codes = torch.nn.functional.pad(codes, (0, n % 2))
    packed = (codes[0::2] << 4 | codes[1::2]).to(torch.uint8)
    offset = absmax.mean()
    a = torch.nn.functional.pad(absmax - offset, (0, -absmax.numel() % 256)).view(-1, 256)
    absmax2 = a.abs().amax(1).clamp_min(1e-12)
    q_absmax = ((a / absmax2[:, None]) * 127).round().to(torch.int8).flatten()[:absmax.numel()].view(torch.uint8)
    return {"packed": packed, "absmax": q_absmax, "absmax2": absmax2, "offset": offset.reshape(1), "levels": levels,
            "shape": w.shape}


def dequantize_nf4(q):
    n = math.prod(q["shape"])
    codes = torch.stack([q["packed"] >> 4, q["packed"] & 15], 1).flatten()[:n].long()
    absmax = q["absmax"].view(torch.int8).float() / 127
    absmax = (absmax.view(-1) * q["absmax2"].repeat_interleave(256)[:absmax.numel()]) + q["offset"]
    return (q["levels"][codes] * absmax.repeat_interleave(64)[:n]).view(q["shape"])


class Linear4bit(torch.autograd.Function):
    """y = x W^T with W dequantized on the fly; saves the packed weight, never x (bitsandbytes MatMul4Bit)."""

    @staticmethod
    def forward(ctx, x, packed, q):
        ctx.q = q
        ctx.save_for_backward(packed)
        return x @ dequantize_nf4(q).to(x.dtype).t()

    @staticmethod
    def backward(ctx, g):
        return g @ dequantize_nf4(ctx.q).to(g.dtype), None, None


class Proj(torch.nn.Module):
    def __init__(self, out, inp, style, dtype, rank=0, lora_dropout=0.0, nf4=False):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(out, inp, dtype=dtype) / inp**0.5)
        self.bias = torch.nn.Parameter(torch.zeros(out, dtype=dtype)) if style == "gpt" else None
        self.q = quantize_nf4(self.weight) if nf4 else None
        if nf4:
            for k in ("packed", "absmax", "absmax2", "offset"):
                self.register_buffer(k, self.q[k])
        self.rank, self.p = rank, lora_dropout
        if rank:
            self.lora_A = torch.nn.Parameter(torch.randn(rank, inp, dtype=dtype) / inp**0.5)
            self.lora_B = torch.nn.Parameter(torch.randn(out, rank, dtype=dtype) / rank)

    def forward(self, x):
        if self.q is not None:
            y = Linear4bit.apply(x, self.packed, self.q)
        else:
            y = torch.nn.functional.linear(x, self.weight, self.bias)
        if self.rank:
            h = dropout(x, self.p) if self.p else x
            y = y + torch.nn.functional.linear(torch.nn.functional.linear(h, self.lora_A), self.lora_B) * 0.5
        return y


class Block(torch.nn.Module):
    def __init__(self, style, dtype, targets=(), rank=0, lora_dropout=0.0, nf4=False):
        super().__init__()
        D, Fd = DIMS["d"], DIMS["F"]
        self.style, self.dropout = style, 0.1 if style == "gpt" else 0.0
        shapes = {"q_proj": (D, D), "k_proj": (D, D), "v_proj": (D, D), "o_proj": (D, D), "up_proj": (Fd, D),
                  "down_proj": (D, Fd)}
        if style == "llama":
            shapes["gate_proj"] = (Fd, D)
        self.proj = torch.nn.ModuleDict({n: Proj(*s, style, dtype, rank if n in targets else 0, lora_dropout, nf4)
                                         for n, s in shapes.items()})
        self.norm1 = torch.nn.Parameter(torch.ones(D, dtype=dtype))
        self.norm2 = torch.nn.Parameter(torch.ones(D, dtype=dtype))
        gpt = style == "gpt"
        self.norm1_bias = torch.nn.Parameter(torch.zeros(D, dtype=dtype)) if gpt else None
        self.norm2_bias = torch.nn.Parameter(torch.zeros(D, dtype=dtype)) if gpt else None

    def forward(self, x):
        b, s, D = x.shape
        h, p = DIMS["H"], self.proj
        rms = self.style == "llama"
        y = Norm.apply(x, self.norm1, self.norm1_bias)
        q, k, v = (p[n](y).view(b, s, h, D // h).transpose(1, 2) for n in ("q_proj", "k_proj", "v_proj"))
        att = torch.softmax((q @ k.transpose(-2, -1)) * (D // h) ** -0.5, -1)
        if self.dropout:
            att = dropout(att, self.dropout)
        o = p["o_proj"]((att @ v).transpose(1, 2).reshape(b, s, D))
        x = x + (dropout(o, self.dropout) if self.dropout else o)
        y = Norm.apply(x, self.norm2, self.norm2_bias)
        if rms:
            m = p["down_proj"](torch.nn.functional.silu(p["gate_proj"](y)) * p["up_proj"](y))
        else:
            m = p["down_proj"](torch.nn.functional.gelu(p["up_proj"](y)))
        return x + (dropout(m, self.dropout) if self.dropout else m)


def saved_bytes(block, x):
    """Bytes of the distinct storages autograd saves in one forward, parameters and buffers excluded."""
    own = {t.untyped_storage().data_ptr() for t in list(block.parameters()) + list(block.buffers())}
    storages = {}

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in own:
            storages[ptr] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = block(x)
    return sum(storages.values()), out


def _values():
    D = DIMS
    return {B: D["B"], S: D["S"], d: D["d"], H: D["H"], F: D["F"], r_sym: D["r"]}


def _stats(style):
    return (1 if style == "llama" else 2) * 2 * DIMS["B"] * DIMS["S"] * 4     # two norms, fp32 per statistic


def _freeze(block, config):
    for name, param in block.named_parameters():
        param.requires_grad_("lora_" in name)


@pytest.mark.parametrize("style", ["gpt", "llama"])
@pytest.mark.parametrize("targets, lora_dropout", [
    ((), 0.0), (("q_proj",), 0.0), (("q_proj", "v_proj"), 0.0), (("o_proj", "down_proj"), 0.0),
    (("q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"), 0.0), (("q_proj", "v_proj"), 0.1)])
def test_lora_saved_tensors_match_pytorch(style, targets, lora_dropout):
    torch.manual_seed(0)
    block = Block(style, torch.bfloat16, targets, DIMS["r"], lora_dropout)
    config = LoraConfig(DIMS["r"], targets or ("q_proj",), dropout=lora_dropout > 0)
    _freeze(block, config)
    x = torch.randn(DIMS["B"], DIMS["S"], DIMS["d"], dtype=torch.bfloat16, requires_grad=True)
    measured, _ = saved_bytes(block, x)
    rows = activation_rows(style, config, dropout=style == "gpt")
    if not targets:                            # every projection frozen, no adapter: only weight-free rows stay
        rows = [row for row in inventory("swiglu" if style == "llama" else "gelu", "RMSNorm", style == "gpt")
                if not row.weight_grad_of]
    assert measured == per_layer_bytes(rows).subs(_values()) + _stats(style)


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_full_training_saved_tensors_match_the_inventory(style):
    torch.manual_seed(0)
    block = Block(style, torch.bfloat16)
    x = torch.randn(DIMS["B"], DIMS["S"], DIMS["d"], dtype=torch.bfloat16, requires_grad=True)
    measured, _ = saved_bytes(block, x)
    rows = inventory("swiglu" if style == "llama" else "gelu", "RMSNorm", style == "gpt")
    assert measured == per_layer_bytes(rows).subs(_values()) + _stats(style)


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_qlora_saved_tensors_are_loras(style):
    torch.manual_seed(0)
    targets = ("q_proj", "v_proj", "down_proj")
    block = Block(style, torch.bfloat16, targets, DIMS["r"], nf4=True)
    _freeze(block, None)
    x = torch.randn(DIMS["B"], DIMS["S"], DIMS["d"], dtype=torch.bfloat16, requires_grad=True)
    measured, out = saved_bytes(block, x)
    rows = activation_rows(style, LoraConfig(DIMS["r"], targets, base="nf4"), dropout=style == "gpt")
    assert measured == per_layer_bytes(rows).subs(_values()) + _stats(style)
    out.float().sum().backward()                               # the frozen 4-bit path still gives x a gradient
    assert x.grad is not None and block.proj["q_proj"].lora_A.grad is not None


def test_nf4_storage_matches_the_component():
    for shape in [(64, 64), (48, 32), (1000, 7)]:
        q = quantize_nf4(torch.randn(shape))
        stored = sum(q[k].numel() * q[k].element_size() for k in ("packed", "absmax", "absmax2"))
        assert stored == NF4_DOUBLE_QUANT.bytes_for(math.prod(shape)), shape   # + one 4-byte offset per tensor


@pytest.mark.parametrize("style", ["gpt", "llama"])
def test_lora_state_bytes_match_pytorch(style):
    torch.manual_seed(0)
    targets = ("q_proj", "o_proj", "up_proj")
    block = Block(style, torch.float32, targets, DIMS["r"])
    _freeze(block, None)
    x = torch.randn(DIMS["B"], DIMS["S"], DIMS["d"], requires_grad=True)
    block(x).sum().backward()
    opt = torch.optim.AdamW([p for p in block.parameters() if p.requires_grad])
    opt.step()
    arch = Architecture(DIMS["d"], 1, DIMS["H"], DIMS["F"], 1, style)
    ours = {role: 0 for role in ("param", "grad", "optimizer")}
    for _, role, _, n in state_rows(arch, LoraConfig(DIMS["r"], targets, base="fp32")):
        ours[role] += n
    frozen = [p for p in block.parameters() if not p.requires_grad]
    assert all(p.grad is None for p in frozen)
    outside_blocks = 4 * sum(int(sp.prod(t.shape).subs({d: DIMS["d"], V: 1}))
                             for t in parameter_tensors(style) if not t.per_layer)   # embeddings, final norm
    measured_params = sum(p.numel() * p.element_size() for p in block.parameters())
    assert ours["param"] - outside_blocks == measured_params
    assert ours["grad"] == sum(p.grad.numel() * p.grad.element_size() for p in block.parameters() if p.requires_grad)
    assert ours["optimizer"] == sum(v.numel() * v.element_size() for s in opt.state.values()
                                    for k, v in s.items() if k != "step")
