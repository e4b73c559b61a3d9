"""``--measure nvidia-smi`` (cuBLAS's workspaces booked in the replay, the CUDA context beside it) and ``--measure
run`` (loading phases, then the step): constants against PyTorch's source, hand-made traces, written-out arithmetic."""
import json
from dataclasses import replace

import pytest

from memledger.answers.verdict import AllocatorSpec, judge, nvidia_smi, replayed, run_peak
from memledger.core.units import MiB
from memledger.ledger.ledger import Ledger
from memledger.ledger.loading import run_phases
from memledger.ledger.outside import cuda_context, workspaces
from memledger.ledger.replay import run
from memledger.models.architecture import Architecture
from clicheck import refused
from clicheck import run as cli

SHAPE = ("--hidden", "256", "--layers", "6", "--heads", "4", "--ffn", "688", "--vocab", "1000", "--style", "llama")
ARCH = Architecture(256, 6, 4, 688, 1000, "llama")
LEDGER = Ledger(arch=ARCH, batch_size=2, seq_len=128)
# The shape's parameters, written out: embedding V*d, per block 4 d^2 (Q, K, V, O) + 3 d F (SwiGLU) + 2 d (two
# RMSNorms), the final RMSNorm d, the untied head V*d.
P = 1000 * 256 + 6 * (4 * 256 ** 2 + 3 * 256 * 688 + 2 * 256) + 256 + 1000 * 256


def test_workspaces_are_pytorchs_defaults_per_compute_capability():
    # CublasHandlePool.cpp lines 147-150: 4096 * 8 * 1024 on sm90, else 4096 * 1024 * 2 + 16 * 1024 * 8; line 186:
    # cuBLASLt 1024 KiB. One per thread: the forward's and the autograd thread's backward.
    assert workspaces("h100-80gb") == [("forward", "cuBLAS workspace (forward)", 33554432),
                                       ("backward", "cuBLAS workspace (backward)", 33554432)]
    assert [size for _, _, size in workspaces("a100-80gb")] == [8519680, 8519680]
    assert [size for _, _, size in workspaces("h200", biased=True)] == [33554432, 1048576, 33554432, 1048576]
    with pytest.raises(ValueError, match="needs a named GPU"):
        workspaces("80GB")


def test_the_workspaces_are_booked_once_and_kept_across_steps():
    # A trace of 512-byte tensors: a parameter, one forward and one backward tensor. Alone: blocks 1,024 B at most,
    # one 2 MiB small segment. Each 8,519,680-byte workspace is a large request under 10 MiB: a 20 MiB segment
    # (kLargeBuffer), split (more than 1 MiB remains), the second cut from the first's remainder
    # (20 MiB - 8,519,680 = 12,451,840 >= 8,519,680); neither is freed, in either step.
    deltas = [[[0, 1]], [[1, 1]], [[1, -1], [2, 1]], [[2, -1]]]
    moments = [["forward", 0], ["forward", 0], ["backward", 0], ["optimizer", 0]]
    sizes = [512, 512, 512]
    alone = run(deltas, moments, sizes)
    assert (alone.allocated, alone.reserved) == (1024, 2 * MiB)
    booked = run(deltas, moments, sizes, resident=(("forward", 8519680), ("backward", 8519680)))
    assert (booked.allocated, booked.reserved) == (1024 + 2 * 8519680, 2 * MiB + 20 * MiB)
    assert booked.series[-1][3] == 512 + 2 * 8519680            # held after the second step's last op


def test_nvidia_smi_is_the_replayed_reserved_with_the_workspaces_and_the_context():
    spec = AllocatorSpec("nvidia-smi", gpu="h100-80gb", cuda_context=500 * MiB)
    smi = nvidia_smi(LEDGER, spec)
    reserved = replayed(LEDGER, spec).reserved
    assert smi.judged == reserved + 500 * MiB == judge(LEDGER, spec).bytes
    plain = replayed(LEDGER, AllocatorSpec("reserved")).reserved
    assert reserved >= plain + 32 * MiB                   # at least one 32 MiB workspace in a segment of its own
    assert [r["bytes"] for r in smi.rows()][1:] == [33554432, 33554432, 500 * MiB]


def test_the_context_is_published_or_given_else_refused():
    # unslothai/unsloth-zoo pull request #1053: 426 MiB on an RTX 6000 Ada, PyTorch 2.10.0+cu130.
    assert cuda_context("rtx-6000-ada")[0] == 426 * 2 ** 20
    assert cuda_context("h100-80gb", 123) == (123, "given (--cuda-context)")
    with pytest.raises(ValueError, match="no published CUDA context size for h100-80gb"):
        cuda_context("h100-80gb")
    with pytest.raises(ValueError, match="NCCL's buffers"):
        nvidia_smi(replace(LEDGER, dp=2, zero_stage=1), AllocatorSpec("nvidia-smi", gpu="h100-80gb", cuda_context=0))


