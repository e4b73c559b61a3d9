"""Packed sequences in the eager core (memledger/step/packing.py, ``"eager"``): LLaMA blocks under the article
backend (or ``attention="eager"``) and GPT blocks under any backend mask the S x S scores with ``masked_fill`` of
one (B, 1, S, S) bool mask, built once per forward and saved by every block (Megatron-LM's ``attention_mask_func``
convention; memledger/pytorch/packing.py). Fast: what the step books and refuses. Against MemTracker: one small
shape here (slow: it imports PyTorch); more shapes, recomputation and LLaMA-2 7B in test_packing_eager_slow.py.
"""
import pytest

from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step

from packcheck import packed_against_memtracker
from stepcheck import GPT7B, landmarks_are_sums_of_rows


@pytest.mark.slow
@pytest.mark.parametrize("arch,backend", [("llama2-7b", "article"), (GPT7B, "cpu"), (GPT7B, "cuda")])
def test_eager_packing_books_one_b_s_s_mask(arch, backend):
    """The shared mask is a (B, S, S) bool tensor (B*S^2 bytes, not per block), beside the (B, S) int64 document
    ids; no SDPA additive mask."""
    B_, S_ = 2, 1024
    step = Step(Ledger(arch, batch_size=B_, seq_len=S_, packed=4, overhead_bytes=0), backend)
    rows = {r["name"]: r["bytes"] for r in step.rows}
    assert rows["causal mask"] == B_ * S_ * S_
    assert rows["document ids"] == 8 * B_ * S_
    assert not any("additive" in name for name in rows)
    landmarks_are_sums_of_rows(step)


@pytest.mark.slow
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_eager_packing_runs_under_recomputation(recompute):
    step = Step(Ledger("llama2-7b", seq_len=4096, packed=4, recompute=recompute, overhead_bytes=0), "article")
    assert {r["name"]: r["bytes"] for r in step.rows}["causal mask"] == 4096 ** 2


@pytest.mark.parametrize("changes,backend,words", [
    ({"tp": 2}, "article", "not for tensor parallelism"),
    ({"framework": "ddp", "dp": 2}, "article", "not for framework ddp"),
    ({"arch": GPT7B, "offload_activations": True}, "cpu", "not for activation offloading with the eager core"),
])
def test_refused_in_one_line(changes, backend, words):
    ledger = Ledger(**{"arch": "llama2-7b", "seq_len": 4096, "packed": 4, **changes})
    with pytest.raises(ValueError, match=words):
        ledger.step(backend)


@pytest.mark.slow
@pytest.mark.parametrize("style,attention,kv", [("llama", "eager", None), ("gpt", None, None)])
def test_packed_eager_step_is_memtrackers(style, attention, kv):
    """B = 2, two documents per row, two blocks: every landmark, phase peak, block peak and the totals op by op
    inside the blocks equal MemTracker's."""
    packed_against_memtracker(2, 32, 2, style=style, attention=attention, kv=kv)
