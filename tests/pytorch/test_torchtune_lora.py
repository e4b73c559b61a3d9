"""torchtune's own LoRA and QLoRA (memledger/pytorch/torchtune_lora.py: ``lora_llama2``, ``LoRALinear``, torchao's
``NF4Tensor``, the ``lora_finetune_single_device`` loop) beside memledger's LoRA step under the CPU backend.

The independent values are PyTorch's measurements of torchtune's model (saved-tensor hooks, MemTracker, fake
tensors) and arithmetic on torchtune's sources written out here. Tests skip, saying why, where torchtune is missing.
"""
import pytest

pytest.importorskip("torch")

from memledger.core.exact import evaluate_expr  # noqa: E402
from memledger.ledger.lora import LoraConfig, LoraLedger  # noqa: E402
from memledger.pytorch.compare import architecture_of  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402
from memledger.pytorch.torchtune_litgpt import missing  # noqa: E402
from memledger.pytorch.torchtune_lora import lora_layer_saved, lora_step, nf4_linear_peaks  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing("torchtune") is not None,
                                                   reason=missing("torchtune") or "")]

#: d x F and d x d multiples of 64 x 256: torchao's to_nf4 double-quantizes the scalers in blocks of 256
#: (``torchao/dtypes/nf4tensor.py`` l. 735-737 asserts it)
SMALL = dict(d=256, H=4, F=768, V=1000)
SEVEN_B = dict(d=4096, H=32, F=11008, V=32000)
#: torchtune's module names and the Hugging Face names memledger's LoRA takes
QV = dict(attn=("q_proj", "v_proj"), mlp=False, targets=("q_proj", "v_proj"))
ALL = dict(attn=("q_proj", "k_proj", "v_proj", "output_proj"), mlp=True,
           targets=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))


def memledger_step(shape, L, B, S, targets, recompute="none", chunks=1):
    c = RefConfig(shape["d"], L, shape["H"], shape["F"], shape["V"], "llama")
    config = LoraConfig(8, targets, adapter_recipe="bf16-pure-adamw")
    return LoraLedger(architecture_of(c), config, B, S, recompute, overhead_bytes=0,
                      loss_chunks=chunks).step("cpu", rmsnorm="composite")


def memledger_layer(shape, B, S, targets) -> int:
    """What memledger's LoRA step (CPU conventions, composite RMSNorm) saves in one block."""
    step = memledger_step(shape, 3, B, S, targets)
    return evaluate_expr(sum(row.bytes for row in step.built.layer_rows), step.values)


def norm_1_saves(d, B, S) -> int:
    """What the first layer's ``sa_norm`` does not save: ``RMSNorm.forward`` (``torchtune/modules/rms_norm.py``
    l. 38-43) runs ``F.rms_norm(x.float(), ...)``, whose composite saves the FP32 input and the FP32 rstd, only
    where the input requires grad; the embedding's output does not (the recipe trains the adapters only,
    ``set_trainable_params``, and calls no ``enable_input_require_grads``)."""
    return 4 * B * S * d + 4 * B * S


@pytest.mark.parametrize("B, S", [(2, 64), (1, 200)])
@pytest.mark.parametrize("adapters", [QV, ALL], ids=["q-v", "all"])
@pytest.mark.parametrize("quantize", [False, True], ids=["lora", "qlora"])
def test_torchtune_lora_layer_is_memledgers(adapters, quantize, B, S):
    """A middle layer of ``lora_llama2`` (``qlora`` with ``quantize_base``: torchao's NF4Tensor, which runs under
    FakeTensorMode) saves what memledger's LoRA block saves to the byte: ``LoRALinear`` keeps ``lora_a``'s input and
    output, torchao's ``LinearNF4`` only the NF4 weight (``torchao/dtypes/nf4tensor.py`` l. 1037-1048, a buffer
    here), torchtune's separate q, k, v projections keep what memledger's fused one does. The first layer saves
    norm 1's FP32 input and rstd less (:func:`norm_1_saves`)."""
    got = lora_layer_saved(**SMALL, batch=B, seq=S, attn=adapters["attn"], mlp=adapters["mlp"], quantize=quantize)
    layer = memledger_layer(SMALL, B, S, adapters["targets"])
    assert (got["layer"], got["first"]) == (layer, layer - norm_1_saves(SMALL["d"], B, S))


