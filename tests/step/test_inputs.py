"""The step reads a typed :class:`StepInputs` that the Ledger produces, never a Ledger's attributes: the framework
knobs arrive grouped (FSDP2Config, DDPConfig), a step made from the inputs is the Ledger's step, and a changed
knob in the inputs changes the step as the same change of the Ledger does."""
from dataclasses import replace
from pathlib import Path
import re

import pytest

from memledger import Ledger
from memledger.step.inputs import DDPConfig, FSDP2Config, StepInputs, inputs_of
from memledger.step.structure import FSDP2Plan, StepStructure
from memledger.step.timeline import Step
from memledger.activations.backends import get_backend

STEP = Path(__file__).resolve().parents[2] / "memledger" / "step"
SMALL = dict(arch="llama2-7b", seq_len=512, overhead_bytes=0)


def test_the_ledger_groups_each_frameworks_knobs():
    fsdp = Ledger(**SMALL, framework="fsdp2", recipe="fp32-adamw", dp=8, dp_replicate=2, fsdp_param_dtype=None,
                  fsdp_reduce_dtype="bf16", reshard_after_forward=2, fsdp_loss_in_root=True).step_inputs
    assert fsdp.fsdp2 == FSDP2Config(None, "bf16", 2, 2, True, False, True)
    assert (fsdp.framework, fsdp.dp, fsdp.shard_group) == ("fsdp2", 8, 4)
    offload = Ledger(**SMALL, framework="fsdp2", recipe="fp32-adamw", dp=8, fsdp_cpu_offload=True,
                     fsdp_offload_pin_memory=False).step_inputs
    assert offload.fsdp2 == FSDP2Config(cpu_offload=True, offload_pin_memory=False)
    ddp = Ledger(**SMALL, framework="ddp", dp=4, ddp_bucket_mb=1, gradient_as_bucket_view=True).step_inputs
    assert ddp.ddp == DDPConfig(1, True) and ddp.fsdp2 == FSDP2Config() and ddp.shard_group == 4


def test_the_fsdp2_plan_resolves_the_policy():
    """No param dtype: the units compute in the parameters' own (FP32); the reduce dtype as given; an int
    reshard_after_forward equal to the shard group (dp / dp_replicate = 4) is True (fully_shard's normalization);
    CPUOffloadPolicy(pin_memory=False)."""
    plan = FSDP2Plan.of(FSDP2Config(None, "bf16", 4, 2, False, True, False), "fp32", 4)
    assert plan == FSDP2Plan("fp32", "bf16", "fp32", True, True, False, False)
    assert FSDP2Plan.of(FSDP2Config("bf16", None, 1), "fp32", 8).reduce == "bf16"
    assert FSDP2Plan.of(FSDP2Config("bf16", None, 1), "fp32", 8).reshard is False


@pytest.mark.parametrize("changes", [dict(framework="fsdp2", recipe="fp32-adamw", dp=8),
                                     dict(framework="ddp", dp=4, ddp_bucket_mb=1), dict(zero_stage=3, dp=8)])
def test_a_step_of_the_inputs_is_the_ledgers_step(changes):
    ledger = Ledger(**SMALL, **changes)
    assert Step(ledger.step_inputs, "cpu").to_dict() == ledger.step("cpu").to_dict()


@pytest.mark.parametrize("knob, field, value", [("reshard_after_forward", "reshard_after_forward", False),
                                                ("fsdp_cpu_offload", "cpu_offload", True),
                                                ("fsdp_reduce_dtype", "reduce_dtype", "bf16")])
def test_a_knob_changed_in_the_inputs_changes_the_step_as_in_the_ledger(knob, field, value):
    ledger = Ledger(**SMALL, framework="fsdp2", recipe="fp32-adamw", dp=8)
    inputs = ledger.step_inputs
    changed = replace(inputs, fsdp2=replace(inputs.fsdp2, **{field: value}))
    assert Step(changed).peak != Step(inputs).peak
    assert Step(changed).peak == replace(ledger, **{knob: value}).step().peak
    assert StepStructure.of(changed, get_backend()) == StepStructure.of(replace(ledger, **{knob: value}), get_backend())


def test_anything_else_is_refused_in_one_line():
    with pytest.raises(TypeError, match="the step reads StepInputs"):
        inputs_of(object())
    assert isinstance(inputs_of(Ledger(**SMALL)), StepInputs)


def test_nothing_in_the_step_reads_a_ledger():
    """No ``ledger.x`` attribute read and no ``getattr(ledger, ...)`` in memledger/step (the step's entry points
    take StepInputs; :func:`inputs_of` is the one place a Ledger turns into them)."""
    reads = re.compile(r"(?<![\w.])(ledger|lora_ledger|led)\.\w+|getattr\((self\.)?(ledger|lora_ledger|led|setup)\b")
    found = [f"{path.name}:{n}: {line.strip()}" for path in sorted(STEP.glob("*.py"))
             for n, line in enumerate(path.read_text().splitlines(), 1) if reads.search(line.split("#")[0])]
    assert found == []
