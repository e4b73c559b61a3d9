"""FP16 automatic mixed precision in the step: ``torch.autocast(dtype=torch.float16)`` on FP32 weights and
``torch.amp.GradScaler`` (recipe ``fp16-amp-adamw``; the reference loop of
:class:`memledger.pytorch.reference.Trainer` with ``amp``), op by op for the reference decoder's LLaMA and GPT
blocks.

What autocast changes (PyTorch 2.13; ``aten/src/ATen/autocast_mode.cpp`` at 008ec6b1):

* **Weight copies.** Each matmul op on the autocast lists (``linear``, ``mm``, ``scaled_dot_product_attention``:
  the ``lower_precision_fp`` policy, CPU and CUDA alike) casts its FP32 arguments to FP16 through
  ``cached_cast`` (l. 120-146): a cast of an FP32 *leaf that requires grad* (a weight) is kept in a cache
  (l. 124-127, ``can_try_cache``) for the next use in the region; the cache is emptied when the outermost
  autocast region exits (``clear_cache``, l. 87-90; the nesting comment l. 46-50; ``torch.autocast.__exit__``
  calls ``torch.clear_autocast_cache()`` at nesting 0). Autograd saves each copy for its matmul's input
  gradient, so every FP16 weight copy outlives the region and lives until that matmul's backward (2 bytes per
  weight of every linear: the block's QKV, output, gate, up and down projections, the LM head). The cache
  applies to every device type (nothing in ``cached_cast`` is CUDA-only); measured on the CPU (FakeTensorMode and
  real tensors alike), so the cpu and cuda backends share it.
* **Activations.** A cast of a non-leaf is not cached: each linear's FP32 input is copied to FP16 and the copy
  is what autograd saves (the gate and up projections each copy the MLP input: two copies). The matmuls' and
  SDPA's outputs are FP16, so are SiLU and the product (no policy: they run in their inputs' dtype). The
  residual stream stays FP32 (an FP32 tensor plus an FP16 one promotes), so do the RMSNorms (composite, on
  FP32 input) and the loss (``logits.float()``, ``cross_entropy_loss`` on the ``fp32`` list).
* **Backward.** A weight's FP16 gradient is converted by the cast's backward (``ToCopyBackward``) into the
  FP32 ``.grad`` (a temporary of the weight's size in FP16 each time); the input copies' FP16
  gradients are converted back to FP32 the same way.
* **GradScaler** (``torch/amp/grad_scaler.py``): its ``_scale`` (FP32) and ``_growth_tracker`` (int32), one
  element each, live the whole step; ``scale(loss)`` multiplies (a 0-d FP32 tensor); ``unscale_`` makes
  ``inv_scale = scale.double().reciprocal().float()`` and ``found_inf``, replicates both per device
  (``_MultiDeviceReplicator.get``: ``.to(copy=True)``), unscales the gradients in place
  (``_amp_foreach_non_finite_check_and_unscale_``) and keeps the replicated ``found_inf`` until ``update()``.

* **Biases.** A bias's FP16 copy is cached too, but ``addmm`` does not save it: the cache alone holds it, until the
  region exits (after the loss). Its FP16 gradient (``addmm``'s backward: input, weight, bias gradients in that
  order) is converted to FP32 after the weight's.
* **Selective recomputation.** The flash kernel under ``checkpoint(use_reentrant=False)``: its log-sum-exp is
  dropped in forward; in backward it is re-run under the autocast state the checkpoint saved
  (``torch/utils/checkpoint.py`` ``_get_autocast_kwargs``, ``recompute_fn``): FP16 output, FP32 statistics. No
  weight is read inside, so the weight cache is untouched.
* **Full recomputation.** The checkpoint saves nothing, but autocast's cache still holds every block's FP16
  weight copies until the region exits (after the loss); in backward each block re-runs in an autocast region of
  its own (``recompute_fn``), re-casting its weights, and stops once the down projection's weight copy is packed.
* **GPT blocks.** LayerNorm runs in FP32 on the FP32 residual stream (no autocast cast: its input is FP32), every
  linear has a bias (cached, not saved), GeLU runs in FP16 on the up projection's output.

Modelled (:func:`memledger.step.structure.check_amp`): LLaMA blocks (composite or fused RMSNorm, grouped-query
attention, QKV biases, a tied head, any head size) and GPT blocks without dropout, with a flash kernel, no,
selective or full recomputation, torchtune's chunked loss (:mod:`memledger.step.amploss`), one rank, AdamW
(for-loop, foreach or fused). Refused: ZeRO, tensor parallelism, offloading and frameworks (no MemTracker run of
them here), the optimizer in backward (GradScaler unscales every gradient before the step), activation
offloading, packed documents and LitGPT's loss (not read off MemTracker under autocast).
Checked by tests/step/test_amp.py against MemTracker.
"""
from dataclasses import replace

