"""``implementation`` and ``attn_implementation`` (issue 28; memledger/step/implementations.py): the options on every
command and the Python API, bad input in one line naming the field, setups not modelled yet under a library's code
refused as such, and the default (reference) leaving every number as it was."""
import json

import pytest

from memledger import Ledger
from memledger.step.implementations import ATTN_IMPLEMENTATIONS, IMPLEMENTATIONS
from clicheck import refused, run

TINY = ("--hidden", "256", "--layers", "2", "--heads", "4", "--ffn", "688", "--vocab", "1000", "--style", "llama")


def test_the_names():
    assert IMPLEMENTATIONS == ("reference", "hf", "torchtune", "litgpt", "torchtitan")
    assert ATTN_IMPLEMENTATIONS == ("sdpa", "eager", "flash_attention_2")
    assert (Ledger.implementation, Ledger.attn_implementation) == ("reference", "sdpa")


@pytest.mark.parametrize("fields, field", [
    ({"implementation": "megatron"}, "implementation"),
    ({"attn_implementation": "flex"}, "attn_implementation"),
    ({"implementation": "torchtune", "attn_implementation": "eager"}, "attn_implementation"),
    ({"implementation": "litgpt", "attn_implementation": "flash_attention_2"}, "attn_implementation"),
    ({"attn_implementation": "eager"}, "attn_implementation"),
])
def test_bad_fields_name_the_field(fields, field):
    with pytest.raises(ValueError, match=field):
        Ledger("llama2-7b", **fields)


def test_a_family_the_library_does_not_ship():
    with pytest.raises(ValueError, match="torchtune ships no bloom model"):
        Ledger("bloom-7b1", implementation="torchtune")
    with pytest.raises(ValueError, match="LitGPT ships no gpt_bigcode model"):
        Ledger("starcoder", implementation="litgpt")
    with pytest.raises(ValueError, match="torchtune ships no GPT-style decoder"):
        Ledger("gpt2", implementation="torchtune")


@pytest.mark.parametrize("fields, what", [
    ({"tp": 2}, "tensor or sequence parallelism"),
    ({"framework": "fsdp2", "dp": 2, "recipe": "bf16-pure-adamw"}, "framework fsdp2"),
    ({"framework": "ddp", "dp": 2}, "framework ddp"), ({"recipe": "fp16-amp-adamw"}, "FP16 autocast"),
    ({"packed": 2}, "packed documents"), ({"loss_impl": "litgpt"}, "a chunked or LitGPT loss"),
])
def test_setups_not_modelled_yet_are_refused(fields, what):
    ledger = Ledger("llama2-7b", batch_size=1, seq_len=1024, implementation="torchtune", **fields)
    with pytest.raises(ValueError, match=f"torchtune's model code\\): .*{what}.* not modelled yet"):
        ledger.step("cuda")
    with pytest.raises(ValueError, match="not modelled yet"):
        _ = ledger.peak                                     # a fit's verdict: refused, not the reference's sum


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_recomputation(attn):
    """transformers' gradient_checkpointing_enable() is modelled (tests/pytorch/test_libraries.py proves it), selective
    recomputation is refused: transformers has none (:func:`test_selective_recomputation_no_library_has`)."""
    ledger = Ledger("llama2-7b", batch_size=1, seq_len=1024, implementation="hf", attn_implementation=attn,
                    recompute="full")
    assert layer_bytes(ledger.step("cuda")) == 1024 * 4096 * 2          # each layer keeps its BF16 input
    with pytest.raises(ValueError, match="recompute selective under implementation hf: transformers 5.25 has no"):
        Ledger("llama2-7b", implementation="hf", attn_implementation=attn, recompute="selective").step("cuda")


@pytest.mark.parametrize("implementation, says", [
    ("hf", "transformers 5.25 has no such option: activation_checkpointing_enable checkpoints whole decoder layers"),
    ("torchtune", "torchtune 0.6.1 has no such option: its ac_mode 'selective' .* checkpoints every ac_option-th layer"),
    ("litgpt", "LitGPT 0.5.13 has no such option: finetune/full.py checkpoints each Block whole")])
