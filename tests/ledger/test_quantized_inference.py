"""bitsandbytes weights in inference (memledger.states.bnb, Inference(quantization=...)): against
transformers' published footprint ratios and the QLoRA paper's double-quantization saving."""
import pytest

from memledger.ledger.inference import Inference
from memledger.models.architecture import Architecture
from memledger.states.bnb import int8_matmul_bytes, nf4_dequant_bytes, nf4_parts

#: bigscience/bloom-1b7 (its config: d 2048, 24 layers, 16 heads, 4d MLP, vocab 250880, ALiBi, an embedding
#: LayerNorm and a final one, tied head): 1,722,408,960 parameters. memledger's GPT block has the same linear
#: layers; the count is given so that both LayerNorms are in it.
BLOOM_1B7 = Architecture(2048, 24, 16, 8192, 250880, "gpt", n_params=1_722_408_960)
#: transformers' tests/quantization/bnb: get_memory_footprint() of the FP16 model over the quantized one.
FOUR_BIT_RATIO = 2.109659552692574      # test_4bit.py Base4bitTest.EXPECTED_RELATIVE_DIFFERENCE
EIGHT_BIT_RATIO = 1.540025              # test_mixed_int8.py BaseMixedInt8Test.EXPECTED_RELATIVE_DIFFERENCE
#: LLaMA-65B's shape (Touvron et al. 2023, Table 2): d 8192, 80 layers, 64 heads; d_ff 22016.
LLAMA_65B = Architecture(8192, 80, 64, 22016, 32000, "llama")


def footprint(quantization):
    return Inference(BLOOM_1B7, weight_dtype="fp16", quantization=quantization).footprint


def test_bloom_footprint_ratios_equal_transformers_published():
    # which layers are quantized (linear weights only; embeddings, norms, biases, the tied head kept in FP16),
    # two codes per byte, one byte per int8 weight: the published ratios to every digit they print
    assert footprint("none") / footprint("nf4") == pytest.approx(FOUR_BIT_RATIO, rel=1e-15)
    assert footprint("none") / footprint("int8") == pytest.approx(EIGHT_BIT_RATIO, rel=1e-6)


def test_double_quantization_saves_about_3_gb_at_65b():
    # QLoRA (Dettmers et al. 2023) Sec. 3: 32/64 = 0.5 bits per parameter of constants become
    # 8/64 + 32/(64*256) = 0.127, "approximately 3 GB for a 65B model"
    with_dq = Inference(LLAMA_65B, quantization="nf4")
    without = Inference(LLAMA_65B, quantization="nf4", double_quant=False)
    saved = without.weights - with_dq.weights
    assert round(saved / 1e9) == 3
    n = 8192 * 8192
    assert round(8 * nf4_parts(n)["absmax"] / n, 3) == 0.127            # the paper's bits per parameter
    assert 8 * nf4_parts(n, double_quant=False)["absmax"] / n == 0.5
    assert nf4_parts(n) == {"packed": n // 2, "absmax": n // 64 + 4 * n // (64 * 256)}
    assert nf4_parts(n, double_quant=False)["absmax"] == 4 * n // 64


def test_rows_sum_and_default_unchanged():
    plain = Inference("llama2-7b")
    assert [r.name for r in plain.rows][0] == "weights (bf16)" and plain.weights == 2 * plain.arch.params
    q = Inference("llama2-7b", quantization="nf4")
    assert q.total == sum(r.bytes for r in q.rows)
    assert q.footprint < q.weights < plain.weights


def test_transients():
    # the dequantized weight in the compute dtype plus two FP32 absmax arrays (double quantization)
    assert nf4_dequant_bytes(4096 * 11008, 2) == 4096 * 11008 * 2 + 2 * 4 * (4096 * 11008 // 64)
    assert nf4_dequant_bytes(4096 * 11008, 2, double_quant=False) == 4096 * 11008 * 2
    # BF16 input: its FP16 copy while quantizing; FP16 input: no copy, the int32 product decides
    assert int8_matmul_bytes(10, 8, 2, "bf16") == 2 * 10 * 8 + 10 * 8 + 40
    assert int8_matmul_bytes(10, 8, 2, "fp16") == 4 * 10 * 2 + 10 * 8 + 40


@pytest.mark.parametrize("changes, field", [
    (dict(quantization="nf3"), "quantization"),
    (dict(quantization="nf4", weight_dtype="int8"), "weight_dtype"),
    (dict(quantization="int8", weight_dtype="fp8"), "weight_dtype"),
    (dict(quantization="nf4", tp=2), "tp"),
    (dict(double_quant=False), "double_quant"),
    (dict(quantization="int8", double_quant=False), "double_quant"),
    (dict(attention="paged"), "attention"),
    (dict(backend="gpu"), "backend"),
])
def test_bad_input_names_the_field(changes, field):
    with pytest.raises(ValueError, match=field):
        Inference("llama2-7b", **changes)


def test_moe_refused():
    with pytest.raises(ValueError, match="quantization"):
        Inference("mixtral-8x7b", quantization="nf4")


@pytest.mark.parametrize("quantization", ["nf4", "int8"])
def test_parts_cover_every_row(quantization):
    from memledger.calculators.parts import gpu_parts
    q = Inference("llama2-7b", quantization=quantization, attention="eager")
    parts = gpu_parts(q)
    assert sum(parts.values()) == q.total and parts["weights"] == q.weights
