"""``memledger check`` and :func:`memledger.intake.from_config` on published config files (issue 30).

Each file under ``configs/`` is a copy of a config its project publishes (``configs/SOURCES.tsv``: repository, path,
commit). :data:`EXPECTED` writes out, for each, the setup its documentation describes, read off the file by hand:
the options memledger must derive (field by field), and the keys it must refuse as inexpressible. A row for every
key is required (nothing is dropped silently).
"""
import csv
import json
from pathlib import Path
import subprocess
import sys

import pytest

from memledger.intake import from_config
from memledger.intake.files import flatten, load

CONFIGS = Path(__file__).parent / "configs"
SOURCES = {row[0]: row[1:] for row in csv.reader((CONFIGS / "SOURCES.tsv").open(), delimiter="\t")}
TORCHTUNE = {"--backend": "cuda", "--rmsnorm": "composite"}       # torchtune/modules/rms_norm.py upcasts to FP32
LITGPT = {"--backend": "cuda", "--rmsnorm": "composite"}
#: torchtune's lora_attn_modules [q_proj, v_proj, output_proj] + apply_lora_to_mlp: HF names q, v, o + the MLP's three
QVO_MLP = "q_proj,v_proj,o_proj,gate_proj,up_proj,down_proj"
#: accelerate's DeepSpeed templates: FP16 with loss scaling, and "auto" sizes the HF Trainer fills in
DS_AUTO = {"fp16.enabled", "train_micro_batch_size_per_gpu", "zero_optimization.reduce_bucket_size"}
#: what each file says, as memledger's options ({flag: value, None for a switch}); ``refused``: keys memledger cannot
#: express; ``model``/``gpus``: what memledger check is given beside the file where the file leaves it out.
EXPECTED = {
    "torchtune_llama2_7B_lora_single_device_2bd69062.yaml": dict(options={
        **TORCHTUNE, "--preset": "llama2-7b", "--batch": "2", "--seq": "2048", "--recipe": "bf16-pure-adamw",
        "--adapter-recipe": "bf16-pure-adamw", "--lora-rank": "8", "--lora-targets": "q_proj,v_proj",
        "--lora-dropout": "0", "--recompute": "full", "--loss-chunks": "8"}, refused=set()),
    "torchtune_llama2_7B_lora_single_device.yaml": dict(options={
        **TORCHTUNE, "--preset": "llama2-7b", "--batch": "2", "--recipe": "bf16-pure-adamw", "--lora-rank": "8",
        "--lora-targets": QVO_MLP, "--recompute": "full"}, refused={"loss._component_"}),
    "torchtune_llama2_7B_qlora_single_device.yaml": dict(options={
        **TORCHTUNE, "--preset": "llama2-7b", "--qlora": None, "--lora-rank": "8", "--lora-targets": QVO_MLP,
        "--lora-dropout": "0", "--adapter-recipe": "bf16-pure-adamw"}, refused={"loss._component_"}),
    "torchtune_llama2_7B_full_low_memory.yaml": dict(options={
        **TORCHTUNE, "--preset": "llama2-7b", "--batch": "2", "--recipe": "bf16-adamw32-bnb", "--paged-optimizer": None,
        "--recompute": "full", "--offload-activations": None, "--optimizer-in-backward": None},
        refused={"loss._component_"}),
    "torchtune_llama3_1_8B_full_single_device.yaml": dict(options={
        **TORCHTUNE, "--preset": "llama3-8b", "--recipe": "bf16-adam8bit-bnb-nomaster", "--paged-optimizer": None,
        "--optimizer-in-backward": None, "--recompute": "full"}, refused={"loss._component_"}),
    "torchtune_llama3_1_8B_lora_single_device.yaml": dict(options={
        **TORCHTUNE, "--preset": "llama3-8b", "--lora-rank": "8", "--lora-targets": QVO_MLP},
        refused={"loss._component_"}),
    "torchtune_llama3_1_8B_qlora_single_device.yaml": dict(options={
        **TORCHTUNE, "--preset": "llama3-8b", "--qlora": None, "--lora-rank": "8"}, refused={"loss._component_"}),
    "torchtune_mistral_7B_lora_single_device.yaml": dict(options={
        **TORCHTUNE, "--preset": "mistral-7b", "--batch": "4", "--lora-rank": "64",
        "--lora-targets": QVO_MLP + ",lm_head"}, refused={"loss._component_"}),
    "torchtune_gemma_2B_lora_single_device.yaml": dict(options={
        **TORCHTUNE, "--preset": "gemma-2b", "--batch": "4", "--lora-rank": "64", "--lora-targets": QVO_MLP},
        refused={"loss._component_"}),
    "torchtune_qwen2_5_0.5B_full_single_device.yaml": dict(options={
        **TORCHTUNE, "--preset": "qwen2.5-0.5b", "--recipe": "bf16-pure-adamw", "--fused": None, "--recompute": "none"},
        refused={"loss._component_"}),
    # LitGPT: bf16-true, 128-token head chunks over max_seq_length 512: 4 chunks
    "litgpt_llama_2_7b_lora.yaml": dict(options={
        **LITGPT, "--preset": "llama2-7b", "--recipe": "bf16-pure-adamw", "--adapter-recipe": "bf16-pure-adamw",
        "--lora-rank": "32", "--lora-targets": "q_proj,v_proj", "--lora-dropout": "0.05", "--batch": "2",
        "--seq": "512", "--loss-chunks": "4", "--loss-impl": "litgpt"}, refused=set()),
    "litgpt_llama_2_7b_qlora.yaml": dict(options={
        **LITGPT, "--preset": "llama2-7b", "--qlora": None, "--no-double-quant": None, "--lora-rank": "32",
        "--batch": "2", "--seq": "512"}, refused=set(), absent={"--adapter-recipe"}),
    "litgpt_llama_3_8b_qlora.yaml": dict(options={
        **LITGPT, "--preset": "llama3-8b", "--qlora": None, "--no-double-quant": None}, refused=set()),
    "litgpt_mistral_7b_lora.yaml": dict(options={**LITGPT, "--preset": "mistral-7b", "--lora-rank": "32"},
                                        refused=set()),
    "litgpt_gemma_2b_lora.yaml": dict(options={
        **LITGPT, "--preset": "gemma-2b", "--lora-rank": "8", "--lora-dropout": "0.1",
        "--lora-targets": "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj,lm_head"}, refused=set()),
    "litgpt_llama_2_7b_full.yaml": dict(options={**LITGPT, "--preset": "llama2-7b", "--batch": "4", "--seq": "512"},
                                        refused={"devices"}),
    # torchtitan: FSDP2 over the GPUs the config leaves to torchrun (its comment: 64 A100s); selective op AC refused
    "torchtitan_llama3_8b.toml": dict(gpus=64, options={
        "--preset": "llama3-8b", "--framework": "fsdp2", "--recipe": "fp32-adamw", "--backend": "cuda", "--batch": "1",
        "--seq": "8192", "--dp": "64", "--fsdp-param-dtype": "bf16", "--fsdp-reduce-dtype": "fp32", "--fused": None},
        refused={"activation_checkpoint.mode"}),
    # accelerate and DeepSpeed files hold no model: memledger check --model
    "accelerate_fsdp.yaml": dict(model="meta-llama/Llama-2-7b-hf", options={"--preset": "llama2-7b"},
                                 refused={"fsdp_config.fsdp_version"}),
    "trl_accelerate_fsdp2.yaml": dict(model="meta-llama/Llama-2-7b-hf", options={
        "--framework": "fsdp2", "--recipe": "fp32-adamw", "--dp": "8", "--fsdp-param-dtype": "bf16",
        "--recompute": "none"}, refused=set()),
    "accelerate_multi_gpu.yaml": dict(model="meta-llama/Llama-2-7b-hf", options={"--framework": "ddp", "--dp": "2"},
                                      refused={"mixed_precision"}),
    "accelerate_single_accelerator.yaml": dict(model="meta-llama/Llama-2-7b-hf", options={}, refused={"mixed_precision"}),
    "accelerate_deepspeed.yaml": dict(model="meta-llama/Llama-2-7b-hf", options={"--dp": "2"}, refused=set()),
    "deepspeed_zero_stage1_config.json": dict(model="meta-llama/Llama-2-7b-hf", gpus=8, options={
        "--framework": "deepspeed", "--zero": "1", "--dp": "8"}, refused=DS_AUTO),
    "deepspeed_zero_stage2_config.json": dict(model="meta-llama/Llama-2-7b-hf", gpus=8, options={
        "--framework": "deepspeed", "--zero": "2"}, refused=DS_AUTO),
    "deepspeed_zero_stage2_offload_config.json": dict(model="meta-llama/Llama-2-7b-hf", gpus=8, options={
        "--zero": "2", "--offload-optimizer": "cpu"}, refused=DS_AUTO),
    "deepspeed_zero_stage3_config.json": dict(model="meta-llama/Llama-2-7b-hf", gpus=8, options={
        "--zero": "3", "--deepspeed-max-live-parameters": "1000000000"}, refused={
        "fp16.enabled", "train_micro_batch_size_per_gpu", "zero_optimization.reduce_bucket_size",
        "zero_optimization.stage3_prefetch_bucket_size", "zero_optimization.stage3_param_persistence_threshold"}),
    "deepspeed_zero_stage3_offload_config.json": dict(model="meta-llama/Llama-2-7b-hf", gpus=8, options={
        "--zero": "3", "--offload-optimizer": "cpu", "--offload-params": "cpu", "--deepspeed-overlap-comm": "true"},
        refused={"fp16.enabled", "train_micro_batch_size_per_gpu", "zero_optimization.reduce_bucket_size",
                 "zero_optimization.stage3_prefetch_bucket_size",
                 "zero_optimization.stage3_param_persistence_threshold"}),
    # PEFT's target_modules null: its default for LLaMA, q_proj and v_proj; FP32 adapters
    "peft_lora_rank32_adapter_config.json": dict(model="meta-llama/Llama-2-7b-hf", options={
        "--lora-rank": "32", "--lora-targets": "q_proj,v_proj", "--lora-dropout": "0"}, refused=set()),
    # TRL's CLI example: the model by its Hub id (a preset's), TRL's max_length default 1024, transformers' batch 8
    "trl_example_config.yaml": dict(options={
        "--preset": "qwen2.5-0.5b", "--batch": "8", "--seq": "1024", "--fused": None}, refused={"torch_dtype"}),
}


