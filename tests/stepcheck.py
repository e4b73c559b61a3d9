"""Shared by the step's tests: the full-scale shapes, the landmark invariant, and the comparison of a step with
MemTracker's run of the reference decoder (memledger/pytorch/reference.py) under the CPU backend."""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.models.architecture import Architecture
from memledger.step.structure import block_of
from memledger.step.timeline import LANDMARKS, Step

GPT7B = Architecture(4096, 32, 32, 16384, 32000, "gpt")          # the article's shape, parameters counted
LLAMA7B = Architecture(4096, 32, 32, 11008, 32000, "llama")
LLAMA3_8B = Architecture(4096, 32, 32, 14336, 128256, "llama", n_kv_heads=8)      # grouped-query attention


def rows_at(step, landmark, device="gpu"):
    return sum(r["bytes"] for r in step.rows if landmark in r["live"] and r["device"] == device)


def landmarks_are_sums_of_rows(step):
    """Each landmark, on each device, is the sum of the rows live there; the peak is at least every landmark."""
    for landmark in LANDMARKS:
        for device in ("gpu", "cpu", "nvme"):
            assert step.landmarks[landmark][device] == rows_at(step, landmark, device)
    assert step.peak.bytes >= max(v["gpu"] for v in step.landmarks.values())


def against_memtracker(style, F_, loop, B, S, L, dropout, recompute, foreach=False, d_=None, H=None, V_=None,
                        kv=None, attention=None, qkv_bias=False, tied=False, trace=None, native_dropout=False,
                        head_dim=None, loss_chunks=1, loss_impl="torchtune", fused=False, in_backward=False,
                        family=None):
    """MemTracker's step of the reference decoder beside the timeline's under the CPU backend; ``attention=
    "eager"`` runs the eager core in LLaMA blocks too (the article backend's kernel); ``kv`` key/value heads,
    ``qkv_bias`` and ``tied``: LLaMA refinements (Qwen2, Gemma); ``trace``: keep MemTracker's op-by-op totals
    (default: small configs without recomputation, see :func:`block_totals_agree`); ``native_dropout``: the
    fused kernel's 1-byte masks (the timeline's ``dropout_mask="bool"``); ``head_dim``: a head size other than
    d/H; ``loss_chunks``: the cross-entropy in n chunks, torchtune's or (``loss_impl="litgpt"``) LitGPT's;
    ``fused``: the optimizer's fused kernel; ``in_backward``: torchtune's optimizer stepped in backward; ``family``:
    more RefConfig fields (the families' ``positions``, ``alibi``, ``input_norm``, ``parallel``, ``shared_norm``,
    ``untied``, ``head_bias``)."""
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    d_, H, V_ = d_ or 64, H or 4, V_ or 1000
    c = RefConfig(d_, L, H, F_, V_, style, dropout=dropout, recompute=recompute, n_kv_heads=kv, attention=attention,
                  qkv_bias=qkv_bias, tied=tied, native_dropout=native_dropout, head_dim=head_dim,
                  loss_chunks=loss_chunks, loss_impl=loss_impl, **(family or {}))
    trace = recompute == "none" and d_ < 1024 if trace is None else trace     # op by op: small configs
    measured = memtracker_step(c, loop, B, S, foreach=foreach, blocks=True, trace=trace, fused=fused,
                               in_backward=in_backward)
    eager = {"attention": "eager"} if attention == "eager" else {}
    mask = {"dropout_mask": "bool"} if native_dropout else {}
    step = Step(Ledger(architecture_of(c), batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0,
                       dropout=dropout > 0, recompute=recompute, loss_chunks=loss_chunks, loss_impl=loss_impl,
                       optimizer_in_backward=in_backward), "cpu", foreach=foreach, fused=fused, **eager, **mask)
    landmarks_agree(step, measured)
    return step, measured


def landmarks_agree(step, measured):
    """The GPU's bytes at each of the four landmarks are MemTracker's."""
    for landmark in LANDMARKS:
        assert step.landmarks[landmark]["gpu"] == measured[landmark], landmark


def peaks_agree(step, measured, op_by_op=False):
    """Each phase's peak, the peak and each block's peaks are MemTracker's; with ``op_by_op`` also the totals
    inside each block, op by op (:func:`block_totals_agree`)."""
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    _blockpeaks_agree(step, measured)
    if op_by_op:
        block_totals_agree(step, measured)


def _blockpeaks_agree(step, measured):
    """The largest total while each block (run op by op) runs forward and backward is MemTracker's."""
    ours = step.block_peaks()
    assert ours == {k: measured["block peaks"][k] for k in ours}


