"""FP16 AMP against MemTracker (slow): B = 1, lumped blocks, fused RMSNorm, foreach and fused AdamW on small shapes,
and LLaMA-2 7B (B 1, S 4096), also with each LLaMA refinement (grouped-query attention at Llama 3's 8 key/value
heads, QKV biases, a tied head, Gemma-7B's head size 256), selective and full recomputation, torchtune's
chunked loss (8 chunks); the article's GPT 7B with the flash kernel."""
import pytest

from ampcheck import amp_against_memtracker

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("B_,L_,kw", [(1, 5, {}), (2, 3, {"rmsnorm": "fused"}), (2, 3, {"foreach": True}),
                                      (1, 3, {"fused": True})])
def test_amp_step_is_memtrackers(B_, L_, kw):
    amp_against_memtracker(B_, 32, L_, **kw)


def test_llama2_7b_amp_is_memtrackers():
    amp_against_memtracker(1, 4096, L_=32, d=4096, H=32, F_=11008, V_=32000, trace=False)


LLAMA2_7B = dict(L_=32, d=4096, H=32, F_=11008, V_=32000, trace=False)


@pytest.mark.parametrize("refinement", [{"n_kv_heads": 8}, {"qkv_bias": True}, {"tied": True}, {"head_dim": 256},
                                        {"recompute": "selective"}, {"recompute": "full"}, {"loss_chunks": 8},
                                        {"loss_chunks": 8, "recompute": "full"},
                                        {"n_kv_heads": 8, "qkv_bias": True, "tied": True, "recompute": "selective"}])
def test_llama2_7b_refinements_are_memtrackers(refinement):
    amp_against_memtracker(1, 4096, **LLAMA2_7B, **refinement)


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_gpt7b_amp_is_memtrackers(recompute):
    """The article's GPT 7B (d 4096, F 16384, tied) under autocast with the flash kernel, B 1, S 4096."""
    amp_against_memtracker(1, 4096, L_=32, d=4096, H=32, F_=16384, V_=32000, trace=False, style="gpt",
                           recompute=recompute)