from ..core.symbols import B, F, H, S, V, d
from .block import _recompute_forward as recompute_forward
from .norms import norm_backward, norm_forward
from .outer import cross_entropy, final_norm_params
from .ops import INPUT_GRADIENT, Ref, Tensor, block_output, define_grads, qkv_width, residual_names, widths_of
from .structure import Shape
from .vocab import Action, Kind, Lifetime, OpRole, Phase, Save, Scope

__all__ = ["CACHE_LUMP", "EXIT", "backward_end", "backward_start", "bias_copy", "block_backward", "block_forward",
           "cache_copy", "cached", "copy_name", "forward_end", "layer_rows", "optimizer_end", "optimizer_start",
           "outside_rows", "release_cached", "scaler_state"]

H16 = "fp16"
#: The op at which the autocast region exits (``torch.autocast.__exit__`` clears the cache).
EXIT = "autocast exits: its cache cleared (the FP16 copies nothing saved)"
#: The lumped middle blocks' cached copies, one tensor.
CACHE_LUMP = "autocast's cached FP16 copies, blocks 2..L-3"
#: The saved rows that autocast makes FP16 (the linears' input copies and outputs, SDPA's tensors).
_FP16 = ("Q/K/V projection input", "Q", "K", "V", "output projection input", "gate output", "SiLU output", "GeLU input",
         "up-projection output", "down-projection input")


def _weights(c: Shape) -> list:
    """(module, shape) of a block's linears in the order forward casts their weights."""
    q = widths_of(c)[0][2]
    mlp = [("up", (F, d))] if c.gpt else [("gate", (F, d)), ("up", (F, d))]
    return [("qkv", (qkv_width(c), d)), ("proj", (d, q))] + mlp + [("down", (d, F))]


def _biased(c: Shape) -> list:
    """The block's linears with a bias: every one in a GPT block, the QKV projection where a LLaMA block has one."""
    return [m for m, _ in _weights(c)] if c.gpt else (["qkv"] if c.qkv_bias else [])


def copy_name(module: str) -> str:
    return f"autocast FP16 copy of {module}.weight"


def layer_rows(rows: list, c: Shape) -> list:
    """A block's saved rows under autocast: the FP32 step's (``rows``, the inventory at dtype FP32) with the
    linears' inputs and outputs and SDPA's tensors in FP16, the MLP input twice (the gate's and the up
    projection's copies), and the cached FP16 weight copies the matmuls save."""
    from ..activations.inventory import Saved
    out = []
    for r in rows:
        if r.name == "MLP input" and not c.gpt:
            out += [replace(r, name="MLP input (gate's FP16 copy)", dtype=H16),
                    replace(r, name="MLP input (up's FP16 copy)", dtype=H16)]
        else:
            out.append(replace(r, dtype=H16) if r.name in _FP16 or r.name == "MLP input" else r)   # GPT: up's copy
    return out + [Saved(copy_name(m), "autocast's cached FP16 cast of the FP32 weight (autocast_mode.cpp cached_cast), "
                                      "saved by the matmul for its input gradient", shape, H16, block="mlp")
                  for m, shape in _weights(c)]


def outside_rows(rows: list) -> list:
    """The rows outside the blocks: the LM head's saved input is its FP16 copy, and its FP16 weight copy."""
    from ..activations.inventory import Saved
    out = [replace(r, dtype=H16) if r.name == "LM head input" else r for r in rows]
    return out + [Saved(copy_name("head"), "autocast's cached FP16 cast of the LM head's weight, saved by its matmul",
                        (V, d), H16, block="outside")]