@pytest.mark.parametrize("B, S", [(1, 1024), (2, 512)])
def test_torchtune_qlora_7b_layer(B, S):
    """LLaMA-2 7B's width, QLoRA on every projection and the MLP (``7B_qlora_single_device.yaml``'s modules)."""
    got = lora_layer_saved(**SEVEN_B, batch=B, seq=S, attn=ALL["attn"], mlp=True, quantize=True)
    layer = memledger_layer(SEVEN_B, B, S, ALL["targets"])
    assert (got["layer"], got["first"]) == (layer, layer - norm_1_saves(SEVEN_B["d"], B, S))


def outside_extra(d, H, L, B) -> int:
    """What torchtune's LoRA model and recipe hold through the step beyond memledger's LoRA step, from their sources:
    each layer's own ``RotaryPositionalEmbeddings`` (``lora_llama2_self_attention`` builds one per layer,
    ``torchtune/models/llama2/_component_builders.py`` l. 417; ``modules/position_embeddings.py`` l. 51 and 67:
    ``theta`` d/H/2 FP32, ``cache`` 4096 x d/H/2 x 2 FP32), ``ignore_labels_cache`` (B int64,
    ``recipes/lora_finetune_single_device.py`` l. 351) and the previous iteration's ``current_num_tokens`` (int64)
    and ``current_loss`` (FP32)."""
    half = d // H // 2
    return L * (half * 4 + 4096 * half * 2 * 4) + 8 * B + 8 + 4


@pytest.mark.parametrize("adapters", [QV, ALL], ids=["q-v", "all"])
@pytest.mark.parametrize("loss, checkpointed", [("ce", False), ("chunked", True)])
def test_torchtune_lora_step_outside(adapters, loss, checkpointed):
    """torchtune's LoRA step as ``lora_finetune_single_device`` runs it: before the forward pass it holds memledger's
    LoRA step's bytes plus :func:`outside_extra` (the adapters' AdamW state is the same: the frozen parameters get no
    gradient, so no state); after the optimizer step the popped labels are gone (8*B*S less: memledger's step
    books the target ids through the step). What lies between (the first layer without an input gradient, the
    recipe's loop tensors, the leaf the reference's LoRA step holds) is implementation torchtune's (the test below)."""
    d, H, L, B, S = SMALL["d"], SMALL["H"], 2, 2, 64
    got = lora_step(**SMALL, L=L, batch=B, seq=S, loss=loss, attn=adapters["attn"], mlp=adapters["mlp"],
                    checkpointed=checkpointed)
    step = memledger_step(SMALL, L, B, S, adapters["targets"], "full" if checkpointed else "none",
                          8 if loss == "chunked" else 1)
    extra = outside_extra(d, H, L, B)
    assert got["before forward"] - step.landmarks["before forward"]["gpu"] == extra
    assert got["after step"] - step.landmarks["after step"]["gpu"] == extra - 8 * B * S


def torchtune_step(shape, L, B, S, targets, recompute="none", chunks=1, dropout=False, quantize=False):
    """memledger's LoRA step (``quantize``: QLoRA's, an NF4 base) under ``implementation="torchtune"`` (CPU
    conventions)."""
    c = RefConfig(shape["d"], L, shape["H"], shape["F"], shape["V"], "llama")
    config = LoraConfig(8, targets, base="nf4" if quantize else "bf16", adapter_recipe="bf16-pure-adamw",
                        dropout=dropout)
    return LoraLedger(architecture_of(c), config, B, S, recompute, overhead_bytes=0, loss_chunks=chunks,
                      implementation="torchtune").step("cpu")


def differences(got, step) -> dict:
    """{landmark, phase peak, "peak": torchtune's measured bytes minus memledger's} (nonzero ones only)."""
    out = {name: got[name] - step.landmarks[name]["gpu"] for name in ("before forward", "after forward",
                                                                       "after backward", "after step")}
    out.update({f"{phase} peak": got["phase peaks"][phase] - v for phase, v in step.phase_peaks().items()})
    out["peak"] = got["peak"] - step.peak.bytes
    return {k: v for k, v in out.items() if v}


#: torchtune's modules (lora_attn_modules, apply_lora_to_mlp, apply_lora_to_output) and memledger's targets
QV_HEAD = dict(attn=("q_proj", "v_proj"), mlp=False, output=True, targets=("q_proj", "v_proj", "lm_head"))
ALL_HEAD = dict(ALL, output=True, targets=ALL["targets"] + ("lm_head",))