def test_selective_recomputation_no_library_has(implementation, says):
    """``recompute="selective"`` (the attention core re-run) is no option of any library: the refusal names the
    library, its version and what it has instead, in the step, a fit's verdict and the CLI."""
    ledger = Ledger("llama2-7b", batch_size=1, seq_len=1024, implementation=implementation, recompute="selective")
    with pytest.raises(ValueError, match=f"recompute selective under implementation {implementation}: {says}"):
        ledger.step("cuda")
    with pytest.raises(ValueError, match="has no such option"):
        _ = ledger.peak


def test_torchtune_offloading():
    """torchtune's recipe refuses activation offloading without activation checkpointing, and so does memledger;
    with it, the timeline under OffloadActivations is refused by name (its rule: memledger.step.torchtune_offload)."""
    setup = dict(batch_size=1, seq_len=1024, implementation="torchtune", offload_activations=True)
    with pytest.raises(ValueError, match="its recipe refuses enable_activation_offloading without "
                                         "enable_activation_checkpointing .*: give recompute full"):
        Ledger("llama2-7b", **setup).step("cpu")
    with pytest.raises(ValueError, match="activation offloading as torchtune's OffloadActivations runs it .* not "
                                         "modelled yet"):
        Ledger("llama2-7b", recompute="full", **setup).step("cpu")


def test_eager_and_flash_attention_contradict():
    with pytest.raises(ValueError, match="contradict"):
        Ledger("llama2-7b", implementation="hf", attn_implementation="eager", flash_attention=True).step("cuda")
    with pytest.raises(ValueError, match="flash_attention_2 .* not modelled yet"):
        Ledger("llama2-7b", implementation="hf", attn_implementation="flash_attention_2").step("cuda")


@pytest.mark.parametrize("attn, batch, seq, measured", [
    ("sdpa", 1, 1024, 190_980_096), ("sdpa", 2, 1304, 486_402_432),
    ("eager", 1, 1024, 392_175_616), ("eager", 2, 1304, 1_139_028_352)])
def test_hf_layers_are_the_measured_ones(attn, batch, seq, measured):
    """transformers 5.25's LlamaDecoderLayer at LLaMA-2-7B width, BF16, as PyTorch measured it (implementations.md's
    table; tests/pytorch/test_libraries.py measures it again): on cuda as on cpu, its norms keep the BF16
    normalized input (LlamaRMSNorm), eager keeps the FP32 softmax output and the BF16 probabilities."""
    ledger = Ledger("llama2-7b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw", implementation="hf",
                    attn_implementation=attn)
    assert layer_bytes(ledger.step("cuda")) == measured == layer_bytes(ledger.step("cpu"))
    tokens, d, BHSS = batch * seq, 4096, batch * 32 * seq * seq
    sdpa = measured if attn == "sdpa" else measured - 6 * BHSS + 4 * batch * 32 * seq   # the S x S pair; the lse
    # against torchtune's layer (the reference block, composite nn.RMSNorm): each norm keeps its BF16 normalized
    # input (2 bytes) instead of the FP32 x*rstd (4 bytes)
    torchtune = Ledger("llama2-7b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw", implementation="torchtune")
    assert layer_bytes(torchtune.step("cuda")) - sdpa == 2 * (4 - 2) * tokens * d


@pytest.mark.parametrize("batch, seq, measured", [(1, 1024, 232_955_904), (2, 1304, 593_258_880)])
def test_litgpt_layers_are_the_measured_ones(batch, seq, measured):
    """LitGPT 0.5.13's Block at LLaMA-2-7B width, BF16, as PyTorch measured it (implementations.md's table), on cuda
    as on cpu: against torchtune's (the reference block with composite norms), each norm's FP32 weight copy (4d),
    the fused QKV output kept whole by v's view while q and k are new (2 x 2BSd bytes), and SDPA's output beside the output
    projection's input, its reshaped copy (2BSd bytes)."""
    ledger = Ledger("llama2-7b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw", implementation="litgpt")
    assert layer_bytes(ledger.step("cuda")) == measured == layer_bytes(ledger.step("cpu"))
    torchtune = Ledger("llama2-7b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw", implementation="torchtune")
    tokens, d = batch * seq, 4096
    assert measured - layer_bytes(torchtune.step("cuda")) == 2 * 4 * d + 2 * 2 * tokens * d + 2 * tokens * d


