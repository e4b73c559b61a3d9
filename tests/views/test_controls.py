"""One description of the interactive controls, taken from the library's own tuples and defaults."""
import pytest

from memledger.activations.inventory import RECOMPUTE
from memledger.models.presets import preset_names
from memledger.views.controls import BY_FIELD, CONTROLS, defaults, ledger_settings
from memledger.ledger.hardware import GPU_MEMORY
from memledger.ledger.ledger import Ledger
from memledger.states.placement import OFFLOAD_DEVICES, PLACEMENTS, ZERO_STAGES
from memledger.states.recipes import DEFAULT_RECIPE, RECIPES
from memledger.core.units import LIMIT


def test_options_are_the_library_tuples():
    # every preset but those a ledger refuses (T5's encoder-decoder)
    assert BY_FIELD["arch"].options == tuple(n for n in preset_names() if n != "t5-base")
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
    fields = set(Ledger.keywords())
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
