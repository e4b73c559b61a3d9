"""The lab: memledger's prediction beside PyTorch's measurement. Without a GPU (this machine) the measurement is
MemTracker's on the CPU, which must equal the timeline byte for byte; the CUDA path is refused in one line."""
import pytest

torch = pytest.importorskip("torch")

from memledger.pytorch.lab import lab, lab_table, main, measure_cuda      # noqa: E402
from memledger.pytorch.measure import memtracker_step                     # noqa: E402
from memledger.pytorch.reference import RefConfig                         # noqa: E402

pytestmark = pytest.mark.slow

SMALL = RefConfig(64, 2, 4, 256, 1000, "gpt", dropout=0.1)
LLAMA = RefConfig(64, 2, 4, 176, 1000, "llama", rmsnorm="fused")


@pytest.mark.parametrize("c", [SMALL, LLAMA], ids=["gpt", "llama-fused-rmsnorm"])
def test_cpu_lab_agrees_with_memtracker_to_the_byte(c):
    result = lab(c, "bf16-adamw", 2, 32, device="cpu")
    measured = memtracker_step(c, "bf16-adamw", 2, 32)          # PyTorch's own count, run again here
    assert result["device"] == "cpu" and "MemTracker" in result["source"]
    assert result["measured"]["peak"] == measured["peak"] == result["predicted"].peak.bytes
    table = lab_table(result)
    assert [row[3] for row in table.rows + table.totals] == ["0"] * 8


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without a GPU")
def test_cuda_is_refused_without_a_gpu(capsys):
    with pytest.raises(RuntimeError, match="needs a CUDA device"):
        measure_cuda(SMALL, "bf16-adamw", 2, 32)
    with pytest.raises(SystemExit) as exit_:
        main(["--device", "cuda"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert err.strip().endswith("measure_cuda needs a CUDA device (torch.cuda.is_available() is False)")
    with pytest.raises(SystemExit):
        main(["--device", "cpu", "--snapshot", "step.pickle"])
    assert "there is no GPU to record" in capsys.readouterr().err


def test_command_line_prints_the_table(capsys):
    assert main(["--device", "cpu", "--hidden", "64", "--layers", "2", "--heads", "4", "--ffn", "256",
                 "--vocab", "1000", "--batch", "2", "--seq", "32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("Measured by MemTracker on the CPU") and "peak" in out


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_cuda_lab_measures_at_least_the_prediction(tmp_path):
    """On a GPU: every block is a tensor's bytes rounded up, so allocated is never below the prediction."""
    result = lab(SMALL, "bf16-adamw", 2, 32, device="cuda", snapshot=str(tmp_path / "step.pickle"))
    assert result["measured"]["peak"] >= result["predicted"].peak.bytes
    assert result["measured"]["reserved"] >= result["measured"]["peak"]
    assert (tmp_path / "step.pickle").stat().st_size > 0
