"""cli_command: a setting of the controls as the `memledger ledger` command that reproduces it."""
from contextlib import redirect_stdout
import io
import json
import random
import shlex

import pytest

from memledger.cli.main import main
from memledger.ledger.hardware import GPU_MEMORY
from memledger.ledger.ledger import Ledger
from memledger.views.controls import BY_FIELD, CONTROLS, IGNORED_WHEN, cli_command, defaults, ledger_settings


def random_states(count, seed=18):
    rng = random.Random(seed)
    for _ in range(count):
        yield {c.field: rng.choice([1, 2, 7, 64, 10**18]) if c.is_count else rng.choice(c.options) for c in CONTROLS}


def run_json(command):
    argv = shlex.split(command)
    assert argv[:2] == ["memledger", "ledger"]
    out = io.StringIO()
    with redirect_stdout(out):
        status = main(argv[1:] + ["--json"])
    assert status == 0, command
    return json.loads(out.getvalue())


@pytest.mark.slow
@pytest.mark.parametrize("state", [defaults()] + list(random_states(24)))
def test_the_command_reproduces_the_state(state):
    data = run_json(cli_command(state))
    # a control the ledger ignores is left out of the command, so the CLI reads its default there
    ignored = {f: BY_FIELD[f].default for f, (other, value) in IGNORED_WHEN.items() if state[other] == value}
    expected = Ledger(**ledger_settings({**state, **ignored}))
    assert Ledger(**ledger_settings(state)).totals == expected.totals
    assert data["inputs"] == json.loads(json.dumps(expected.inputs()))
    assert data["totals"] == expected.totals
    assert data["gpu_memory"] == GPU_MEMORY[state["gpu"]]


def test_counts_are_written_as_the_cli_reads_them():
    command = cli_command({**defaults(), "batch_size": "7e2", "dp": " 8 "})
    assert "--batch 700" in command and "--dp 8" in command
    assert "--flash-attention" not in command
    assert "--flash-attention" in cli_command({**defaults(), "flash_attention": True})
    assert "--offload-placement" not in cli_command({**defaults(), "offload_placement": "zero-offload"})
    assert "--offload-placement zero-offload" in cli_command({**defaults(), "offload_placement": "zero-offload",
                                                              "offload_optimizer": "cpu"})


def test_a_bad_value_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="^batch_size must be a positive integer"):
        cli_command({**defaults(), "batch_size": "0"})
    with pytest.raises(ValueError, match="^recipe must be one of"):
        cli_command({**defaults(), "recipe": "sgd; rm -rf /"})
    assert set(BY_FIELD) == {c.field for c in CONTROLS}
