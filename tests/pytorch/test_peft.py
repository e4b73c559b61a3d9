"""PEFT's LoRA on transformers' ``LlamaForCausalLM`` (issue 28): the harness that measures it
(:mod:`memledger.pytorch.libraries`, ``lora=``) and the refusal of LoRA under ``--implementation hf``.

PEFT 0.22.0 (requirements.txt) runs beside torchao 0.14.1 (torchtune 0.6.1's pin): 0.19-0.21 raise ImportError in
``get_peft_model`` (``peft/import_utils.py`` ``is_torchao_available``) for a torchao older than 0.16, 0.22 warns
there and leaves torchao out. The harness builds PEFT's model under ``FakeTensorMode`` with two patches
(:func:`memledger.pytorch.libraries._peft`: PEFT's ``Module.to`` moves that change nothing are skipped; MemTracker's
gradient hooks are not put on frozen parameters): :func:`test_the_harness_builds_what_peft_builds` checks on real
tensors that the first builds what ``get_peft_model`` builds.
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
