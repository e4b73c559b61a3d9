"""torchtune's and LitGPT's chunked cross-entropy in the step (memledger/step/loss.py), against PyTorch's MemTracker.

The reference decoder runs ``CEWithChunkedOutputLoss`` as torchtune does, or LitGPT's ``chunked_cross_entropy``
(memledger/pytorch/reference.py, ``RefConfig(loss_chunks=n, loss_impl=...)``); every landmark, each phase's
peak, the peak and each block's peaks of the step are MemTracker's to the byte. One small case runs in the fast
loop (chunks of unequal length, B > 1: the strided chunks are copied); the full-scale grid (LLaMA-2 7B and
LLaMA-3 8B's 128k vocabulary, B 1-2, S 4096-8192, 1, 8 and 16 chunks, with and without full recomputation;
LitGPT's 128-token chunks) is slow (one to two minutes a case).
"""
import json
import subprocess
import sys

import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step

from stepcheck import LLAMA3_8B, LLAMA7B, against_memtracker, landmarks_are_sums_of_rows, peaks_agree


@pytest.mark.slow
@pytest.mark.parametrize("style, B, S, n, impl", [("llama", 2, 13, 5, "torchtune"), ("gpt", 1, 16, 4, "torchtune"),
                                                  ("llama", 2, 16, 4, "litgpt"), ("llama", 1, 16, 1, "litgpt"),
                                                  ("gpt", 1, 16, 2, "litgpt")])
@pytest.mark.sample(1)
def test_small_chunked_loss_equals_memtracker(style, B, S, n, impl):
    """13 tokens in 5 chunks (3, 3, 3, 2, 2 tokens), B = 2: landmarks, phase peaks, peak and block peaks are
    MemTracker's; the other cases (slow): a tied GPT decoder, LitGPT's BF16 loss with and without chunks."""
    F_ = 128 if style == "llama" else 256
    step, measured = against_memtracker(style, F_, "bf16-adamw", B, S, 2, 0.0, "none", loss_chunks=n, loss_impl=impl)
    peaks_agree(step, measured, op_by_op=True)
    loss_totals_agree(step, measured)
    landmarks_are_sums_of_rows(step)


def loss_totals_agree(step, measured):
    """Op by op through the loss (the final norm, the head, the loss and their backward): the totals the
    timeline reaches after each op that allocates are totals MemTracker reaches between the last block's forward
    and the last block's backward, in the same order (MemTracker samples after every ATen op)."""
    def in_block(mods):
        return any(m.startswith("Decoder.blocks.") for m in mods)
    trace = measured["trace"]
    start = max(i for i, (_, bw, opt, mods, _) in enumerate(trace) if bw is False and not opt and in_block(mods))
    end = min(i for i, (_, bw, opt, mods, _) in enumerate(trace) if bw and not opt and in_block(mods))
    theirs = [total for total, bw, _, _, _ in trace[start + 1:end] if bw is not None]
    ours = [int(total) for total, index in zip(step.totals, step.built.compiled.ops)
            if step.built.ops[index].phase == "loss" and step.built.ops[index].allocs]
    rest = iter(theirs)
    assert all(any(t == u for u in rest) for t in ours)


FULL = [(LLAMA7B, 1, 4096, 8, "none"), (LLAMA7B, 2, 4096, 16, "none"), (LLAMA7B, 1, 8192, 1, "none"),
        (LLAMA7B, 2, 8192, 8, "full"), (LLAMA7B, 1, 8192, 16, "full"),
        (LLAMA3_8B, 1, 8192, 1, "none"), (LLAMA3_8B, 1, 8192, 8, "none"), (LLAMA3_8B, 1, 8192, 16, "none"),
        (LLAMA3_8B, 2, 4096, 16, "full"), (LLAMA3_8B, 1, 8192, 16, "full")]
LITGPT = [(LLAMA3_8B, 1, 8192, 1, "none"), (LLAMA3_8B, 1, 8192, 64, "none"), (LLAMA7B, 2, 4096, 32, "full")]


@pytest.mark.live(3)  # full-scale repeats of the small grids' proofs: n run PyTorch under --pytorch=live
@pytest.mark.slow
@pytest.mark.parametrize("arch, B, S, n, recompute", FULL)
def test_full_scale_chunked_loss_equals_memtracker(arch, B, S, n, recompute):
    """At LLaMA-2 7B's and LLaMA-3 8B's shapes (BF16 with FP32 masters), alone and under full recomputation."""
    step, measured = against_memtracker("llama", arch.d_ff, "bf16-adamw", B, S, arch.n_layers, 0.0, recompute,
                                        d_=arch.d_model, H=arch.n_heads, V_=arch.vocab_size, kv=arch.n_kv_heads,
                                        loss_chunks=n)
    peaks_agree(step, measured)