def test_every_committed_config_is_expected_and_sourced():
    files = {p.name for p in CONFIGS.iterdir() if p.suffix in (".yaml", ".json", ".toml")}
    assert files == set(EXPECTED) == set(SOURCES), (files ^ set(EXPECTED)) | (files ^ set(SOURCES))
    assert len(files) >= 25
    for name, (repo, path, commit) in SOURCES.items():
        assert "/" in repo and path.endswith((".yaml", ".json", ".toml")) and len(commit) == 40, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_config_reads_into_the_setup_it_describes(name):
    spec = EXPECTED[name]
    intake = from_config(CONFIGS / name, model=spec.get("model"), gpus=spec.get("gpus"))
    for flag, value in spec["options"].items():
        assert flag in intake.options, (name, flag)
        assert intake.options[flag] == value, (name, flag, intake.options[flag], value)
    for flag in spec.get("absent", ()):
        assert flag not in intake.options, (name, flag)
    assert {r.key for r in intake.rows if r.outcome == "refused"} == spec["refused"], name
    # every key of the file has a row: nothing is dropped silently
    keys = set(flatten(load(CONFIGS / name)))
    assert keys <= {r.key for r in intake.rows}, keys - {r.key for r in intake.rows}


def test_overrides_apply_as_tune_run_applies_them():
    name = CONFIGS / "torchtune_llama2_7B_lora_single_device_2bd69062.yaml"
    intake = from_config(name, overrides=["tokenizer.max_seq_len=4096", "batch_size=8", "~loss"])
    assert intake.options["--seq"] == "4096" and intake.options["--batch"] == "8"
    assert "--loss-chunks" not in intake.options          # the loss removed: torch's plain cross-entropy
    with pytest.raises(ValueError, match="expected key=value"):
        from_config(name, overrides=["batch_size"])


