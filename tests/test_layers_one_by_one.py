"""Inputs that made memledger allocate gigabytes instead of answering or refusing in one line (a fuzz worker killed
by the kernel at 23 GB resident: ``infer --weights nf4`` on a config of 10^9 layers, from
``tests/cli/test_fuzz.py::test_huge_shapes_slow``).

The step itself runs blocks 2..L-3 as one lump, so any L is answered in seconds. What listed the model block by
block did not: quantized inference weights and DeepSpeed's persistent parameters (now counted: L times one block's),
and the walks that must go block by block, the caching allocator's replay, DDP's buckets and a library's loading
trace, now refused past :data:`memledger.core.choices.LAYERS_ONE_BY_ONE` layers, naming ``n_layers``, before
anything is built. No test here allocates more than a few tens of megabytes with the fix removed: the counted sums
are first run at 10^4 layers under ``tracemalloc`` (a list of 7 x 10^4 shapes shows, and the 10^18 call is not
reached); each refusal is checked on inputs that fail fast without it.
"""
import json
from types import SimpleNamespace
import tracemalloc

import pytest

import memledger.step.cache
from memledger.core.choices import LAYERS_ONE_BY_ONE, check_layers_one_by_one
from memledger.ledger.inference import Inference
from memledger.ledger.ledger import Ledger
from memledger.ledger.library_loading import load_trace
from memledger.ledger.replay import replay, replay_step
from memledger.models.architecture import Architecture
from memledger.models.presets import get_preset
from memledger.states.frameworks import deepspeed_buffers
from memledger.step.ddp import ready_order
from clicheck import refused, run

#: A LLaMA block of d 64, 8 heads of 8 (2 key/value heads), d_ff 96: its seven projections (out, in) are q (64, 64),
#: k and v (16, 64), o (64, 64), gate and up (96, 64), down (64, 96): 28,672 weights, 416 output rows.
BLOCK_WEIGHTS, BLOCK_ROWS = 2 * 64 * 64 + 2 * 16 * 64 + 3 * 96 * 64, 64 + 16 + 16 + 64 + 96 + 96 + 64


def _arch(n_layers):
    return Architecture(d_model=64, n_layers=n_layers, n_heads=8, n_kv_heads=2, d_ff=96, vocab_size=100,
                        style="llama")


def _rows(inference) -> dict:
    return {r.name: r.bytes for r in inference.rows}


def _traced_rows(quantization) -> int:
    """The most bytes Python allocates for the rows of :func:`_arch` at 10^4 layers (its modules imported first, at
    one layer): a list of every layer's shapes would hold 7 x 10^4 of them, and a dict of parts each (over 10 MB);
    one block's, a few KB."""
    assert _rows(Inference(_arch(1), quantization=quantization))
    tracemalloc.start()
    try:
        assert _rows(Inference(_arch(10**4), quantization=quantization))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_quantized_inference_counts_one_block_l_times(quantization):
    assert _traced_rows(quantization) < 1_000_000                # first: without the fix, 10^18 would never end
    L = 10**18
    rows = _rows(Inference(_arch(L), quantization=quantization))
    if quantization == "nf4":                      # bitsandbytes packs two 4-bit codes a byte
        assert rows["NF4 linear weights: packed 4-bit codes"] == L * BLOCK_WEIGHTS // 2
    else:                                          # LLM.int8: one byte a weight, an FP32 scale per output row
        assert rows["LLM.int8 linear weights (int8)"] == L * BLOCK_WEIGHTS
        assert rows["LLM.int8 row scales (SCB, FP32)"] == L * 4 * BLOCK_ROWS


def test_infer_nf4_answers_for_a_quintillion_layers(capsys):
    assert _traced_rows("nf4") < 1_000_000                       # first: without the fix, 10^18 would never end
    code, out, err = run(capsys, "infer", "--hidden", 64, "--heads", 8, "--layers", 10**18, "--ffn", 96, "--vocab",
                         100, "--style", "llama", "--weights", "nf4", "--json")
    assert (code, err) == (0, "")
    rows = {r["name"]: r["bytes"] for r in json.loads(out)["rows"]}
    # the command line's --heads sets the key/value heads too: q, k, v, o are 64 x 64 each
    assert rows["NF4 linear weights: packed 4-bit codes"] == 10**18 * (4 * 64 * 64 + 3 * 96 * 64) // 2


def test_deepspeed_persistent_parameters_count_one_block_l_times():
    # LLaMA 2 7B's block: its two RMSNorm weights (4,096 elements each) are under stage3_param_persistence_threshold
    # (10^5), its projections are not; the final norm too. Listing 9 x 10^18 tensors fails at once (MemoryError).
    L = 10**18
    ledger = Ledger(get_preset("llama2-7b").with_changes(n_layers=L), framework="deepspeed", zero_stage=3, dp=8)
    persistent = next(b for b in deepspeed_buffers(ledger) if b.name.startswith("DeepSpeed persistent parameters"))
    assert persistent.bytes == 2 * (2 * L + 1) * 4096


def test_the_bound_is_inclusive_and_names_n_layers():
    assert check_layers_one_by_one(LAYERS_ONE_BY_ONE, "x") == LAYERS_ONE_BY_ONE
    with pytest.raises(ValueError, match=f"^n_layers {LAYERS_ONE_BY_ONE + 1:,}: x walks the blocks one by one"):
        check_layers_one_by_one(LAYERS_ONE_BY_ONE + 1, "x")


def test_ddp_buckets_refuse_before_listing_any_gradient():
    with pytest.raises(ValueError, match="^n_layers 1,025: assigning framework ddp's buckets"):
        ready_order([], {}, LAYERS_ONE_BY_ONE + 1)              # no ops: without the refusal, an empty list


def test_the_replay_refuses_before_compiling_the_step(monkeypatch):
    def compiled(*_):
        raise AssertionError("the step was compiled before the refusal")
    monkeypatch.setattr(memledger.step.cache, "compiled_step", compiled)
    with pytest.raises(ValueError, match="^n_layers 1,025: the caching allocator's replay"):
        replay(Ledger(_arch(LAYERS_ONE_BY_ONE + 1)))


def test_a_built_steps_replay_refuses_before_tracing_it():
    step = SimpleNamespace(values={"L": 10**18}, built=None)      # no ops: without the refusal, an AttributeError
    with pytest.raises(ValueError, match="^n_layers 1,000,000,000,000,000,000: the caching allocator's replay"):
        replay_step(step)


@pytest.mark.parametrize("library", ["torchtune", "litgpt"])
def test_a_loading_trace_refuses_before_listing_any_module(library):
    lora = SimpleNamespace(arch=_arch(10**18), config=SimpleNamespace(base="bf16"))   # no rank: an AttributeError
    with pytest.raises(ValueError, match=f"^n_layers 1,000,000,000,000,000,000: --load {library}'s trace"):
        load_trace(lora, library)


@pytest.mark.slow                  # compiles a step (SymPy)
@pytest.mark.parametrize("options", [["--framework", "ddp", "--dp", "2"], ["--measure", "reserved"],
                                     ["--measure", "allocated", "--framework", "ddp", "--dp", "2"]])
def test_the_command_line_refuses_in_one_line(capsys, options):
    refused(capsys, "step", "--hidden", 64, "--heads", 8, "--layers", LAYERS_ONE_BY_ONE + 1, "--ffn", 96, "--vocab",
            100, "--style", "llama", *options, message=f"n_layers {LAYERS_ONE_BY_ONE + 1:,}: ")
