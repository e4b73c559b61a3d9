"""torchtitan's own Llama3 model and training loop (memledger/pytorch/torchtitan_step.py) beside memledger's
``implementation="torchtitan"`` step (memledger/step/torchtitan.py).

The independent values are PyTorch's measurements of torchtitan 0.3.0's ``Llama3Model`` built from its own config
classes (saved-tensor hooks, MemTracker under ``FakeTensorMode``), its ``Trainer.train_step`` transcribed, and
arithmetic on its sources written out here. Skipped, saying why, where torchtitan is not installed.
"""
import pytest

torch = pytest.importorskip("torch")

from memledger.ledger.ledger import Ledger  # noqa: E402
from memledger.pytorch.compare import _block_rows, architecture_of, ledger_for, run_options  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402
from memledger.pytorch.torchtitan_step import layer_saved, missing, titan_fsdp1_step, titan_step  # noqa: E402
from memledger.step.timeline import LANDMARKS, Step  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.skipif(missing() is not None, reason=missing() or "")]

SMALL = dict(d=256, H=4, F=688, V=1000)
#: torchtitan's ``_8b`` widths (models/llama3/__init__.py l. 230-272): dim 4096, 32 heads, 8 KV heads,
#: compute_ffn_hidden_dim(4096, multiple_of=1024, ffn_dim_multiplier=1.3) = 14336, vocab 128256.
LLAMA3_8B = dict(d=4096, H=32, F=14336, V=128256)
LOOP = "bf16-pure-adamw"        # training.dtype = "bfloat16": parameters, gradients and AdamW's state in BF16


def reference_layer(shape, B, S, kv=None):
    """What memledger books for one LLaMA layer of the reference decoder under the CPU backend's conventions."""
    c = RefConfig(**shape, L=2, style="llama", n_kv_heads=kv)
    return ledger_for(c, LOOP, B, S).evaluate(sum(r.bytes for r in _block_rows(c, run_options(c, LOOP))))