def test_grouped_query_attention_under_hf():
    """transformers' SDPA path with grouped-query attention is modelled; its eager core (repeat_kv's copies), LitGPT's
    and torchtune's grouped attention are not yet."""
    assert Ledger("llama3-8b", seq_len=1024, implementation="hf").step("cuda").peak.bytes > 0
    for fields in ({"implementation": "hf", "attn_implementation": "eager"}, {"implementation": "litgpt"},
                   {"implementation": "torchtune"}):
        with pytest.raises(ValueError, match="grouped-query attention.* not modelled yet"):
            Ledger("llama3-8b", seq_len=1024, **fields).step("cuda")


def test_the_article_backend_is_refused_under_a_library():
    with pytest.raises(ValueError, match="give backend cpu or cuda"):
        Ledger("llama2-7b", implementation="torchtune").step("article")


def test_the_default_changes_nothing():
    base = Ledger("llama2-7b", batch_size=2, seq_len=1304)
    same = Ledger("llama2-7b", batch_size=2, seq_len=1304, implementation="reference", attn_implementation="sdpa")
    for backend in ("article", "cuda", "cpu"):
        assert base.step(backend).peak == same.step(backend).peak
    assert base.peak == same.peak


def layer_bytes(step) -> int:
    """One block's saved bytes: the "L x ..." rows of the step, divided by L."""
    total = sum(r["bytes"] for r in step.rows if r["name"].startswith("L x "))
    L = step.values["L"]
    assert total % L == 0
    return total // L


@pytest.mark.parametrize("batch, seq, measured", [(1, 1024, 207_757_312), (2, 1304, 529_131_904)])
def test_torchtune_keeps_its_composite_norm_on_cuda(batch, seq, measured):
    """torchtune's RMSNorm upcasts x to FP32 before ``F.rms_norm`` with a BF16 weight, so no fused kernel runs on CUDA
    either: the cuda step books its layer as PyTorch measured torchtune 0.6.1's own llama2 layer (FakeTensorMode,
    LLaMA-2-7B width, BF16: /work/shared/docs/implementations.md's table), where the reference decoder on cuda books
    the fused norm (input + FP32 rstd) instead."""
    tt = Ledger("llama2-7b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw", implementation="torchtune")
    ref = Ledger("llama2-7b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw")
    assert layer_bytes(tt.step("cuda")) == measured == layer_bytes(tt.step("cpu"))
    tokens, d = batch * seq, 4096
    composite, fused = 2 * (4 * tokens * d + 4 * tokens + 4 * tokens * d), 2 * (2 * tokens * d + 4 * tokens)
    assert layer_bytes(ref.step("cuda")) == measured - composite + fused