def test_two_files_that_disagree_are_refused(tmp_path):
    other = tmp_path / "other.yaml"
    other.write_text((CONFIGS / "torchtune_llama2_7B_lora_single_device_2bd69062.yaml").read_text().replace(
        "batch_size: 2", "batch_size: 4"))
    with pytest.raises(ValueError, match="sets --batch 4, but .* set --batch 2"):
        from_config(CONFIGS / "torchtune_llama2_7B_lora_single_device_2bd69062.yaml", other)


def test_a_model_from_a_local_directory_and_from_the_hub_cache(tmp_path, monkeypatch):
    import memledger
    config = (Path(memledger.__file__).parent / "models" / "configs" / "mistral-7b.json").read_bytes()
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_bytes(config)
    ds = CONFIGS / "deepspeed_zero_stage1_config.json"
    assert from_config(ds, model=folder).options["--config"] == str(folder / "config.json")
    cache = tmp_path / "hub"
    snapshot = cache / "models--someone--tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_bytes(config)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    assert from_config(ds, model="someone/tiny").options["--config"] == str(snapshot / "config.json")
    with pytest.raises(ValueError, match=r"not in the local Hugging Face cache \(looked in .*models--nobody--x"):
        from_config(ds, model="nobody/x")


def _check(*args, env=None):
    return subprocess.run([sys.executable, "-m", "memledger", "check", *map(str, args)], capture_output=True,
                          text=True, env=env)