@pytest.mark.parametrize("B, S, kv", [(1, 256, None), (2, 200, None), (2, 64, 2)])
def test_torchtitans_layer_is_the_reference_layer(B, S, kv):
    """torchtitan's Llama3 block (fused wqkv split into contiguous q, k, v; ComplexRoPE on FP32 complex views; SDPA
    with ``enable_gqa``, K and V not repeated) saves what memledger's reference layer books under ``--backend cpu``;
    its RoPE caches are buffers, L x S x d_h/2 complex64 (rope.py l. 185-234)."""
    got = layer_saved(**SMALL, batch=B, seq=S, n_kv_heads=kv)
    assert got["layer"] == reference_layer(SMALL, B, S, kv)
    assert got["buffers"] == 2 * S * (SMALL["d"] // SMALL["H"] // 2) * 8


def titan_ledger_step(shape, L, B, S, kv=None):
    arch = architecture_of(RefConfig(**shape, L=L, style="llama", n_kv_heads=kv))
    return Step(Ledger(arch, batch_size=B, seq_len=S, recipe=LOOP, overhead_bytes=0, implementation="torchtitan"),
                "cpu")


def differences(got, step) -> dict:
    """{landmark, phase peak, "peak": torchtitan's measured bytes minus memledger's}."""
    out = {name: got[name] - step.landmarks[name]["gpu"] for name in LANDMARKS}
    peaks = step.phase_peaks()
    out.update({f"{phase} peak": got["phase peaks"][phase] - peaks[phase] for phase in got["phase peaks"]})
    out["peak"] = got["peak"] - step.peak.bytes
    return out


@pytest.mark.parametrize("L, B, S, kv", [(2, 2, 200, None), (3, 1, 128, None), (2, 2, 64, 2), (1, 1, 96, None)])
def test_torchtitan_step_equals_memledgers(L, B, S, kv):
    """Every landmark, phase peak and the peak of torchtitan's ``train_step`` (gradients zeroed and kept, the token
    count, the summed loss divided by it with the BF16 logits held until ``del pred``, ``clip_grad_norm_``, AdamW
    over its parameter order) equal memledger's ``implementation="torchtitan"`` step to the byte."""
    diff = differences(titan_step(**SMALL, L=L, batch=B, seq=S, n_kv_heads=kv), titan_ledger_step(SMALL, L, B, S, kv))
    assert diff == {k: 0 for k in diff}


def test_before_forward_holds_the_kept_gradients_and_rope_caches():
    """Arithmetic on torchtitan's sources: before forward its step holds what the reference step holds (parameters,
    AdamW's state, the batch) plus every gradient (``zero_grad(set_to_none=False)``, BF16: 2 bytes a parameter) and
    every layer's RoPE cache (S x d_h/2 complex64)."""
    d, H, F, V = SMALL["d"], SMALL["H"], SMALL["F"], SMALL["V"]
    L, B, S = 2, 2, 200
    got = titan_step(**SMALL, L=L, batch=B, seq=S)
    params = 2 * V * d + d + L * (2 * d + 3 * d * d + d * d + 3 * d * F)    # embedding, head, norm; the layers
    tensors = 3 + 7 * L
    reference = 2 * params + 2 * 2 * params + 4 * tensors + 2 * 8 * B * S     # weights, AdamW, step counters, batch
    assert got["before forward"] == reference + 2 * params + L * S * (d // H // 2) * 8


def test_llama3_8b_width():
    """torchtitan's Llama3-8B widths (GQA 32/8, FFN 14336, vocab 128256), two layers, B 1, S 128: its layer is the
    reference layer and its whole step equals memledger's to the byte."""
    assert layer_saved(**LLAMA3_8B, batch=1, seq=128, n_kv_heads=8)["layer"] == reference_layer(LLAMA3_8B, 1, 128, 8)
    diff = differences(titan_step(**LLAMA3_8B, L=2, batch=1, seq=128, n_kv_heads=8),
                       titan_ledger_step(LLAMA3_8B, 2, 1, 128, 8))
    assert diff == {k: 0 for k in diff}


def titan_recompute_step(shape, L, B, S, kv=None):
    arch = architecture_of(RefConfig(**shape, L=L, style="llama", n_kv_heads=kv))
    return Step(Ledger(arch, batch_size=B, seq_len=S, recipe=LOOP, overhead_bytes=0, implementation="torchtitan",
                       recompute="full"), "cpu")


@pytest.mark.parametrize("L, B, S, kv", [(2, 2, 200, None), (3, 1, 128, None), (2, 2, 64, 2)])
def test_torchtitan_full_ac_step_equals_memledgers(L, B, S, kv):
    """torchtitan's ``FullAC`` (every block in ``checkpoint_wrapper(preserve_rng_state=True, early_stop=False)``,
    activation_checkpoint.py l. 166-182) under its ``train_step``: every landmark, phase peak and the peak equal
    memledger's ``implementation="torchtitan", recompute="full"`` step to the byte, the recomputed forward's transients
    in backward included."""
    got = titan_step(**SMALL, L=L, batch=B, seq=S, n_kv_heads=kv, ac="full")
    diff = differences(got, titan_recompute_step(SMALL, L, B, S, kv))
    assert diff == {k: 0 for k in diff}


def test_torchtitan_selective_ac_on_the_cpu():
    """torchtitan's ``SelectiveAC`` op policy measured on the CPU (what one layer adds to the forward pass, L 3 minus
    L 2): the block's input (the checkpoint's) and the outputs of the mm it must save, the first, third and fifth of
    the block (wqkv, w1, w2; wo and w3 recomputed: "every second mm", activation_checkpoint.py l. 258-270). The CPU's
    flash kernel (``_scaled_dot_product_flash_attention_for_cpu``) is not in its save list, so attention is recomputed
    here; CUDA's ``_scaled_dot_product_flash_attention`` is (torch/_functorch/partitioners.py l. 2971-2980): what the
    policy keeps on a GPU is not measured here, and memledger refuses it."""
    d, F, B, S = SMALL["d"], SMALL["F"], 2, 200
    a = [titan_step(**SMALL, L=L, batch=B, seq=S, ac="selective") for L in (2, 3)]
    layer = (a[1]["after forward"] - a[1]["before forward"]) - (a[0]["after forward"] - a[0]["before forward"])
    assert layer == 2 * B * S * (d + 3 * d + F + d)


def test_fsdp_at_world_one_keeps_the_head_unit_unsharded():
    """torchtitan's ``parallelize_llama`` calls ``apply_fsdp_to_decoder`` on one GPU too (models/llama3/parallelize.py
    l. 69-90), and FSDP2 on a 1-rank group still copies each unit into an unsharded parameter
    (torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py l. 437-463); the final norm and LM head unit is not
    resharded after forward (torchtitan/distributed/fsdp.py l. 200-207). Measured: its step holds 2 (V d + d) bytes more
    after forward, and at its peak, than the same loop without the wrapping; nothing else at the landmarks."""
    d, V, L, B, S = SMALL["d"], SMALL["V"], 2, 2, 200
    plain, wrapped = titan_step(**SMALL, L=L, batch=B, seq=S), titan_fsdp1_step(**SMALL, L=L, batch=B, seq=S)
    head = 2 * (V * d + d)
    assert {k: wrapped[k] - plain[k] for k in LANDMARKS} == {"before forward": 0, "after forward": head,
                                                              "after backward": 0, "after step": 0}
    assert wrapped["peak"] - plain["peak"] == head


@pytest.mark.xfail(strict=True, reason="implementation torchtitan models torchtitan's model and train_step without the "
                   "FSDP2 wrapping parallelize_llama applies on one GPU (a 1-rank mesh): the unsharded copy of the final "
                   "norm and LM head unit kept from forward into backward, 2 (V d + d) bytes (measured above), is not "
                   "booked; memledger's fsdp2 needs dp >= 2")
def test_memledgers_torchtitan_step_books_the_world_one_wrapping():
    got = titan_fsdp1_step(**SMALL, L=2, batch=2, seq=200)
    step = titan_ledger_step(SMALL, 2, 2, 200)
    assert {k: got[k] - step.landmarks[k]["gpu"] for k in LANDMARKS} == {k: 0 for k in LANDMARKS}
