"""LoRA and QLoRA in the step (memledger/step/lora.py) against MemTracker's run of the reference
(memledger/pytorch/lora.py) under the CPU backend: landmarks, phase peaks, block peaks and the peak, to the byte.

One difference is MemTracker's own: its module tracker keeps the autograd graph's nodes alive after backward
(its gradient hooks), so the embedding's output, a leaf the graph's AccumulateGrad node holds, and that leaf's
``.grad`` outlive the graph there. Plain PyTorch frees both with the loss (:func:`test_the_leaf_goes_with_the_graph`,
weak references on real tensors): the step models PyTorch, and the comparison adds the two B*S*d tensors to the
step's totals after backward (the "after backward" and "after step" landmarks, the optimizer's phase).
"""
import gc
import weakref

import pytest

from memledger.ledger.lora import LoraConfig, LoraLedger, qlora

from stepcheck import LORA_7B as LLAMA2_7B, LORA_ALL as ALL, LORA_QV as QV, LORA_SMALL as SMALL, \
    lora_against_memtracker as against_memtracker


@pytest.mark.slow
def test_lora_small_q_v_equals_memtracker():
    step, _ = against_memtracker(dict(SMALL, L=2), 2, 8, 8, QV)
    assert step.peak.phase == "loss"


@pytest.mark.slow
@pytest.mark.parametrize("targets, dropout, nf4, loop, kv, batch, rmsnorm", [
    (ALL, 0.0, False, "bf16-pure-adamw", None, 2, "composite"), (QV, 0.1, False, "bf16-adamw", None, 1, "composite"),
    (ALL, 0.1, True, "bf16-adamw", 2, 1, "composite"), (("o_proj", "down_proj"), 0.1, True, "bf16-pure-adamw", None,
                                                         2, "fused"),
    (("k_proj", "gate_proj", "up_proj"), 0.0, True, "bf16-adamw", 2, 2, "fused"),
    (ALL, 0.1, True, "fp32-adamw", 2, 2, "composite"), (("q_proj", "v_proj", "down_proj"), 0.0, False, "fp32-adamw",
                                                         None, 1, "fused")])
def test_lora_small_variants_equal_memtracker(targets, dropout, nf4, loop, kv, batch, rmsnorm):
    """Every projection, dropout, NF4, FP32 masters, FP32 adapters, grouped-query attention, fused RMSNorm; L = 6
    (blocks 2..L-3 as one lump in the step)."""
    against_memtracker(dict(SMALL, L=6), batch, 16, 8, targets, dropout, nf4, loop, kv, rmsnorm)


@pytest.mark.slow
@pytest.mark.parametrize("refinements, nf4, loop", [
    (dict(tied=True, head_dim=32, kv=2), False, "fp32-adamw"), (dict(qkv_bias=True), True, "bf16-adamw")])
def test_lora_on_refined_llama_blocks_equals_memtracker(refinements, nf4, loop):
    """A tied LM head, a head size other than d/H, grouped-query attention (Gemma); QKV biases (Qwen2), kept in
    BF16 beside the NF4 weights as bitsandbytes' Linear4bit keeps them."""
    against_memtracker(dict(SMALL, L=5), 2, 16, 8, ALL, 0.1, nf4, loop, **refinements)


@pytest.mark.slow
def test_the_leaf_goes_with_the_graph():
    """Without MemTracker, the embedding's output (a leaf: ``requires_grad_``) and its ``.grad`` are gone once
    the loss is: what the step models."""
    torch = pytest.importorskip("torch")
    from memledger.pytorch.lora import LoraRef, make_lora_model
    from memledger.pytorch.reference import RefConfig, Trainer
    model = make_lora_model(RefConfig(32, 2, 4, 64, 100, "llama"), LoraRef(4), "bf16-pure-adamw")
    leaves = []
    model.embed.register_forward_hook(lambda module, args, out: leaves.append(weakref.ref(out)))
    trainer = Trainer(model, "bf16-pure-adamw")
    ids = torch.randint(0, 100, (2, 8))
    alive = {}
    trainer.step(ids, ids, lambda name: alive.__setitem__(name, bool(leaves) and leaves[0]() is not None))
    gc.collect()
    assert alive == {"before forward": False, "after forward": True, "after backward": False, "after step": False}
    assert all(p.requires_grad == ("lora_" in n) for n, p in model.named_parameters())


#: A sample of B 1-2 x r 8/64 x (q, v / every projection) x dropout x QLoRA (each case takes minutes on 2 CPUs).
GRID = [(1, 8, QV, 0.0, False, "bf16-adamw"), (2, 8, QV, 0.1, False, "bf16-adamw"),
        (1, 64, ALL, 0.0, False, "bf16-adamw"), (2, 64, ALL, 0.1, False, "bf16-adamw"),
        (1, 64, ALL, 0.1, True, "bf16-adamw"), (2, 8, QV, 0.0, True, "bf16-adamw"), (1, 8, QV, 0.1, False, "fp32-adamw")]


@pytest.mark.live(2)  # full-scale repeats of the small grids' proofs: n run PyTorch under --pytorch=live
@pytest.mark.slow
@pytest.mark.parametrize("batch, rank, targets, dropout, nf4, recipe", GRID)
def test_llama2_7b_lora_equals_memtracker(batch, rank, targets, dropout, nf4, recipe):
    """LLaMA-2 7B's shape at S 4096: LoRA r 8/64 on q, v and on every projection, with and without dropout,
    QLoRA; BF16 adapters with FP32 masters (bf16-adamw), FP32 adapters (fp32-adamw)."""
    against_memtracker(LLAMA2_7B, batch, 4096, rank, targets, dropout, nf4, recipe)


@pytest.mark.slow
def test_qlora_preset_is_the_paper_s_and_runs_in_the_step():
    """qlora.py's defaults: r 64 on every projection, NF4 with double quantization, BF16 adapters under
    paged_adamw_32bit (a fused in-place update), LoRA dropout (0.1 for 7B-13B)."""
    config = qlora()
    assert (config.rank, config.targets, config.base, config.adapter_recipe, config.dropout) == (
        64, ALL, "nf4", "bf16-adamw32-bnb", True)
    step = LoraLedger("llama2-7b", config, 1, 4096, overhead_bytes=0).step("cpu")
    assert step.peak.bytes > step.landmarks["after forward"]["gpu"]


@pytest.mark.slow
def test_the_qlora_peak_is_the_step_s_and_flash_attention_sets_the_sum_apart():
    """The LoRA ledger is judged by the step's peak (CUDA's conventions) where the step models the run."""
    run = LoraLedger("llama2-7b", qlora(), 1, 4096)
    assert run.judged_bytes() == run.peak == run.step("cuda").peak.bytes
    unmodelled = LoraLedger("llama2-7b", LoraConfig(8, QV, base="fp32"), 1, 4096)
    assert unmodelled.peak is None and unmodelled.judged_bytes() == unmodelled.totals["gpu"]   # not in the step: the sum


@pytest.mark.parametrize("config, message", [
    (LoraConfig(8, QV, base="fp32"), "BF16 base"),
    (LoraConfig(8, QV, adapter_recipe="bf16-adam8bit-bnb"), "adapter_recipe"),
])
def test_unmodelled_lora_runs_are_refused_in_one_line(config, message):
    with pytest.raises(ValueError, match=message):
        LoraLedger("llama2-7b", config, 1, 4096).step("cpu")