def bias_copy(module: str) -> str:
    """The name of a block's cached FP16 copy of ``module``'s bias."""
    return f"autocast FP16 copy of {module}.bias (cached, not saved)"


def _cast_bias(p, c, module):
    """A bias's FP16 cast (cached, read by ``addmm``, not saved: the cache holds it until the region exits)."""
    if module in _biased(c):
        p.new(bias_copy(module), (dict(_weights(c))[module][0],), H16, "autocast's cached FP16 cast of the bias: "
              "addmm does not save it; the cache holds it until the autocast region exits")
        p.op(f"autocast: {module}.bias to FP16 (cached)", alloc=[bias_copy(module)])


def _linear(p, c, module, out, cast_input=True, saved_input=None):
    """An autocast linear: its bias's FP16 copy (the QKV bias: cached, read by ``addmm``, not saved; the cache
    holds it until the region exits), its weight's FP16 copy (cached, saved), its input's FP16 copy
    ``saved_input`` where the input is FP32, the FP16 output ``out``. The casts run bias, weight, input (read off
    MemTracker's log)."""
    _cast_bias(p, c, module)
    p.op(f"autocast: {module}.weight to FP16 (cached)", alloc=[copy_name(module)])
    if cast_input:
        p.op(f"autocast: {module} input to FP16", alloc=[saved_input])
    p.op(f"{module} projection (FP16)", alloc=out)


def cache_copy(module: str) -> str:
    """A weight's FP16 copy in a checkpointed block's forward: held by autocast's cache alone."""
    return f"autocast FP16 copy of {module}.weight (cached, not saved)"


def cached(c: Shape) -> list:
    """The names of a block's FP16 copies that autocast's cache alone holds until the region exits: the QKV
    bias's, and under full recomputation every weight's (the checkpoint saves nothing)."""
    return [bias_copy(m) for m in _biased(c)] + ([cache_copy(m) for m, _ in _weights(c)]
                                                    if c.recompute == "full" else [])


def _checkpointed_forward(p, c: Shape):
    """One block's forward under full recomputation (``checkpoint(block, use_reentrant=False)``): nothing is
    saved, each tensor dies with its last reference, but the cached FP16 weight copies stay in the cache until
    the autocast region exits (:func:`release_cached`). Read off MemTracker's log."""
    n1 = norm_forward(p, c, "1", None, Save.DROPPED)
    copies = {m: p.new(cache_copy(m), shape, H16, "autocast's cached FP16 cast of the weight: the checkpoint saves "
                       "nothing, the cache holds it until the autocast region exits") for m, shape in _weights(c)}

    def linear(module, out, cast=None):
        _cast_bias(p, c, module)
        p.op(f"autocast: {module}.weight to FP16 (cached)", alloc=[copies[module]])
        if cast:
            p.op(f"autocast: {module} input to FP16", alloc=[cast])
        p.op(f"{module} projection (FP16)", alloc=[out])

    def new(name, shape, dtype=H16, why="not kept: the checkpoint recomputes it"):
        return p.new(name + " (checkpointed)", shape, dtype, why)
    i1, qkv = new("Q/K/V projection input", (B, S, d)), new("QKV projection output", (B, S, qkv_width(c)))
    linear("qkv", qkv, i1)
    p.op("released", free=[n1, i1])
    out, lse = new("attention output", widths_of(c)[0]), new("log-sum-exp", (B, H, S), "fp32")
    p.op("flash attention (FP16)", alloc=[out, lse])
    p.op("released", free=[lse])
    po, xm = new("output projection output", (B, S, d)), new("attention residual sum", (B, S, d), "fp32")
    linear("proj", po)
    p.op("residual add (FP32 + FP16: FP32)", alloc=[xm])
    p.op("released", free=[po])
    n2 = norm_forward(p, c, "2", None, Save.DROPPED)
    if c.gpt:
        i2, u, h = new("MLP input", (B, S, d)), new("up-projection output", (B, S, F)), new("GeLU output", (B, S, F))
        linear("up", u, i2)
        p.op("released", free=[i2])
        p.op("GeLU (FP16)", alloc=[h])
        p.op("released", free=[u])
    else:
        h = _checkpointed_swiglu(p, linear, new)
    dn = new("down-projection output", (B, S, d))
    linear("down", dn)
    p.op("released", free=[h])
    p.op("residual add (FP32 + FP16: FP32)", alloc=[block_output(c)])
    p.op("block returns", free=[dn, out, n2, xm, qkv], role=OpRole.BLOCK_RETURNS)


