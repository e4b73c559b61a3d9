"""The op-by-op prefill without PyTorch: what is left once it returns, and its one-line refusals
(tests/step/test_prefill_memtracker.py checks it against MemTracker)."""
import pytest

from memledger.core.exact import evaluate_expr
from memledger.activations.serving import kv_cache_expr
from memledger.ledger.inference import Inference
from memledger.models.architecture import Architecture
from memledger.models.presets import get_preset
from memledger.states.bnb import nf4_table_bytes
from memledger.step.prefill import Prefill


@pytest.mark.parametrize("kv, dtype", [(None, "bf16"), (2, "fp32")])
def test_what_stays_is_the_cache_and_the_fp32_logits(kv, dtype):
    arch = Architecture(64, 2, 8, 96, 100, "llama", n_kv_heads=kv)
    p = Prefill(arch, 2, 16, dtype, resident=0)
    cache = evaluate_expr(kv_cache_expr(4 if dtype == "fp32" else 2), dict(arch.values, B=2, S=16))
    assert p.after == cache + 2 * 100 * 4


def test_resident_is_weights_ids_and_inv_freq():
    arch = get_preset("llama2-7b")
    assert Prefill(arch, 1, 4096).resident_bytes == 6_738_415_616 * 2 + 4096 * 8 + 64 * 4


def test_eager_peaks_at_the_softmax_at_long_prompts():
    arch = get_preset("llama2-7b")
    assert Prefill(arch, 1, 4096, attention="eager").peak.op.endswith("softmax")
    assert Prefill(arch, 1, 4096).peak.layer == 31


@pytest.mark.parametrize("kwargs, words", [
    (dict(dtype="fp16"), "dtype"), (dict(attention="flash"), "attention"), (dict(logits_to_keep=-1), "logits_to_keep"),
    (dict(logits_to_keep=True), "logits_to_keep"), (dict(batch_size=0), "batch_size")])
def test_bad_input_names_the_field(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Prefill(get_preset("llama2-7b"), **kwargs)


def test_gpt_blocks_are_refused():
    with pytest.raises(ValueError, match="LLaMA blocks"):
        Prefill(Architecture(64, 2, 8, 96, 100, "gpt"))


@pytest.mark.slow
def test_inference_reads_it_or_says_why_not():
    inf = Inference("llama2-7b", seq_len=4096, attention="eager")
    assert inf.to_dict()["prefill"]["peak"] == inf.prefill.peak.bytes == Prefill(
        get_preset("llama2-7b"), 1, 4096, attention="eager").peak.bytes
    int8 = Inference("llama2-7b", quantization="int8")
    assert int8.prefill is None and "LLM.int8" in int8.to_dict()["prefill"]["why"]
    with pytest.raises(ValueError, match="logits_to_keep"):
        Inference("llama2-7b", quantization="int8", logits_to_keep=0)
    nf4 = Inference("llama2-7b", quantization="nf4")          # the weight rows (code tables included) are resident
    assert nf4.prefill.resident_bytes == nf4.weights + 2048 * 8 + 64 * 4
    # transformers' q_proj, k_proj, v_proj are three Linear4bit, the reference's fused QKV one: two QuantState
    # tables fewer per block in the reference (whose resident MemTracker measures)
    ours = Prefill(get_preset("llama2-7b"), 1, 2048, weights="nf4").resident_bytes
    assert nf4.prefill.resident_bytes - ours == 2 * 32 * nf4_table_bytes()
    assert nf4.prefill.peak.op.endswith("(NF4)")
    every = Inference("llama3-8b", seq_len=4096, logits_to_keep=0).prefill.peak      # 128,256-token vocabulary
    assert every.op == "LM head" and Inference("llama3-8b", seq_len=4096).prefill.peak.op != "LM head"
