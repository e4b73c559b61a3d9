"""A GPU's memory by part, for every view: the parts add up to the view's own total, and each part is
what its source books (written out here)."""
import pytest

from memledger.calculators import ConventionInputs, get_convention
from memledger.ledger.inference import Inference
from memledger.ledger.ledger import Ledger
from memledger.ledger.lora import LoraConfig, LoraLedger
from memledger.calculators.parts import PARTS, gpu_parts, gpu_total

P = 7 * 10**9
ACT = 32 * 2048 * 4096 * 114          # L x BSd x (34 + 5HS/d) at the article's spec
LLAMA = 6_738_415_616                  # the released Llama-2-7b checkpoint


def test_article_ledger_by_part():
    ledger = Ledger("article-7b", scope="layers")
    parts = gpu_parts(ledger)
    assert set(parts) == set(PARTS)
    assert (parts["weights"], parts["gradients"], parts["optimizer states"]) == (2 * P, 2 * P, 12 * P)
    assert parts["activations"] == ACT and parts["overhead"] == 2 * 10**9
    assert gpu_total(ledger) == ledger.totals["gpu"]


def test_offloaded_optimizer_leaves_the_gpu():
    parts = gpu_parts(Ledger("article-7b", offload_optimizer="cpu"))
    assert parts["optimizer states"] == 0 and parts["gradients"] == 2 * P


def test_zero3_gathered_unit_is_not_split():
    ledger = Ledger("article-7b", zero_stage=3, dp=8, offload_params="cpu", offload_optimizer="cpu")
    parts = gpu_parts(ledger)
    assert parts["model states, roles not split"] == ledger.by_role("gpu")["gathered"] > 0
    assert gpu_total(ledger) == ledger.totals["gpu"]


def test_lora_ledger_by_part():
    ledger = LoraLedger("llama2-7b", LoraConfig(rank=16))
    adapters = 32 * 2 * 16 * (4096 + 4096)           # L x targets x r (in + out), Q and V of d x d
    parts = gpu_parts(ledger)
    assert parts["weights"] == 2 * LLAMA + 4 * adapters    # frozen BF16 base + FP32 adapters
    assert parts["gradients"] == 4 * adapters and parts["optimizer states"] == 8 * adapters
    assert gpu_total(ledger) == ledger.totals["gpu"]


def test_inference_by_part():
    parts = gpu_parts(Inference("llama2-7b"))
    assert parts["weights"] == 2 * LLAMA
    assert parts["KV cache"] == 2 * 32 * 2048 * 4096 * 2  # K and V, L x S x d, BF16
    assert parts["gradients"] == parts["activations"] == 0 and parts["working buffer"] > 0


def test_convention_estimates_by_part():
    one = Ledger(n_params=10**9)
    ds = gpu_parts(get_convention("deepspeed-zero2").estimate(one, ConventionInputs(largest_layer=1)))
    assert ds["weights"] == 2 * 10**9 and ds["model states, roles not split"] == 18 * 10**9   # int(18P/N)
    hf = gpu_parts(get_convention("hf-anatomy").estimate(one))
    assert (hf["weights"], hf["gradients"], hf["optimizer states"]) == (6 * 10**9, 4 * 10**9, 8 * 10**9)
    assert gpu_parts(get_convention("accelerate").estimate(one))["model states, roles not split"] == 8 * 10**9


def test_unknown_view():
    with pytest.raises(TypeError, match="view must be"):
        gpu_parts("article-7b")
