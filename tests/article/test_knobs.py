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


@pytest.mark.slow
def test_each_rung_is_the_step_of_its_setup_built_directly(rows):
    """The rungs are cumulative: each keeps the knobs before it; LoRA starts from the checkpointing rung (the
    chunked loss and full recomputation, torchtune's LoRA config) and QLoRA changes its base. CUDA's conventions
    with torchtune's composite RMSNorm."""
    def full(**knobs):
        return Ledger("llama2-7b", **TORCHTUNE, **knobs).step("cuda", rmsnorm="composite")

    def lora(base):
        config = LoraConfig(rank=8, targets=("q_proj", "v_proj"), base=base, adapter_recipe="bf16-pure-adamw")
        return LoraLedger("llama2-7b", config, seq_len=S, flash_attention=True, loss_chunks=8,
                          recompute="full").step("cuda", rmsnorm="composite")
    chunked, ckpt = dict(loss_chunks=8), dict(loss_chunks=8, recompute="full")
    direct = {
        "baseline": full(),
        "chunked cross-entropy": full(**chunked),
        "activation checkpointing": full(**ckpt),
        "optimizer in backward": full(**ckpt, optimizer_in_backward=True),
        "activation offloading": full(**ckpt, optimizer_in_backward=True, offload_activations=True),
        "LoRA": lora("bf16"),
        "QLoRA": lora("nf4"),
    }
    assert [r.name for r in RUNGS] == list(direct)
    for name, step in direct.items():
        assert rows[name].peak == step.peak.bytes, name
        assert rows[name].phase == step.peak.phase
    names = list(direct)
    against = dict(zip(names[1:5], names[:4])) | {"LoRA": "activation checkpointing", "QLoRA": "LoRA"}
    for name, before in against.items():
        assert rows[name].against == before
        assert rows[name].saved == direct[before].peak.bytes - direct[name].peak.bytes
    assert rows["baseline"].saved == 0 and rows["baseline"].against == ""


@pytest.mark.slow
def test_offloading_the_checkpoints_saves_them_at_the_peak(rows):
    """Under full recomputation each block saves its BF16 input only (2BSd, L blocks): offloading takes exactly
    those off the peak, in backward, and puts them on the host."""
    saved = rows["activation offloading"]
    assert saved.saved == 32 * 2 * S * 4096
    host = saved.step.landmarks["after forward"]["cpu"] - rows["optimizer in backward"].step.landmarks[
        "after forward"]["cpu"]
    assert host == 32 * 2 * S * 4096


@pytest.mark.slow
def test_the_table_has_a_line_per_rung(rows):
    table = ladder_table(list(rows.values()))
    assert [line[0] for line in table.rows] == list(rows)


SMALL = Architecture(64, 2, 4, 128, 1000, "llama")       # the reference decoder's small LLaMA (tests/step)


@pytest.mark.slow
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
def test_the_top_rung_is_memtrackers():
    """Checkpointing, the chunked loss, the optimizer in backward and offloading together (the ladder's top rung,
    which no other test combines): the small LLaMA decoder's step under the CPU backend equals MemTracker's run
    of the reference decoder with all four, landmark by landmark on the GPU and on the host, phase by phase."""
    pytest.importorskip("torch")
    from memledger.pytorch.compare import architecture_of
    from memledger.pytorch.measure import memtracker_step
    from memledger.pytorch.reference import RefConfig
    from memledger.step.timeline import LANDMARKS
    c = RefConfig(64, 3, 4, 96, 1000, "llama", recompute="full", offload_activations=True, loss_chunks=4)
    measured = memtracker_step(c, "bf16-pure-adamw", 1, 64, blocks=True, in_backward=True)
    top = dict(loss_chunks=4, recompute="full", optimizer_in_backward=True, offload_activations=True)
    step = setup_step(architecture_of(c), 64, dict(recipe="bf16-pure-adamw", overhead_bytes=0, **top), "cpu")
    for landmark in LANDMARKS:
        assert step.landmarks[landmark]["gpu"] == measured[landmark], landmark
        assert step.landmarks[landmark]["cpu"] == measured["host"][landmark], landmark
    assert step.phase_peaks() == measured["phase peaks"]
    assert step.peak.bytes == measured["peak"]


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
    with pytest.raises(ValueError, match="starts from 'LoRA': no rung before it"):
        ladder("llama2-7b", 4096, [Rung("baseline"), Rung("QLoRA", {"loss_chunks": 2}, start="LoRA")])
    with pytest.raises(ValueError, match="does not model offload_activations"):
        setup_step("llama2-7b", 4096, dict(TORCHTUNE, offload_activations=True, lora=LoraConfig()))
    with pytest.raises(TypeError, match="LoraConfig"):
        setup_step("llama2-7b", 4096, dict(TORCHTUNE, lora="qlora"))


@pytest.mark.slow
def test_the_usage_page_prints_the_library_s_table():
    from pathlib import Path
    from memledger.article.knobs import knob_table
    page = (Path(__file__).resolve().parents[2] / "docs" / "usage.md").read_text()       # the "Knobs" table
    assert knob_table().markdown() in page
