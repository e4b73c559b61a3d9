"""``memledger step --implementation hf`` against transformers' own ``LlamaForCausalLM`` (issue 28), to the byte.

The model is built from a ``LlamaConfig`` without weights under ``FakeTensorMode``, pure BF16, on the CPU
(:mod:`memledger.pytorch.libraries`); memledger's step runs under the cpu backend with the same loop (AdamW on the
BF16 parameters, ``foreach=False`` as the cpu backend's default, or ``foreach=True``). **A trap is patched away in
the harness**: under ``FakeTensorMode`` transformers' packed-sequence check (``masking_utils.
find_packed_sequence_indices``) cannot run on fake position ids and reports packed sequences, so the model would
build a (B, 1, S, S) causal mask a real run never builds (a real unpacked batch passes no mask and SDPA runs
``is_causal``), saved by every layer as an additive BF16 mask (2·B·S² bytes per layer); the harness makes the check
return None, what it returns for a real unpacked batch.

Measured: (a) the bytes autograd saves per layer (saved-tensor hooks, each storage once, parameters skipped; the
model with two layers minus the model with one), equal to the step's "L x" rows over L and, at LLaMA-2-7B's width
(hidden 4096, 32 heads, FFN 11008), to the figures of /work/shared/docs/implementations.md's table (PyTorch's own
measurement of transformers 5.25); (b) MemTracker's totals of the second step at each landmark, each phase's peak
and the peak, equal to the step's.
"""
import pytest

from memledger import Ledger
from memledger.models.architecture import Architecture

pytestmark = pytest.mark.slow
pytest.importorskip("torch")
pytest.importorskip("transformers")

from memledger.pytorch.libraries import library_step, saved_per_layer  # noqa: E402

LLAMA2 = dict(d=4096, H=32, F=11008, V=32000)
SMALL = dict(d=256, H=4, F=688, V=1000)


def step_of(d, H, F, V, L, batch, seq, attn, foreach=False, kv=None):
    ledger = Ledger(Architecture(d, L, H, F, V, "llama", n_kv_heads=kv), batch_size=batch, seq_len=seq,
                    recipe="bf16-pure-adamw", implementation="hf", attn_implementation=attn, overhead_bytes=0)
    return ledger.step("cpu", foreach=foreach)


def layer_bytes(step) -> int:
    total = sum(r["bytes"] for r in step.rows if r["name"].startswith("L x "))
    return total // step.values["L"]


def agree(step, measured):
    """Every landmark, each phase's peak, each layer's peak forward and backward (those the step runs op by op) and
    the peak, to the byte."""
    assert {k: step.landmarks[k]["gpu"] for k in step.landmarks} == {k: measured[k] for k in step.landmarks}
    assert step.phase_peaks() == measured["phase peaks"]
    blocks = step.block_peaks()
    assert blocks == {k: measured["block peaks"][k] for k in blocks}
    assert step.peak.bytes == measured["peak"]


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("batch, seq", [(1, 64), (2, 48)])
def test_small_layer_and_step(attn, batch, seq):
    measured = saved_per_layer("hf", **SMALL, batch=batch, seq=seq, attn=attn)
    step = step_of(**SMALL, L=3, batch=batch, seq=seq, attn=attn)
    assert layer_bytes(step) == measured["layer"]
    agree(step, library_step("hf", **SMALL, L=3, batch=batch, seq=seq, attn=attn))


def test_small_lumped_foreach_step():
    """Five layers (the step lumps the middle ones) and AdamW's foreach step."""
    step = step_of(**SMALL, L=5, batch=2, seq=32, attn="sdpa", foreach=True)
    agree(step, library_step("hf", **SMALL, L=5, batch=2, seq=32, foreach=True))


#: One LLaMA-2-7B layer's saved bytes, BF16 (implementations.md's table: transformers 5.25 under FakeTensorMode).
TABLE = {("sdpa", 1, 1024): 190_980_096, ("sdpa", 2, 1304): 486_402_432,
         ("eager", 1, 1024): 392_175_616, ("eager", 2, 1304): 1_139_028_352}


@pytest.mark.parametrize("attn, batch, seq", list(TABLE))
def test_llama2_7b_width(attn, batch, seq):
    measured = saved_per_layer("hf", **LLAMA2, batch=batch, seq=seq, attn=attn)
    step = step_of(**LLAMA2, L=2, batch=batch, seq=seq, attn=attn)
    assert layer_bytes(step) == measured["layer"] == TABLE[attn, batch, seq]
    agree(step, library_step("hf", **LLAMA2, L=2, batch=batch, seq=seq, attn=attn))


def test_llama2_7b_sdpa_whole_model():
    """32 layers, AdamW foreach (the cuda backend's default): the step the implementations note measured."""
    step = step_of(**LLAMA2, L=32, batch=1, seq=1024, attn="sdpa", foreach=True)
    agree(step, library_step("hf", **LLAMA2, L=32, batch=1, seq=1024, foreach=True))


#: One LLaMA-2-7B layer's saved bytes under LitGPT 0.5.13 (implementations.md's table).
LITGPT = {(1, 1024): 232_955_904, (2, 1304): 593_258_880}