def _checkpointed_swiglu(p, linear, new):
    """SwiGLU under the block's checkpoint; returns its product's name."""
    i2, gate, silu = new("MLP input (gate's FP16 copy)", (B, S, d)), new("gate output", (B, S, F)), \
        new("SiLU output", (B, S, F))
    linear("gate", gate, i2)
    p.op("released", free=[i2])
    p.op("SiLU (FP16)", alloc=[silu])
    p.op("released", free=[gate])
    i3, up, h = new("MLP input (up's FP16 copy)", (B, S, d)), new("up-projection output", (B, S, F)), \
        new("SiLU(gate) * up", (B, S, F))
    linear("up", up, i3)
    p.op("released", free=[i3])
    p.op("SiLU(gate) * up (FP16)", alloc=[h])
    p.op("released", free=[silu, up])
    return h


def block_forward(p, c: Shape, recomputing=False):
    """One LLaMA block's forward under autocast (``recomputing``: full recomputation's re-run, saving). Its FP32
    input (norm 1's saved input) is live."""
    if c.recompute == "full" and not recomputing:
        _checkpointed_forward(p, c)
        return
    x, xm = residual_names(c)
    n1 = p.new("norm 1 output (FP32)", (B, S, d), "fp32", "the norm's output, until the QKV projection has cast it")
    norm_forward(p, c, "1", n1)
    _linear(p, c, "qkv", ["Q", "K", "V"], saved_input="Q/K/V projection input")
    p.op("released", free=[n1])
    if c.recompute == "selective":       # the kernel under the checkpoint: its log-sum-exp is not kept
        lse = p.new("log-sum-exp (dropped)", (B, H, S), "fp32", "not kept: the checkpointed call recomputes it")
        p.op("flash attention (FP16, checkpointed; its output is the output projection's saved input)",
             alloc=["output projection input", lse])
        p.op("log-sum-exp dropped", free=[lse])
    else:
        p.op("flash attention (FP16)", alloc=["output projection input", "softmax log-sum-exp"])
    po = p.new("output projection output (FP16)", (B, S, d), H16, "the attention branch before the residual add")
    _linear(p, c, "proj", [po], cast_input=False)
    p.op("residual add (FP32 + FP16: FP32)", alloc=[xm])
    p.op("released", free=[po])
    n2 = p.new("norm 2 output (FP32)", (B, S, d), "fp32", "h, a local until the block returns")
    norm_forward(p, c, "2", n2)
    if c.gpt:               # GeLU on the FP16 up projection (no autocast policy: its input's dtype)
        _linear(p, c, "up", ["GeLU input"], saved_input="MLP input")
        p.op("GeLU (FP16)", alloc=["down-projection input"])
    else:
        _linear(p, c, "gate", ["gate output"], saved_input="MLP input (gate's FP16 copy)")
        p.op("SiLU (FP16)", alloc=["SiLU output"])
        _linear(p, c, "up", ["up-projection output"], saved_input="MLP input (up's FP16 copy)")
        p.op("SiLU(gate) * up (FP16)", alloc=["down-projection input"])
    dn = p.new("down-projection output (FP16)", (B, S, d), H16, "the MLP branch before the residual add")
    _linear(p, c, "down", [dn], cast_input=False)
    p.op("residual add (FP32 + FP16: FP32)", alloc=[block_output(c)])
    p.op("block returns", free=[dn, n2], role=OpRole.BLOCK_RETURNS)


def _weight_grad_to_fp32(p, c, share, module, kind="weight"):
    """The FP16 weight (or bias) gradient converted into the FP32 ``.grad`` (the cast's backward, then
    AccumulateGrad)."""
    g16 = f"FP16 gradient of {module}.{kind}"
    grad = define_grads(p, [f"{module}.{kind}"], c, share)
    p.op(f"{module}.{kind} gradient to FP32", alloc=grad)
    p.op("released", free=[g16])


