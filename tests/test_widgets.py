import ipywidgets as w

from memledger.widgets import STATIC_NOTE, controls, explorer, render


def test_explorer_updates_on_change():
    box = explorer("article-7b")
    grid, output = box.children[1], box.children[2]
    assert "does not fit" in output.value
    recompute = next(c for c in grid.children if c.description == "recompute")
    offload = next(c for c in grid.children if c.description == "offload optimizer")
    recompute.value, offload.value = "full", "cpu"
    assert ">fits<" in output.value and "CPU" in output.value


def test_controls_cover_the_setup():
    names = set(controls())
    assert {"arch", "batch_size", "seq_len", "recipe", "recompute", "zero_stage", "dp", "offload_optimizer",
            "gpu"} <= names


def test_invalid_setting_shows_the_error():
    values = {k: c.value for k, c in controls().items()}
    values["offload_placement"] = "elsewhere"
    values["offload_optimizer"] = "cpu"
    assert "offload_placement must be one of" in render(values)


def test_static_note_says_a_kernel_is_needed():
    assert "kernel" in STATIC_NOTE
    assert isinstance(explorer().children[0], w.HTML)
