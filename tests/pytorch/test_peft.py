"""PEFT's LoRA on transformers' ``LlamaForCausalLM`` (issue 28): the harness that measures it
(:mod:`memledger.pytorch.libraries`, ``lora=``) and the refusal of LoRA under ``--implementation hf``.

PEFT 0.22.0 (requirements.txt) runs beside torchao 0.14.1 (torchtune 0.6.1's pin): 0.19-0.21 raise ImportError in
``get_peft_model`` (``peft/import_utils.py`` ``is_torchao_available``) for a torchao older than 0.16, 0.22 warns
there and leaves torchao out. The harness builds PEFT's model under ``FakeTensorMode`` with two patches
(:func:`memledger.pytorch.libraries._peft`: PEFT's ``Module.to`` moves that change nothing are skipped; MemTracker's
gradient hooks are not put on frozen parameters): :func:`test_the_harness_builds_what_peft_builds` checks on real
tensors that the first builds what ``get_peft_model`` builds. What PEFT's model saves per layer is what the LoRA
step books per layer (:func:`test_peft_saves_per_layer_what_the_lora_step_books`).
"""
import pytest

from clicheck import refused

pytest.importorskip("torch")
pytest.importorskip("transformers")


QV, ALL = ("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SMALL = dict(d=256, H=4, F=688, V=1000)
LLAMA2 = dict(d=4096, H=32, F=11008, V=32000)


def _base(torch):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                         num_hidden_layers=2, vocab_size=50, use_cache=False)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(before)


@pytest.mark.parametrize("targets", ["q_proj,v_proj", "all-linear"])
@pytest.mark.parametrize("fp32_adapters", [True, False])
def test_the_harness_builds_what_peft_builds(targets, fp32_adapters):
    """The harness's PEFT model (adapters made under the base's dtype, PEFT's no-op moves skipped) has the
    parameters, dtypes, shapes, devices and trainable flags of ``get_peft_model``'s, and its modules."""
    import torch
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model

    from memledger.pytorch.libraries import _peft
    ours = _peft(_base(torch), targets, 8, 16, 0.05, fp32_adapters)
    config = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.05, bias="none", task_type="CAUSAL_LM",
                        target_modules=targets if targets == "all-linear" else targets.split(","))
    theirs = get_peft_model(_base(torch), config, autocast_adapter_dtype=fp32_adapters)

    def described(model):
        return [(n, p.dtype, tuple(p.shape), p.device, p.requires_grad) for n, p in model.named_parameters()]
    assert described(ours) == described(theirs) and str(ours) == str(theirs)
    adapters = {p.dtype for _, p in ours.named_parameters() if p.requires_grad}
    assert adapters == {torch.float32 if fp32_adapters else torch.bfloat16}


@pytest.mark.parametrize("targets, names", [("q_proj,v_proj", ("q_proj", "v_proj")),
                                            ("all-linear", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                            "up_proj", "down_proj"))])
def test_peft_trains_the_adapters_the_lora_step_counts(targets, names):
    """PEFT's trainable parameters on transformers' model (under ``FakeTensorMode``, grouped-query at 2 K/V heads)
    are the adapters the LoRA step counts (its ``P``: r (in + out) per target and layer)."""
    pytest.importorskip("peft")
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.models.architecture import Architecture
    from memledger.pytorch.libraries import make_library_model
    with FakeTensorMode():
        model = make_library_model("hf", 256, 4, 688, 1000, 3, kv=2, lora=(targets, 8, 16, 0.0, True))
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    step = LoraLedger(Architecture(256, 3, 4, 688, 1000, "llama", n_kv_heads=2), LoraConfig(8, names), 2, 48).step("cpu")
    assert step.values["P"] == trainable


@pytest.mark.parametrize("args, message", [
    (("step", "--attn-implementation", "eager"), "--attn-implementation eager: PEFT's LoRA on transformers' model is "
                                                 "modelled with SDPA"),
    (("ledger", "--attn-implementation", "eager"), "--attn-implementation eager"),
    (("step", "--lora-dropout", "0.05"), "implementation hf (transformers' model code): LoRA dropout not modelled"),
    (("step", "--qlora"), "implementation hf (transformers' model code): QLoRA")])
