"""``memledger step --json`` over the grid of tests/stepgolden.py gives, setup by setup, the exit status, the
peak, the landmarks and the sha256 of the whole canonical output recorded in tests/step/golden_step.jsonl, which
was generated before memledger/step was refactored (``python tests/stepgolden.py --write``). The snapshot is no
source of truth for the numbers (the step's PyTorch proofs are): it proves that a refactoring changed none. Twelve
setups spread over the grid run in the fast loop, the whole grid in the full suite."""
import pytest

from stepgolden import GRID, load, record

SNAPSHOT = load()


def test_the_snapshot_covers_the_grid():
    assert list(SNAPSHOT) == GRID
    steps = [r for r in SNAPSHOT.values() if r["exit"] == 0]
    assert len(steps) > 500 and len(SNAPSHOT) - len(steps) > 20     # mostly steps, some refusals


@pytest.mark.sample(12)
@pytest.mark.parametrize("line", GRID)
def test_step_json_matches_the_snapshot(line):
    got, want = record(line), SNAPSHOT[line]
    assert got.get("peak") == want.get("peak") and got.get("landmarks") == want.get("landmarks")
    assert got == want