def block_totals_agree(step, measured):
    """Op by op: the totals the timeline reaches after each op that allocates while a block runs (forward and
    backward) are totals MemTracker reaches in that block, in the same order (MemTracker samples after every
    ATen op, the timeline after groups of them; a tensor released as the block's frame exits is seen by
    MemTracker after the block, hence ops that only free are not compared). Exact without recomputation
    (with it, a recomputed tensor is freed when unpacked, a few ops before the timeline frees it:
    memledger/step/block.py)."""
    import re

    def sequences(samples):
        out = {}
        for key, total in samples:
            seq = out.setdefault(key, [])
            if not seq or seq[-1] != total:
                seq.append(total)
        return out
    theirs = sequences(((("backward" if bw else "forward"), int(m.group(1))), total)
                       for total, bw, opt, mods, _ in measured["trace"] if bw is not None and not opt
                       for m in [next(filter(None, (re.fullmatch(r"Decoder\.blocks\.(\d+)", x) for x in mods)),
                                      None)] if m)
    lumped, n_layers = step.structure.layers is None, step.values["L"]
    ours = sequences(((op.phase, block_of(op.layer, lumped, n_layers)), int(total))
                     for total, op in ((t, step.built.ops[i]) for t, i in zip(step.totals, step.built.compiled.ops))
                     if isinstance(op.layer, int) and op.phase in ("forward", "backward") and op.allocs)
    for key, totals in ours.items():
        rest = iter(theirs[key])
        assert all(any(t == u for u in rest) for t in totals), key


LORA_ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
LORA_QV = ("q_proj", "v_proj")
LORA_7B = dict(d=4096, L=32, H=32, F=11008, V=32000)
LORA_SMALL = dict(d=64, L=3, H=4, F=160, V=1000)


def lora_against_memtracker(shape, batch, seq, rank, targets, dropout=0.0, nf4=False, loop="bf16-pure-adamw", kv=None,
                       rmsnorm="composite", in_backward=False, **refinements):
    """The step of a LoRA (QLoRA with ``nf4``) run beside MemTracker's measurement of the reference (``rmsnorm``:
    the reference's and the step's RMSNorm, composite as on CPU or fused as the CUDA kernel); ``loop``: the
    adapters' recipe (``fp32-adamw``: FP32 adapters on the BF16 base, PEFT's default); ``refinements``: RefConfig's
    (``recompute``, ``loss_chunks``, ``loss_impl``, ...), read by the step too."""
    pytest.importorskip("torch")
    from memledger.ledger.lora import LoraConfig, LoraLedger
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.lora import LoraRef
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(shape["d"], shape["L"], shape["H"], shape["F"], shape["V"], "llama", n_kv_heads=kv, rmsnorm=rmsnorm,
                  **refinements)
    measured = memtracker_step(c, loop, batch, seq, blocks=True, in_backward=in_backward,
                               lora=LoraRef(rank, targets, dropout=dropout, qlora=nf4,
                                            fp32_adapters=loop == "fp32-adamw"))
    config = LoraConfig(rank, targets, base="nf4" if nf4 else "bf16", adapter_recipe=loop, dropout=dropout > 0)
    step = LoraLedger(architecture_of(c), config, batch, seq, c.recompute, overhead_bytes=0, loss_chunks=c.loss_chunks,
                      loss_impl=c.loss_impl, optimizer_in_backward=in_backward).step("cpu", rmsnorm=rmsnorm)
    held = 2 * batch * seq * shape["d"] * 2            # the leaf and its .grad, kept by MemTracker (docstring)
    after = {"after backward", "after step"}
    for landmark in LANDMARKS:
        assert step.landmarks[landmark]["gpu"] + held * (landmark in after) == measured[landmark], landmark
    ours = step.phase_peaks()
    ours["optimizer"] += held
    assert ours == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    blocks = step.block_peaks()
    assert blocks == {k: measured["block peaks"][k] for k in blocks}
    return step, measured


def against_fsdp2_tp(shape: dict, B: int, S: int, dp: int, t: int, sequence_parallel=False, loop="fp32-adamw",
                     reshard=True, param="bf16", reduce="fp32", loss_in_root=False):
    """FSDP2 x TP on a (dp, t) mesh: the landmarks, every phase peak and the peak of memledger's step
    (``Ledger(framework="fsdp2", dp=dp, tp=t)``) equal FSDPMemTracker's run of rank 0 of dp x t ranks
    (memledger/pytorch/distributed.py ``fsdp_step(..., tp=t)``), byte for byte. ``reshard`` None: PyTorch's
    default (True for the blocks, False for the root). ``shape``: RefConfig's fields (recompute included)."""
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.distributed import fsdp_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(**shape, tp=t)
    resharding = dict(reshard=True, root_reshard=False) if reshard is None else dict(reshard=reshard)
    measured = fsdp_step(c, loop, batch=B, seq=S, world=dp * t, tp=t, sequence_parallel=sequence_parallel,
                         param_dtype=param, reduce_dtype=reduce, loss_in_root=loss_in_root, track_first=False,
                         **resharding)
    step = Ledger(architecture_of(c), batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0, dropout=False,
                  recompute=c.recompute, framework="fsdp2", dp=dp, tp=t, sequence_parallel=sequence_parallel,
                  fsdp_param_dtype=param, fsdp_reduce_dtype=reduce, reshard_after_forward=reshard,
                  fsdp_loss_in_root=loss_in_root).step("cpu")
    assert {k: step.landmarks[k]["gpu"] for k in LANDMARKS} == {k: measured[k] for k in LANDMARKS}
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    landmarks_are_sums_of_rows(step)
    return step, measured
