"""An adapter on the LM head (``lm_head`` as a LoRA target, as PEFT's ``target_modules`` allows) in the LoRA step
(memledger/step/lora.py) and ledger (memledger/ledger/lora.py), beside MemTracker's run of the reference
(memledger/pytorch/lora.py, whose ``LoraDecoder`` adds PEFT's sum on the head): landmarks, phase peaks, block
peaks and the peak to the byte; the trainable count is PyTorch's own count of the reference's parameters."""
import subprocess
import sys

import pytest

from memledger.ledger.lora import LoraConfig, LoraLedger, adapter_params

from stepcheck import LORA_7B as LLAMA2_7B, LORA_ALL as ALL, LORA_QV as QV, LORA_SMALL as SMALL, \
    lora_against_memtracker as against_memtracker

torch = pytest.importorskip("torch")
HEAD = QV + ("lm_head",)


def test_an_adapter_on_the_head_equals_memtracker():
    """q, v and the head, B 2: the head's input and A x kept for backward, the V-wide adapter output summed with
    the frozen head's; the head alone too. The head's adapter raises the peak (V x r of states and a logits-wide
    delta in the loss's neighbourhood)."""
    with_head, _ = against_memtracker(dict(SMALL, L=2), 2, 8, 8, HEAD)
    alone, _ = against_memtracker(dict(SMALL, L=2), 2, 8, 8, ("lm_head",))
    without, _ = against_memtracker(dict(SMALL, L=2), 2, 8, 8, QV)
    assert with_head.peak.bytes > without.peak.bytes
    assert alone.values["P"] == 8 * (64 + 1000)


@pytest.mark.slow
@pytest.mark.parametrize("targets, dropout, nf4, loop, rmsnorm", [
    (HEAD, 0.1, False, "bf16-pure-adamw", "composite"), (HEAD, 0.0, False, "fp32-adamw", "composite"),
    (HEAD, 0.0, True, "bf16-adamw", "fused"), (ALL + ("lm_head",), 0.1, True, "fp32-adamw", "composite"),
    (("lm_head",), 0.1, False, "fp32-adamw", "fused")])
def test_head_adapter_variants_equal_memtracker(targets, dropout, nf4, loop, rmsnorm):
    """LoRA dropout on the head's input (its mask and dropped copy kept instead of the input), FP32 adapters
    (the FP32 copy of the input, the FP32 sum cast back), FP32 masters, QLoRA, fused RMSNorm; L = 6 (lumped)."""
    against_memtracker(dict(SMALL, L=6), 2, 16, 8, targets, dropout, nf4, loop, rmsnorm=rmsnorm)


@pytest.mark.slow
@pytest.mark.parametrize("batch, rank, targets, dropout, nf4, recipe", [
    (1, 8, HEAD, 0.0, False, "bf16-adamw"), (2, 64, ALL + ("lm_head",), 0.1, True, "bf16-adamw")])
def test_llama2_7b_head_adapter_equals_memtracker(batch, rank, targets, dropout, nf4, recipe):
    """LLaMA-2 7B's shape at S 4096 with the head adapted: LoRA r 8 on q, v and the head; QLoRA r 64 on all."""
    against_memtracker(LLAMA2_7B, batch, 4096, rank, targets, dropout, nf4, recipe)


def test_trainable_parameters_are_pytorch_s_count():
    """LLaMA-2 7B, r 8 on q, v and the head: the reference's trainable parameters as PyTorch counts them (built on
    the meta device), which PEFT's ``print_trainable_parameters`` would print; the head adds r (d + V) once."""
    from memledger.pytorch.lora import LoraRef, make_lora_model
    from memledger.pytorch.reference import RefConfig
    s = LLAMA2_7B
    with torch.device("meta"):
        model = make_lora_model(RefConfig(s["d"], s["L"], s["H"], s["F"], s["V"], "llama"), LoraRef(8, HEAD),
                                "bf16-pure-adamw")
    counted = sum(p.numel() for p in model.parameters() if p.requires_grad)
    config = LoraConfig(8, HEAD, adapter_recipe="bf16-pure-adamw")
    run = LoraLedger("llama2-7b", config, 1, 4096, overhead_bytes=0)
    assert adapter_params(run.arch, config) == counted
    assert run.step("cpu").values["P"] == counted
    assert counted - adapter_params(run.arch, LoraConfig(8, QV)) == 8 * (4096 + 32000)


def test_the_head_on_the_command_line():
    """``--lora-targets ...,lm_head`` in ``ledger`` and ``step``; a misspelt target: one line, exit 2."""
    def run(*args):
        return subprocess.run([sys.executable, "-m", "memledger", *args], capture_output=True, text=True)
    for command in (["ledger"], ["step", "--backend", "cpu"]):
        done = run(*command, "--preset", "llama2-7b", "--lora-rank", "8", "--lora-targets", "q_proj,v_proj,lm_head",
                   "--seq", "4096", "--json")
        assert done.returncode == 0, done.stderr
    bad = run("step", "--preset", "llama2-7b", "--lora-rank", "8", "--lora-targets", "q_proj,lm_hed")
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "lm_hed" in bad.stderr