def test_the_cli_echoes_and_refuses(capsys):
    code, out, _ = run(capsys, "step", *TINY, "--seq", "64", "--backend", "cuda", "--implementation", "torchtune",
                       "--json")
    inputs = json.loads(out)["inputs"]
    assert code == 0 and (inputs["implementation"], inputs["attn_implementation"]) == ("torchtune", "sdpa")
    refused(capsys, "step", *TINY, "--implementation", "nemo", message="implementation must be one of")
    refused(capsys, "step", *TINY, "--implementation", "torchtune", "--attn-implementation", "eager",
            message="attn_implementation 'eager' is transformers' option")
    refused(capsys, "step", *TINY, "--backend", "cuda", "--implementation", "torchtune", "--rmsnorm", "fused",
            message="the library's code decides its RMSNorm")
    for command in ("step", "ledger"):      # FP32 adapters: not what torchtune's recipe trains
        refused(capsys, command, *TINY, "--implementation", "torchtune", "--lora-rank", "8", "--adapter-recipe",
                "fp32-adamw", *(("--backend", "cuda") if command == "step" else ()), message="not modelled yet")
    # without --adapter-recipe, the implementation's own (cli.compare.ADAPTER_RECIPE: torchtune's bf16 adapters)
    code, out, _ = run(capsys, "ledger", *TINY, "--seq", "64", "--implementation", "torchtune", "--lora-rank", "8",
                       "--json")
    assert code == 0 and json.loads(out)["inputs"]["adapter_recipe"] == "bf16-pure-adamw"
    refused(capsys, "ledger", *TINY, "--implementation", "torchtitan", "--lora-rank", "8", message="not modelled yet")
    for command in ("step", "ledger"):      # torchtune's lora_llama2: its adapters in the model's dtype (bf16-pure-adamw)
        code, out, _ = run(capsys, command, *TINY, "--seq", "64", "--implementation", "torchtune", "--lora-rank", "8",
                           "--adapter-recipe", "bf16-pure-adamw", "--json", *(("--backend", "cuda") if command == "step"
                                                                              else ()))
        assert code == 0 and json.loads(out)["inputs"]["implementation"] == "torchtune"
    refused(capsys, "infer", *TINY, "--implementation", "hf", message="not modelled yet")
    refused(capsys, "ledger", *TINY, "--implementation", "torchtune", "--measure", "total",
            message="does not read --implementation")
    code, out, _ = run(capsys, "ledger", *TINY, "--seq", "64", "--implementation", "torchtune", "--json")
    assert code == 0 and json.loads(out)["inputs"]["implementation"] == "torchtune"
    code, out, _ = run(capsys, "fit", *TINY, "--vary", "batch", "--implementation", "torchtune", "--json")
    assert code == 0 and json.loads(out)["ledger"]["inputs"]["implementation"] == "torchtune"
    code, out, _ = run(capsys, "infer", *TINY, "--implementation", "reference", "--json")
    assert code == 0 and json.loads(out)["implementation"] == "reference"


def test_litgpt_runs_its_own_loss_and_refuses_its_chunked_head():
    """Under implementation litgpt the step runs ``finetune/full.py``'s loss (the head unchunked, the cross-entropy
    split by 128 tokens, tests/pytorch/test_torchtune_litgpt.py measures it): with ``loss_impl`` litgpt or not, the
    same step, whose loss keeps the BF16 log-softmax of the B (S - 1) shifted tokens (2 B (S - 1) V bytes) beside the
    logits (2 B S V, kept to the next iteration); ``finetune/lora.py``'s head chunked by 128 tokens is refused."""
    B, S, V = 1, 1024, 32000
    plain = Ledger("llama2-7b", batch_size=B, seq_len=S, recipe="bf16-pure-adamw", implementation="litgpt").step("cpu")
    named = Ledger("llama2-7b", batch_size=B, seq_len=S, recipe="bf16-pure-adamw", implementation="litgpt",
                   loss_impl="litgpt").step("cpu")
    assert plain.landmarks == named.landmarks
    assert sum(r["bytes"] for r in plain.rows if r["name"].startswith("log-softmax output, ")) == 2 * B * (S - 1) * V
    with pytest.raises(ValueError, match="implementation litgpt .*LitGPT's head chunked by 128 tokens.* not modelled yet"):
        Ledger("llama2-7b", batch_size=B, seq_len=S, loss_chunks=8, implementation="litgpt").step("cpu")