def _linear_backward(p, c, module, g_out, shape, saved_input, frees=(), grad_in=None, bias=False):
    """The FP16 matmuls' backward (weight gradient first without a bias: mm; with one, addmm's input gradient,
    weight gradient, bias gradient), then the saved copies released; returns the FP16 input gradient's name."""
    g16 = p.new(f"FP16 gradient of {module}.weight", shape, H16, "the matmul's weight gradient, before the cast's "
                "backward")
    width = {"down": F, "proj": widths_of(c)[0][2]}.get(module, d)       # proj reads H*d_h (head_dim)
    gin = grad_in or p.new(f"FP16 gradient of the {module} input", (B, S, width), H16, "the matmul's input gradient")
    if bias:
        b16 = p.new(f"FP16 gradient of {module}.bias", (shape[0],), H16, "addmm's bias gradient (a sum), before the "
                    "cast's backward")
        if c.recompute == "full":   # the recomputed tensors go when unpacked, before the bias gradient (block.py)
            p.op(f"{module} projection backward (addmm: input, weight gradients)", alloc=[gin, g16])
            p.op("released (unpacked)", free=[copy_name(module), saved_input])
            p.op(f"{module} bias gradient", alloc=[b16])
            p.op("released", free=[g_out] + list(frees))
            return gin
        p.op(f"{module} projection backward (addmm: input, weight, bias gradients)", alloc=[gin, g16, b16])
    else:
        p.op(f"{module} projection backward", alloc=[g16, gin])
    p.op("released", free=[g_out, copy_name(module), saved_input] + list(frees))
    return gin


def _input_grad_to_fp32(p, module, gin):
    g32 = p.new(f"gradient of the {module} input (FP32)", (B, S, d), "fp32", "the input cast's backward")
    p.op(f"{module} input gradient to FP32", alloc=[g32])
    p.op("released", free=[gin])
    return g32


def block_backward(p, c: Shape, share):
    """One LLaMA block's backward under autocast: ``dX_out`` (FP32, live) -> the previous block's."""
    shapes = dict(_weights(c))
    g = p.new("MLP branch gradient (FP16)", (B, S, d), H16, "the residual add's backward casts to the branch's dtype")
    p.op("MLP branch gradient to FP16", alloc=[g])
    if c.recompute == "full":       # the down projection's backward unpacks: the block re-runs first, under the
        # autocast state the checkpoint saved (torch/utils/checkpoint.py recompute_fn: a region and cache of its
        # own), stopped once the down projection's weight copy is packed; the QKV bias's copy goes with the cache
        recompute_forward(p, c, lambda q, c, _policy: block_forward(q, c, recomputing=True))
    biased = _biased(c)

    def to_fp32(module):
        """The weight's (then the bias's) FP16 gradient into its FP32 ``.grad``."""
        _weight_grad_to_fp32(p, c, share, module)
        if module in biased:
            _weight_grad_to_fp32(p, c, share, module, "bias")
    gdi = p.new("gradient of the down-projection input", (B, S, F), H16, "dL/d(down input)")
    _linear_backward(p, c, "down", g, shapes["down"], "down-projection input", grad_in=gdi, bias="down" in biased)
    to_fp32("down")
    if c.gpt:
        gu = p.new("gradient of the GeLU input", (B, S, F), H16, "GeLU backward's output")
        p.op("GeLU backward", alloc=[gu])
        p.op("released", free=[gdi, "GeLU input"])
        gin = _linear_backward(p, c, "up", gu, shapes["up"], "MLP input", bias=True)
        gh = _input_grad_to_fp32(p, "up", gin)
        to_fp32("up")
    else:
        gh = _swiglu_backward(p, c, shapes, gdi, to_fp32)
    _norm2_and_attention_backward(p, c, share, shapes, to_fp32, gh)


