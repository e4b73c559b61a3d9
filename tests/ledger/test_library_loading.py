"""The LoRA/QLoRA step under the allocator's measures in the CLI, and loading as torchtune and LitGPT do it
(:mod:`memledger.ledger.library_loading`) replayed before the step: written-out arithmetic on the libraries' code."""
import json

import pytest

from memledger.ledger.library_loading import _to_nf4, _Trace, load_trace, trace_peak
from memledger.ledger.lora import LoraConfig, LoraLedger, qlora
from memledger.ledger.replay import replay_step
from memledger.models.architecture import Architecture
from clicheck import refused
from clicheck import run as cli

SHAPE = ("--hidden", "256", "--layers", "6", "--heads", "4", "--ffn", "688", "--vocab", "1000", "--style", "llama")
ARCH = Architecture(256, 6, 4, 688, 1000, "llama")


def lora(base="bf16"):
    config = qlora(8, ("q_proj", "v_proj"), "llama") if base == "nf4" else LoraConfig(
        rank=8, targets=("q_proj", "v_proj"), adapter_recipe="bf16-pure-adamw")
    return LoraLedger(ARCH, config, batch_size=2, seq_len=128, overhead_bytes=0)


def test_the_lora_step_is_judged_by_the_allocator_in_the_cli(capsys):
    for measure in ("allocated", "reserved"):
        code, out, _ = cli(capsys, "step", *SHAPE, "--lora-rank", "8", "--backend", "cuda", "--overhead", "0",
                           "--measure", measure, "--json")
        data = json.loads(out)
        assert code == 0 and data["measure"] == measure and data["judged_bytes"] == data["allocator"][measure]
        assert data["allocator"]["reserved"] >= data["allocator"]["allocated"] >= data["peak"]["gpu"]
    code, out, _ = cli(capsys, "step", *SHAPE, "--qlora", "--backend", "cuda", "--measure", "nvidia-smi",
                       "--gpu-memory", "h100-80gb", "--cuda-context", "500MiB", "--json")
    data = json.loads(out)
    # the reserved segments with two cuBLAS workspaces of 32 MiB (sm90) in them, and the context beside
    assert code == 0 and data["judged_bytes"] == data["nvidia_smi"]["reserved"] + 500 * 2**20
    assert data["nvidia_smi"]["reserved"] >= data["allocator"]["allocated"] + 0 and data["allocator"]["reserved"] == \
        data["nvidia_smi"]["reserved"]
    refused(capsys, "step", *SHAPE, "--lora-rank", "8", "--backend", "cuda", "--measure", "nvidia-smi",
            "--gpu-memory", "h100-80gb", message="no published CUDA context size")


