"""Five inputs that crashed, hung or disagreed (issue 32), each answered in one line or the same in both places:
a model directory whose config.json is a directory, a sequence-parallel split that is not whole bytes, ``compare``
against ``ledger --convention`` on a stated ZeRO stage, a prefill of 10^18 layers, a flag given as 0."""
import json
import time

import pytest

import memledger as ml
from memledger.calculators import CONVENTIONS, get_convention
from memledger.models.architecture import Architecture
from memledger.step.prefill import Prefill, prefill_programs
from clicheck import refused, run

LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
         "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False}


# 1: a model directory whose config.json is itself a directory

@pytest.mark.parametrize("argv", [["compare", "--json"], ["fit", "--vary", "seq", "--json"], ["ledger"], ["infer"],
                                  ["step"]])
def test_a_config_json_that_is_a_directory_is_refused(capsys, tmp_path, argv):
    (tmp_path / "config.json").mkdir()
    err = refused(capsys, argv[0], "--config", tmp_path, *argv[1:], message="is a directory, not a config.json file")
    assert str(tmp_path / "config.json")[-20:] in err


def test_the_api_refuses_it_with_a_value_error(tmp_path):
    (tmp_path / "config.json").mkdir()
    with pytest.raises(ValueError, match="is a directory"):
        ml.Architecture.from_hf_config(tmp_path)


# 2: a split that is not whole bytes

@pytest.mark.slow                      # compiles a step (SymPy)
def test_a_sequence_parallel_split_of_half_a_byte_is_refused_naming_the_tensor(capsys):
    # the CUDA backend saves RMSNorm's FP32 rstd, B x S x 4 bytes, split over tp under --sp: 1 x 1 x 4 / 8 = 1/2
    refused(capsys, "step", "--hidden", "128", "--layers", "24", "--heads", "8", "--style", "llama", "--batch", "1",
            "--seq", "1", "--tp", "8", "--sp", "--backend", "cuda", "--foreach", "--json",
            message="the step's 'RMSNorm 1 rstd' would be 1/2 bytes per rank at tp 8: tp must divide the tensors it "
                    "splits (sequence parallelism splits the B x S = 1 token over the 8 ranks)")


@pytest.mark.slow
def test_the_compiled_peak_names_the_tensor():
    from memledger.step.cache import step_peak
    arch = Architecture(d_model=128, n_layers=6, n_heads=8, d_ff=256, vocab_size=64, style="llama")
    whole = ml.Ledger(arch, batch_size=3, seq_len=1, tp=4, sequence_parallel=True)
    assert step_peak(whole, "cuda")[0] > 0                        # 3 x 1 x 4 / 4 = 3 bytes: whole
    half = ml.Ledger(arch, batch_size=1, seq_len=1, tp=8, sequence_parallel=True)
    with pytest.raises(ValueError, match=r"the step's '.*rstd' would be 1/2 bytes per rank at tp 8"):
        step_peak(half, "cuda")


# 3: compare and ledger --convention on a stated ZeRO stage

@pytest.mark.parametrize("zero", ["0", "1", "2", "3"])
def test_compare_shows_the_refusal_of_ledger_convention(capsys, zero):
    options = ["--params", "175e9", "--zero", zero, "--dp", "8", "--nodes", "2", "--largest-layer", "1e8"]
    code, out, _ = run(capsys, "compare", *options, "--json")
    rows = {r["name"]: r for r in json.loads(out)["conventions"]}
    assert code == 0
    for name in ("deepspeed-zero2", "deepspeed-zero2-docs", "deepspeed-zero3"):
        stage = get_convention(name).zero_stage
        argv = [o for o in options if o not in ("--largest-layer", "1e8")] if stage == 2 else options
        if int(zero) != stage:
            err = refused(capsys, "ledger", *argv, "--convention", name, message=f"estimates ZeRO stage {stage}; "
                          f"--zero {zero} contradicts it")
            assert rows[name]["error"] == err.removeprefix("memledger: error: ").rstrip("\n")
            assert "gpu_minus_memledger" not in rows[name]
        else:
            code, out, _ = run(capsys, "ledger", *argv, "--convention", name, "--json")
            assert code == 0 and "error" not in rows[name]
            assert rows[name]["gpu"]["total"] == json.loads(out)["totals"]["gpu"]