def _swiglu_backward(p, c, shapes, gdi, to_fp32):
    """SwiGLU's backward from the down projection's input gradient ``gdi``; returns the MLP input's FP32 gradient."""
    gs = p.new("gradient of the SiLU output", (B, S, F), H16, "g * up")
    gup = p.new("gradient of the up-projection output", (B, S, F), H16, "g * SiLU(gate)")
    p.op("SiLU(gate) * up backward", alloc=[gs, gup])
    p.op("released", free=[gdi, "up-projection output", "SiLU output"])
    gin = _linear_backward(p, c, "up", gup, shapes["up"], "MLP input (up's FP16 copy)")
    up32 = _input_grad_to_fp32(p, "up", gin)
    to_fp32("up")
    gg = p.new("gradient of the gate output", (B, S, F), H16, "SiLU backward's output")
    p.op("SiLU backward", alloc=[gg])
    p.op("released", free=[gs, "gate output"])
    gin = _linear_backward(p, c, "gate", gg, shapes["gate"], "MLP input (gate's FP16 copy)")
    gate32 = _input_grad_to_fp32(p, "gate", gin)
    gh = p.new("gradient of the MLP input", (B, S, d), "fp32", "the two input gradients summed")
    p.op("MLP input gradients summed", alloc=[gh])
    p.op("released", free=[up32, gate32])
    to_fp32("gate")
    return gh


def _norm2_and_attention_backward(p, c, share, shapes, to_fp32, gh):
    """Norm 2, the attention branch and norm 1 backward (``gh``, the MLP input's FP32 gradient, live)."""
    composite = c.composite         # composite RMSNorm sums the skip's gradient in its own backward
    gn2 = p.new("gradient of norm 2's input", (B, S, d), "fp32", "norm 2 backward's output")
    norm_backward(p, c, "2", gh, gn2, define_grads(p, ["norm2.weight", "norm2.bias"], c, share),
                  residual="dX_out" if composite else None)
    if not composite:
        gxm = p.new("gradient of the attention residual sum", (B, S, d), "fp32", "skip and norm gradients summed")
        p.op("residual gradients summed", alloc=[gxm])
        p.op("released", free=[gn2, "dX_out"])
        gn2 = gxm
    ga = p.new("attention branch gradient (FP16)", (B, S, d), H16, "cast to the branch's dtype")
    p.op("attention branch gradient to FP16", alloc=[ga])
    selective = c.recompute == "selective"
    gpi = _linear_backward(p, c, "proj", ga, shapes["proj"], "output projection input" if selective else None,
                           bias=c.gpt)
    to_fp32("proj")
    again = []
    if selective:           # the checkpointed kernel re-run under the saved autocast state: FP16 output
        again = [p.new("flash output (recomputed)", widths_of(c)[0], H16, "the re-run kernel's output"),
                 p.new("softmax log-sum-exp (recomputed)", (B, H, S), "fp32", "the re-run kernel's statistics")]
        p.op("flash attention recomputed (FP16)", alloc=again)
    gq, gk, gv = (p.new(f"gradient of {n}", w, H16, f"dL/d{n}") for n, w in (("q", widths_of(c)[0]),
                                                                           ("k", widths_of(c)[1]),
                                                                           ("v", widths_of(c)[1])))
    p.op("flash attention backward", alloc=[gq, gk, gv], role=OpRole.FLASH_ATTENTION_BACKWARD)
    if again:
        p.op("recomputed output released", free=again)
    p.op("released", free=[gpi, "Q", "K", "V"] + ([] if selective else ["softmax log-sum-exp",
                                                                          "output projection input"]))
    if c.gqa:               # split's backward concatenates (memledger.step.block)
        gqkv = p.new("gradient of the QKV projection output", (B, S, qkv_width(c)), H16,
                     "split backward: torch.cat of the q, k, v gradients")
        p.op("q, k, v gradients concatenated", alloc=[gqkv])
        p.op("released", free=[gq, gk, gv])
    else:
        stack = p.new("stacked q, k, v gradients", (B, S, qkv_width(c)), H16, "torch.stack of the three gradients")
        gqkv = p.new("gradient of the QKV projection output", (B, S, qkv_width(c)), H16, "permuted back: a copy")
        p.op("q, k, v gradients stacked", alloc=[stack])
        p.op("released", free=[gq, gk, gv])
        p.op("permuted back", alloc=[gqkv])
        p.op("released", free=[stack])
    gin = _linear_backward(p, c, "qkv", gqkv, shapes["qkv"], "Q/K/V projection input", bias=bool(c.gpt or c.qkv_bias))
    n1 = _input_grad_to_fp32(p, "qkv", gin)
    to_fp32("qkv")
    if composite:
        norm_backward(p, c, "1", n1, INPUT_GRADIENT, define_grads(p, ["norm1.weight", "norm1.bias"], c, share), residual=gn2)
        return
    gx1 = p.new("gradient of norm 1's input", (B, S, d), "fp32", "norm 1 backward's output")
    norm_backward(p, c, "1", n1, gx1, define_grads(p, ["norm1.weight", "norm1.bias"], c, share))
    p.op("residual gradients summed", alloc=[INPUT_GRADIENT])
    p.op("released", free=[gx1, gn2])


