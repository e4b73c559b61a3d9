"""``--measure allocated|reserved`` on ledger, step and fit (the caching allocator's replay), named in the verdict and
in --json; what nvidia-smi and run do not model refused in one line, and the allocator's options without those
measures."""
import json

import pytest

from memledger.answers.fit import fit
from memledger.answers.verdict import AllocatorSpec, judge
from memledger.ledger.ledger import Ledger
from memledger.ledger.replay import replay
from memledger.models.architecture import Architecture
from clicheck import refused, run

SHAPE = ("--hidden", "256", "--layers", "6", "--heads", "4", "--ffn", "688", "--vocab", "1000", "--style", "llama")
LEDGER = Ledger(arch=Architecture(256, 6, 4, 688, 1000, "llama"), batch_size=2, seq_len=128)


@pytest.mark.slow
@pytest.mark.parametrize("measure", ["allocated", "reserved"])
def test_ledger_and_step_json_name_the_measure_and_its_bytes(capsys, measure):
    expected = replay(LEDGER, expandable_segments=True).judged(measure)
    for command in ("ledger", "step"):
        code, out, _ = run(capsys, command, *SHAPE, "--batch", "2", "--seq", "128", "--measure", measure,
                           "--expandable-segments", "--json")
        data = json.loads(out)
        assert code == 0 and data["measure"] == measure and data["judged_bytes"] == expected
        assert data["allocator"]["expandable_segments"] is True
        assert data["allocator"]["fragmentation"] == sum(s["free_size"] for s in data["allocator"]["segments"])


def test_step_text_shows_allocated_and_reserved_and_the_verdict_names_the_measure(capsys):
    code, out, _ = run(capsys, "step", *SHAPE, "--measure", "reserved")
    assert code == 0 and "max_memory_reserved" in out.splitlines()[-1]
    assert "live tensors      allocated       reserved" in out and "free in" in out


@pytest.mark.slow
def test_fit_by_reserved_is_the_api(capsys):
    memory = 3 * 10**9
    spec = AllocatorSpec("reserved")
    result = fit(LEDGER, "batch", memory, measure="reserved", margin=0)
    assert result["measure_key"] == "reserved"
    answer = result["answer"]
    from dataclasses import replace
    assert judge(replace(LEDGER, batch_size=answer), spec).bytes <= memory
    assert judge(replace(LEDGER, batch_size=answer + 1), spec).bytes > memory
    code, out, _ = run(capsys, "fit", "--vary", "batch", *SHAPE, "--seq", "128", "--measure", "reserved",
                       "--gpu-memory", str(memory + 10**9), "--json")
    assert code == 0 and json.loads(out)["answer"] == answer and json.loads(out)["measure_key"] == "reserved"


@pytest.mark.parametrize("args, message", [
    (("--measure", "nvidia-smi"), "no published CUDA context size for a100-80gb"),        # the default GPU
    (("--measure", "nvidia-smi", "--gpu-memory", "80GB", "--cuda-context", "500MiB"), "needs a named GPU"),
    (("--measure", "nvidia-smi", "--gpu-memory", "h100-80gb", "--cuda-context", "500MiB", "--dp", "2", "--zero", "1"),
     "NCCL's buffers"),
    (("--measure", "run", "--zero", "3", "--dp", "2"), "ZeRO stage 3"),
    (("--measure", "run", "--load", "disk"), "load must be one of from-pretrained, state-dict"),
    (("--measure", "reserved", "--load", "state-dict"), "does not read --load"),
    (("--measure", "reserved", "--cuda-context", "1GB"), "does not read --cuda-context"),
    (("--measure", "run", "--expandable-segments"), "does not read --expandable-segments")])
def test_what_nvidia_smi_and_run_do_not_model_is_refused_in_one_line(capsys, args, message):
    for command in ("ledger", "step"):
        refused(capsys, command, *SHAPE, *args, message=message)
    refused(capsys, "fit", "--vary", "batch", *SHAPE, *args, message=message)


def test_allocator_options_need_an_allocator_measure_and_side_streams_are_refused(capsys):
    refused(capsys, "ledger", *SHAPE, "--expandable-segments", message="does not read --expandable-segments")
    refused(capsys, "step", *SHAPE, "--max-split-size-mb", "100", message="does not read --max-split-size-mb")
    refused(capsys, "step", *SHAPE, "--measure", "reserved", "--max-split-size-mb", "20", message="above 20")
    refused(capsys, "step", *SHAPE, "--measure", "reserved", "--framework", "deepspeed", "--zero", "2", "--dp", "2",
            message="--measure reserved is not modelled under --framework deepspeed")
    refused(capsys, "step", *SHAPE, "--measure", "total", message="memledger step judges the step")
    code, out, _ = run(capsys, "step", *SHAPE, "--measure", "allocated", "--framework", "fsdp2", "--dp", "2")
    assert code == 0 and "max_memory_allocated" in out.splitlines()[-1]
    # FSDP2's side streams are replayed, each a pool of its own: the segments at the peak by stream
    code, out, _ = run(capsys, "step", *SHAPE, "--measure", "reserved", "--framework", "fsdp2", "--dp", "2")
    assert code == 0 and "max_memory_reserved" in out.splitlines()[-1]
    assert "FSDP2 reduce-scatter stream:" in out and "default stream:" in out


@pytest.mark.slow
@pytest.mark.parametrize("command", [["ledger", *SHAPE, "--measure", "reserved", "--json"],
                                     ["ledger", *SHAPE, "--framework", "ddp", "--dp", "2", "--measure", "reserved"],
                                     ["fit", "--vary", "batch", *SHAPE, "--framework", "fsdp2", "--dp", "2",
                                      "--measure", "reserved"]])
def test_a_cached_replay_imports_no_sympy(tmp_path, command):
    """Once a structure's step is compiled (and its tensors' roles kept beside it: their streams, DDP's buckets),
    ``--measure reserved`` replays it without SymPy or NumPy, as fast as the peak."""
    import os
    import subprocess
    import sys
    code = (f"import sys; from memledger.cli.main import main; main({command!r}); "
            "assert 'sympy' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'")
    env = {**os.environ, "MEMLEDGER_CACHE_DIR": str(tmp_path)}
    first = subprocess.run([sys.executable, "-c", f"from memledger.cli.main import main; main({command!r})"],
                           capture_output=True, text=True, env=env)
    assert first.returncode == 0, first.stderr
    second = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert second.returncode == 0, second.stderr