@pytest.mark.slow
@pytest.mark.parametrize("arch, B, S, n, recompute", LITGPT)
def test_full_scale_litgpt_loss_equals_memtracker(arch, B, S, n, recompute):
    """LitGPT's BF16 cross-entropy (its fine-tuning default: chunks of 128 tokens, 64 at S = 8192; none)."""
    step, measured = against_memtracker("llama", arch.d_ff, "bf16-adamw", B, S, arch.n_layers, 0.0, recompute,
                                        d_=arch.d_model, H=arch.n_heads, V_=arch.vocab_size, kv=arch.n_kv_heads,
                                        loss_chunks=n, loss_impl="litgpt")
    peaks_agree(step, measured)


@pytest.mark.slow
@pytest.mark.parametrize("B", [1, 2])
def test_chunks_keep_their_tensors_in_rows(B):
    """Each landmark is the sum of the rows live there; the chunks' log-softmax outputs add up to the unchunked
    one (4*B*S*V), and with B > 1 the LM head input is kept as its chunks' copies."""
    step = Step(Ledger(LLAMA3_8B, batch_size=B, seq_len=4099, loss_chunks=8, overhead_bytes=0), "cpu")
    landmarks_are_sums_of_rows(step)
    rows = {r["name"]: r["bytes"] for r in step.rows if "after forward" in r["live"]}
    logsoftmax = sum(b for name, b in rows.items() if name.startswith("log-softmax output, chunk"))
    assert logsoftmax == 4 * B * 4099 * 128256
    assert ("LM head input" in rows) == (B == 1)
    assert sum(b for name, b in rows.items() if name.startswith("LM head input")) == 2 * B * 4099 * 4096


@pytest.mark.parametrize("kwargs, field", [(dict(loss_chunks=0), "loss_chunks"),
                                           (dict(loss_chunks=9, seq_len=8), "loss_chunks"),
                                           (dict(loss_chunks=2.5), "loss_chunks"),
                                           (dict(loss_impl="liger"), "loss_impl 'liger' is not modelled"),
                                           (dict(loss_impl="cce"), "loss_impl 'cce' is not modelled"),
                                           (dict(loss_impl="megatron"), "loss_impl"),
                                           (dict(loss_impl="litgpt", loss_chunks=3, seq_len=4096), "loss_impl")])
def test_bad_chunks_are_refused(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Ledger(LLAMA7B, **kwargs)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memledger", *args], capture_output=True, text=True)


@pytest.mark.slow
@pytest.mark.parametrize("args", [["--loss-chunks", "0"], ["--loss-chunks", "9", "--seq", "8"]])
def test_cli_refuses_bad_chunks_in_one_line(args):
    run = _cli("step", "--preset", "llama2-7b", *args)
    assert run.returncode == 2 and "loss_chunks" in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_step_reads_chunks_and_compare_refuses_them():
    """``step`` honours ``--loss-chunks`` (the peak of LLaMA-3 8B's shape falls); ``compare`` refuses it in one
    line, as the sums it compares book the unchunked loss."""
    base = ["--hidden", "4096", "--layers", "32", "--heads", "32", "--ffn", "14336", "--vocab", "128256",
            "--style", "llama", "--seq", "8192", "--overhead", "0", "--json"]
    peaks = [json.loads(_cli("step", *base, *more).stdout)["peak"]["gpu"] for more in ([], ["--loss-chunks", "8"])]
    assert peaks[1] < peaks[0]
    run = _cli("compare", "--preset", "llama2-7b", "--loss-chunks", "8")
    assert run.returncode == 2 and "--loss-chunks" in run.stderr and len(run.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_ledger_reads_chunks_only_where_its_verdict_is_the_peak():
    """``ledger`` judges by the step's peak unless ``--measure total``: there the chunks change nothing printed."""
    assert _cli("ledger", "--preset", "llama2-7b", "--loss-chunks", "8").returncode == 0
    run = _cli("ledger", "--preset", "llama2-7b", "--loss-chunks", "8", "--measure", "total")
    assert run.returncode == 2 and "--loss-chunks" in run.stderr and len(run.stderr.strip().splitlines()) == 1


def test_fit_cannot_search_sequences_shorter_than_the_chunks():
    from memledger.answers.fit import fit
    with pytest.raises(ValueError, match="loss_chunks"):
        fit(Ledger(LLAMA7B, loss_chunks=8), "seq", 80 * 10**9)
