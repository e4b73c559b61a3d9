"""The step timeline: landmarks, transients and the peak (docs/step.md).

Fast tests check the timeline against the article's formulas and the recipes'
definitions; the slow ones run PyTorch's MemTracker on the reference decoder
(memledger/pytorch/reference.py) under fake tensors and compare: every landmark to the
byte, the peak of each phase (forward with the loss, backward, optimizer) to
the byte as well (the issue asks for 1 %).
"""
import pytest
import sympy as sp

from memledger.activations.inventory import closed_form
from memledger.models.architecture import Architecture
from memledger.activations.backends import get_backend
from memledger.ledger.ledger import Ledger
from memledger.activations.outside import outside_inventory
from memledger.models.parameters import block_params_expr
from memledger.step.timeline import LANDMARKS, Step
from memledger.core.symbols import B, F, H, L, N_d, O, P, S, V, d, t
from stepcheck import (GPT7B, LLAMA3_8B, LLAMA7B, against_memtracker, landmarks_are_sums_of_rows,
                       peaks_agree)



@pytest.mark.slow
def test_article_forward_adds_eq1_per_layer():
    """Under the article's conventions the blocks add L x BSd(34 + 5HS/d) (Korthikanti Eq. 1) in forward."""
    ledger = Ledger(GPT7B, batch_size=1, seq_len=2048, overhead_bytes=0)
    step = Step(ledger)
    added = step.landmarks["after forward"]["gpu"] - step.landmarks["before forward"]["gpu"]
    outside = sum(ledger.evaluate(r.bytes) for r in outside_inventory("gpt") if "ids" not in r.name)
    assert added == 32 * ledger.evaluate(closed_form()) + outside


@pytest.mark.slow
@pytest.mark.parametrize("kwargs", [dict(), dict(recipe="bf16-pure-adamw", batch_size=3),
                                    dict(recipe="fp32-adamw", recompute="full"),
                                    dict(zero_stage=3, dp=8, offload_optimizer="cpu", offload_params="cpu",
                                         offload_placement="zero-offload"),
                                    dict(zero_stage=2, dp=4, offload_optimizer="nvme", tp=2, sequence_parallel=True),
                                    dict(tp=2), dict(tp=4, sequence_parallel=True, recompute="selective")])
@pytest.mark.parametrize("backend", ["article", "cuda", "cpu"])
@pytest.mark.parametrize("arch", [GPT7B, LLAMA7B, Architecture(256, 3, 4, 1024, 1000, "gpt")])
@pytest.mark.sample(4)
def test_landmarks_are_sums_of_rows(arch, backend, kwargs):
    landmarks_are_sums_of_rows(Step(Ledger(arch, **kwargs), backend))


@pytest.mark.slow
@pytest.mark.parametrize("backend, kwargs", [
    ("article", dict(recompute="full", zero_stage=3, dp=8)), ("cuda", dict(tp=8, sequence_parallel=True)),
    ("cpu", dict(recipe="bf16-pure-adamw", batch_size=3, zero_stage=2, dp=4, offload_optimizer="nvme"))])
@pytest.mark.sample(1)
def test_gqa_landmarks_are_sums_of_rows(backend, kwargs):
    """The same for Llama 3 8B's grouped-query blocks."""
    landmarks_are_sums_of_rows(Step(Ledger(LLAMA3_8B, **kwargs), backend))


@pytest.mark.slow
@pytest.mark.parametrize("recipe, per_param, kv", [("bf16-pure-adamw", 8, None), ("fp32-adamw", 16, None),
                                                   ("bf16-adamw", 16, None), ("bf16-adamw", 16, 1)])
def test_model_states_are_the_recipes(recipe, per_param, kv):
    """Before forward: parameters and optimizer states; after backward: + the gradients (the recipe's sum).
    With grouped-query attention the step's parameter tensors (a (d + 2 H_kv d/H) x d fused QKV weight) add
    up to the architecture's count (memledger/models/parameters.py)."""
    arch = Architecture(512, 4, 8, 2048, 5000, "llama", n_kv_heads=kv)
    step = Step(Ledger(arch, recipe=recipe, overhead_bytes=0))
    P = arch.computed_params
    ids = 2 * 8 * 2048                                       # input and target ids, int64
    assert step.landmarks["after backward"]["gpu"] - ids == per_param * P
    assert step.landmarks["after step"] == step.landmarks["before forward"]