def forward_end(p, c: Shape):
    """Final norm (FP32), the LM head under autocast (its weight's FP16 copy, its input's), FP32 upcast,
    log_softmax, nll_loss."""
    fn = p.new("final norm output (FP32)", (B, S, d), "fp32", "the final norm's output, until the LM head has cast it")
    norm_forward(p, c, "final", fn)
    logits = p.new("logits (FP16)", (B, S, V), H16, "the LM head's output under autocast")
    p.op("autocast: head.weight to FP16 (cached)", alloc=[copy_name("head")])
    p.op("autocast: LM head input to FP16", alloc=["LM head input"])
    p.op("LM head (FP16)", alloc=[logits])
    p.op("released", free=[fn])
    src = p.new("logits in FP32", (B, S, V), "fp32", "logits.float(): cross-entropy runs in FP32")
    p.op("logits.float()", alloc=[src])
    p.op("FP16 logits released", free=[logits])
    cross_entropy(p, src)
    if cached(c):           # every block's cached copies are freed here: release_cached
        p.op(EXIT, free=[], role=OpRole.AUTOCAST_EXIT)


def backward_start(p, c: Shape):
    """``scaler.scale(loss).backward()`` through the loss, the LM head (FP16 matmuls, their gradients converted
    to FP32) and the final norm; ends with the last block's ``dX_out``."""
    scaled = p.new("scaled loss", (), "fp32", "scaler.scale(loss): loss * scale")
    dl = p.new("gradient of the loss", (), "fp32", "loss.backward() seeds a 1 (held until backward returns)")
    dl2 = p.new("gradient of the unscaled loss", (), "fp32", "the product's backward: seed * scale")
    g1 = p.new("nll_loss gradient", (B, S, V), "fp32", "nll_loss backward: B*S*V FP32")
    g2 = p.new("log_softmax gradient", (B, S, V), "fp32", "log_softmax backward: B*S*V FP32")
    p.op("scaler.scale(loss)", alloc=[scaled])
    p.op("loss.backward()", alloc=[dl], role=OpRole.LOSS_BACKWARD)
    p.op("scale backward", alloc=[dl2])
    p.op("nll_loss backward", alloc=[g1])
    p.op("released", free=["nll_loss total weight", dl2])
    p.op("log_softmax backward", alloc=[g2])
    p.op("released", free=[g1, "log-softmax output (FP32)"])
    g = p.new("logits gradient (FP16)", (B, S, V), H16, "downcast to the logits' dtype")
    p.op("logits.float() backward", alloc=[g])
    p.op("released", free=[g2])
    gin = _linear_backward(p, c, "head", g, (V, d), "LM head input",
                           grad_in=p.new("FP16 gradient of the LM head input", (B, S, d), H16, "its input gradient"))
    g32 = _input_grad_to_fp32(p, "LM head", gin)
    grad = "grad head.weight"
    if c.is_tied:           # the FP32 conversion waits in autograd's buffer for the embedding's (outer.backward_end)
        grad = "LM head's contribution to the tied embedding gradient"
        p.tensors[grad] = Tensor(grad, p.tensors["grad embedding.weight"].expr, Kind.TRANSIENT, Lifetime.TEMPORARY,
                                 p.placement.gradients, "the head's FP16 gradient of the tied weight in FP32, waiting "
                                 "in autograd's buffer for the embedding's contribution")
    p.op("head.weight gradient to FP32", alloc=[grad])
    p.op("released", free=["FP16 gradient of head.weight"])
    norm_backward(p, c, "final", g32, Ref(Scope.LAST, "dX_out"), [f"grad {n}" for n, _ in final_norm_params(c)])


