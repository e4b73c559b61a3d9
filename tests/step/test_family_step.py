"""The families in the step: a GPT block with multi-query (grouped-query) attention, GPT-BigCode's, is the one-block
program with K and V at H_kv heads, equal to MemTracker's run of the reference decoder to the byte; StarCoder's
learned positions and BLOOM's ALiBi bias and embedding LayerNorm run op by op (memledger/step/families.py), equal to
MemTracker's run of the reference decoder that has them (more shapes, StarCoder's and BLOOM 7B1's widths in
test_family_step_memtracker.py). What the step does not model is refused in one line naming the model_type and
why; T5 (encoder-decoder) by every command that builds a ledger. No traceback for any shipped family."""
import subprocess
import sys
from pathlib import Path

import pytest
from stepcheck import against_memtracker, landmarks_are_sums_of_rows, peaks_agree

from memledger.ledger.ledger import Ledger
from memledger.models.presets import get_preset
from memledger.step.cache import step_peak
from memledger.step.structure import StepStructure
from memledger.activations.backends import get_backend

CONFIGS = Path(__file__).resolve().parents[2] / "memledger" / "models" / "configs"

REFUSED = {       # every decoder family runs in the step now (GPT-NeoX and Phi: test_parallel.py)
}
#: The families the step runs op by op (memledger/step/families.py), and what each adds to the GPT block's step.
MODELLED = {"starcoder": dict(positions=True), "bloom-7b1": dict(alibi=True, input_norm=True),
            "pythia-6.9b": dict(parallel=True, tied=False), "phi-2": dict(parallel=True, shared_norm=True,
                                                                       head_bias=True, tied=False)}


@pytest.mark.slow
def test_multi_query_gpt_block_is_memtrackers():
    step, measured = against_memtracker("gpt", 256, "bf16-pure-adamw", 2, 16, 2, 0.1, "none", kv=1)
    peaks_agree(step, measured, op_by_op=True)
    multi_head, _ = against_memtracker("gpt", 256, "bf16-pure-adamw", 2, 16, 2, 0.1, "none")
    assert multi_head.peak.bytes > step.peak.bytes          # the comparison sees the K/V width


@pytest.mark.slow
def test_every_family_refinement_at_once_is_memtrackers():
    """Learned positions, ALiBi and the embedding LayerNorm in one small multi-query decoder: the landmarks, the
    phase peaks, the peak, each block's peaks and the totals op by op inside the blocks and outside them (the
    embeddings, the ALiBi bias, the embedding LayerNorm's and the position embedding's backward)."""
    step, measured = against_memtracker("gpt", 64, "bf16-pure-adamw", 2, 8, 2, 0.0, "none", d_=32, V_=100, kv=1,
                                        trace=True, family=dict(positions=12, alibi=True, input_norm=True))
    peaks_agree(step, measured, op_by_op=True)
    outside_totals_agree(step, measured)
    landmarks_are_sums_of_rows(step)


def outside_totals_agree(step, measured):
    """The totals after each op outside the blocks that allocates (forward and backward, not the optimizer) are
    totals MemTracker reaches outside the blocks, in the same order."""
    theirs = [total for total, bw, opt, mods, _ in measured["trace"] if bw is not None and not opt
              and not any(".blocks." in m for m in mods)]
    ours = [int(total) for total, op in ((t, step.built.ops[i]) for t, i in zip(step.totals,
                                                                                 step.built.compiled.ops))
            if op.layer is None and op.phase != "optimizer" and op.allocs]
    rest = iter(theirs)
    assert all(any(t == u for u in rest) for t in ours)


@pytest.mark.slow
@pytest.mark.parametrize("name", MODELLED)
def test_the_step_runs_the_family(name):
    ledger = Ledger(get_preset(name), batch_size=1, seq_len=2048)
    structure = StepStructure.of(ledger, get_backend("cuda"))
    assert {k: getattr(structure.shape, k) for k in MODELLED[name]} == MODELLED[name]
    names = {r["name"] for r in ledger.step("cuda").rows}
    assert ("position ids" in names) == (name == "starcoder")
    assert ("embedding LayerNorm input" in names) == (name == "bloom-7b1")