def test_torchtitan_books_its_rope_caches_and_kept_gradients():
    """Arithmetic on torchtitan 0.3.0's sources: each of its layers keeps a ComplexRoPE cache of training.seq_len x
    d_h/2 complex64 (``models/common/rope.py`` l. 111-114, 185-234; ``decoder.py`` l. 165-181: the trainer sizes it to
    seq_len), Llama3-8B at S 8192: 32 x 8192 x 64 x 8 bytes (at ``_8b``'s own 131,072 positions it would be 2 GiB);
    ``zero_grad(set_to_none=False)`` keeps every BF16 gradient the whole step; the step runs on the reference's block
    otherwise (tests/pytorch/test_torchtitan.py measures both)."""
    step = Ledger("llama3-8b", batch_size=1, seq_len=8192, recipe="bf16-pure-adamw",
                  implementation="torchtitan").step("cpu")
    rows = {r["name"]: r for r in step.rows}
    assert rows["RoPE caches (complex64 buffers, every layer)"]["bytes"] == 32 * 8192 * 64 * 8 == 2 ** 27
    assert 32 * 131072 * 64 * 8 == 2 * 2 ** 30
    kept = rows["gradients, zeroed and kept (zero_grad(set_to_none=False))"]
    assert kept["bytes"] == 2 * 8_030_261_248 and kept["live"] == {"before forward", "after forward", "after backward",
                                                                    "after step"}
    ref = Ledger("llama3-8b", batch_size=1, seq_len=8192, recipe="bf16-pure-adamw").step("cpu")
    assert step.landmarks["after step"]["gpu"] - ref.landmarks["after step"]["gpu"] == 2 ** 27 + 2 * 8_030_261_248


@pytest.mark.parametrize("fields, what", [
    ({"recipe": "bf16-adamw"}, "recipe bf16-adamw"),
    ({"recompute": "selective"}, "recompute selective \\(torchtitan's SelectiveAC op policy"),
    ({"packed": 2}, "packed documents"),
    ({"tp": 2}, "tensor or sequence parallelism"), ({"loss_chunks": 8}, "a chunked or LitGPT loss"),
])
def test_torchtitan_refuses_what_is_not_modelled(fields, what):
    ledger = Ledger("llama3-8b", batch_size=1, seq_len=1024, implementation="torchtitan",
                    **{"recipe": "bf16-pure-adamw", **fields})
    with pytest.raises(ValueError, match=f"torchtitan's model code\\): .*{what}.* not modelled yet"):
        ledger.step("cpu")


def test_torchtitan_full_ac_is_modelled():
    """torchtitan's FullAC (tests/pytorch/test_torchtitan.py proves the step): each layer keeps its input only."""
    B, S, d, L = 1, 1024, 4096, 32
    steps = [Ledger("llama3-8b", batch_size=B, seq_len=S, recipe="bf16-pure-adamw", implementation="torchtitan",
                    recompute=r).step("cpu") for r in ("none", "full")]
    forward = [s.landmarks["after forward"]["gpu"] - s.landmarks["before forward"]["gpu"] for s in steps]
    assert forward[0] > forward[1]
    assert sum(r["bytes"] for r in steps[1].rows if r["name"].startswith("L x ")) == L * 2 * B * S * d


def test_torchtitan_on_the_cli(capsys):
    code, out, _ = run(capsys, "step", *TINY, "--seq", "64", "--backend", "cpu", "--recipe", "bf16-pure-adamw",
                       "--implementation", "torchtitan", "--json")
    assert code == 0 and json.loads(out)["inputs"]["implementation"] == "torchtitan"
    refused(capsys, "step", *TINY, "--backend", "cpu", "--implementation", "torchtitan", message="recipe bf16-adamw")
    refused(capsys, "step", *TINY[:-2], "--style", "gpt", "--backend", "cpu", "--implementation", "torchtitan",
            message="torchtitan ships no GPT-style decoder")
    with pytest.raises(ValueError, match="torchtitan ships no gpt_bigcode model"):
        Ledger("starcoder", implementation="torchtitan")


