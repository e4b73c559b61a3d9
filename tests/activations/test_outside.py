"""The tensors kept outside the blocks, on one tensor-parallel rank (memledger/activations/outside.py).

Korthikanti et al. (2022), Sec. 4.3, with p = 1 and tensor + sequence parallelism: the final
LayerNorm's input 2sbh/t, the output layer's input 2sbh/t and the FP32 logits 4sbv/t (no norm
statistics, as the article). Megatron-LM's output layer is vocabulary-parallel, so the logits are
split by t under tensor parallelism alone; the two B x S x d inputs only under sequence
parallelism; token ids and the causal mask never (every rank reads the whole batch).
The ledger and the step use one rule (Saved.rank_bytes): the step's saved activations at the end
of the forward pass equal the ledger's activation rows, outside rows included.
"""
import pytest
import sympy as sp

from memledger import formulas
from memledger.ledger.ledger import Ledger
from memledger.step.timeline import Step
from memledger.core.symbols import B, S, V, d, t

from stepcheck import GPT7B, LLAMA3_8B, LLAMA7B

b, s, h, v = B, S, d, V          # the paper's names


def outside(name, tp, sequence_parallel, style="gpt", attention="eager"):
    return formulas.expr(formulas.outside_key(style, attention, name, tp, sequence_parallel))


def test_tensor_and_sequence_parallel_is_korthikanti_sec_4_3():
    """p = 1, tensor + sequence parallel: 2sbh/t, 2sbh/t, 4sbv/t."""
    assert sp.simplify(outside("final LayerNorm input", True, True) - 2 * s * b * h / t) == 0
    assert sp.simplify(outside("LM head input", True, True) - 2 * s * b * h / t) == 0
    assert sp.simplify(outside("log-softmax output (FP32)", True, True) - 4 * s * b * v / t) == 0
    assert sp.simplify(outside("final RMSNorm input", True, True, "llama") - 2 * s * b * h / t) == 0


def test_tensor_parallel_alone_splits_only_the_vocabulary_parallel_logits():
    """Without sequence parallelism every rank holds the final norm's and the LM head's input whole."""
    assert sp.simplify(outside("log-softmax output (FP32)", True, False) - 4 * s * b * v / t) == 0
    assert sp.simplify(outside("final LayerNorm input", True, False) - 2 * s * b * h) == 0
    assert sp.simplify(outside("LM head input", True, False) - 2 * s * b * h) == 0


@pytest.mark.parametrize("tp, sequence_parallel", [(False, False), (True, False), (True, True)])
def test_ids_mask_and_loss_are_never_split(tp, sequence_parallel):
    """int64 ids: 8 bytes per token; the (S, S) bool mask: S^2 bytes; the loss scalars: 4 bytes each."""
    assert outside("input ids", tp, sequence_parallel) == 8 * b * s
    assert outside("target ids", tp, sequence_parallel) == 8 * b * s
    assert outside("causal mask", tp, sequence_parallel) == s**2
    assert outside("loss", tp, sequence_parallel) == 4


def test_unsplit_keys_are_unchanged():
    """t = 1 keeps the keys it had (compiled ahead of time in memledger/core/compiled.py)."""
    assert formulas.outside_key("gpt", "eager", "LM head input").positional() == \
        ("outside", "gpt", "eager", "LM head input")
    assert formulas.outside_key("gpt", "eager", "LM head input", False, False).positional() == \
        ("outside", "gpt", "eager", "LM head input")


@pytest.mark.parametrize("tp, sp_, vocab_split, seq_split", [(4, True, 4, 4), (4, False, 4, 1), (1, False, 1, 1)])
def test_ledger_rows_at_7b(tp, sp_, vocab_split, seq_split):
    """The ledger's rows at the article's shape, B = 1, S = 2048, d = 4096, V = 32000, written out."""
    rows = {r.name: r.bytes for r in Ledger(GPT7B, batch_size=1, seq_len=2048, tp=tp, sequence_parallel=sp_).rows}
    assert rows["log-softmax output (FP32)"] == 2048 * 32000 * 4 // vocab_split
    assert rows["final LayerNorm input"] == rows["LM head input"] == 2048 * 4096 * 2 // seq_split
    assert rows["input ids"] == rows["target ids"] == 2048 * 8
    assert rows["causal mask"] == 2048**2


@pytest.mark.slow
@pytest.mark.parametrize("arch", [GPT7B, LLAMA7B, LLAMA3_8B])
@pytest.mark.parametrize("kwargs", [dict(), dict(tp=2), dict(tp=4, sequence_parallel=True),
                                    dict(tp=2, recompute="selective"),
                                    dict(tp=8, sequence_parallel=True, flash_attention=True)])
@pytest.mark.sample(3)
def test_ledger_activations_are_the_steps_saved_tensors_after_forward(arch, kwargs):
    """One rule for both: the ledger's activation rows (blocks and outside) sum to the step's saved
    activations live at the end of the forward pass, under tensor and sequence parallelism too."""
    ledger = Ledger(arch, batch_size=2, seq_len=2048, overhead_bytes=0, **kwargs)
    step = Step(ledger)
    saved = sum(r["bytes"] for r in step.rows
                if r["kind"] == "activation" and r["device"] == "gpu" and "after forward" in r["live"])
    assert saved == ledger.group_total("activations") + dtensor_gathered_inputs(ledger)


def dtensor_gathered_inputs(ledger) -> int:
    """What DTensor saves under sequence parallelism beyond Megatron-LM's rows (the ledger's, Korthikanti et al.
    2022 Sec. 4.2.2, the S/t shard of each column-wise layer's input): each column-wise layer's all-gathered
    input, the whole sequence, in 16 bits: in every block the QKV projection's and the MLP's (LLaMA: the up
    projection's own copy too), and the LM head's once (tests/step/test_tensor.py holds the step to tp_step)."""
    if not ledger.sequence_parallel:
        return 0
    whole = 2 * ledger.batch_size * ledger.seq_len * ledger.arch.d_model
    gathered = whole - whole // ledger.tp
    per_block = 2 * gathered + (whole if ledger.arch.style == "llama" else 0)
    return ledger.arch.n_layers * per_block + gathered
