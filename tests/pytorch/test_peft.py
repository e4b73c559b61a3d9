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


@pytest.mark.parametrize("args", [("step", "--backend", "cuda", "--implementation", "hf"),
                                  ("step", "--backend", "cuda", "--implementation", "hf", "--attn-implementation", "eager"),
                                  ("ledger", "--implementation", "hf")])
def test_lora_under_transformers_is_refused_naming_peft(capsys, args):
    err = refused(capsys, args[0], "--preset", "llama2-7b", *args[1:], "--lora-rank", "8",
                  message="LoRA and QLoRA under transformers' code (PEFT 0.22.0's LoRA layers")
    assert "not modelled yet" in err


def lora_layer_bytes(shape, names, dropout, fp32_adapters, batch, seq, rank=16) -> int:
    """One layer's saved bytes in the LoRA step (its "L x" rows over L)."""
    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.models.architecture import Architecture
    arch = Architecture(shape["d"], 2, shape["H"], shape["F"], shape["V"], "llama", n_kv_heads=shape.get("kv"))
    config = LoraConfig(rank, names, adapter_recipe="fp32-adamw" if fp32_adapters else "bf16-pure-adamw",
                        dropout=dropout > 0)
    step = LoraLedger(arch, config, batch, seq, overhead_bytes=0).step("cpu")
    return sum(row["bytes"] for row in step.rows if row["name"].startswith("L x ")) // step.values["L"]


QV, ALL = ("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
SMALL = dict(d=256, H=4, F=688, V=1000)
LLAMA2 = dict(d=4096, H=32, F=11008, V=32000)


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