@pytest.mark.parametrize("name, change, why", [
    ("bloom-7b1", dict(flash_attention=True), "a flash attention kernel"),
    ("starcoder", dict(optimizer_in_backward=True, recipe="bf16-pure-adamw"), "the optimizer in backward"),
    ("starcoder", dict(zero_stage=3), "ZeRO"), ("gpt2", {}, "dropout .the embeddings' own"),
    ("bloom-7b1", dict(tp=2), "tensor parallelism"),
    ("starcoder", dict(loss_chunks=4), "a chunked loss")])
def test_what_the_families_are_not_modelled_with_is_refused(name, change, why):
    with pytest.raises(ValueError, match=f"not with.*{why}"):      # (the ledger asks the step where it needs it)
        StepStructure.of(Ledger(get_preset(name), **dict(dict(batch_size=1, seq_len=2048), **change)),
                         get_backend("cuda"))


@pytest.mark.parametrize("name", ["bloom-7b1", "starcoder"])
def test_packed_documents_are_refused_with_the_families_refinements(name):
    """Packing was measured on the plain GPT and LLaMA blocks only (tests/step/test_packing_eager_slow.py)."""
    with pytest.raises(ValueError, match="not for learned positions, ALiBi or an embedding norm"):
        StepStructure.of(Ledger(get_preset(name), batch_size=1, seq_len=2048, packed=4), get_backend("article"))


@pytest.mark.parametrize("name", REFUSED)
def test_step_refuses_the_family_by_name(name):
    model_type, why = REFUSED[name]
    ledger = Ledger(get_preset(name), batch_size=1, seq_len=2048)
    with pytest.raises(ValueError, match=f"{why}.*not modelled op by op \\(model_type '{model_type}'\\)"):
        StepStructure.of(ledger, get_backend("cuda"))


def test_t5_refused_by_the_ledger():
    with pytest.raises(ValueError, match="arch: model_type 't5' is an encoder-decoder"):
        Ledger("t5-base", batch_size=1, seq_len=512)


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "memledger", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.sample(3)
@pytest.mark.parametrize("command, name", [("step", n) for n in REFUSED] + [
    (c, "t5-base") for c in ("ledger", "step", "compare", "infer")] + [("fit --vary batch", "t5-base")])
def test_cli_refuses_in_one_line(command, name):
    result = _cli(*command.split(), "--preset", name)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr
    assert (REFUSED[name][0] if name in REFUSED else "t5") in result.stderr


@pytest.mark.slow
@pytest.mark.sample(2)
@pytest.mark.parametrize("name", list(REFUSED) + list(MODELLED))
@pytest.mark.parametrize("command", ["ledger", "compare", "fit --vary batch"])
def test_cli_answers_the_decoder_families(command, name):
    result = _cli(*command.split(), "--preset", name)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name, kwargs", [("starcoder", {}), ("bloom-7b1", {}), ("bloom-7b1", dict(recompute="full")),
                                          ("pythia-6.9b", {}), ("phi-2", dict(recompute="selective"))])
def test_the_compiled_peak_is_the_timelines(name, kwargs, tmp_path, monkeypatch):
    """The command line's compiled peak (memledger/step/cache.py) of a family, and the ledger's verdict, are the
    step's peak."""
    monkeypatch.setenv("MEMLEDGER_CACHE_DIR", str(tmp_path))
    ledger = Ledger(name, batch_size=2, seq_len=2048, **kwargs)
    expected = ledger.step("cuda").peak
    assert step_peak(ledger, "cuda") == (expected.bytes, expected.phase, expected.layer)
    assert ledger.peak == ledger.step().peak.bytes


@pytest.mark.slow
@pytest.mark.parametrize("args", [("--preset", "starcoder"), ("--config", str(CONFIGS / "bloom-7b1.json"))])
def test_cli_steps_the_families(args):
    result = _cli("step", *args, "--json")
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr


@pytest.mark.slow
def test_cli_refuses_what_the_family_is_not_modelled_with():
    result = _cli("step", "--preset", "bloom-7b1", "--flash-attention")
    assert result.returncode == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "a flash attention kernel" in result.stderr
