"""The ledger's activation rows follow the recipe's compute dtype (memledger/ledger/ledger.py, activation_dtype).

An FP32 run saves 4-byte tensors: the FP32 step of the reference decoder does (measured by PyTorch's
MemTracker under the CPU backend, tests/step/test_timeline.py's fp32-adamw cases and the one below), and the
ledger books what the step keeps at the end of the forward pass under the same (the article's) conventions.
"""
import pytest

from memledger.ledger.ledger import Ledger, activation_dtype
from memledger.states.recipes import ALL_RECIPES
from memledger.step.timeline import Step

from stepcheck import GPT7B, LLAMA7B


def _activations(ledger):
    """The ledger's activation rows without the ids (which the step books from the start)."""
    return sum(r.bytes for r in ledger.rows if r.group == "activations" and not r.name.endswith(" ids"))


def _saved(step):
    """What the step adds in the forward pass: the activations it keeps for backward."""
    marks = step.landmarks
    return marks["after forward"]["gpu"] - marks["before forward"]["gpu"]


@pytest.mark.slow
@pytest.mark.parametrize("arch", [GPT7B, LLAMA7B, "llama2-7b", "llama3-8b"])
@pytest.mark.parametrize("recipe", ["fp32-adamw", "bf16-adamw"])
@pytest.mark.parametrize("recompute, B, S", [("none", 1, 4096), ("selective", 2, 2048), ("full", 2, 8192)])
@pytest.mark.sample(4)
def test_ledger_books_the_steps_saved_activations(arch, recipe, recompute, B, S):
    """Under the article's conventions the ledger's activation rows are the step's saved tensors, FP32 or BF16."""
    ledger = Ledger(arch, batch_size=B, seq_len=S, recipe=recipe, recompute=recompute, overhead_bytes=0)
    assert _activations(ledger) == _saved(Step(ledger))


def test_fp32_books_four_byte_activations():
    """LLaMA-2 7B: FP32 training books more activations than BF16 mixed precision (every tensor but the
    FP32 log-softmax and the loss doubles), and the 16-bit recipes all book the same."""
    fp32, bf16 = (Ledger("llama2-7b", recipe=r) for r in ("fp32-adamw", "bf16-adamw"))
    rows = {r.name: r.bytes for r in fp32.rows if r.group == "activations"}
    half = {r.name: r.bytes for r in bf16.rows if r.group == "activations"}
    assert rows["activations"] == 2 * half["activations"]
    assert rows["LM head input"] == 2 * half["LM head input"]
    assert rows["log-softmax output (FP32)"] == half["log-softmax output (FP32)"]
    assert _activations(Ledger("llama2-7b", recipe="bf16-pure-adamw")) == _activations(bf16)


def test_compute_dtype_of_each_recipe():
    """FP32 weights compute in FP32, except under FP8 recipes (BF16 activations around FP8 GEMMs)."""
    wide = {name for name, r in ALL_RECIPES.items() if activation_dtype(r) == "fp32"}
    assert wide == {"fp32-adamw", "fp32-sgd", "fp32-sgd-momentum", "adafactor"}


@pytest.mark.slow
def test_fp32_step_saves_what_memtracker_sees():
    """PyTorch: the FP32 reference decoder's step (CPU backend) keeps 4-byte tensors at the end of forward, and
    what it adds there is MemTracker's to the byte (GPT blocks, eager attention, dropout)."""
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    c = RefConfig(64, 2, 4, 256, 1000, "gpt", dropout=0.1)
    measured = memtracker_step(c, "fp32-adamw", 2, 32)
    step = Step(Ledger(architecture_of(c), batch_size=2, seq_len=32, recipe="fp32-adamw", overhead_bytes=0,
                       dropout=True), "cpu")
    assert _saved(step) == measured["after forward"] - measured["before forward"]
    half = Step(Ledger(architecture_of(c), batch_size=2, seq_len=32, recipe="bf16-pure-adamw", overhead_bytes=0,
                       dropout=True), "cpu")
    assert _saved(step) > _saved(half)
