"""The knobs' ladder (memledger/article/knobs.py): each rung's peak is the step of the same setup built directly,
and what a rung saves at the peak is what PyTorch's MemTracker measures between the two runs."""
import pytest

from memledger.article.knobs import RUNGS, Rung, ladder, ladder_table, setup_step
from memledger.ledger.ledger import Ledger
from memledger.ledger.lora import LoraConfig, LoraLedger
from memledger.models.architecture import Architecture

from stepcheck import against_memtracker

S = 16384
TORCHTUNE = dict(recipe="bf16-pure-adamw", seq_len=S, flash_attention=True)    # BF16 weights and AdamW states


@pytest.fixture(scope="module")
def rows():
    return {r.rung: r for r in ladder("llama2-7b", S)}


def test_each_rung_is_the_step_of_its_setup_built_directly(rows):
    """The rungs are cumulative: checkpointing keeps the chunked loss; LoRA starts again from the baseline and
    QLoRA replaces its adapters."""
    direct = {
        "baseline": Ledger("llama2-7b", **TORCHTUNE).step("cuda"),
        "chunked cross-entropy": Ledger("llama2-7b", loss_chunks=8, **TORCHTUNE).step("cuda"),
        "activation checkpointing": Ledger("llama2-7b", loss_chunks=8, recompute="full", **TORCHTUNE).step("cuda"),
        "LoRA": LoraLedger("llama2-7b", LoraConfig(rank=8, targets=("q_proj", "v_proj"), adapter_recipe="bf16-pure-adamw"),
                           seq_len=S, flash_attention=True).step("cuda"),
        "QLoRA": LoraLedger("llama2-7b", LoraConfig(rank=8, targets=("q_proj", "v_proj"), base="nf4",
                                                    adapter_recipe="bf16-pure-adamw"),
                            seq_len=S, flash_attention=True).step("cuda"),
    }
    assert [r.name for r in RUNGS] == list(direct)
    for name, step in direct.items():
        assert rows[name].peak == step.peak.bytes, name
        assert rows[name].phase == step.peak.phase
    against = {"chunked cross-entropy": "baseline", "activation checkpointing": "chunked cross-entropy",
               "LoRA": "baseline", "QLoRA": "LoRA"}
    for name, before in against.items():
        assert rows[name].against == before
        assert rows[name].saved == direct[before].peak.bytes - direct[name].peak.bytes
    assert rows["baseline"].saved == 0 and rows["baseline"].against == ""


def test_the_table_has_a_line_per_rung(rows):
    table = ladder_table(list(rows.values()))
    assert [line[0] for line in table.rows] == list(rows)


SMALL = Architecture(64, 2, 4, 128, 1000, "llama")       # the reference decoder's small LLaMA (tests/step)


@pytest.mark.parametrize("rung, changes", [("chunked cross-entropy", dict(loss_chunks=4)),
                                           ("activation checkpointing", dict(recompute="full"))])
def test_a_rung_saves_what_memtracker_measures(rung, changes):
    """CPU conventions, pure BF16 AdamW, B 1, S 256: the peak the rung takes off is MemTracker's difference between
    the reference decoder's step without and with the knob (PyTorch on fake tensors)."""
    knob = Rung(rung, changes)
    rows = ladder(SMALL, 256, [Rung("baseline"), knob], backend="cpu")
    before = against_memtracker("llama", 128, "bf16-pure-adamw", 1, 256, 2, 0.0, "none")[1]["peak"]
    after = against_memtracker("llama", 128, "bf16-pure-adamw", 1, 256, 2, 0.0, changes.get("recompute", "none"),
                               loss_chunks=changes.get("loss_chunks", 1))[1]["peak"]
    assert rows[1].saved == before - after != 0


@pytest.mark.slow
def test_the_chunked_loss_saves_what_memtracker_measures_at_full_scale():
    """LLaMA-2 7B at S 4096, 8 chunks, CPU conventions: the rung's saving is MemTracker's (two full runs)."""
    rows = ladder("llama2-7b", 4096, RUNGS[:2], backend="cpu")
    shape = dict(d_=4096, H=32, V_=32000)
    before = against_memtracker("llama", 11008, "bf16-pure-adamw", 1, 4096, 32, 0.0, "none", **shape)[1]["peak"]
    after = against_memtracker("llama", 11008, "bf16-pure-adamw", 1, 4096, 32, 0.0, "none", loss_chunks=8,
                               **shape)[1]["peak"]
    assert rows[1].saved == before - after > 0


def test_bad_rungs_are_refused_by_name():
    with pytest.raises(ValueError, match="loss_chunk"):
        Rung("typo", {"loss_chunk": 8})
    with pytest.raises(ValueError, match="name"):
        Rung("")
    with pytest.raises(ValueError, match="at least one rung"):
        ladder("llama2-7b", 4096, [])
    with pytest.raises(ValueError, match="does not model loss_chunks"):
        setup_step("llama2-7b", 4096, dict(TORCHTUNE, loss_chunks=8, lora=LoraConfig()))
    with pytest.raises(TypeError, match="LoraConfig"):
        setup_step("llama2-7b", 4096, dict(TORCHTUNE, lora="qlora"))


def test_the_readme_prints_the_library_s_table():
    from pathlib import Path
    from memledger.article.knobs import knob_table
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert knob_table().markdown() in readme
