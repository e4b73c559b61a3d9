"""The compiled step (memledger/step/cache.py) gives Step.peak to the byte, without SymPy once cached.

Step.peak itself is proved against PyTorch's MemTracker in tests/step/test_timeline.py; here every structure's plain-Python
record must agree with the SymPy timeline it was printed from, at several numbers per structure.
"""
import json
from pathlib import Path
import subprocess
import sys

import pytest

from memledger.step import cache as steppeak
from memledger.models.architecture import Architecture
from memledger.ledger.ledger import Ledger
from memledger.step.cache import compiled_step, record_path, step_peak
from memledger.step.structure import StepStructure, step_values
from memledger.activations.backends import get_backend

SMALL_GPT = Architecture(256, 3, 4, 1024, 1000, "gpt")
SMALL_LLAMA = Architecture(256, 2, 4, 688, 1000, "llama")
SMALL_MQA = Architecture(256, 3, 4, 688, 1000, "llama", n_kv_heads=1)

SETUPS = [
    ("llama2-7b", {}),
    ("llama2-7b", dict(recompute="full")),
    ("llama2-7b", dict(recipe="fp32-adamw", flash_attention=True)),
    ("llama2-7b", dict(zero_stage=3, dp=8)),
    ("llama2-7b", dict(zero_stage=2, dp=8, offload_optimizer="cpu")),
    ("llama2-7b", dict(zero_stage=3, dp=8, offload_optimizer="nvme", offload_params="cpu")),
    ("llama2-7b", dict(tp=4, sequence_parallel=True)),
    ("llama2-13b", dict(recipe="bf16-pure-adamw", dropout=True)),
    ("article-7b", dict(recipe="bf16-adamw", zero_stage=1, dp=4)),
    ("gpt2", dict(recompute="full", dropout=True)),
    (SMALL_GPT, dict(recipe="fp32-adamw")),
    (SMALL_LLAMA, dict(zero_stage=3, dp=2, recompute="full")),
    # grouped-query attention; QKV biases (Qwen2), a tied LM head (Gemma)
    ("llama3-8b", {}),
    ("mistral-7b", dict(recipe="fp32-adamw", zero_stage=2, dp=4, offload_optimizer="cpu", tp=8,
                        sequence_parallel=True)),
    (SMALL_MQA, dict(recompute="full")),
    ("qwen2.5-0.5b", dict(zero_stage=3, dp=4, recipe="bf16-pure-adamw", flash_attention=True)),
    # selective recomputation: the attention core checkpointed (eager, flash; GQA and MQA)
    ("article-7b", dict(recompute="selective", dropout=True, offload_optimizer="cpu")),
    ("llama3-8b", dict(recompute="selective", flash_attention=True, zero_stage=3, dp=8)),
    (SMALL_MQA, dict(recompute="selective", zero_stage=2, dp=2, recipe="fp32-adamw")),
    # a head size other than d/H (Gemma-7B: 16 x 256 != 3072)
    ("gemma-7b", dict(zero_stage=3, dp=8, flash_attention=True, recompute="selective")),
]


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["article", pytest.param("cuda", marks=pytest.mark.slow),
                                     pytest.param("cpu", marks=pytest.mark.slow)])
@pytest.mark.parametrize("arch, kwargs", SETUPS)
@pytest.mark.sample(4)
def test_compiled_peak_is_the_timelines(arch, kwargs, backend):
    for batch, seq in [(1, 512), (3, 2048), (8, 4096)]:
        ledger = Ledger(arch, batch_size=batch, seq_len=seq, **kwargs)
        try:
            expected = ledger.step(backend).peak
        except ValueError:                   # a variant the timeline refuses: the compiled path says None
            assert step_peak(ledger, backend) is None
            continue
        assert step_peak(ledger, backend) == (expected.bytes, expected.phase, expected.layer)


