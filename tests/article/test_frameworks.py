"""Chapter 16's helpers (memledger/article/frameworks.py), against published defaults, arithmetic written out
here, and PyTorch's own FSDP2 (slow)."""
import pytest

from memledger.article.frameworks import (FRAMEWORK_SETUPS, SEVEN_B, buffer_kinds, comparison, design_grid,
                                          framework_runs, fsdp_comparison, source_buffers, tp_saved)
from memledger.ledger.ledger import Ledger

P = 6_738_415_616                      # the released Llama-2-7b checkpoint
GB = 10**9
A100_40 = 40960 * 2**20                # nvidia-smi's A100-40GB total
FSDP2 = dict(framework="fsdp2", recipe="fp32-adamw")


def test_runs_are_one_setup_under_each_framework():
    runs = framework_runs()
    assert list(runs) == list(FRAMEWORK_SETUPS)
    for ledger in runs.values():
        assert (ledger.batch_size, ledger.seq_len, ledger.dp, ledger.params) == (1, 4096, 8, P)
    assert [r.framework for r in runs.values()] == ["plain", "ddp", "fsdp2", "deepspeed", "megatron"]
    with pytest.raises(ValueError, match="labels of FRAMEWORK_SETUPS"):
        framework_runs(SEVEN_B, ["Horovod"])


@pytest.mark.slow
def test_comparison_judges_each_as_memledger_does():
    runs = framework_runs()
    table = comparison(runs)
    rows = {r[0]: r for r in table.rows}
    assert rows["FSDP2"][1] == "peak of the step" and rows["DeepSpeed ZeRO-3"][1].startswith("sum of the rows")
    # Megatron-LM's rows: BF16 weights 2P and FP32 main_grad 4P whole, FP32 masters and Adam 12P over 8 ranks
    megatron = runs["Megatron-LM, distributed optimizer"]
    assert megatron.group_total("model_states") == 2 * P + 4 * P + 3 * (4 * P // 8)
    assert rows["Megatron-LM, distributed optimizer"][2] == f"{megatron.totals['gpu'] / GB:.2f} GB"
    # DeepSpeed's largest transient: the FP32 gradient of one sub-group, min(1e9, P/8) elements
    assert rows["DeepSpeed ZeRO-3"][3] == f"{4 * -(-P // 8) / GB:.2f} GB"
    assert rows["plain loop, ZeRO-3"][4] == "none (memledger's own loop)"


@pytest.mark.slow
def test_buffer_kinds_name_each_kind_once():
    kinds = buffer_kinds(Ledger(**SEVEN_B, **FSDP2))
    for name in ("FSDP2 all-gather output (BF16)", "FSDP2 unsharded parameters (BF16)",
                 "FSDP2 reduce-scatter input (FP32)", "FSDP2 sharded parameters (FP32)"):
        assert name in kinds
    assert not any("block" in k for k in kinds)
    assert buffer_kinds(Ledger(**SEVEN_B, framework="ddp")) == ["DDP gradient bucket"]


def test_source_buffers_cite_file_and_lines():
    table = source_buffers(Ledger(**SEVEN_B, framework="deepspeed", zero_stage=3))
    by_name = {r[0].split(" (")[0]: r for r in table.rows}
    # DeepSpeed's defaults (deepspeed/runtime/zero/config.py): reduce_bucket_size 5e8, stage3_max_live_parameters
    # 1e9, stage3_prefetch_bucket_size 5e7 elements, BF16
    assert by_name["DeepSpeed IPG bucket"][1] == "1.00 GB"
    assert by_name["DeepSpeed gathered parameters"][1] == "2.00 GB"
    assert by_name["DeepSpeed prefetched parameters"][1] == "0.10 GB"
    assert all(":" in r[3] and "@" in r[3] for r in table.rows)
    with pytest.raises(ValueError, match="no buffers read from a source"):
        source_buffers(Ledger(**SEVEN_B, zero_stage=3))


@pytest.mark.slow
def test_tp_saved_dtensor_keeps_the_gathered_inputs():
    """Under SP, DTensor keeps three whole all-gathered inputs per layer (QKV, gate, up: 2BSd each) where
    Megatron-LM keeps the two norm outputs' S/t slices."""
    B, S, d, L, t = 1, 4096, 4096, 32, 8
    saved = tp_saved(Ledger("llama2-7b", seq_len=S, tp=t, sequence_parallel=True, flash_attention=True))
    per_layer = L * (3 * 2 * B * S * d - 2 * 2 * B * S * d // t)
    outside = 2 * B * S * d - 2 * B * S * d // t                # the LM head's input, gathered too
    assert abs(saved["dtensor"] - saved["megatron"] - per_layer - outside) <= 65536   # within the ids' bytes
    with pytest.raises(ValueError, match="tp must be > 1"):
        tp_saved(Ledger("llama2-7b"))


@pytest.mark.slow
def test_design_grid_answers_fit():
    setup = dict(arch="llama2-13b", batch_size=1, seq_len=8192, dp=8, flash_attention=True)
    table = design_grid(setup, A100_40, ["FSDP2"], recomputes=("full",))
    (row,) = table.rows
    n = int(row[3])
    step = Ledger(**{**setup, **FSDP2, "recompute": "full", "batch_size": n}).step()
    more = Ledger(**{**setup, **FSDP2, "recompute": "full", "batch_size": n + 1}).step()
    assert step.peak.bytes <= A100_40 - GB < more.peak.bytes


@pytest.mark.slow
def test_fsdp_comparison_is_pytorchs_fsdp2():
    pytest.importorskip("torch")
    from memledger.pytorch.reference import RefConfig
    result = fsdp_comparison(RefConfig(d=60, L=6, H=4, F=170, V=1001, style="llama"), batch=2, seq=16, world=8)
    assert all(r[3] == "0" for r in result["table"].rows)
    assert result["step"].peak.bytes == result["measured"]["peak"]
    with pytest.raises(ValueError, match="unknown options"):
        fsdp_comparison(RefConfig(d=60, L=6, H=4, F=170, V=1001, style="llama"), shard=2)