def test_litgpt_lora_ledger_and_its_refusals(capsys):
    """``ledger --lora-rank --implementation litgpt`` books LitGPT's LoRA layers (memledger.step.litgpt_lora; proved
    against LitGPT's model in tests/step/test_litgpt_lora.py) and is judged by LitGPT's LoRA step
    (memledger.step.litgpt_lora_step, proved in tests/step/test_litgpt_lora_step.py), whose landmarks are the ledger's;
    what LitGPT cannot build or the step does not model is refused in one line."""
    lit = ("--lora-rank", "8", "--implementation", "litgpt", "--adapter-recipe", "bf16-pure-adamw", "--lora-dropout")
    code, out, _ = run(capsys, "ledger", *TINY, "--seq", "64", *lit, "--json")
    data = json.loads(out)
    assert code == 0 and data["inputs"]["implementation"] == "litgpt" and data["peak"] > data["landmarks"][
        "after forward"]
    marks = data["landmarks"]       # memledger.step.litgpt_lora.landmarks (proved in tests/step/test_litgpt_lora.py)
    assert marks["before forward"] == marks["after step"] < marks["after backward"] < marks["after forward"]
    code, out, _ = run(capsys, "step", *TINY, "--seq", "64", *lit, "--backend", "cuda", "--overhead", "0", "--json")
    assert code == 0 and {k: v["gpu"] for k, v in json.loads(out)["landmarks"].items()} == marks
    code, out, _ = run(capsys, "ledger", *TINY, "--seq", "64", *lit[:-1], "--json")
    assert json.loads(out)["totals"]["gpu"] != data["totals"]["gpu"]
    refused(capsys, "step", *TINY, *lit, "--backend", "cuda", "--lora-targets", "q_proj,o_proj",
            message="lora_projection, lora_mlp")
    refused(capsys, "step", *TINY, "--seq", "129", *lit, "--backend", "cuda", message="seq_len 129")
    refused(capsys, "ledger", *TINY, *lit[:4], "--adapter-recipe", "fp32-adamw", message="FP32 adapters")
    refused(capsys, "ledger", *TINY, *lit, "--lora-targets", "q_proj,up_proj", message="three projections together")
    refused(capsys, "ledger", *TINY, *lit, "--lora-targets", "q_proj,lm_head", message="lm_head adapter")
    refused(capsys, "ledger", *TINY, *lit, "--recompute", "full", message="recompute full")


@pytest.mark.parametrize("measure", ["allocated", "reserved", "run"])
def test_litgpt_lora_step_is_replayed(capsys, measure):
    """``step --lora-rank ... --implementation litgpt --measure allocated|reserved|run``: LitGPT's LoRA step through
    the caching allocator's replay (memledger.ledger.replay.replay_step) or the run's phases; the replay's allocated
    peak is at least the step's."""
    lit = ("--lora-rank", "8", "--implementation", "litgpt", "--adapter-recipe", "bf16-pure-adamw", "--lora-dropout",
           "--backend", "cuda", "--seq", "200", "--overhead", "0")
    code, out, _ = run(capsys, "step", *TINY, *lit, "--measure", measure, "--json")
    data = json.loads(out)
    assert code == 0 and data["judged_bytes"] >= data["peak"]["gpu"] > 0


def test_litgpt_qlora_quantizes_its_fused_qkv_and_its_head():
    """LitGPT's QLoRA (``finetune/lora.py`` l. 141-150: ``BitsandbytesPrecision(quantize[4:], dtype)`` without
    ``ignore_modules``, so every ``nn.Linear`` is replaced, the LM head's too; ``CausalSelfAttention.qkv`` one fused
    linear): LLaMA-2 7B's NF4 bytes written out from bitsandbytes' ``quantize_4bit`` (two codes a byte, an 8-bit absmax
    per 64 weights, an FP32 constant per 256 absmax); the embedding and the RMSNorms stay BF16."""
    from memledger.ledger.lora import LoraLedger, qlora
    d, L, F, V = 4096, 32, 11008, 32000
    nf4 = lambda n: n // 2 + n // 64 + 4 * (n // 64 // 256)        # noqa: E731  (every n here divides)
    layer = nf4(3 * d * d) + nf4(d * d) + 3 * nf4(F * d)
    rows = {r.name: r.bytes for r in LoraLedger("llama2-7b", qlora(8, ("q_proj", "v_proj"), "llama"),
                                                 implementation="litgpt").rows}
    assert rows["frozen NF4 base projections (double-quantized absmax)"] == L * layer + nf4(V * d)
    assert rows["frozen base weights (bf16; no grads, no states)"] == 2 * (V * d + (2 * L + 1) * d)