def run(adapters, shape, L, B, S, loss, checkpointed, dropout, quantize=False):
    got = lora_step(**shape, L=L, batch=B, seq=S, loss=loss, attn=adapters["attn"], mlp=adapters["mlp"],
                    output=adapters.get("output", False), checkpointed=checkpointed, dropout=dropout,
                    quantize=quantize)
    step = torchtune_step(shape, L, B, S, adapters["targets"], "full" if checkpointed else "none",
                          8 if loss == "chunked" else 1, dropout > 0, quantize)
    return differences(got, step)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("adapters, L, B, S, loss, dropout", [
    (QV, 2, 2, 64, "ce", 0.0), (QV, 3, 1, 64, "chunked", 0.0), (ALL, 2, 2, 64, "chunked", 0.0),
    (ALL, 3, 1, 64, "ce", 0.05), (QV_HEAD, 2, 2, 64, "ce", 0.05), (ALL_HEAD, 5, 2, 64, "ce", 0.05),
    (QV, 5, 1, 64, "chunked", 0.05)])
def test_torchtune_lora_step_equals_memledgers(adapters, L, B, S, loss, dropout, checkpointed):
    """torchtune's LoRA step as ``lora_finetune_single_device`` runs it (``lora_llama2``, LoRALinear on the chosen
    modules, LoRA dropout, CrossEntropyLoss or CEWithChunkedOutputLoss(8), ``enable_activation_checkpointing``) equals
    memledger's ``LoraLedger(..., implementation="torchtune")`` step at every landmark, every phase's peak and the
    step's, to the byte: each layer's RoPE buffers, the recipe's loop tensors (memledger.step.torchtune), the first
    layer without an input gradient (memledger.step.lora.first_block), and under the checkpoint the attention's
    locals (q, k, v, SDPA's output) gone when it returns, the layer's attn_out kept until the layer returns and
    LoRALinear's ``lora_out`` (A's output) alive through the scaling."""
    assert run(adapters, SMALL, L, B, S, loss, checkpointed, dropout) == {}


