"""FP16 autocast with a GradScaler in the step (memledger/step/amp.py) against PyTorch's MemTracker.

The reference loop ``fp16-amp-adamw`` (memledger/pytorch/reference.py, ``Trainer(amp=...)``): FP32 weights,
``torch.autocast(dtype=torch.float16)`` around forward and loss, ``torch.amp.GradScaler``. Every landmark, each
phase's peak, the peak, each block's peaks and the totals op by op inside the blocks equal MemTracker's to the
byte under the CPU backend (small shapes here, with grouped-query attention, QKV biases, a tied head and a head
size other than d/H; composite and fused RMSNorm, each AdamW implementation and LLaMA-2 7B in
tests/step/test_amp_slow.py).
"""
import pytest

from memledger.ledger.ledger import Ledger

from ampcheck import amp_against_memtracker
from stepcheck import GPT7B


@pytest.mark.slow
def test_weight_copies_are_the_linears_weights_in_fp16():
    """The step's autocast copies (and the ledger's row) hold 2 bytes per element of every nn.Linear weight of the
    reference decoder, as PyTorch counts them; the step is MemTracker's, op by op (amp_against_memtracker)."""
    torch = pytest.importorskip("torch")
    from memledger.pytorch.reference import RefConfig, make_model
    step, _ = amp_against_memtracker(2, 32)
    with torch.device("meta"):
        model = make_model(RefConfig(64, 2, 4, 160, 1000, "llama"), "fp16-amp-adamw")
    linear = 2 * sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    rows = {r["name"]: r["bytes"] for r in step.rows}
    assert sum(b for n, b in rows.items() if "autocast FP16 copy" in n) == linear
    ledger = Ledger(step.ledger.arch, batch_size=2, seq_len=32, recipe="fp16-amp-adamw", overhead_bytes=0)
    assert {r.name: r.bytes for r in ledger.rows}["autocast FP16 weight copies (saved by autograd)"] == linear


@pytest.mark.slow
@pytest.mark.parametrize("refinement", [{"n_kv_heads": 2}, {"n_kv_heads": 1}, {"qkv_bias": True}, {"tied": True},
                                        {"head_dim": 32}, {"recompute": "selective"}, {"recompute": "full"},
                                        {"recompute": "full", "qkv_bias": True, "n_kv_heads": 2, "L_": 5},
                                        {"loss_chunks": 3}, {"loss_chunks": 4, "tied": True, "recompute": "full"}])
def test_llama_refinements_are_memtrackers(refinement):
    """Grouped-query (and multi-query) attention, a biased QKV projection (Qwen2), a tied head (Gemma) and a head
    size other than d/H under autocast; the flash kernel under selective recomputation's checkpoint (re-run in FP16
    under the autocast state the checkpoint saved); full recomputation (the forward's weight copies held by the
    cache alone until the region exits, each block re-run in a region of its own in backward); torchtune's chunked
    loss (the head's weight cast once, each chunk's input cast and saved, FP16 weight gradients summed before one
    conversion: memledger/step/amploss.py). Landmarks, phase
    peaks, block peaks (and, without full recomputation, the totals op by op) are MemTracker's (LLaMA-2 7B's shape
    in tests/step/test_amp_slow.py)."""
    amp_against_memtracker(1, 16, **refinement)


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_gpt_blocks_are_memtrackers(recompute):
    """GPT blocks (LayerNorm in FP32 on the FP32 residual stream, biased FP16 linears whose bias copies only the
    cache holds, GeLU in FP16, the tied head) with SDPA's flash kernel: landmarks, phase and block peaks (op by op
    without full recomputation) are MemTracker's (the article's GPT 7B in tests/step/test_amp_slow.py)."""
    amp_against_memtracker(1, 16, L_=3, F_=256, style="gpt", recompute=recompute)


@pytest.mark.slow
def test_chunked_loss_with_gpt_blocks_and_b2_is_memtrackers():
    """B = 2 (strided chunks), S not a multiple of the chunks, GPT blocks: MemTracker's to the byte."""
    amp_against_memtracker(2, 20, L_=2, F_=256, style="gpt", loss_chunks=3)


@pytest.mark.slow
def test_full_recomputation_keeps_only_the_heads_copy_after_forward():
    """Under full recomputation no block saves a weight copy: the ledger's row is the LM head's, as the step's rows
    live after forward are (equal to MemTracker's, amp_against_memtracker)."""
    step, _ = amp_against_memtracker(1, 16, L_=3, recompute="full")
    after = sum(r["bytes"] for r in step.rows if "after forward" in r["live"] and "autocast FP16 copy" in r["name"])
    ledger = Ledger(step.ledger.arch, batch_size=1, seq_len=16, recipe="fp16-amp-adamw", overhead_bytes=0,
                    recompute="full")
    assert {r.name: r.bytes for r in ledger.rows}["autocast FP16 weight copies (saved by autograd)"] == after == \
        2 * 1000 * 64


@pytest.mark.slow
def test_bias_copies_die_with_the_cache():
    """The QKV bias's FP16 copy is cached but not saved (``addmm`` keeps its matrices only): MemTracker sees it go
    when the autocast region exits, so the ledger's row of copies alive after forward holds the weights' only, as the
    step's rows live there do."""
    step, _ = amp_against_memtracker(2, 16, L_=3, qkv_bias=True)
    after = sum(r["bytes"] for r in step.rows if "after forward" in r["live"] and "autocast FP16 copy" in r["name"])
    ledger = Ledger(step.ledger.arch, batch_size=2, seq_len=16, recipe="fp16-amp-adamw", overhead_bytes=0)
    assert {r.name: r.bytes for r in ledger.rows}["autocast FP16 weight copies (saved by autograd)"] == after


@pytest.mark.parametrize("changes,backend,words", [
    ({}, "article", "not for the eager attention kernel"),
    ({"tp": 2}, "cpu", "not for tensor parallelism"),
    ({"arch": GPT7B}, "cpu", "not for the eager attention kernel, dropout"),
    ({"arch": GPT7B, "flash_attention": True, "dropout": False, "loss_chunks": 4, "loss_impl": "litgpt"}, "cpu",
     "not for LitGPT's loss"),
    ({"zero_stage": 1, "dp": 2}, "cpu", "ZeRO"),
    ({"arch": "starcoder", "flash_attention": True, "dropout": False}, "cpu",
     "not for learned positions, grouped-query attention in a GPT block"),
    ({"arch": "pythia-6.9b", "flash_attention": True, "dropout": False}, "cpu", "parallel attention and MLP"),
])
def test_refused_in_one_line(changes, backend, words):
    ledger = Ledger(**{"arch": "llama2-7b", "seq_len": 4096, "recipe": "fp16-amp-adamw", **changes})
    with pytest.raises(ValueError, match=words):
        ledger.step(backend)


def test_cuda_backend_runs_amp():
    """The weight cache is the same on every device (cached_cast has no device test): the cuda backend's step runs
    AMP with its own conventions (fused RMSNorm, foreach AdamW), above the cpu backend's here."""
    ledger = Ledger("llama2-7b", seq_len=4096, recipe="fp16-amp-adamw", overhead_bytes=0)
    assert ledger.step("cuda").peak.bytes > ledger.step("cpu").peak.bytes > 0
