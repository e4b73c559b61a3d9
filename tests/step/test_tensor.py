"""The step under tensor (and sequence) parallelism against PyTorch's own: DTensor's ``parallelize_module``
(torchtitan's plan: column-wise QKV and MLP-in, row-wise output and MLP-out, a vocabulary-parallel embedding and
``loss_parallel()``) on a fake process group, rank 0 of t, tracked by MemTracker
(memledger/pytorch/distributed.py ``tp_step``). Every landmark, every phase's peak and the peak to the byte; on
small shapes also each block's totals op by op (memledger/step/tensor.py)."""
import re

import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import LANDMARKS, Step
from stepcheck import GPT7B, LLAMA7B, block_totals_agree

pytest.importorskip("torch")

from memledger.pytorch.compare import architecture_of  # noqa: E402
from memledger.pytorch.distributed import tp_step  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402

pytestmark = pytest.mark.slow

SMALL = dict(d=64, L=2, H=4, F=256, V=1000, style="llama")


def shape_of(arch) -> dict:
    return dict(d=arch.d_model, L=arch.n_layers, H=arch.n_heads, F=arch.d_ff, V=arch.vocab_size, style=arch.style)


def agree(shape: dict, t: int, B: int, S: int, sequence_parallel=False, loop="bf16-pure-adamw", kv=None,
          op_by_op=False):
    """The step's landmarks, phase peaks and peak are MemTracker's under ``tp_step``; with ``op_by_op`` each
    block's peaks and its totals op by op too."""
    c = RefConfig(**shape, n_kv_heads=kv, tp=t)
    measured = tp_step(c, loop, batch=B, seq=S, sequence_parallel=sequence_parallel, trace=op_by_op)
    step = Step(Ledger(architecture_of(c), batch_size=B, seq_len=S, recipe=loop, overhead_bytes=0, tp=t,
                       sequence_parallel=sequence_parallel, dropout=False), "cpu")
    assert {k: step.landmarks[k]["gpu"] for k in LANDMARKS} == {k: measured[k] for k in LANDMARKS}
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]
    if op_by_op:
        trace = [(total, bw, opt, mods, op) for total, _, bw, opt, mods, op in measured["trace"]]
        peaks = {}
        for total, bw, opt, mods, _ in trace:
            for m in (re.fullmatch(r"Decoder\.blocks\.(\d+)", x) for x in mods or ()):
                if m and bw is not None and not opt:
                    key = ("backward" if bw else "forward", int(m.group(1)))
                    peaks[key] = max(peaks.get(key, 0), total)
        assert step.block_peaks() == {k: peaks[k] for k in step.block_peaks()}
        block_totals_agree(step, {"trace": trace})
    return step, measured


def test_small_tensor_parallel_step_is_dtensors():
    """LLaMA blocks, t = 2: landmarks, the forward (log-softmax), backward (loss backward) and optimizer
    (the LM head's AdamW temporaries) peaks, and each block op by op."""
    agree(SMALL, 2, 2, 32, op_by_op=True)


@pytest.mark.parametrize("shape, t, B, S, sp_, loop, kv", [
    (SMALL, 2, 2, 32, True, "bf16-pure-adamw", None),               # sequence parallelism
    (SMALL, 4, 1, 48, False, "fp32-adamw", None),                   # FP32, B = 1 (q, k, v views)
    (SMALL, 2, 2, 32, True, "bf16-pure-adamw", 2),                  # grouped-query attention, H_kv/t heads
    (dict(SMALL, L=5, V=128), 2, 2, 64, False, "bf16-pure-adamw", None),   # lumped blocks, a block peak
    (dict(SMALL, L=5, V=128), 2, 2, 64, True, "bf16-pure-adamw", None),
    (dict(SMALL, style="gpt"), 2, 2, 32, False, "bf16-pure-adamw", None),  # tied head, biases, eager, GeLU
    (dict(SMALL, style="gpt", L=5, V=128), 2, 2, 64, True, "bf16-pure-adamw", None),
])
def test_small_variants(shape, t, B, S, sp_, loop, kv):
    agree(shape, t, B, S, sp_, loop, kv, op_by_op=True)


@pytest.mark.live(2)  # full-scale repeats of the small grids' proofs: n run PyTorch under --pytorch=live
@pytest.mark.parametrize("arch, t, sp_", [(LLAMA7B, 2, False), (LLAMA7B, 4, True), (LLAMA7B, 8, False),
                                          (LLAMA7B, 8, True), (GPT7B, 4, False), (GPT7B, 8, True)])
def test_7b(arch, t, sp_):
    """LLaMA-2 7B and the article's GPT 7B, B 1, S 2048 (a sample of t = 2, 4, 8 with and without SP). The
    issue's "3.3 % low after backward at t = 8" was the untied embedding's gradient, whole (V x d) on every
    rank, with the replicated norms."""
    step, measured = agree(shape_of(arch), t, 1, 2048, sp_)
    if arch is LLAMA7B:
        assert measured["after backward"] - measured["before forward"] > 2 * arch.vocab_size * arch.d_model


#: LLaMA-2 7B's width with 2 blocks: the issue's TP gap did not depend on the number of layers.
LLAMA7B_2 = dict(d=4096, L=2, H=32, F=11008, V=32000, style="llama")


