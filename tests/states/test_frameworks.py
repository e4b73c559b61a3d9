"""DeepSpeed's and Megatron-LM's buffers, from source (memledger/states/frameworks.py).

Neither runs here, so the independent values are what they publish: DeepSpeed's documented defaults
(docs/_pages/config-json.md) and its own estimator (estimate_zero2_model_states_mem_needs), its persistence rule
applied to the reference decoder's real parameters (PyTorch, meta device), and Megatron-LM's bytes-per-parameter
table (docs/user-guide/features/dist_optimizer.md). Sources: deepspeedai/DeepSpeed@edaa7221,
NVIDIA/Megatron-LM@d98e8a64.
"""
from fractions import Fraction

import pytest

from memledger.ledger.ledger import Ledger
from memledger.models.architecture import Architecture
from memledger.states.frameworks import DEEPSPEED_DEFAULTS

LLAMA7B = Architecture(4096, 32, 32, 11008, 32000, "llama")


def model_states(ledger) -> int:
    return ledger.group_total("model_states", "gpu")


def buffer(ledger, start):
    found = [b for b in ledger.framework_buffers if b.name.startswith(start)]
    assert len(found) == 1, [b.name for b in ledger.framework_buffers]
    return found[0]


def test_deepspeed_defaults_are_the_published_ones():
    """config-json.md: reduce_bucket_size 5e8 (line 522), allgather_bucket_size 5e8 (504), contiguous_gradients
    True (528), overlap_comm false (510: stages 1 and 2; config.py 383-386 turns it on at stage 3),
    stage3_max_live_parameters 1e9 (564), stage3_param_persistence_threshold 1e5 (583). The docs give
    stage3_prefetch_bucket_size 5e8 (576); the engine reads 5e7 (config.py line 215: Field(pp_int(5e7))), which
    is what runs; sub_group_size 1e9 is config.py's (line 175; the docs' example at line 474 writes 1e12)."""
    published = {"reduce_bucket_size": 5e8, "allgather_bucket_size": 5e8, "contiguous_gradients": True,
                 "stage3_max_live_parameters": 1e9, "stage3_param_persistence_threshold": 1e5,
                 "stage3_prefetch_bucket_size": 5e7, "sub_group_size": 1e9}
    assert {k: DEEPSPEED_DEFAULTS[k] for k in published} == published
    assert DEEPSPEED_DEFAULTS["overlap_comm"] is None
    one = Ledger(LLAMA7B, framework="deepspeed", zero_stage=2, dp=8)
    three = Ledger(LLAMA7B, framework="deepspeed", zero_stage=3, dp=8)
    assert buffer(one, "DeepSpeed IPG bucket").bytes == 2 * 5 * 10 ** 8          # one BF16 bucket: overlap off
    assert buffer(three, "DeepSpeed IPG bucket").live == "whole step"


@pytest.mark.parametrize("N", [1, 8, 64])
def test_zero2_is_deepspeeds_own_estimate(N):
    """estimate_zero2_model_states_mem_needs without offload (stage_1_and_2.py 3093-3095): 2P + 18P/N bytes,
    "2 = params_16bit, 18 = 2_grads_16bit + 4_grads_32bit + 4_params_32bit + 8_optimizer_states_32bit": the
    model states live the whole step plus the FP32 gradient partition the step makes."""
    P = 2 * N * 3_500_000_001         # divisible by 2N: no alignment padding
    ledger = Ledger(n_params=P, framework="deepspeed", zero_stage=2, dp=N, overhead_bytes=0)
    fp32 = buffer(ledger, "DeepSpeed FP32 gradient partition").bytes
    assert model_states(ledger) + fp32 == 2 * P + 18 * P // N
    assert buffer(ledger, "DeepSpeed flat-buffer alignment padding").bytes == 0


def test_alignment_padding():
    """The flat BF16 buffer is padded to a multiple of 2 x dp elements (stage_1_and_2.py 391-393):
    P = 1001, N = 8 -> 1008 elements, each rank's FP32 partition 126 elements."""
    ledger = Ledger(n_params=1001, framework="deepspeed", zero_stage=1, dp=8, overhead_bytes=0)
    assert buffer(ledger, "DeepSpeed flat-buffer alignment padding").bytes == 2 * 7 + 12 * (126 - 126)
    assert buffer(ledger, "DeepSpeed FP32 gradient partition").bytes == 4 * 126


