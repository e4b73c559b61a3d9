"""The generated plain-Python formulas are the SymPy ones: fresh, and equal at random points."""
from pathlib import Path
import os
import subprocess
import sys

from hypothesis import given, settings, strategies as st

import memledger
import pytest

from memledger import formulas
from memledger.core.exact import exact_function


@pytest.mark.slow
def test_compiled_module_is_a_fresh_generation():
    committed = Path(memledger.__file__).parent.joinpath("core", "compiled.py").read_text()
    assert committed == formulas.generate(), "run `python -m memledger.formulas` and commit memledger/core/compiled.py"


def test_every_key_is_compiled():
    from memledger.core.compiled import FORMULAS
    assert list(FORMULAS) == formulas.keys()


VALUES = st.fixed_dictionaries({name: st.integers(1, 10**6) for name in
                                ("B", "S", "d", "H", "L", "F", "V", "P", "N_d", "t", "O", "n_positions",
                                 "H_kv", "d_h", "E", "k", "n_token_types", "L_dec", "n_relative_buckets")})


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(st.sampled_from(formulas.keys()), VALUES)
def test_compiled_equals_symbolic(key, values):
    expression = formulas.expr(key)
    symbols = sorted(expression.free_symbols, key=lambda s: s.name)
    values = dict(values, t=1) if key[0] == "activations" else values   # activations divide B*S*d by t exactly
    try:
        expected = exact_function(symbols, (expression,))(*(values[s.name] for s in symbols))[0]
    except ArithmeticError:
        return                                  # not a whole number of bytes at these values: nothing to compare
    assert formulas.evaluate(key, values) == expected


def test_uncompiled_key_falls_back_to_sympy(monkeypatch):
    from memledger.core import compiled
    key = ("elements", True)
    monkeypatch.setattr(compiled, "FORMULAS", {})
    assert formulas.evaluate(key, {"P": 7, "N_d": 2, "t": 1}) == 4


@pytest.mark.parametrize("compiled", [True, False])
def test_projection_shapes_are_the_symbolic_projections(monkeypatch, compiled):
    # the one tuple-valued key: every preset's block shapes, from the compiled table and from SymPy's fallback,
    # equal memledger.models.tensors.projections evaluated at the preset
    from memledger.core import compiled as table
    from memledger.models.presets import all_presets
    from memledger.models.tensors import projections
    if not compiled:
        monkeypatch.setattr(table, "FORMULAS", {})
    for name, arch in all_presets().items():
        expected = tuple(tuple(arch.evaluate(x) for x in shape) for shape in projections(arch.features).values())
        assert formulas.projection_shapes(arch) == expected, name


@pytest.mark.slow
@pytest.mark.parametrize("command", [["ledger", "--preset", "llama2-7b", "--measure", "total"],
                                     ["infer", "--preset", "llama2-7b"],
                                     ["infer", "--preset", "llama2-7b", "--attention", "eager", "--seq", "4096"],
                                     ["infer", "--preset", "llama2-7b", "--weights", "nf4"],
                                     ["infer", "--preset", "llama2-7b", "--weights", "nf4", "--no-double-quant"],
                                     ["infer", "--preset", "starcoder", "--weights", "int8"]])
def test_command_line_imports_no_sympy_or_numpy(tmp_path, command):
    # the sum's formulas (and serving's KV cache, working buffer and the projections' shapes bitsandbytes quantizes)
    # are compiled in memledger/core/compiled.py, so --measure total and infer (its op-by-op prefill on whole
    # numbers; NF4 and int8 weights) need no SymPy even with an empty cache of compiled steps; the peak's are
    # compiled once per structure (test_steppeak)
    code = (f"import sys; from memledger.cli.main import main; main({command + ['--json']!r}); "
            "assert 'sympy' not in sys.modules and 'numpy' not in sys.modules, 'heavy import'")
    env = {**os.environ, "MEMLEDGER_CACHE_DIR": str(tmp_path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
