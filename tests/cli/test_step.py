"""``memledger step`` with LoRA and QLoRA (memledger/cli/step.py): the step of the Python API, and bad input in one
line (exit 2)."""
import json

import pytest

from memledger.ledger.lora import LoraConfig, LoraLedger, qlora
from memledger.models.architecture import Architecture
from clicheck import run

SHAPE = ("--hidden", "256", "--layers", "6", "--heads", "4", "--ffn", "688", "--vocab", "1000", "--style", "llama")
ARCH = Architecture(256, 6, 4, 688, 1000, "llama")


@pytest.mark.slow
def test_step_lora_json_is_the_python_step(capsys):
    code, out, _ = run(capsys, "step", *SHAPE, "--batch", "2", "--seq", "128", "--lora-rank", "8", "--lora-targets",
                       "q_proj,v_proj,down_proj", "--lora-dropout", "--adapter-recipe", "bf16-adamw", "--backend",
                       "cpu", "--overhead", "0", "--json")
    data = json.loads(out)
    step = LoraLedger(ARCH, LoraConfig(8, ("q_proj", "v_proj", "down_proj"), adapter_recipe="bf16-adamw",
                                       dropout=True), 2, 128, overhead_bytes=0).step("cpu")
    assert code == 0 and data["peak"]["gpu"] == step.peak.bytes and data["landmarks"] == step.landmarks
    assert data["inputs"]["trainable_params"] == 6 * 8 * (256 + 256 + 256 + 256 + 688 + 256)


@pytest.mark.slow
def test_step_lora_defaults_to_peft_s_fp32_adapters(capsys):
    code, out, _ = run(capsys, "step", *SHAPE, "--seq", "128", "--lora-rank", "8", "--backend", "cpu", "--json")
    step = LoraLedger(ARCH, LoraConfig(8, ("q_proj", "v_proj")), 1, 128).step("cpu")
    assert code == 0 and json.loads(out)["peak"]["gpu"] == step.peak.bytes
    assert json.loads(out)["inputs"]["adapter_recipe"] == "fp32-adamw"


@pytest.mark.slow
def test_step_qlora_is_the_preset(capsys):
    code, out, _ = run(capsys, "step", *SHAPE, "--seq", "128", "--qlora", "--backend", "cuda", "--json")
    assert code == 0 and json.loads(out)["peak"]["gpu"] == LoraLedger(ARCH, qlora(), 1, 128).step("cuda").peak.bytes


@pytest.mark.slow
def test_step_lora_full_recomputation_and_chunked_loss(capsys):
    """``--recompute full --loss-chunks 4`` reach the LoRA step (and the LoRA ledger's verdict, its peak)."""
    from memledger.ledger.lora import LoraConfig
    args = ("--seq", "128", "--lora-rank", "8", "--recompute", "full", "--loss-chunks", "4", "--json")
    code, out, _ = run(capsys, "step", *SHAPE, "--backend", "cpu", *args)
    python = LoraLedger(ARCH, LoraConfig(8, ("q_proj", "v_proj")), 1, 128, "full", loss_chunks=4)
    data = json.loads(out)
    assert code == 0 and data["peak"]["gpu"] == python.step("cpu").peak.bytes and data["inputs"]["loss_chunks"] == 4
    code, out, _ = run(capsys, "ledger", *SHAPE, *args)
    assert code == 0 and json.loads(out)["judged_bytes"] == python.step("cuda").peak.bytes
    code, out, _ = run(capsys, "step", *SHAPE, "--backend", "cpu", *args, "--optimizer-in-backward")
    stepped = LoraLedger(ARCH, LoraConfig(8, ("q_proj", "v_proj")), 1, 128, "full", loss_chunks=4,
                         optimizer_in_backward=True).step("cpu")
    assert code == 0 and json.loads(out)["peak"]["gpu"] == stepped.peak.bytes


@pytest.mark.parametrize("args, message", [
    (("--lora-targets", "q_proj,lm_head", "--loss-chunks", "4"), "lm_head adapter with the chunked loss"),
    (("--qlora", "--offload-activations"), "activation offloading of a LoRA block"),
    (("--qlora", "--optimizer-in-backward"), "adapter_recipe bf16-adamw32-bnb keeps FP32 masters or is bitsandbytes'"),
    (("--qlora", "--recipe", "fp32-adamw"), "--qlora quantizes a 16-bit base to NF4 and computes in BF16; --recipe "
                                            "fp32-adamw gives an FP32 base"),
    (("--lora-rank", "8", "--adapter-recipe", "bf16-adamw", "--recipe", "fp32-adamw"), "models a BF16 base"),
    (("--lora-rank", "8", "--adapter-recipe", "adafactor"), "adapter_recipe must be one of"),
    (("--lora-rank", "8", "--zero", "2"), "does not read --zero"),
    (("--qlora", "--lora-dropout", "1.5"), "--lora-dropout must be a probability in [0, 1)"),
])
def test_bad_lora_steps_are_one_line(capsys, args, message):
    code, out, err = run(capsys, "step", *SHAPE, "--seq", "128", "--backend", "cpu", *args)
    assert code == 2 and out == "" and message in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_lora_ledger_is_judged_by_the_step_s_peak(capsys):
    code, out, _ = run(capsys, "ledger", *SHAPE, "--seq", "128", "--qlora", "--json")
    data = json.loads(out)
    run_ = LoraLedger(ARCH, qlora(), 1, 128)
    assert code == 0 and data["judged_bytes"] == data["peak"] == run_.step("cuda").peak.bytes
    code, out, _ = run(capsys, "ledger", *SHAPE, "--seq", "128", "--qlora", "--measure", "total", "--json")
    data = json.loads(out)
    assert data["peak"] is None and data["judged_bytes"] == run_.totals["gpu"]
