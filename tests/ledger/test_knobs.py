"""A framework's knobs are one config object in the Ledger (memledger.ledger.knobs), still given and read by their
own keywords; the setup's choices are declared once (memledger.step.inputs.SetupChoices), for the Ledger and the
step's StepInputs (issue 27)."""
from dataclasses import fields, replace

import pytest

from memledger import Ledger
from memledger.ledger import knobs
from memledger.states.frameworks import FRAMEWORK_OPTIONS, DeepSpeedConfig, MegatronConfig
from memledger.step.inputs import DDPConfig, FSDP2Config, SetupChoices, StepInputs

FSDP2 = dict(arch="llama2-7b", framework="fsdp2", dp=8, recipe="fp32-adamw")

#: The Ledger's keywords before its framework knobs were grouped (its dataclass fields, in their order then): the
#: order of ``inputs`` in every JSON output.
BEFORE = ["arch", "n_params", "batch_size", "seq_len", "recipe", "recompute", "tp", "sequence_parallel", "zero_stage",
          "dp", "offload_optimizer", "offload_params", "offload_placement", "overhead_bytes", "dropout",
          "flash_attention", "scope", "loss_chunks", "loss_impl", "framework", "ddp_bucket_mb",
          "gradient_as_bucket_view", "deepspeed_reduce_bucket_size", "deepspeed_contiguous_gradients",
          "deepspeed_overlap_comm", "deepspeed_prefetch_bucket_size", "deepspeed_max_live_parameters",
          "deepspeed_param_persistence_threshold", "megatron_gradient_accumulation_fusion", "fsdp_param_dtype",
          "fsdp_reduce_dtype", "reshard_after_forward", "dp_replicate", "offload_activations", "optimizer_in_backward",
          "packed", "compile", "fsdp_loss_in_root", "fsdp_cpu_offload", "fsdp_offload_pin_memory", "fsdp_units",
          "paged_optimizer", "implementation", "attn_implementation"]


def test_the_keywords_and_the_json_inputs_keep_their_names_and_order():
    assert list(Ledger.keywords()) == BEFORE
    assert list(Ledger("article-7b").inputs()) == BEFORE
    assert list(Ledger(**FSDP2).step_inputs.record) == BEFORE


def test_each_setup_choice_is_declared_once():
    """Neither the Ledger nor StepInputs declares a field SetupChoices declares; each framework knob is a field of
    one framework's config, not of the Ledger."""
    shared = {f.name for f in fields(SetupChoices)}
    assert not shared & set(vars(Ledger).get("__annotations__", {}))
    assert not shared & set(vars(StepInputs).get("__annotations__", {}))
    assert {f.name for f in fields(StepInputs)} == shared | {"ddp", "fsdp2", "values", "record"}
    assert {f.name for f in fields(Ledger)} == shared | {"n_params", "overhead_bytes", "scope", "framework_config"}
    assert not set(knobs.KNOBS) & {f.name for f in fields(Ledger)}


def test_the_knobs_are_the_frameworks_options():
    """memledger.states.frameworks checks each framework's options by the same names."""
    grouped = {fw: tuple(k for k, (f, _) in knobs.KNOBS.items() if f == fw) for fw in FRAMEWORK_OPTIONS}
    assert grouped == FRAMEWORK_OPTIONS
    from memledger.states.frameworks import _DEFAULTS       # what check_framework takes as "not given"
    assert all(knobs.default(k) == _DEFAULTS.get(k) for k in knobs.KNOBS)
    assert knobs.CONFIGS == {"ddp": DDPConfig, "fsdp2": FSDP2Config, "deepspeed": DeepSpeedConfig,
                             "megatron": MegatronConfig}
    assert all(len(fields(c)) == len(grouped[fw]) for fw, c in knobs.CONFIGS.items())


@pytest.mark.parametrize("setup, config", [
    (dict(arch="article-7b"), None),
    (dict(arch="article-7b", framework="ddp", dp=4, ddp_bucket_mb=1), DDPConfig(bucket_mb=1)),
    (dict(FSDP2, fsdp_units="torchtitan", fsdp_param_dtype=None), FSDP2Config(units="torchtitan", param_dtype=None)),
    (dict(FSDP2, dp_replicate=2.0), FSDP2Config(dp_replicate=2)),       # a whole float is a count, as before
    (dict(arch="article-7b", framework="deepspeed", zero_stage=3, dp=8, deepspeed_overlap_comm=False),
     DeepSpeedConfig(overlap_comm=False)),
    (dict(arch="article-7b", framework="megatron", recipe="fp32-adamw", dp=8,
          megatron_gradient_accumulation_fusion=False), MegatronConfig(gradient_accumulation_fusion=False))])
def test_the_ledger_holds_its_frameworks_config_and_reads_each_knob_by_name(setup, config):
    ledger = Ledger(**setup)
    assert ledger.framework_config == config
    for keyword in knobs.KNOBS:
        expected = setup[keyword] if keyword in setup else knobs.default(keyword)
        assert getattr(ledger, keyword) == expected and getattr(Ledger, keyword) == knobs.default(keyword)
    assert replace(ledger, batch_size=2).framework_config == config
    assert Ledger(**setup) == ledger and hash(Ledger(**setup)) == hash(ledger)
    assert "_foreign" not in vars(ledger)


def test_the_step_reads_the_config():
    ledger = Ledger(**FSDP2, fsdp_units="torchtitan")
    assert ledger.step_inputs.fsdp2 is ledger.framework_config and ledger.step_inputs.ddp == DDPConfig()
    assert Ledger(**FSDP2).step_inputs.fsdp2 == FSDP2Config()


@pytest.mark.parametrize("setup, message", [
    (dict(arch="article-7b", fsdp_units="torchtitan"), "^fsdp_units is an option of framework fsdp2, not of plain$"),
    (dict(arch="article-7b", framework="ddp", dp=4, fsdp_loss_in_root=True),
     "^fsdp_loss_in_root is an option of framework fsdp2, not of ddp$"),
    (dict(arch="article-7b", dp_replicate=0), "^dp_replicate must be a positive integer"),
    (dict(arch="article-7b", dp_replicate=2), "^dp_replicate is an option of framework fsdp2, not of plain$")])
def test_a_knob_of_another_framework_is_refused_by_name(setup, message):
    with pytest.raises(ValueError, match=message):
        Ledger(**setup)


def test_replace_to_another_framework_refuses_the_old_frameworks_knobs():
    ledger = Ledger(**FSDP2, fsdp_units="torchtitan")
    with pytest.raises(ValueError, match="^fsdp_units is an option of framework fsdp2, not of ddp$"):
        replace(ledger, framework="ddp", recipe="bf16-adamw")
    assert replace(Ledger(**FSDP2), framework="ddp", recipe="bf16-adamw").framework_config == DDPConfig()


def test_unknown_keywords_are_a_type_error():
    with pytest.raises(TypeError, match="unexpected keyword argument 'fsdp_unit'"):
        Ledger("article-7b", fsdp_unit="torchtitan")
    with pytest.raises(TypeError, match="multiple values for argument 'arch'"):
        Ledger("article-7b", arch="article-7b")