def test_without_zero_the_estimators_run_at_their_own_stage(capsys):
    code, out, _ = run(capsys, "compare", "--params", "175e9", "--dp", "8", "--nodes", "2", "--json")
    rows = {r["name"]: r for r in json.loads(out)["conventions"]}
    # DeepSpeed's docs formula (memory.rst): 4 bytes/param replicated + 16 sharded over the 8 GPUs
    assert code == 0 and rows["deepspeed-zero2-docs"]["gpu"]["total"] == 175 * 10**9 * (4 + 16 // 8)


def test_the_api_takes_the_stated_stage():
    from memledger.calculators.compare import compare
    rows = {r.name: r for r in compare(ml.Ledger(n_params=10**9, dp=8), stated_zero=0)}
    assert rows["deepspeed-zero2"].error == CONVENTIONS["deepspeed-zero2"].stage_conflict(0) != ""
    assert not {r.name: r for r in compare(ml.Ledger(n_params=10**9, dp=8))}["deepspeed-zero2"].error


# 4: sizes no real model has, answered as fast as a 7B

def _huge(tmp_path, layers=10**18):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(LLAMA, hidden_size=10**18, intermediate_size=10**18, vocab_size=10**18,
                                    num_hidden_layers=layers, num_attention_heads=1, num_key_value_heads=1)))
    return path


def test_infer_answers_for_a_quintillion_layers_in_a_second(capsys, tmp_path):
    start = time.perf_counter()
    code, out, err = run(capsys, "infer", "--config", _huge(tmp_path), "--json")
    assert (code, err) == (0, "") and time.perf_counter() - start < 5
    assert json.loads(out)["prefill"]["block"] == 10**18 - 1          # the last block (its cache the largest)


def _cache_per_block(arch, B, S, c=2):
    return 2 * B * S * arch.kv_heads * arch.head_dim * c              # K and V, B x S x H_kv x d_h each


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_lumped_prefill_grows_by_one_blocks_cache_per_block(attention):
    """Every block runs the same ops and leaves only its cache, so the peak at L blocks is the peak at 5 plus
    (L - 5) blocks' caches, for any L (here 10^18), and the total after the prefill likewise."""
    five = Architecture(d_model=64, n_layers=5, n_heads=8, n_kv_heads=2, d_ff=96, vocab_size=100, style="llama")
    many = Architecture(d_model=64, n_layers=10**18, n_heads=8, n_kv_heads=2, d_ff=96, vocab_size=100,
                        style="llama")
    a, b = (Prefill(x, 2, 16, attention=attention, resident=0) for x in (five, many))
    grown = (10**18 - 5) * _cache_per_block(five, 2, 16)
    assert b.peak.bytes == a.peak.bytes + grown and b.after == a.after + grown
    assert b.peak.layer == 10**18 - 1 and a.peak.layer == 4 and b.peak.op == a.peak.op.replace("block 4", f"block "
                                                                                               f"{10**18 - 1}")


@pytest.mark.parametrize("layers", [5, 6, 9])
@pytest.mark.parametrize("attention,keep", [("sdpa", 1), ("eager", 0)])
def test_the_lumped_prefill_equals_every_block_run(layers, attention, keep):
    arch = Architecture(d_model=64, n_layers=layers, n_heads=8, n_kv_heads=2, d_ff=96, vocab_size=100, style="llama")
    lumped = Prefill(arch, 2, 16, attention=attention, logits_to_keep=keep)
    every = Prefill(arch, 2, 16, attention=attention, logits_to_keep=keep)
    every.__dict__["programs"] = prefill_programs(arch, 2, 16, "bf16", attention, keep, lump=False)
    assert len(every.moments) > len(lumped.moments)
    assert (lumped.peak, lumped.after) == (every.peak, every.after)
    for i in (0, 1, layers - 2, layers - 1):
        assert [m for m in lumped.moments if m[1] == i] == [m for m in every.moments if m[1] == i]


# 5: a flag given as a number

@pytest.mark.parametrize("value", [0, 1])
def test_a_flag_given_as_a_number_is_refused_as_transformers_refuses_it(capsys, tmp_path, value):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(LLAMA, tie_word_embeddings=value)))
    refused(capsys, "ledger", "--config", path, message=f"config: tie_word_embeddings must be true or false, got "
            f"{value} (a number is not a flag: transformers' typed configs refuse it too)")
