"""Eager attention's softmax moment (memledger.ledger.prefill) equals MemTracker's prefill peak of the reference
decoder with transformers' eager core (memledger.pytorch.prefill), less what is live before the prefill."""
import pytest

from memledger.ledger.inference import Inference
from memledger.ledger.prefill import eager_softmax_bytes
from memledger.models.architecture import Architecture
from memledger.models.presets import get_preset

torch = pytest.importorskip("torch")
from memledger.pytorch.prefill import memtracker_prefill  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402

pytestmark = pytest.mark.slow


def measured(arch, batch, seq, dtype="bf16"):
    c = RefConfig(d=arch.d_model, L=arch.n_layers, H=arch.n_heads, F=arch.d_ff, V=arch.vocab_size, style="llama",
                  attention="eager", rmsnorm="fused", softmax_fp32=True, n_kv_heads=arch.n_kv_heads)
    r = memtracker_prefill(c, batch, seq, dtype=dtype)
    return r["peak"] - r["before"]


@pytest.mark.parametrize("kv", [None, 2])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_small_shapes_to_the_byte(kv, dtype):
    arch = Architecture(64, 2, 8, 96, 100, "llama", n_kv_heads=kv)       # scores dominate at S 256
    assert eager_softmax_bytes(arch, 2, 256, dtype, "cpu") == measured(arch, 2, 256, dtype)


def test_inference_books_it():
    arch = Architecture(64, 2, 8, 96, 100, "llama")
    row = Inference(arch, batch_size=2, seq_len=256, attention="eager", backend="cpu").rows[2]
    assert "eager" in row.name and row.bytes == measured(arch, 2, 256)
    assert Inference(arch, batch_size=2, seq_len=256).rows[2].bytes < row.bytes     # flash: no S x S


def test_llama2_7b_at_4096():
    arch = get_preset("llama2-7b")
    assert eager_softmax_bytes(arch, 1, 4096, "bf16", "cpu") == measured(arch, 1, 4096)


def test_a_lower_bound_where_the_mlp_decides():
    # a short prompt and a wide MLP: another moment of the block is larger; the softmax moment stays below it
    arch = Architecture(64, 2, 8, 512, 100, "llama")
    assert eager_softmax_bytes(arch, 1, 16, "bf16", "cpu") < measured(arch, 1, 16)