@pytest.mark.slow
def test_mixed_precision_holds_18_bytes_per_parameter_in_the_optimizer_step():
    """docs/step.md: with FP32 masters the step briefly holds FP32 gradients, 18 B/param, not 16."""
    arch = Architecture(512, 4, 8, 2048, 5000, "llama")
    step = Step(Ledger(arch, recipe="bf16-adamw", overhead_bytes=0))
    P = arch.computed_params
    converted = [r for r in step.rows if r["name"].startswith("FP32 gradient of")]
    assert sum(r["bytes"] for r in converted) == 4 * P
    assert step.phase_peaks()["optimizer"] >= 18 * P


@pytest.mark.slow
def test_zero3_gathers_a_block_and_prefetches_the_next():
    step = Step(Ledger(LLAMA7B, zero_stage=3, dp=8))
    row = next(r for r in step.rows if r["name"] == "ZeRO-3 gathered block parameters")
    block = int(block_params_expr("llama").subs({d: 4096, F: 11008}))
    assert row["bytes"] == 2 * block * 2                      # two blocks (prefetch), BF16
    names = [n for n, _ in step.live_at_peak()]
    assert any(n.startswith("ZeRO-3") for n in names) or step.peak.phase == "loss"


@pytest.mark.slow
def test_step_counters_live_on_the_host_with_cuda():
    cuda = Step(Ledger(GPT7B), "cuda")
    cpu = Step(Ledger(GPT7B), "cpu")
    count = 12 * 32 + 3                                       # parameter tensors of the GPT decoder
    assert cuda.landmarks["before forward"]["cpu"] == 4 * count
    assert cpu.landmarks["before forward"]["cpu"] == 0


def test_peak_decides_fits():
    step = Step(Ledger(GPT7B))
    assert step.within(step.peak.bytes) and not step.within(step.peak.bytes - 1)
    assert step.fits(step.peak.bytes, margin=0) and not step.fits(step.peak.bytes - 1, margin=0)
    assert step.peak.bytes > step.landmarks["after backward"]["gpu"]


@pytest.mark.slow
def test_logits_with_full_checkpointing_rival_the_checkpoints():
    """Chapter 4's "small next to the layers" fails with full checkpointing: the loss's FP32 tensors
    are as large as all the checkpoints together (128k vocabulary, S = 8192)."""
    arch = Architecture(4096, 32, 32, 14336, 128256, "llama")
    step = Step(Ledger(arch, seq_len=8192, recompute="full"))
    fp32_logits = next(r for r in step.rows if r["name"] == "logits in FP32")["bytes"]
    checkpoints = next(r for r in step.rows if r["name"].startswith("L x layer input"))["bytes"]
    assert fp32_logits == 8192 * 128256 * 4 > checkpoints


@pytest.mark.parametrize("kwargs, message", [
    (dict(arch=None, n_params=10**9), "needs an architecture"),
    (dict(arch="mixtral-8x7b"), "mixture of experts"),
    (dict(arch="bert-base-uncased"), "token types, a pooler, an embedding norm are not modelled"),
    (dict(arch=Architecture(256, 2, 4, 1024, 1000, "gpt", qkv_bias=False)), "a GPT block without QKV biases"),
])
def test_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Step(Ledger(**kwargs))
    assert Ledger(**kwargs).peak is None                      # the ledger falls back to its sum


def test_math_kernel_is_refused():
    with pytest.raises(ValueError, match="math SDPA"):
        Step(Ledger(LLAMA7B, dropout=True), "cpu")


def test_bad_backend():
    with pytest.raises(ValueError, match="backend"):
        get_backend("gpu")
    with pytest.raises(ValueError, match="foreach"):
        get_backend("cuda", foreach="yes")