def test_hf_lora_cli_refuses_what_it_does_not_model(capsys, args, message):
    backend = ("--backend", "cuda") if args[0] == "step" else ()
    refused(capsys, args[0], "--preset", "llama2-7b", *backend, "--implementation", "hf", "--lora-rank", "8",
            *args[1:], message=message)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_hf_lora_cli_prints_the_api_step(capsys, recompute):
    """``memledger step --lora-rank 8 --implementation hf --json`` is ``LoraLedger(..., implementation="hf")``'s step."""
    import json

    from clicheck import run
    from memledger.ledger.lora import LoraConfig, LoraLedger
    code, out, _ = run(capsys, "step", "--preset", "llama2-7b", "--backend", "cpu", "--implementation", "hf",
                       "--lora-rank", "8", "--recompute", recompute, "--batch", "1", "--seq", "1024", "--json")
    api = LoraLedger("llama2-7b", LoraConfig(8, QV), 1, 1024, recompute=recompute, implementation="hf").step("cpu")
    assert code == 0 and json.loads(out)["peak"]["gpu"] == api.peak.bytes
    assert api.peak.bytes != LoraLedger("llama2-7b", LoraConfig(8, QV), 1, 1024, recompute=recompute).step(
        "cpu").peak.bytes


def _hf_lora(shape, L, batch, seq, names, fp32_adapters, recompute="full", **config):
    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.models.architecture import Architecture
    arch = Architecture(shape["d"], L, shape["H"], shape["F"], shape["V"], "llama", n_kv_heads=shape.get("kv"))
    config = {"targets": names} | config
    lora = LoraConfig(16, adapter_recipe="fp32-adamw" if fp32_adapters else "bf16-pure-adamw", **config)
    return LoraLedger(arch, lora, batch, seq, recompute=recompute, overhead_bytes=0, implementation="hf")


@pytest.mark.parametrize("recompute, config, message", [
    ("none", {"targets": ("v_proj",)}, "LoRA without gradient_checkpointing_enable() and without a q_proj adapter"),
    ("full", {"dropout": True}, "LoRA dropout"), ("full", {"base": "nf4"}, "QLoRA")])
def test_hf_lora_refuses_what_it_does_not_model(recompute, config, message):
    """The hf LoRA step models PEFT on a checkpointed model without dropout or QLoRA; the rest is refused in one
    line, never computed with the reference decoder's block."""
    with pytest.raises(ValueError, match="implementation hf") as e:
        _hf_lora(SMALL, 3, 2, 48, QV, True, recompute, **config).step("cpu")
    assert message in str(e.value)


def test_hf_lora_keeps_the_reference_step():
    """implementation hf changes the LoRA step; the default (reference) is the step it was."""
    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.models.architecture import Architecture
    arch = Architecture(256, 3, 4, 688, 1000, "llama")
    ref = LoraLedger(arch, LoraConfig(16, QV), 2, 48, recompute="full", overhead_bytes=0).step("cpu")
    assert ref.peak.bytes != _hf_lora(SMALL, 3, 2, 48, QV, False).step("cpu").peak.bytes


@pytest.mark.slow
@pytest.mark.parametrize("tracked", [False, True])
def test_peft_leaf_outlives_the_step_only_under_memtracker(tracked):
    """The artifact :func:`memledger.pytorch.libraries.library_step` corrects: PEFT's embedding-output leaf (a
    checkpointed model, ``enable_input_require_grads``) is dead after the step without MemTracker (a plain weak
    reference, no ``gc.collect()``) and alive after the same step under it."""
    pytest.importorskip("peft")
    from memledger.pytorch.libraries import leaf_alive_after_step
    assert leaf_alive_after_step(tracked) is tracked


def agree(step, measured):
    """Every landmark, each phase's peak, each layer's peak forward and backward and the peak, to the byte."""
    assert {k: step.landmarks[k]["gpu"] for k in step.landmarks} == {k: measured[k] for k in step.landmarks}
    assert step.phase_peaks() == measured["phase peaks"]
    blocks = step.block_peaks()
    assert blocks == {k: measured["block peaks"][k] for k in blocks}
    assert step.peak.bytes == measured["peak"]


def _measured(shape, L, batch, seq, names, fp32_adapters, recompute):
    from memledger.pytorch.libraries import library_step
    targets = ",".join(names) if names == QV else "all-linear"
    return library_step("hf", **shape, L=L, batch=batch, seq=seq, loop="fp32-adamw" if fp32_adapters
                        else "bf16-pure-adamw", gradient_checkpointing=recompute == "full",
                        lora=(targets, 16, 32, 0.0, fp32_adapters))


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["full", "none"])
@pytest.mark.parametrize("shape, L, batch, seq, names, fp32_adapters", [
    (SMALL, 3, 2, 48, QV, False), (SMALL, 3, 2, 48, QV, True), (SMALL, 3, 2, 48, ALL, True),
    (SMALL, 3, 1, 64, QV, True), (dict(SMALL, kv=2), 3, 2, 48, ALL, False), (SMALL, 5, 2, 32, QV, True)])
