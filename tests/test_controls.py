"""One description of the interactive controls, taken from the library's own tuples and defaults."""
import json
import shlex

import pytest

from memledger.activations.inventory import RECOMPUTE
from memledger.models.presets import preset_names
from memledger.cli.main import main
from memledger.views.controls import BY_FIELD, CLI_FLAGS, CONTROLS, cli_command, defaults, ledger_settings
from memledger.ledger.hardware import GPU_MEMORY
from memledger.ledger.ledger import Ledger
from memledger.states.placement import OFFLOAD_DEVICES, PLACEMENTS, ZERO_STAGES
from memledger.states.recipes import DEFAULT_RECIPE, RECIPES
from memledger.core.units import LIMIT


def test_options_are_the_library_tuples():
    assert BY_FIELD["arch"].options == tuple(preset_names())
    assert BY_FIELD["recipe"].options == tuple(RECIPES) and BY_FIELD["recipe"].default == DEFAULT_RECIPE
    assert BY_FIELD["recompute"].options == RECOMPUTE
    assert BY_FIELD["zero_stage"].options == ZERO_STAGES
    assert BY_FIELD["offload_optimizer"].options == OFFLOAD_DEVICES
    assert BY_FIELD["offload_placement"].options == PLACEMENTS
    assert BY_FIELD["gpu"].options == tuple(GPU_MEMORY)


def test_defaults_are_the_ledger_defaults():
    assert Ledger(**ledger_settings(defaults())) == Ledger("article-7b")
    assert all(c.default in c.options for c in CONTROLS if not c.is_count)


def test_every_ledger_field_is_a_ledger_keyword():
    fields = set(Ledger.__dataclass_fields__)
    assert set(ledger_settings(defaults())) <= fields


def test_counts_are_read_as_the_cli_reads_them():
    batch = BY_FIELD["batch_size"]
    assert batch.parse("7e2") == 700 and batch.parse(str(LIMIT)) == LIMIT
    for text in ("1e30", "0", "1.5", "abc", str(LIMIT + 1)):
        with pytest.raises(ValueError, match="^batch_size must be a positive integer"):
            batch.parse(text)


def test_choices_refuse_lookalikes():
    with pytest.raises(ValueError, match="zero_stage must be one of 0, 1, 2, 3"):
        BY_FIELD["zero_stage"].parse(True)
    with pytest.raises(ValueError, match="arch must be one of"):
        defaults("h100")
    assert BY_FIELD["zero_stage"].parse(2) == 2


#: Settings of the controls, each away from its default in some field; the last ones the CLI refuses.
CLI_SETUPS = [
    {},
    dict(arch="llama2-7b", batch_size=4, seq_len=4096, zero_stage=2, dp=8, offload_optimizer="nvme"),
    dict(arch="gpt2", batch_size=61, seq_len=1024, recipe="fp32-adamw", flash_attention=True, gpu="h200"),
    dict(recompute="full", offload_optimizer="cpu", offload_placement="zero-offload", gpu="rtx-4090"),
    dict(arch="mixtral-8x7b", recompute="selective", zero_stage=3, dp=64, recipe="bf16-adam-8bit"),
    dict(arch="llama2-13b", batch_size=LIMIT),
]


def cli_json(capsys, command: str) -> dict:
    """``command`` (from :func:`cli_command`) run through the CLI's ``main`` with ``--json``."""
    words = shlex.split(command)
    assert words[:2] == ["memledger", "ledger"]
    status = main(words[1:] + ["--json"])
    out, err = capsys.readouterr()
    assert (status, err) == (0, ""), command
    return json.loads(out)


@pytest.mark.parametrize("changes", CLI_SETUPS, ids=lambda c: ",".join(c) or "default")
def test_cli_command_gives_the_same_ledger(capsys, changes):
    values = {**defaults(), **changes}
    data = cli_json(capsys, cli_command(values))
    assert data["inputs"] == Ledger(**ledger_settings(values)).inputs()
    assert data["rows"] == Ledger(**ledger_settings(values)).to_dict()["rows"]
    assert data["gpu_memory"] == GPU_MEMORY[values["gpu"]]


def test_cli_command_names_the_model_and_what_differs_from_the_defaults():
    assert cli_command(defaults()) == cli_command({}) == "memledger ledger --preset article-7b"
    assert cli_command({**defaults("gpt2"), "flash_attention": True, "dp": 8}) == \
        "memledger ledger --preset gpt2 --flash-attention --dp 8"
    assert set(CLI_FLAGS) == set(BY_FIELD)


def test_cli_command_refuses_what_is_not_a_control():
    with pytest.raises(ValueError, match="unknown control field.*: tp"):
        cli_command({"tp": 2})
    with pytest.raises(ValueError, match="flash_attention must be one of"):
        cli_command({"flash_attention": "yes"})