@pytest.mark.slow
def test_json_contract():
    data = Step(Ledger(GPT7B, overhead_bytes=0), "cpu").to_dict()
    assert set(data) >= {"inputs", "landmarks", "peak", "rows"}
    assert set(data["landmarks"]) == set(LANDMARKS)
    assert data["peak"]["phase"] in ("forward", "loss", "backward", "optimizer")
    kinds = {"param", "grad", "optimizer", "activation", "transient", "overhead"}
    assert all(r["kind"] in kinds and isinstance(r["bytes"], int) for r in data["rows"])
    names = {s.name: s for s in (B, S, d, H, L, F, V, P, t, N_d, O)}
    logits = next(r for r in data["rows"] if r["name"] == "logits")
    assert sp.sympify(logits["formula"], locals=names) == B * S * V * 2
    for mark, devices in data["landmarks"].items():       # each row names the landmarks it is live at
        assert devices["gpu"] == sum(r["bytes"] for r in data["rows"] if r["device"] == "gpu" and mark in r["live"])
    # the vocabulary is typed inside (memledger/step/vocab.py); what the API hands out are plain strings
    assert all(type(r[k]) is str for r in data["rows"] for k in ("kind", "phase", "device"))
    assert all(type(dev) is str for v in data["landmarks"].values() for dev in v)
    assert type(data["peak"]["phase"]) is str


# -- against PyTorch -------------------------------------------------------------------------------

SMALL = [("gpt", 320, "bf16-pure-adamw", 2, 24, 2, 0.0, "none"), ("gpt", 320, "bf16-adamw", 1, 64, 6, 0.1, "none"),
         ("gpt", 320, "fp32-adamw", 3, 256, 3, 0.1, "full"), ("gpt", 320, "bf16-pure-adamw", 1, 256, 5, 0.0, "full"),
         ("llama", 320, "bf16-adamw", 2, 24, 2, 0.0, "none"), ("llama", 256, "fp32-adamw", 1, 256, 6, 0.0, "none"),
         ("llama", 320, "bf16-pure-adamw", 3, 256, 3, 0.0, "full"), ("llama", 320, "bf16-adamw", 1, 64, 5, 0.0, "full")]


@pytest.mark.slow
@pytest.mark.parametrize("style, F_, loop, B, S, L, dropout, recompute", SMALL)
@pytest.mark.parametrize("foreach", [False, True])
def test_small_steps_match_memtracker_to_the_byte(style, F_, loop, B, S, L, dropout, recompute, foreach):
    step, measured = against_memtracker(style, F_, loop, B, S, L, dropout, recompute, foreach)
    peaks_agree(step, measured, op_by_op=recompute == "none")


FULL = [("gpt", 16384, "bf16-pure-adamw", 1, 2048, "none", 0.0), ("gpt", 16384, "bf16-adamw", 4, 2048, "full", 0.1),
        ("gpt", 16384, "fp32-adamw", 1, 4096, "none", 0.1), ("gpt", 16384, "bf16-pure-adamw", 2, 4096, "full", 0.0),
        ("llama", 11008, "bf16-pure-adamw", 1, 2048, "none", 0.0), ("llama", 11008, "bf16-adamw", 4, 4096, "none", 0.0),
        ("llama", 11008, "fp32-adamw", 2, 2048, "full", 0.0), ("llama", 11008, "bf16-adamw", 1, 4096, "full", 0.0)]


@pytest.mark.live(3)  # full-scale repeats of the small grids' proofs: n run PyTorch under --pytorch=live
@pytest.mark.slow
@pytest.mark.parametrize("style, F_, loop, B, S, recompute, dropout", FULL)
def test_7b_steps_match_memtracker(style, F_, loop, B, S, recompute, dropout):
    """The article's 7B shape (counted parameters) and LLaMA-2 7B, whole steps under fake tensors."""
    step, measured = against_memtracker(style, F_, loop, B, S, 32, dropout, recompute, d_=4096, H=32, V_=32000)
    assert abs(step.peak.bytes - measured["peak"]) <= measured["peak"] // 100       # the bound
    assert step.phase_peaks() == measured["phase peaks"]                            # in fact exact