def test_run_books_the_state_dict_beside_the_model_and_names_the_phase_of_the_peak():
    assert LEDGER.params == P == 5258496
    overhead = LEDGER.overhead_bytes
    phases = run_phases(LEDGER, "state-dict").phases
    assert [(p, b) for p, b, _ in phases] == [("load", 2 * P + overhead), ("load state dict", 4 * P + overhead),
                                               ("step", LEDGER.peak)]
    assert run_peak(LEDGER, AllocatorSpec("run", load="from-pretrained")).phase == "step"
    # FSDP2 over 8 ranks, fp32-adamw: every rank first holds the full FP32 model, 4 P, more than its step.
    fsdp = Ledger(arch=ARCH, batch_size=1, seq_len=16, framework="fsdp2", dp=8, recipe="fp32-adamw",
                  overhead_bytes=0)
    run = run_phases(fsdp)
    assert (run.phase, run.judged) == ("load", 4 * P)
    assert judge(fsdp, AllocatorSpec("run", load="from-pretrained")).bytes == 4 * P


def test_step_json_and_verdict_carry_the_measure_and_its_rows(capsys):
    code, out, _ = cli(capsys, "step", *SHAPE, "--batch", "2", "--seq", "128", "--measure", "run", "--load",
                       "state-dict", "--json")
    data = json.loads(out)
    assert code == 0 and data["measure"] == "run" and data["judged_bytes"] == data["run"]["run_peak"]
    assert [p["phase"] for p in data["run"]["phases"]] == ["load", "load state dict", "step"]
    code, out, _ = cli(capsys, "ledger", *SHAPE, "--measure", "nvidia-smi", "--gpu-memory", "h100-80gb",
                       "--cuda-context", "500MiB", "--json")
    data = json.loads(out)
    assert code == 0 and data["measure"] == "nvidia-smi" and data["judged_bytes"] == data["nvidia_smi"]["nvidia_smi"]
    assert data["nvidia_smi"]["cuda_context"] == 500 * MiB
    code, out, _ = cli(capsys, "step", *SHAPE, "--measure", "run")
    assert code == 0 and "the peak of the whole run" in out and "the run's peak is in phase 'step'" in out
    refused(capsys, "step", *SHAPE, "--measure", "run", "--load", "torchtune", message="give --lora-rank or --qlora")


def test_qlora_run_books_the_largest_projection_in_bf16_beside_its_nf4_copy(capsys):
    # The shape's largest projection is d x F = 256 x 688 = 176,128 weights: in BF16 2 bytes each, and the FP32
    # absmax quantize_4bit keeps until its 8-bit copy is made, 4 bytes per 64 weights (176,128 / 64 = 2,752 blocks).
    code, out, _ = cli(capsys, "step", *SHAPE, "--qlora", "--backend", "cuda", "--measure", "run", "--json")
    data = json.loads(out)
    phases = {p["phase"]: p["bytes"] for p in data["run"]["phases"]}
    assert code == 0 and list(phases) == ["quantize at load", "load", "step"]
    assert phases["quantize at load"] - phases["load"] == 2 * 256 * 688 + 4 * 2752
    assert data["judged_bytes"] == max(phases.values()) == data["run"]["run_peak"]
    refused(capsys, "step", *SHAPE, "--qlora", "--backend", "cuda", "--measure", "run", "--load", "state-dict",
            message="PEFT wraps a from_pretrained model")
    refused(capsys, "step", *SHAPE, "--qlora", "--backend", "cuda", "--load", "state-dict",
            message="does not read --load")


def test_fit_searches_by_nvidia_smi_and_by_the_run():
    from memledger.answers.fit import fit
    memory = 3 * 10 ** 9
    result = fit(LEDGER, "batch", memory, measure="nvidia-smi", margin=0, gpu="h100-80gb", cuda_context=500 * MiB)
    answer = result["answer"]
    spec = AllocatorSpec("nvidia-smi", gpu="h100-80gb", cuda_context=500 * MiB)
    assert result["measure_key"] == "nvidia-smi" and judge(replace(LEDGER, batch_size=answer), spec).bytes <= memory
    assert judge(replace(LEDGER, batch_size=answer + 1), spec).bytes > memory
    with pytest.raises(ValueError, match=r"needs a named GPU \(gpu, --gpu-memory"):
        fit(LEDGER, "batch", memory, measure="nvidia-smi", cuda_context=0)
    with pytest.raises(ValueError, match="load says how a run loads"):
        fit(LEDGER, "batch", memory, load="state-dict")
    run = fit(LEDGER, "batch", memory, measure="run", load="state-dict")
    assert run["measure_key"] == "run" and run["answer"] == fit(LEDGER, "batch", memory, measure="peak")["answer"]