def test_unmodelled_setups_have_no_peak():
    assert Ledger("mixtral-8x7b").peak is None                   # MoE
    assert Ledger("bert-base-uncased").peak is None              # an encoder
    assert Ledger(None, n_params=7 * 10**9).peak is None


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["llama2-7b", "llama3-8b", "mistral-7b", "qwen2.5-7b", "gemma-2b"])
@pytest.mark.sample(1)
def test_ledger_peak_uses_the_compiled_step(preset):
    ledger = Ledger(preset, batch_size=2, seq_len=4096)
    assert ledger.peak is not None and ledger.peak == ledger.step().peak.bytes
    assert Ledger(preset).peak == Ledger(preset).step().peak.bytes


def test_command_line_judges_a_gqa_preset_by_its_peak(capsys):
    """``memledger ledger --preset llama3-8b``: the verdict is the step's peak, no longer the sum."""
    from memledger.cli.main import main
    assert main(["ledger", "--preset", "llama3-8b", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["measure"] == "peak"
    assert main(["ledger", "--preset", "llama3-8b"]) == 0
    text = capsys.readouterr().out
    assert "peak" in text and f"{Ledger('llama3-8b').peak / 1e9:.2f} GB" in text


def _structure(**kwargs):
    return StepStructure.of(Ledger("llama2-7b", **kwargs), get_backend("article"))


@pytest.mark.slow
def test_record_is_cached_and_read_back(tmp_path, monkeypatch):
    monkeypatch.setenv("MEMLEDGER_CACHE_DIR", str(tmp_path))
    compiled_step.cache_clear()
    structure = _structure(recompute="full")
    first = compiled_step(structure)
    path = record_path(structure)
    assert path.parent == tmp_path and json.loads(path.read_text())["structure"] == repr(structure)
    compiled_step.cache_clear()

    def no_sympy(_):
        raise AssertionError("compiled again although cached")
    monkeypatch.setattr(steppeak, "compile_step", no_sympy)
    again = compiled_step(structure)
    values = step_values(Ledger("llama2-7b", recompute="full", batch_size=2, seq_len=1024))
    assert again.peak(values) == first.peak(values)


@pytest.mark.slow
def test_a_damaged_or_foreign_record_is_rebuilt(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("MEMLEDGER_CACHE_DIR", str(tmp_path))
    structure = _structure(zero_stage=2, dp=4)
    ledger = Ledger("llama2-7b", zero_stage=2, dp=4)
    good = steppeak.compile_step(structure)
    tape = good["sizes"]
    last = len(tape["args"]) + len(tape["constants"]) + len(tape["ops"])
    damaged = [{**good, "deltas": good["deltas"][:-1]}, {k: v for k, v in good.items() if k != "moments"},
               {**good, "sizes": {**tape, "ops": [["exec", 0]] + tape["ops"]}},              # an unknown operation
               {**good, "sizes": {**tape, "ops": [["add", last + 5]] + tape["ops"]}},        # a slot not yet computed
               {**good, "sizes": {**tape, "constants": [["1", 2]] + tape["constants"]}},     # not a number
               {**good, "sizes": {**tape, "outputs": tape["outputs"] + [last]}},
               {**good, "sizes": "not a tape"}]
    for damage in ["{not json", json.dumps({"format": steppeak.FORMAT, "structure": "another"})] + [
            json.dumps(d) for d in damaged]:
        compiled_step.cache_clear()
        record_path(structure).write_text(damage)
        assert step_peak(ledger)[0] == ledger.step().peak.bytes
        assert json.loads(record_path(structure).read_text()) == good          # compiled and written again
        warning = capsys.readouterr().err
        assert warning.count("\n") == 1 and "ignoring the step cache record" in warning, warning


@pytest.mark.slow
def test_a_record_is_data_never_run(tmp_path, monkeypatch, capsys):
    """A record written as code (the layout of memledger before tapes: Python text read back with ``eval``) is
    ignored, and nothing in it runs, whoever wrote it into a shared cache folder."""
    monkeypatch.setenv("MEMLEDGER_CACHE_DIR", str(tmp_path))
    structure = _structure(recompute="full")
    marker = tmp_path / "ran"
    code = f"[__import__('pathlib').Path({str(marker)!r}).touch()]"
    good = steppeak.compile_step(structure)
    for record in ({**good, "format": 2, "whole": [[0], code], "exact": [[], "[]"]},
                   {**good, "sizes": {**good["sizes"], "ops": [[code, 0]] + good["sizes"]["ops"]}},
                   {**good, "sizes": {**good["sizes"], "args": [code]}}):
        compiled_step.cache_clear()
        record_path(structure).write_text(json.dumps(record))
        ledger = Ledger("llama2-7b", recompute="full")
        assert step_peak(ledger)[0] == ledger.step().peak.bytes
        assert not marker.exists()
    assert "ignoring the step cache record" in capsys.readouterr().err


@pytest.mark.slow
def test_no_eval_or_exec_in_the_package():
    import ast
    from pathlib import Path
    import memledger
    calls = []
    for path in Path(memledger.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("eval", "exec", "compile"):
                calls.append(f"{path.name}:{node.lineno}")
    assert calls == []


@pytest.mark.slow
def test_an_unwritable_cache_still_answers(tmp_path, monkeypatch):
    blocked = tmp_path / "file"
    blocked.write_text("")
    monkeypatch.setenv("MEMLEDGER_CACHE_DIR", str(blocked / "cache"))      # a path under a file: mkdir fails
    compiled_step.cache_clear()
    ledger = Ledger("llama2-7b", batch_size=5)
    assert step_peak(ledger)[0] == ledger.step().peak.bytes
    assert not list(tmp_path.glob("**/*.json"))


@pytest.mark.slow
@pytest.mark.parametrize("edit", ["activations/inventory.py", "states/recipes.py", "core/units.py",
                                  "ledger/ledger.py", "models/configs/llama2-7b.json", "step/block.py"])
def test_an_edited_library_gets_new_records(tmp_path, edit):
    """The record's name covers every file of the package: an edit outside ``step/`` (or to a config the presets
    read) must not reuse a record compiled from the old source. Measured on a copy of the package."""
    import shutil
    import memledger
    copy = tmp_path / "memledger"
    shutil.copytree(Path(memledger.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    code = ("from memledger.step.cache import record_path; from memledger.step.structure import StepStructure;"
            "from memledger.ledger.ledger import Ledger; from memledger.activations.backends import get_backend;"
            "print(record_path(StepStructure.of(Ledger('llama2-7b'), get_backend('article'))).name)")

    def name():
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                              env={"PYTHONPATH": str(tmp_path), "MEMLEDGER_CACHE_DIR": str(tmp_path / "cache")})
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()
    before = name()
    assert name() == before                                     # the same source, the same record
    target = copy / edit
    assert target.is_file(), edit
    target.write_bytes(target.read_bytes() + (b"\n" if edit.endswith(".json") else b"\n# edited\n"))
    assert name() != before


@pytest.mark.slow
def test_command_line_judges_the_peak_without_sympy_once_cached(tmp_path):
    env = {"MEMLEDGER_CACHE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    args = "['ledger', '--preset', 'llama2-7b', '--zero', '3', '--dp', '8', '--json']"
    code = (f"import sys, json, io, contextlib; from memledger.cli.main import main; out = io.StringIO()\n"
            f"with contextlib.redirect_stdout(out): main({args})\n"
            "print(json.dumps({'measure': json.loads(out.getvalue())['measure'], 'heavy': sorted("
            "m for m in ('sympy', 'numpy') if m in sys.modules)}))")
    cold = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    assert json.loads(cold.stdout) == {"measure": "peak", "heavy": ["numpy", "sympy"]}
    assert json.loads(warm.stdout) == {"measure": "peak", "heavy": []}
