"""Shared by the packed-sequence tests: the step with ``packed`` beside MemTracker's run of the packed reference
decoder (memledger/pytorch/packing.py) under the CPU backend."""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step

from stepcheck import landmarks_agree, landmarks_are_sums_of_rows, peaks_agree


def packed_against_memtracker(B_, S_, n, L_=2, d=64, H=4, F_=160, V_=1000, loop="bf16-pure-adamw", kv=None,
                              trace=True, loss_chunks=1, loss_impl="torchtune", style="llama", attention=None,
                              recompute="none", offload=False, dropout=0.0):
    """``attention="eager"``: LLaMA blocks run the eager core (the article backend's kernel; GPT blocks always do),
    masking the packed documents with ``masked_fill``; ``recompute``: the save policy."""
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(d, L_, H, F_, V_, style, packed=n, n_kv_heads=kv, loss_chunks=loss_chunks, loss_impl=loss_impl,
                  attention=attention, recompute=recompute, offload_activations=offload, dropout=dropout)
    measured = memtracker_step(c, loop, B_, S_, blocks=True, trace=trace)
    step = Step(Ledger(architecture_of(c), batch_size=B_, seq_len=S_, recipe=loop, overhead_bytes=0, packed=n,
                       loss_chunks=loss_chunks, loss_impl=loss_impl, recompute=recompute, dropout=dropout > 0,
                       offload_activations=offload), "cpu",
                **({"attention": "eager"} if attention == "eager" else {}))
    landmarks_agree(step, measured)
    if offload:                 # the host copies (MemTracker counts the fake host device apart)
        assert {k: step.landmarks[k]["cpu"] for k in measured["host"]} == measured["host"]
    peaks_agree(step, measured, op_by_op=trace)
    landmarks_are_sums_of_rows(step)
    return step, measured