@pytest.mark.parametrize("checkpointed", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("adapters, B, S, loss", [(QV, 1, 1024, "ce"), (ALL, 2, 512, "chunked")], ids=["q-v", "all"])
def test_torchtune_lora_7b_width_step(adapters, B, S, loss, checkpointed):
    """LLaMA-2 7B's width (two layers, V 32000), as ``7B_lora_single_device.yaml`` runs it (rank 8; q, v or every
    projection and the MLP; CEWithChunkedOutputLoss or CrossEntropyLoss), with and without activation
    checkpointing: every landmark and peak equals memledger's ``implementation="torchtune"`` step to the byte."""
    assert run(adapters, SEVEN_B, 2, B, S, loss, checkpointed, 0.0) == {}


def nf4_bytes(n: int) -> int:
    """One torchao ``NF4Tensor`` of ``n`` BF16 weights (``to_nf4(weight)``: blocks of 64, scalers in blocks of 256),
    from ``torchao/dtypes/nf4tensor.py`` (0.14.1) ``from_tensor`` l. 633-700 and ``double_quantize_scalers``
    l. 705-762: ``quantized_data`` (uint8, two codes a byte, n/2), ``quantized_scalers`` (int8, n/64),
    ``quantization_factor`` (BF16, one per 256 scalers), ``scaler_mean`` (a BF16 scalar) and the 16-value BF16
    lookup table ``nf4`` each tensor keeps."""
    return n // 2 + n // 64 + 2 * (n // 64 // 256) + 2 + 16 * 2


@pytest.mark.parametrize("adapters", [QV, ALL], ids=["q-v", "all"])
def test_torchtune_qlora_holds_torchaos_nf4_tensors(adapters):
    """QLoRA under torchtune's code (``quantize_base=True``: every block projection an ``NF4Tensor``, measured under
    FakeTensorMode): before the forward pass its step holds the BF16 LoRA step's bytes with each projection's
    2n BF16 bytes replaced by :func:`nf4_bytes` (not bitsandbytes' layout, which memledger's QLoRA books: FP32
    constants per 256 absmax, no lookup table). The step itself (``linear_nf4``: the whole weight dequantized to
    BF16 in forward and again in backward, ``get_original_weight`` l. 829-855 with its int64 codes) is
    :func:`test_torchtune_qlora_step_equals_memledgers`'."""
    d, F, L, B, S = SMALL["d"], SMALL["F"], 2, 2, 64
    kw = dict(**SMALL, L=L, batch=B, seq=S, attn=adapters["attn"], mlp=adapters["mlp"])
    lora, qlora = lora_step(**kw), lora_step(**kw, quantize=True)
    sizes = [d * d] * 4 + [d * F] * 3
    assert qlora["before forward"] - lora["before forward"] == L * sum(nf4_bytes(n) - 2 * n for n in sizes)


@pytest.mark.parametrize("adapters", [QV, ALL], ids=["q-v", "all"])
def test_torchtune_qlora_state_rows_are_measured(adapters):
    """memledger's QLoRA ledger under implementation torchtune books torchao's NF4Tensor per block projection
    (memledger.states.torchao): its frozen base rows less the BF16 LoRA ledger's are what torchtune's QLoRA step
    holds before the forward pass less its LoRA step (MemTracker, FakeTensorMode), to the byte."""
    from memledger.ledger.lora import state_rows
    L = 2
    kw = dict(**SMALL, L=L, batch=2, seq=64, attn=adapters["attn"], mlp=adapters["mlp"])
    measured = lora_step(**kw, quantize=True)["before forward"] - lora_step(**kw)["before forward"]
    arch = architecture_of(RefConfig(SMALL["d"], L, SMALL["H"], SMALL["F"], SMALL["V"], "llama"))

    def frozen(base):
        config = LoraConfig(8, adapters["targets"], base=base, adapter_recipe="bf16-pure-adamw")
        return sum(b for name, _, _, b in state_rows(arch, config, "torchtune") if name.startswith("frozen"))
    assert frozen("nf4") - frozen("bf16") == measured


@pytest.mark.parametrize("out, inp, B, S", [(768, 256, 2, 64), (256, 768, 1, 200), (256, 256, 4, 2048)])
def test_torchao_nf4_dequantization_is_measured(out, inp, B, S):
    """torchao's ``linear_nf4`` (LoRALinear's base under ``quantize_base``) under MemTracker: forward and backward each
    peak at ``get_original_weight``'s locals and the BF16 weight (memledger.states.torchao.nf4_dequant_peak) or, where
    the activation is larger, at the weight beside the output (forward) or the input's gradient (backward); what
    stays is the output, then the gradient."""
    from memledger.states.torchao import nf4_dequant_peak
    n = out * inp
    got = nf4_linear_peaks(out, inp, B, S)
    y, gx = 2 * B * S * out, 2 * B * S * inp
    assert got == {"forward": max(nf4_dequant_peak(n), 2 * n + y), "after forward": y,
                   "backward": max(nf4_dequant_peak(n), 2 * n + gx), "after backward": gx}


#: F below 3d: the fused q, k, v weight (3 d x d) would be dequantized at once, larger than the MLP's (d x F)
NARROW = dict(SMALL, F=512)


@pytest.mark.parametrize("checkpointed", [False, True], ids=["none", "full"])
@pytest.mark.parametrize("adapters, shape, L, B, S, loss, dropout", [
    (QV, SMALL, 2, 2, 64, "ce", 0.0), (ALL, SMALL, 2, 2, 64, "ce", 0.0), (QV, NARROW, 2, 2, 64, "ce", 0.0),
    (ALL, NARROW, 3, 1, 64, "chunked", 0.0), (QV, NARROW, 3, 1, 64, "chunked", 0.05),
    (ALL, SMALL, 3, 1, 64, "ce", 0.05), (QV_HEAD, NARROW, 2, 2, 64, "ce", 0.05)],
    ids=["q-v", "all", "q-v-narrow", "all-narrow-chunked", "q-v-narrow-dropout", "all-dropout", "q-v-head"])
def test_torchtune_qlora_step_equals_memledgers(adapters, shape, L, B, S, loss, dropout, checkpointed):
    """torchtune's QLoRA step (``quantize_base=True``: every block projection a torchao ``NF4Tensor``, through
    ``LoRALinear`` or ``FrozenNF4Linear``, both ``linear_nf4``) as ``lora_finetune_single_device`` runs it equals
    memledger's QLoRA step under implementation torchtune at every landmark and peak, to the byte: q, k and v three
    projections in turn, each weight dequantized (``get_original_weight``'s locals beside the BF16 weight, the locals
    gone before the matmul, the weight after it) in forward and again in backward, the earlier outputs (gradients)
    alive. ``NARROW`` (F < 3d) tells three dequantizations from one fused one."""
    assert run(adapters, shape, L, B, S, loss, checkpointed, dropout, quantize=True) == {}


@pytest.mark.parametrize("checkpointed", [False, True], ids=["none", "full"])
def test_torchtune_qlora_7b_width_step(checkpointed):
    """LLaMA-2 7B's width (two layers, V 32000), as ``7B_qlora_single_device.yaml`` runs it (rank 8, every projection
    and the MLP, NF4 base, CEWithChunkedOutputLoss), B 2, S 512: every landmark and peak equals memledger's QLoRA step
    under implementation torchtune to the byte."""
    assert run(ALL, SEVEN_B, 2, 2, 512, "chunked", checkpointed, 0.0, quantize=True) == {}