def backward_end(ops: list) -> list:
    """``ops`` (the embedding's backward) with the scaled loss released with the loss."""
    return [op._replace(frees=op.frees + ("scaled loss",)) if op.role is OpRole.LOSS_RELEASED else op
            for op in ops]


def scaler_state() -> list:
    """(name, bytes, why) of GradScaler's tensors, live the whole step."""
    return [("GradScaler scale", 4, "torch.amp.GradScaler._scale: one FP32 element"),
            ("GradScaler growth tracker", 4, "torch.amp.GradScaler._growth_tracker: one int32 element")]


def optimizer_start(p):
    """``scaler.step(opt)``'s ``unscale_``: the inverse scale (via FP64), ``found_inf``, their per-device copies;
    the gradients unscaled in place; what is left when it returns: the replicated ``found_inf``."""
    # one FP64 element: 8 bytes, written (2,) x FP32 (the dtype table has no FP64)
    t = {n: p.new(n, (2,) if dtype == "fp64" else (), "fp32", why) for n, dtype, why in [
        ("scale.double()", "fp64", "unscale_: the inverse scale is computed in FP64 (8 bytes)"),
        ("scale.double().reciprocal()", "fp64", "unscale_ (FP64, 8 bytes)"), ("inv_scale", "fp32", "unscale_: .float()"),
        ("found_inf", "fp32", "unscale_: torch.full((), 0.0)"),
        ("inv_scale (per device)", "fp32", "_MultiDeviceReplicator.get: .to(copy=True)"),
        ("found_inf (per device)", "fp32", "_MultiDeviceReplicator.get: .to(copy=True), kept until update()")]}
    p.op("unscale_: scale.double()", alloc=[t["scale.double()"]])
    p.op("reciprocal", alloc=[t["scale.double().reciprocal()"]])
    p.op(".float()", free=[t["scale.double()"]], alloc=[t["inv_scale"]])
    p.op("found_inf = torch.full", free=[t["scale.double().reciprocal()"]], alloc=[t["found_inf"]])
    p.op("inv_scale per device", alloc=[t["inv_scale (per device)"]])
    p.op("found_inf per device", alloc=[t["found_inf (per device)"]])
    p.op("_amp_foreach_non_finite_check_and_unscale_: in place")
    p.op("unscale_ returns", free=[t["inv_scale"], t["found_inf"], t["inv_scale (per device)"]])


def optimizer_end(ops: list) -> list:
    """``ops`` (the optimizer program) with ``scaler.update()`` releasing the replicated ``found_inf`` before
    ``zero_grad``."""
    at = max(i for i, op in enumerate(ops) if op.action is Action.RELEASE_GRADIENTS)
    return ops[:at] + [type(ops[0])("scaler.update(): found_inf released", ("found_inf (per device)",), ())] + ops[at:]


def release_cached(ops: list, tensors: dict, c: Shape, n_layers: int) -> list:
    """``ops`` (the flattened step) with the FP16 copies autocast's cache alone holds (:func:`cached`) of every
    block (the lumped blocks' as one tensor, allocated by their op) freed where the autocast region exits
    (``clear_cache``, ``autocast_mode.cpp`` l. 87-90)."""
    names = cached(c)
    if not names:
        return ops
    from ..core.symbols import L
    from .trace import LUMP, explicit_layers
    tensors[CACHE_LUMP] = Tensor(CACHE_LUMP, (L - 4) * sum(tensors[n].expr for n in names), Kind.TRANSIENT,
                                 Lifetime.TEMPORARY, why="the middle blocks' cached copies, until the autocast "
                                 "region exits")
    lumped = n_layers > 4
    out = []
    for op in ops:
        if op.layer == LUMP and op.phase is Phase.FORWARD:
            op = replace(op, allocs=op.allocs + ((None, CACHE_LUMP),))
        elif op.layer is None and op.role is OpRole.AUTOCAST_EXIT:
            op = replace(op, frees=tuple((i, n) for i in explicit_layers(n_layers) for n in names) +
                         (((None, CACHE_LUMP),) if lumped else ()))
        out.append(op)
    return out