#: Grouped-query (and multi-query) LLaMA blocks: kernel, H, H_kv, loop, B, S, L, recompute. V = 40 in some rows
#: so that the blocks, not the loss, hold the peak of the backward pass.
GQA_SMALL = [
    ("sdpa", 4, 2, "bf16-pure-adamw", 2, 24, 3, "none", 1000),
    ("sdpa", 4, 1, "bf16-adamw", 1, 64, 6, "none", 40),
    ("sdpa", 8, 2, "fp32-adamw", 3, 40, 2, "none", 40),
    ("sdpa", 4, 2, "bf16-adamw", 2, 128, 3, "full", 1000),
    ("sdpa", 8, 1, "bf16-pure-adamw", 1, 40, 6, "full", 40),
    ("eager", 4, 2, "bf16-pure-adamw", 1, 24, 3, "none", 40),
    ("eager", 8, 2, "bf16-adamw", 3, 128, 6, "none", 40),
    ("eager", 4, 1, "fp32-adamw", 2, 64, 2, "none", 1000),
    ("eager", 4, 2, "fp32-adamw", 1, 64, 6, "full", 40),
    ("eager", 8, 1, "bf16-adamw", 3, 40, 3, "full", 1000),
]


@pytest.mark.slow
@pytest.mark.parametrize("kernel, H, kv, loop, B, S, L, recompute, V", GQA_SMALL)
@pytest.mark.parametrize("foreach", [False, True])
def test_small_gqa_steps_match_memtracker_to_the_byte(kernel, H, kv, loop, B, S, L, recompute, V, foreach):
    """GQA and MQA blocks (K and V never expanded: SDPA's enable_gqa, or the grouped eager core of
    memledger/pytorch/reference.py): every landmark, every phase's peak and the peak equal MemTracker's."""
    step, measured = against_memtracker("llama", 256, loop, B, S, L, 0.0, recompute, foreach, d_=96 if H == 8 else 64,
                                         H=H, V_=V, kv=kv, attention=kernel)
    peaks_agree(step, measured, op_by_op=recompute == "none")


@pytest.mark.slow
@pytest.mark.parametrize("B, S, L, recompute", [(2, 128, 3, "none"), (1, 128, 3, "full"), (1, 16, 6, "full")])
def test_eager_llama_blocks_match_memtracker(B, S, L, recompute):
    """The article backend's LLaMA block (the eager core of the GPT block, multi-head) against the reference
    running that core. At B = 1, S = 16 the backward's peak is in block 0's recomputed norm, while the
    checkpoint still holds the causal mask (released with norm 1's input, not by masked_fill's backward)."""
    step, measured = against_memtracker("llama", 256, "bf16-pure-adamw", B, S, L, 0.0, recompute, V_=40,
                                         attention="eager")
    peaks_agree(step, measured, op_by_op=recompute == "none")


@pytest.mark.slow
@pytest.mark.parametrize("kernel, kv, bias, tied, loop, B, recompute", [
    ("sdpa", 2, True, False, "bf16-adamw", 2, "none"), ("sdpa", 1, False, True, "bf16-pure-adamw", 1, "full"),
    ("eager", 2, True, True, "fp32-adamw", 3, "none"), ("eager", 1, True, True, "bf16-adamw", 1, "full"),
    ("sdpa", None, True, True, "fp32-adamw", 2, "full")])
def test_qkv_biases_and_tied_heads_match_memtracker(kernel, kv, bias, tied, loop, B, recompute):
    """LLaMA blocks with QKV biases (Qwen2: addmm, the input gradient first, and a bias gradient) and a
    tied LM head (Gemma: the embedding's two gradients summed), with and without GQA."""
    for vocab in (1000, 40):
        step, measured = against_memtracker("llama", 256, loop, B, 64, 3, 0.0, recompute, V_=vocab, kv=kv,
                                             attention=kernel, qkv_bias=bias, tied=tied)
        peaks_agree(step, measured, op_by_op=recompute == "none")


