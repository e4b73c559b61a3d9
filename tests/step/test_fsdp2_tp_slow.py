"""FSDP2 x TP (memledger/step/fsdp2_tp.py) against FSDPMemTracker on a fake (dp, tp) mesh, to the byte: small
variants (lumped blocks, dim-0 padding, grouped-query attention, GPT's tied head and biases, SP, the resharding
choices, recomputation, other policies) and LLaMA-2 7B and the article's 7B GPT shape at full scale."""
import pytest

from stepcheck import against_fsdp2_tp

pytestmark = pytest.mark.slow

LLAMA = dict(d=4096, L=32, H=32, F=11008, V=32000, style="llama")        # LLaMA-2 7B's shape
GPT = dict(d=4096, L=32, H=32, F=16384, V=32000, style="gpt")            # the article's 7B GPT shape
#: No TP-local dim 0 a multiple of 4 dp ranks (FSDP2 pads each); L = 6: lumped blocks.
ODD = dict(d=60, L=6, H=4, F=170, V=1002, style="llama")
SMALL = dict(d=64, L=5, H=4, F=256, V=1000, style="llama")


@pytest.mark.parametrize("shape, B, S, dp, t, sp_, options", [
    (ODD, 2, 16, 4, 2, False, {}),
    (ODD, 2, 16, 8, 2, True, {}),
    (ODD, 2, 16, 4, 2, False, dict(reshard=False)),
    (ODD, 2, 16, 4, 2, True, dict(reshard=None)),                      # PyTorch's default: the root kept
    (dict(SMALL, n_kv_heads=2), 2, 32, 4, 2, False, {}),                # H_kv / t heads
    (dict(SMALL, style="gpt"), 2, 32, 4, 2, True, {}),                  # tied head, biases, GeLU
    (dict(SMALL, style="gpt"), 2, 32, 4, 2, False, dict(loop="bf16-pure-adamw")),
    (SMALL, 2, 32, 4, 4, True, dict(param=None, reduce=None)),         # MixedPrecisionPolicy(): no cast
    (dict(SMALL, recompute="full"), 2, 32, 4, 2, False, {}),
    (dict(SMALL, recompute="selective"), 2, 32, 4, 2, False, dict(loss_in_root=True)),
])
def test_small_variants(shape, B, S, dp, t, sp_, options):
    against_fsdp2_tp(shape, B, S, dp, t, sp_, **options)


@pytest.mark.parametrize("shape, B, S, dp, t, sp_", [
    (LLAMA, 1, 4096, 4, 2, False),
    (LLAMA, 1, 4096, 4, 2, True),
    (LLAMA, 1, 4096, 8, 8, False),
    (GPT, 2, 2048, 8, 2, False),
])
def test_7b_shapes(shape, B, S, dp, t, sp_):
    against_fsdp2_tp(shape, B, S, dp, t, sp_)