def test_torchaos_to_nf4_holds_what_its_code_allocates():
    # n = 2**22 weights: nb = n / 64 = 65,536 blocks. torchao 0.14.1's from_tensor at its worst, in
    # convert_to_norm_float_weight's chunk loop: the kept int8 scalers and BF16 factors (nb + 2 nb / 256), the block
    # maxima (2 nb), blocks / scales (2 n), the uint8 indices (n), and one chunk of 2**20 elements' (value - nf4) and
    # its abs() (32 bytes per element each).
    n, nb, c = 2**22, 2**16, 2**20
    t = _Trace()
    _to_nf4(t, n, keep=True)
    assert trace_peak(t.events) == (nb + 2 * (nb // 256)) + 2 * nb + 2 * n + n + 64 * c
    # torchao 0.1 (torchtune 0914d5c pins torchao==0.1): no chunks, the whole tensor's (value - nf4) and abs() at once,
    # and the factors a view of the full n/64-entry BF16 quantization_factor (kept: 2 nb beside the int8 nb)
    t = _Trace()
    _to_nf4(t, n, keep=True, chunked=False)
    assert trace_peak(t.events) == (nb + 2 * nb) + 2 * nb + 2 * n + 64 * n


def test_loading_replayed_before_the_step_is_not_allocated_twice():
    # torchtune and LitGPT build a BF16 LoRA model on the GPU and copy the checkpoint in place: loading allocates the
    # parameters once, one block each. The step then takes them as allocated: the whole run's allocated peak is the
    # step's, within the rounding of the parameters' blocks and the allocator's rule that a cached block less than
    # 1 MiB larger than a request is handed out whole (what is cached differs): below 1 MiB here, while allocating
    # the 10,516,992 bytes of frozen weights twice would add all of them.
    step = lora().step("cuda")
    plain = replay_step(step)
    for library in ("torchtune", "litgpt"):
        events, kept = load_trace(step.ledger, library)
        assert all(e[0] == "alloc" for e in events)
        run = replay_step(step, load=library)
        assert abs(run.allocated - plain.allocated) < 2**20
        assert run.series[0][:3] == (0, 0, "load")


def test_qlora_loading_quantizes_each_projection_and_litgpt_keeps_the_old_embedding():
    step = lora("nf4").step("cuda")
    d, V = 256, 1000
    events, kept = load_trace(step.ledger, "litgpt")
    # LitGPT: the plugin's _NF4Linear allocates the BF16 weight, its FP16 copy, then quantize_4bit's packed weight
    # and FP32 absmax; its largest projection is the fused qkv, 3 d x d.
    n = 3 * d * d
    assert max(e[2] for e in events if e[0] == "alloc") == max(2 * n, 2 * V * d)
    live_after = sum(e[2] for e in events if e[0] == "alloc") - sum(
        next(x[2] for x in events if x[0] == "alloc" and x[1] == e[1]) for e in events if e[0] == "free")
    kept_bytes = sum(next(x[2] for x in events if x[0] == "alloc" and x[1] == k) for _, k in kept)
    assert live_after - kept_bytes == 2 * V * d       # the StableEmbedding swap leaves the old embedding referenced
    run = replay_step(step, load="litgpt")
    assert run.allocated >= replay_step(step).allocated


def test_a_library_load_is_refused_where_it_is_not_modelled(capsys):
    from memledger.answers.verdict import allocator_spec
    with pytest.raises(ValueError, match="load must be one of"):
        load_trace(lora(), "unsloth")
    with pytest.raises(ValueError, match="measure run"):
        allocator_spec("reserved", load="state-dict")
    refused(capsys, "step", *SHAPE, "--measure", "reserved", "--load", "litgpt", message="does not read --load")


def test_the_lora_ledger_judges_by_the_measure_asked_for(capsys):
    # memledger ledger --lora-rank used to judge by the step's peak whatever --measure said
    code, out, _ = cli(capsys, "ledger", *SHAPE, "--lora-rank", "8", "--measure", "reserved", "--json")
    data = json.loads(out)
    assert code == 0 and data["measure"] == "reserved" and data["judged_bytes"] == data["allocator"]["reserved"] + \
        data["allocator"]["outside_allocator"]
    code, out, _ = cli(capsys, "ledger", *SHAPE, "--qlora", "--measure", "allocated", "--load", "litgpt")
    assert code == 0 and "max_memory_allocated" in out and "loading by litgpt replayed first" in out
    refused(capsys, "ledger", *SHAPE, "--qlora", "--load", "litgpt", message="--load says how a run loads")


def test_fit_searches_a_lora_ledger_by_the_replayed_step():
    from dataclasses import replace

    from memledger.answers.fit import fit
    from memledger.core.capacity import MARGIN
    template = lora("nf4")
    room = 60 * 2**20
    for load in (None, "litgpt"):
        answer = fit(template, "batch", room + MARGIN, measure="reserved", load=load)
        n = answer["answer"]

        def reserved(batch, load=load):        # the step replayed directly, loading first where asked
            return replay_step(replace(template, batch_size=batch).step("cuda"), load=load).reserved
        assert n and reserved(n) <= room < reserved(n + 1) and answer["judged_at_answer"] == reserved(n)
        assert answer["measure_key"] == "reserved"
    with pytest.raises(ValueError, match="not searched for a LoRA ledger"):
        fit(template, "dp", room, measure="reserved")
