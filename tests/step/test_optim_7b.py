"""LLaMA-2 7B's shape (B 1, S 4096): each optimizer implementation and each recipe the step models beyond AdamW,
beside MemTracker's run of the reference Trainer under fake tensors (memledger/pytorch/reference.py), every
landmark, each phase's peak and the peak to the byte (tests/step/test_optim.py has the small shapes). Fused SGD
only there: ``torch._fused_sgd_`` has no fake-tensor kernel, so FakeTensorMode runs it on real tensors of the
parameters' size (13.6 GB at this shape)."""
import pytest

from stepcheck import against_memtracker

pytestmark = pytest.mark.slow

LLAMA2_7B = dict(d_=4096, H=32, V_=32000)


@pytest.mark.parametrize("loop, impl", [
    ("bf16-adamw", "for-loop"), ("bf16-adamw", "foreach"), ("bf16-adamw", "fused"),
    ("bf16-pure-adamw", "in backward, for-loop"), ("bf16-pure-adamw", "in backward, foreach"),
    ("bf16-pure-adamw", "in backward, fused"),
    ("fp32-sgd", "for-loop"), ("fp32-sgd-momentum", "foreach"), ("bf16-sgd", "foreach"),
    ("bf16-sgd-momentum", "for-loop"), ("bf16-pure-sgd-momentum", "in backward, for-loop"),
    ("adafactor", "for-loop"), ("adafactor", "in backward, for-loop"),
])
def test_llama2_7b_optimizer_steps_match_memtracker(loop, impl):
    step, measured = against_memtracker("llama", 11008, loop, 1, 4096, 32, 0.0, "none", trace=False,
                                        foreach=impl.endswith("foreach"), fused=impl.endswith("fused"),
                                        in_backward=impl.startswith("in backward"), **LLAMA2_7B)
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