def test_issue_setup_t8_s4096():
    """The issue's first disagreement: torchtitan's plan without SP at t = 8, pure BF16 ``AdamW(foreach=False)``,
    B 1, S 4096, MemTracker over the second step. Measured here, memledger's step equals PyTorch's at every
    landmark and phase peak and at the peak (the final norm's backward), to the byte: the 929,570,808 B an
    independent harness saw above memledger's peak is not in what a rank allocates (see the next test)."""
    step, measured = agree(LLAMA7B_2, 8, 1, 4096)
    assert step.peak.bytes == measured["peak"] < measured["after forward"] + 2 * 4096 * 32000 * 4


def test_sharding_propagations_global_tensors_are_not_a_ranks_memory(monkeypatch):
    """Where a harness counts more than memledger under ``loss_parallel()``: DTensor derives an output's global
    shape by running the op on fake global-shape tensors (``_sharding_prop.py`` l. 546, PyTorch 2.13:
    ``fake_mode = detect_fake_mode() or FakeTensorMode()``), and ``loss_parallel``'s handlers do it on every
    call (``parallel/loss.py`` l. 237 and 566, ``_propagate_tensor_meta``). In a real run that is a
    FakeTensorMode of its own (nothing allocated) and MemTracker skips it (``_tools/mem_tracker.py``
    l. 931-941: ops are tracked only when ``active_fake_mode() is self._fake_mode_on_entry``). A harness that
    runs the step under its own FakeTensorMode makes DTensor find that mode, and MemTracker then counts the
    propagation's global tensors as the rank's: at ``nll_loss_backward``, its fake arguments and output at
    the global (B*S, V) shape. Without ``_propagation_as_in_a_real_run`` the measured peak is exactly after
    forward + the loss gradient's seed (4 B) + grad_output (4 B) + self (B*S*V FP32) + target (B*S int64) +
    total_weight (4 B) + the output (B*S*V FP32), 846,503,948 B above memledger's at S 4096, whatever the
    number of layers (the order of the issue's 929,570,808 B); the landmarks are unchanged."""
    from contextlib import nullcontext

    import memledger.pytorch.distributed as distributed
    B, S, V = 1, 4096, 32000
    step, measured = agree(LLAMA7B_2, 8, B, S)
    monkeypatch.setattr(distributed, "_propagation_as_in_a_real_run", nullcontext)
    # the harness patched: no recordable call (tp_step.__wrapped__ runs PyTorch, never the record)
    counted = tp_step.__wrapped__(RefConfig(**LLAMA7B_2, tp=8), "bf16-pure-adamw", batch=B, seq=S)
    assert {k: counted[k] for k in LANDMARKS} == {k: measured[k] for k in LANDMARKS}
    global_args = 4 + B * S * V * 4 + B * S * 8 + 4
    assert counted["peak"] == measured["after forward"] + 4 + global_args + B * S * V * 4


def test_torchtitans_held_logits_raise_the_forward_peak_only(monkeypatch):
    """torchtitan's train step holds the BF16 logits through the loss (``torchtitan/train.py``,
    ``forward_backward_step``: ``pred = model_parts[0](inputs, ...)``, ``loss = self.loss_fn(pred, labels)``, then
    "need to free pred before bwd to avoid peaking memory": ``del pred`` before ``loss.backward()``); the
    reference frees them once ``.float()`` has copied them. Held, the forward's peak (the vocabulary-parallel
    log-softmax) is B*S*V/t*2 B higher; the landmarks and the step's peak (the final norm's backward) are the
    same at the issue's setup. With the propagation's global tensors counted too, the forward's peak is after
    forward - 8 + 2 B*S*V*4 + B*S*V/t*2: of the issue's 929,570,808 B, all but 8192*S + S^2 (48 MiB at S 4096,
    9 MiB at S 1024, which fit both of its figures) is the propagation's phantom and these held logits."""
    import torch.nn.functional as F
    from contextlib import nullcontext

    import memledger.pytorch.distributed as distributed
    from memledger.pytorch.reference import Decoder

    def loss(self, ids, targets):
        pred = self(ids)
        return F.cross_entropy(pred.flatten(0, 1).float(), targets.flatten(0, 1))
    B, S, V, t = 1, 4096, 32000, 8
    step = agree(LLAMA7B_2, t, B, S)[0]
    monkeypatch.setattr(Decoder, "loss", loss)
    held = tp_step.__wrapped__(RefConfig(**LLAMA7B_2, tp=t), "bf16-pure-adamw", batch=B, seq=S)    # patched: live
    assert {k: held[k] for k in LANDMARKS} == {k: step.landmarks[k]["gpu"] for k in LANDMARKS}
    assert held["phase peaks"]["forward"] == step.phase_peaks()["forward"] + B * S * V // t * 2
    assert held["peak"] == step.peak.bytes
    monkeypatch.setattr(distributed, "_propagation_as_in_a_real_run", nullcontext)
    counted = tp_step.__wrapped__(RefConfig(**LLAMA7B_2, tp=t), "bf16-pure-adamw", batch=B, seq=S)
    assert counted["phase peaks"]["forward"] == held["after forward"] - 8 + 2 * B * S * V * 4 + B * S * V // t * 2
