"""The shape of memledger/step's code: no function over ~60 lines (the project's guide), so that each reads as the
operations it does (issue 27). A function is measured from its ``def`` to its last line, docstring included."""
import ast
from pathlib import Path

STEP = Path(__file__).resolve().parents[2] / "memledger" / "step"
#: The most lines a function (or method) of memledger/step may span.
MOST_LINES = 60


def long_functions(path: Path, most: int = MOST_LINES) -> list:
    """``module:function (lines)`` for each function or method in ``path`` spanning more than ``most`` lines."""
    return [f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1})"
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= most]


def test_no_function_of_the_step_spans_more_than_60_lines():
    found = [f for path in sorted(STEP.glob("*.py")) for f in long_functions(path)]
    assert found == []


def test_the_measure_sees_a_long_function(tmp_path):
    """A 61-line function is caught, a 60-line one is not."""
    for lines, caught in ((60, False), (61, True)):
        source = tmp_path / "m.py"
        source.write_text("def f():\n" + "    x = 1\n" * (lines - 2) + "    return x\n")
        assert bool(long_functions(source)) is caught
