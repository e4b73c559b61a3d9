"""Shared by the FP16 AMP tests: the step under ``fp16-amp-adamw`` beside MemTracker's run of the reference loop
with autocast and a GradScaler (memledger/pytorch/reference.py) under the CPU backend. ``refinements``: RefConfig's
fields (``n_kv_heads``, ``qkv_bias``, ``tied``, ``head_dim``, ``recompute``, ``style``)."""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step

from stepcheck import landmarks_agree, landmarks_are_sums_of_rows, peaks_agree


def amp_against_memtracker(B_, S_, L_=2, d=64, H=4, F_=160, V_=1000, rmsnorm="composite", foreach=False,
                           fused=False, trace=True, **refinements):
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    style = refinements.pop("style", "llama")
    gpt = {"attention": "sdpa"} if style == "gpt" else {}        # GPT blocks under autocast: SDPA, no dropout
    c = RefConfig(d, L_, H, F_, V_, style, rmsnorm=rmsnorm, **gpt, **refinements)
    measured = memtracker_step(c, "fp16-amp-adamw", B_, S_, blocks=True, trace=trace, foreach=foreach, fused=fused)
    conv = {"rmsnorm": "fused"} if rmsnorm == "fused" else {}
    step = Step(Ledger(architecture_of(c), batch_size=B_, seq_len=S_, recipe="fp16-amp-adamw", overhead_bytes=0,
                       recompute=c.recompute, dropout=False, flash_attention=bool(gpt), loss_chunks=c.loss_chunks),
                "cpu", foreach=foreach, fused=fused, **conv)
    landmarks_agree(step, measured)
    # op by op only without full recomputation: a recomputed tensor is freed when unpacked, a few ops before the
    # timeline frees it (memledger/step/block.py); the block peaks are still compared
    peaks_agree(step, measured, op_by_op=trace and c.recompute != "full")
    landmarks_are_sums_of_rows(step)
    return step, measured