@pytest.mark.slow
def test_check_prints_what_it_understood_then_the_verdict():
    done = _check(CONFIGS / "torchtune_llama2_7B_lora_single_device_2bd69062.yaml", "tokenizer.max_seq_len=4096")
    assert done.returncode == 0 and done.stderr == "", done.stderr
    out = done.stdout
    assert "--lora-rank 8 --lora-targets q_proj,v_proj" in out and "--loss-chunks 8" in out
    assert "ignored, no memory effect on a training step: " in out and "checkpointer.checkpoint_dir" in out
    command = next(line for line in out.splitlines() if line.startswith("The run, as memledger models it: "))
    argv = command.split(": ", 1)[1].split()[1:]
    step = subprocess.run([sys.executable, "-m", "memledger", *argv], capture_output=True, text=True)
    assert step.returncode == 0 and out.rstrip().endswith(step.stdout.rstrip())    # the same verdict, word for word


@pytest.mark.slow
def test_strict_refuses_what_cannot_be_expressed_naming_it():
    done = _check(CONFIGS / "torchtune_llama2_7B_lora_single_device.yaml", "--strict")
    assert done.returncode == 2 and done.stdout == "" and done.stderr.count("\n") == 1
    assert "loss._component_ is refused" in done.stderr
    assert _check(CONFIGS / "torchtune_llama2_7B_lora_single_device_2bd69062.yaml", "--strict").returncode == 0


@pytest.mark.slow
def test_check_json_carries_the_rows_and_the_step():
    done = _check(CONFIGS / "litgpt_llama_2_7b_lora.yaml", "--json")
    data = json.loads(done.stdout)
    assert data["refused"] == 0 and data["refusal"] is None
    assert data["step"]["inputs"]["rank"] == 32 and data["step"]["peak"]["gpu"] > 0
    assert {r["outcome"] for r in data["rows"]} <= {"option", "default", "ignored", "refused", "unknown"}


@pytest.mark.parametrize("bad, message", [
    ("missing.yaml", "cannot read it"), ("bad.yaml", "not valid YAML"), ("list.yaml", "must hold a mapping"),
    ("notes.txt", "not a .json, .yaml, .yml or .toml file"), ("folder", "no config.json there|cannot read")])
def test_malformed_files_are_one_line(tmp_path, bad, message):
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    (tmp_path / "list.yaml").write_text("- a\n")
    (tmp_path / "notes.txt").write_text("x")
    (tmp_path / "folder").mkdir()
    with pytest.raises(ValueError, match=message):
        from_config(tmp_path / bad)
