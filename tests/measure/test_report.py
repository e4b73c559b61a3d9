"""The measured run's report without PyTorch: the difference split into parts, the one line, the setup checked when
the callback is made (docs/measure.md)."""
import os
import subprocess
import sys

import pytest

from memledger.measure.plan import Plan, check_steps, output_path
from memledger.measure.report import build_report, difference_parts, human, summary_line

# A step as the report holds it; the numbers are made up so that each part's difference is distinct.
PREDICTED = {"landmarks": {"before forward": 1000, "after forward": 1600, "after backward": 1400, "after step": 1000},
             "phase_peaks": {"forward": 1700, "backward": 1900, "optimizer": 1500}, "peak": 1900}
MEASURED = {"landmarks": {"before forward": 1010, "after forward": 1710, "after backward": 1420, "after step": 1010},
            "phase_peaks": {"forward": 1810, "backward": 2030, "optimizer": 1520}, "peak": 2030,
            "compared_step": 2, "what": "MemTracker"}


def test_parts_are_differences_of_landmarks_and_phase_peaks():
    parts = {p["part"]: p["bytes"] for p in difference_parts(PREDICTED, MEASURED)}
    assert parts == {
        "held before forward": 1010 - 1000,                                  # +10
        "added by forward": (1710 - 1010) - (1600 - 1000),                   # +100
        "added by backward": (1420 - 1710) - (1400 - 1600),                  # -90
        "added by the optimizer step": (1010 - 1420) - (1000 - 1400),        # -10
        "forward transients": (1810 - max(1010, 1710)) - (1700 - max(1000, 1600)),      # 0
        "backward transients": (2030 - max(1710, 1420)) - (1900 - max(1600, 1400)),     # +20
        "optimizer transients": (1520 - max(1420, 1010)) - (1500 - max(1400, 1000)),    # 0
    }


def test_report_names_the_largest_part_and_words_it_in_one_line():
    report = build_report({"arch": "x"}, PREDICTED, MEASURED, {}, {})
    assert report["difference"]["bytes"] == 2030 - 1900
    assert report["difference"]["percent"] == round(100 * 130 / 1900, 4)
    assert report["difference"]["largest_unexplained"]["part"] == "added by forward"
    assert report["line"] == ("memledger: step 2 peak predicted 1.90 kB, measured 2.03 kB (MemTracker); "
                              "difference +130 B (+6.84%); largest unexplained part: added by forward +100 B")
    assert "\n" not in report["line"]


def test_a_prediction_equal_to_the_measurement_has_no_unexplained_part():
    report = build_report({}, PREDICTED, dict(PREDICTED, compared_step=2, what="MemTracker"), {}, {})
    assert report["difference"]["bytes"] == 0 and report["difference"]["largest_unexplained"] is None
    assert report["line"].endswith("difference +0 B (+0.00%); largest unexplained part: none, every part agrees "
                                   "to the byte")


def test_reserved_is_shown_beside_allocated():
    measured = dict(MEASURED, peak_reserved=4_194_304, what="torch.cuda.max_memory_allocated")
    line = summary_line(build_report({}, PREDICTED, measured, {}, {}))
    assert "measured 2.03 kB (4.19 MB reserved) (torch.cuda.max_memory_allocated)" in line


def test_a_setup_that_cannot_be_predicted_is_said_so():
    report = build_report({}, None, MEASURED, {}, {}, ["memledger cannot predict this setup: MoE"])
    assert report["difference"] is None
    assert report["line"] == ("memledger: step 2 peak measured 2.03 kB (MemTracker); not predicted: "
                              "memledger cannot predict this setup: MoE")


@pytest.mark.parametrize("n, text", [(0, "0 B"), (999, "999 B"), (1000, "1.00 kB"), (4_147_276, "4.15 MB"),
                                     (-5220, "-5.22 kB"), (30_601_641_984, "30.60 GB")])
def test_human(n, text):
    assert human(n) == text


def test_setup_is_checked_when_the_callback_is_made():
    with pytest.raises(ValueError, match="setup: unknown Ledger field 'batch'"):
        Plan(dict(arch="llama2-7b", batch=2))
    with pytest.raises(ValueError, match="setup must be a memledger Ledger, LoraLedger or a dict"):
        Plan("llama2-7b")
    with pytest.raises(ValueError, match="unknown recipe"):
        Plan(dict(arch="llama2-7b", recipe="bf16-adam"))
    with pytest.raises(ValueError, match="conventions: unknown switch 'foreachh'"):
        Plan(dict(arch="llama2-7b"), conventions={"foreachh": True})
    with pytest.raises(ValueError, match="backend must be one of"):
        Plan(dict(arch="llama2-7b"), backend="gpu")
    for bad in (0, -1, 1.5, True, "2"):
        with pytest.raises(ValueError, match="steps must be a whole number"):
            check_steps(bad)
    with pytest.raises(ValueError, match="report must be a file path"):
        output_path(3, "report")


def test_the_batch_shape_comes_from_the_run_unless_given():
    plan = Plan(dict(arch="llama2-7b"))
    ledger, notes = plan.ledger((4, 512))
    assert (ledger.batch_size, ledger.seq_len, ledger.overhead_bytes) == (4, 512, 0) and notes == []
    ledger, notes = Plan(dict(arch="llama2-7b", batch_size=2, seq_len=512)).ledger((4, 512))
    assert ledger.batch_size == 2 and notes == ["the setup predicts batch 2 x 512 tokens; the model saw 4 x 512"]


def test_the_plot_goes_beside_the_report():
    from pathlib import Path
    assert output_path(True, "plot", Path("out/r.json")) == Path("out/r.png")
    assert output_path(False, "plot", Path("out/r.json")) is None


@pytest.mark.slow
def test_memledger_imports_without_torch_transformers_or_lightning():
    """``import memledger`` and ``memledger.measure`` need none of them; the callbacks say what they need."""
    code = ("import sys\n"
            "for name in ('torch', 'transformers', 'lightning', 'pytorch_lightning'): sys.modules[name] = None\n"
            "import memledger, memledger.measure as m\n"
            "assert 'track' in dir(m) and 'HFCallback' in dir(m)\n"
            "m.Plan(dict(arch='llama2-7b'))\n"
            "for name in ('track', 'LightningCallback'):\n"
            "    try:\n"
            "        getattr(m, name)\n"
            "    except ImportError as error:\n"
            "        print(error)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=os.environ)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "memledger.measure measures a PyTorch run: it needs torch (pip install torch)",
        "memledger.measure.LightningCallback needs Lightning: pip install lightning (or pytorch-lightning); "
        "memledger does not install it"]