@pytest.mark.slow
@pytest.mark.parametrize("style, threshold", [("llama", None), ("gpt", None), ("llama", 4096), ("gpt", 11008)])
def test_zero3_persistent_parameters_follow_deepspeeds_rule(style, threshold):
    """parameter_offload.py mark_persistent_parameters (311-323): every parameter with ds_numel <= threshold stays
    gathered, applied here to the reference decoder's own parameters (PyTorch, on the meta device)."""
    torch = pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.reference import Decoder, RefConfig
    c = RefConfig(4096, 4, 32, 11008, 32000, style)
    with torch.device("meta"):
        model = Decoder(c)
    limit = DEEPSPEED_DEFAULTS["stage3_param_persistence_threshold"] if threshold is None else threshold
    small = sum(p.numel() for p in model.parameters() if p.numel() <= limit)
    ledger = Ledger(architecture_of(c), framework="deepspeed", zero_stage=3, dp=8,
                    deepspeed_param_persistence_threshold=threshold)
    assert buffer(ledger, "DeepSpeed persistent parameters").bytes == 2 * small > 0


@pytest.mark.parametrize("recipe, plain, distributed", [("bf16-adamw-fp32-grads", 18, (6, 12)),
                                                        ("fp32-adamw", 16, (8, 8))])
@pytest.mark.parametrize("d", [1, 8, 64])
def test_megatron_bytes_per_parameter_are_its_docs_table(recipe, plain, distributed, d):
    """dist_optimizer.md: bf16 parameters, fp32 gradients: 18 bytes per parameter, 6 + 12/d distributed; fp32:
    16, 8 + 8/d."""
    P = 64 * 10 ** 9
    base = dict(n_params=P, framework="megatron", recipe=recipe, dp=d, overhead_bytes=0)
    assert Fraction(model_states(Ledger(**base, zero_stage=0)), P) == plain
    assert Fraction(model_states(Ledger(**base, zero_stage=1)), P) == distributed[0] + Fraction(distributed[1], d)
    main_grad = buffer(Ledger(**base, zero_stage=1), "Megatron main_grad buffer")
    assert main_grad.bytes == 4 * P and main_grad.booked == "FP32 gradients"


@pytest.mark.slow
def test_megatron_without_gradient_accumulation_fusion():
    """Without fusion each weight gradient is first written in the parameters' dtype: the largest weight's
    (the reference decoder's largest parameter, PyTorch meta device) is the transient."""
    torch = pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.reference import Decoder, RefConfig
    c = RefConfig(4096, 2, 32, 11008, 32000, "llama")
    with torch.device("meta"):
        largest = max(p.numel() for p in Decoder(c).parameters())
    base = dict(framework="megatron", recipe="bf16-adamw-fp32-grads")
    off = Ledger(architecture_of(c), **base, megatron_gradient_accumulation_fusion=False)
    assert buffer(off, "Megatron weight gradient").bytes == 2 * largest
    assert not [b for b in Ledger(architecture_of(c), **base).framework_buffers if b.live == "backward"]


def test_framework_options_are_refused_elsewhere():
    with pytest.raises(ValueError, match="deepspeed_reduce_bucket_size is an option of framework deepspeed"):
        Ledger(LLAMA7B, deepspeed_reduce_bucket_size=10 ** 8)
    with pytest.raises(ValueError, match="megatron_gradient_accumulation_fusion is an option of framework megatron"):
        Ledger(LLAMA7B, framework="deepspeed", zero_stage=1, megatron_gradient_accumulation_fusion=False)
    with pytest.raises(ValueError, match="ZeRO stage 3 option"):
        Ledger(LLAMA7B, framework="deepspeed", zero_stage=2, deepspeed_prefetch_bucket_size=10)
    with pytest.raises(ValueError, match="zero_stage 1 or 2 or 3"):
        Ledger(LLAMA7B, framework="deepspeed")
    with pytest.raises(ValueError, match="modelled with recipe"):
        Ledger(LLAMA7B, framework="megatron")
    with pytest.raises(ValueError, match="whole number of elements"):
        Ledger(LLAMA7B, framework="deepspeed", zero_stage=1, deepspeed_reduce_bucket_size=-1)
    with pytest.raises(ValueError, match="step timeline does not run framework deepspeed"):
        Ledger(LLAMA7B, framework="deepspeed", zero_stage=1).step()