def test_hf_lora_step_equals_peft_on_transformers(shape, L, batch, seq, names, fp32_adapters, recompute):
    """``LoraLedger(..., implementation="hf")`` against PEFT's LoRA on transformers' ``LlamaForCausalLM`` (rank 16,
    alpha 32, FP32 or BF16 adapters, AdamW over them), with ``gradient_checkpointing_enable()`` (recompute full;
    MemTracker's leaf artifact taken off by the harness) or without (block 0's input frozen): every landmark, phase
    peak, layer peak and the peak, to the byte."""
    pytest.importorskip("peft")
    agree(_hf_lora(shape, L, batch, seq, names, fp32_adapters, recompute).step("cpu"),
          _measured(shape, L, batch, seq, names, fp32_adapters, recompute))


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["full", "none"])
@pytest.mark.parametrize("L", [1, 2])
@pytest.mark.parametrize("names", [QV, ALL])
def test_hf_lora_step_llama2_7b_width(L, names, recompute):
    """LLaMA-2-7B's width (hidden 4096, 32 heads, FFN 11008, vocabulary 32000), B 1, S 1024, FP32 adapters (PEFT's
    default), with and without gradient checkpointing."""
    pytest.importorskip("peft")
    agree(_hf_lora(LLAMA2, L, 1, 1024, names, True, recompute).step("cpu"),
          _measured(LLAMA2, L, 1, 1024, names, True, recompute))


def lora_layer_bytes(shape, names, dropout, fp32_adapters, batch, seq, rank=16) -> int:
    """One layer's saved bytes in the LoRA step (its "L x" rows over L)."""
    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.models.architecture import Architecture
    arch = Architecture(shape["d"], 2, shape["H"], shape["F"], shape["V"], "llama", n_kv_heads=shape.get("kv"))
    config = LoraConfig(rank, names, adapter_recipe="fp32-adamw" if fp32_adapters else "bf16-pure-adamw",
                        dropout=dropout > 0)
    step = LoraLedger(arch, config, batch, seq, overhead_bytes=0).step("cpu")
    return sum(row["bytes"] for row in step.rows if row["name"].startswith("L x ")) // step.values["L"]




@pytest.mark.slow
@pytest.mark.parametrize("shape, batch, seq", [(SMALL, 2, 48), (dict(SMALL, kv=2), 2, 48), (dict(SMALL, kv=1), 1, 64),
                                               (LLAMA2, 1, 1024)])
@pytest.mark.parametrize("names, dropout, fp32_adapters", [(QV, 0.0, True), (QV, 0.05, False), (ALL, 0.0, False),
                                                           (ALL, 0.05, True)])
def test_peft_saves_per_layer_what_the_lora_step_books(shape, batch, seq, names, dropout, fp32_adapters):
    """PEFT's LoRA on transformers' ``LlamaForCausalLM`` (``get_peft_model``, rank 16, alpha 32; FP32 adapters under
    ``autocast_adapter_dtype`` or BF16; dropout 0, PEFT's ``nn.Identity``, or 0.05; grouped-query at 2 and 1 K/V
    heads; LLaMA-2-7B's width): one layer's saved bytes (two layers minus one, saved-tensor hooks under
    ``FakeTensorMode``) equal the LoRA step's per layer: ``LlamaRMSNorm`` keeps its FP32 input and rstd (its frozen
    weight needs no BF16 normalized input), each FP32 adapter its own FP32 copy of its input, BF16 adapters the
    shared input, A's output, with dropout its mask and output instead, SDPA and the MLP what they save without LoRA,
    no frozen projection's input. The step's landmarks and peak under PEFT wait for what is outside the layers
    (the rotary buffers, cos and sin, transformers' loss) and for block 0, which without
    ``gradient_checkpointing_enable()`` gets an input that does not require grad (no norm 1 tensors, no input
    gradient): not modelled yet, the step refuses LoRA under ``--implementation hf``."""
    pytest.importorskip("peft")
    from memledger.pytorch.libraries import saved_per_layer
    targets = ",".join(names) if names == QV else "all-linear"
    measured = saved_per_layer("hf", **shape, batch=batch, seq=seq, lora=(targets, 16, 32, dropout, fp32_adapters))
    assert measured["layer"] == lora_layer_bytes(shape, names, dropout, fp32_adapters, batch, seq)
