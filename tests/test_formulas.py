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


def named(key):
    """The named key whose positional tuple is the compiled ``key`` (None for the short plain keys)."""
    from memledger.formulas import ActivationsKey, OutsideKey
    from memledger.models.features import Features, ModelKey
    name, *args = key
    before = args[:1] if name == "working buffer" else []
    rest = args[len(before):]
    if name == "activations":
        return ActivationsKey(*args)
    if name == "outside":
        return OutsideKey(*args)
    if name in ("params", "active params", "largest unit", "projections", "working buffer"):
        return ModelKey(name, rest[0] if len(rest) == 1 else Features(*rest), tuple(before))
    return None


def test_every_long_key_is_a_named_keys_positional_tuple():
    """The activations, outside-row and model keys of the compiled table are the positional tuples of named keys
    (:class:`memledger.formulas.ActivationsKey`, ``OutsideKey``, :class:`memledger.models.features.ModelKey`),
    their fields at the builders' arguments; only the short keys (elements, symbol, kv cache) stay plain."""
    keys = formulas.keys()
    plain = [k for k in keys if named(k) is None]
    assert {k[0] for k in plain} == {"elements", "symbol", "kv cache"} and max(map(len, plain)) == 2
    assert [named(k).positional() for k in keys if named(k) is not None] == [k for k in keys if named(k) is not None]


@pytest.mark.parametrize("preset, dropout, fields", [
    ("phi-2", True, dict(parallel=True, shared_norm=True, attention_dropout=False, dtype="bf16")),
    ("pythia-6.9b", False, dict(parallel=True, shared_norm=False, attention_dropout=True)),
    ("llama2-7b", False, dict(mlp="swiglu", norm="RMSNorm", parallel=False))])
def test_a_ledgers_activations_row_is_keyed_by_name(preset, dropout, fields):
    from dataclasses import asdict
    from memledger import Ledger
    from memledger.formulas import ActivationsKey
    from memledger.ledger.ledger import row_specs
    ledger = Ledger(preset, seq_len=512, dropout=dropout)
    key = next(s.key for s in row_specs(ledger.structure) if s.name == "activations")
    assert isinstance(key, ActivationsKey) and fields.items() <= asdict(key).items()
    from memledger.core.exact import evaluate_expr       # the compiled table's value at the key, and SymPy's
    assert formulas.evaluate(key, ledger.values) == evaluate_expr(formulas.expr(key.positional()), ledger.values)