@pytest.mark.live(3)  # full-scale repeats of the small grids' proofs: n run PyTorch under --pytorch=live
@pytest.mark.slow
@pytest.mark.parametrize("preset, loop, B, S, recompute, kernel", [
    ("llama3-8b", "bf16-pure-adamw", 1, 2048, "none", "sdpa"), ("llama3-8b", "bf16-adamw", 1, 2048, "none", "eager"),
    ("llama3-8b", "bf16-adamw", 2, 4096, "full", "sdpa"), ("mistral-7b", "bf16-pure-adamw", 1, 2048, "none", "sdpa"),
    ("mistral-7b", "fp32-adamw", 1, 2048, "full", "eager"), ("qwen2.5-7b", "bf16-adamw", 1, 2048, "none", "sdpa"),
    ("qwen2.5-0.5b", "bf16-pure-adamw", 1, 2048, "none", "eager"), ("gemma-2b", "bf16-adamw", 1, 2048, "full", "sdpa")])
def test_gqa_presets_match_memtracker(preset, loop, B, S, recompute, kernel):
    """Llama 3 8B and Mistral 7B (8 key/value heads), Qwen2.5 7B (4, QKV biases), Qwen2.5 0.5B (2, QKV biases,
    tied) and Gemma 2B (multi-query, tied) at full scale under fake tensors, as the reference decoder runs
    their shapes (no rotary embedding; Gemma's GeGLU as SwiGLU, which saves the same tensors). Mistral's
    sliding window (4096 tokens) is not in the reference: at S <= 4096 its mask is the causal mask, and neither
    kernel's memory depends on the mask (the flash kernel builds none, the eager core keeps S x S scores either
    way)."""
    from memledger.models.presets import get_preset
    a = get_preset(preset)
    f = a.features
    step, measured = against_memtracker("llama", a.d_ff, loop, B, S, a.n_layers, 0.0, recompute, d_=a.d_model,
                                         H=a.n_heads, V_=a.vocab_size, kv=a.kv_heads, attention=kernel,
                                         qkv_bias=f.has_qkv_bias, tied=f.is_tied)
    assert step.structure == Step(Ledger(preset, batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0,
                                         recompute=recompute), "cpu", **step_kernel(kernel)).structure
    peaks_agree(step, measured)


def step_kernel(kernel):
    return {"attention": "eager"} if kernel == "eager" else {}


@pytest.mark.slow
@pytest.mark.parametrize("style, ffn", [("gpt", "16384"), ("llama", "11008")])
def test_command_line_reports_memtrackers_landmarks(style, ffn, capsys):
    """The issue's command: the article's shape with its parameters counted (and LLaMA-2 7B's), --json."""
    import json
    pytest.importorskip("torch")
    from memledger.cli.main import main
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    assert main(["step", "--hidden", "4096", "--layers", "32", "--heads", "32", "--ffn", ffn, "--vocab", "32000",
                 "--style", style, "--overhead", "0", "--backend", "cpu", "--no-dropout", "--recipe",
                 "bf16-pure-adamw", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    measured = memtracker_step(RefConfig(4096, 32, 32, int(ffn), 32000, style), "bf16-pure-adamw", 1, 2048)
    assert {k: v["gpu"] for k, v in data["landmarks"].items()} == {k: measured[k] for k in LANDMARKS}
    assert data["peak"]["gpu"] == measured["peak"]


@pytest.mark.slow
@pytest.mark.parametrize("B, loop", [(3, "bf16-pure-adamw"), (1, "fp32-adamw")])
def test_checkpointed_forward_drops_one_byte_masks_with_the_fused_kernel(B, loop):
    """``torch.native_dropout`` (what ``F.dropout`` runs on CUDA while training, with or without grad:
    ATen ``Dropout.cpp``, ``dropout``) makes a 1-byte mask even in a checkpointed block's no-grad forward."""
    pytest.importorskip("torch")
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    measured = memtracker_step(RefConfig(64, 3, 4, 320, 1000, "gpt", dropout=0.1, native_dropout=True,
                                         recompute="full"), loop, B, 256)
    step = Step(Ledger(Architecture(64, 3, 4, 320, 1000, "gpt"), batch_size=B, seq_len=256, recipe=loop,
                       overhead_bytes=0, dropout=True, recompute="full"), "cpu", dropout_mask="bool")
    assert {k: step.landmarks[k]["gpu"] for k in LANDMARKS} == {k: measured[k] for k in LANDMARKS}
    assert step.phase_peaks() == measured["phase peaks"]