@pytest.mark.parametrize("batch, seq", [(1, 64), (2, 48)] + list(LITGPT))
def test_litgpt_layer(batch, seq):
    """LitGPT's ``GPT`` (LLaMA config: RMSNorm, LLaMAMLP, full rotary) from its ``Config``: one layer's saved bytes
    equal the step's (its FP32 norm weights, the fused QKV output kept whole by v's view, the new rotated q and k,
    SDPA's output beside its reshaped copy). The step's landmarks and peak under LitGPT wait for its loss
    (``chunked_cross_entropy``) and RoPE cache buffers, not modelled yet."""
    shape = LLAMA2 if seq > 64 else SMALL
    measured = saved_per_layer("litgpt", **shape, batch=batch, seq=seq)["layer"]
    ledger = Ledger(Architecture(shape["d"], 2, shape["H"], shape["F"], shape["V"], "llama"), batch_size=batch,
                    seq_len=seq, recipe="bf16-pure-adamw", implementation="litgpt")
    assert layer_bytes(ledger.step("cpu")) == measured == layer_bytes(ledger.step("cuda"))
    if seq > 64:
        assert measured == LITGPT[batch, seq]


@pytest.mark.parametrize("shape, L, batch, seq", [(dict(SMALL, kv=2), 3, 2, 48), (dict(SMALL, kv=1), 3, 1, 64),
                                                  (dict(d=256, H=4, kv=1, F=64, V=100), 3, 2, 48),
                                                  (dict(d=4096, H=32, kv=8, F=14336, V=128256), 2, 1, 1024)])
def test_grouped_query_sdpa(shape, L, batch, seq):
    """Grouped-query attention (LLaMA-3-8B's width last: 8 K/V heads, FFN 14336, vocabulary 128256): transformers
    passes ``enable_gqa=True`` to SDPA where no mask is given (``integrations/sdpa_attention.py`` ``use_gqa_in_sdpa``),
    the k and v projections and k's rotary code at H_kv heads. With a narrow MLP and a small vocabulary the peak
    comes in the final LlamaRMSNorm's backward, and LlamaModel.forward's ``inputs_embeds`` (block 0's input, held
    until it returns) shows in every later layer's peak."""
    measured = saved_per_layer("hf", **shape, batch=batch, seq=seq)["layer"]
    step = step_of(**shape, L=L, batch=batch, seq=seq, attn="sdpa")
    assert layer_bytes(step) == measured
    agree(step, library_step("hf", **shape, L=L, batch=batch, seq=seq))


def recompute_step(shape, L, batch, seq, attn, foreach=False):
    ledger = Ledger(Architecture(shape["d"], L, shape["H"], shape["F"], shape["V"], "llama", n_kv_heads=shape.get("kv")),
                    batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw", implementation="hf",
                    attn_implementation=attn, overhead_bytes=0, recompute="full")
    return ledger.step("cpu", foreach=foreach)


@pytest.mark.parametrize("attn, shape, L, batch, seq, foreach", [
    ("sdpa", SMALL, 3, 2, 48, False), ("sdpa", SMALL, 3, 1, 64, False), ("sdpa", SMALL, 5, 2, 32, True),
    ("sdpa", dict(d=256, H=4, kv=1, F=64, V=100), 3, 2, 48, False), ("sdpa", dict(SMALL, kv=2), 3, 2, 48, False),
    ("eager", SMALL, 3, 2, 48, False), ("eager", SMALL, 3, 1, 64, False), ("eager", SMALL, 5, 2, 32, True)])
def test_gradient_checkpointing(attn, shape, L, batch, seq, foreach):
    """``--recompute full`` under implementation hf is transformers' ``model.gradient_checkpointing_enable()`` (5.25:
    non-reentrant, ``modeling_utils.py`` l. 3159-3160; ``GradientCheckpointingLayer`` checkpoints each decoder
    layer's ``forward``, ``modeling_layers.py`` l. 89-123): each layer keeps its input, the checkpoints hold cos, sin,
    position_ids (and eager's mask) until block 0's backward, a layer is re-run in its backward. Equal at every
    landmark, phase peak, each layer's peak forward and backward, and the peak (the narrow-MLP GQA case peaks in
    backward). MemTracker warns that its module tracking "may be messed up" (the recomputation runs forward hooks
    inside backward): the per-layer backward peaks it reports are what the step's are."""
    step = recompute_step(shape, L, batch, seq, attn, foreach)
    assert layer_bytes(step) == batch * seq * shape["d"] * 2          # each layer keeps its BF16 input, nothing else
    agree(step, library_step("hf", **shape, L=L, batch=batch, seq=seq, attn=attn, foreach=foreach,
                             gradient_checkpointing=True))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("batch, seq", [(1, 1024), (2, 1304)])
def test_gradient_checkpointing_llama2_7b_width(attn, batch, seq):
    """LLaMA-2-7B's width, two layers: each keeps its BF16 input (8 MiB at B 1, S 1024). Eager at B 2, S 1304 peaks
    in block 0's recomputed softmax backward."""
    step = recompute_step(LLAMA2, 2, batch, seq, attn)
    assert layer_bytes(step) == batch * seq * 4096 * 2
    if (attn, batch) == ("eager", 2):
        assert step.peak.phase == "backward"
    agree(step, library_step("hf", **LLAMA2, L=2, batch=batch, seq=seq, attn=attn, gradient_checkpointing=True))
