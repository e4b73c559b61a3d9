import ipywidgets as w

from memledger.views.controls import CONTROLS, defaults
from memledger.views.widgets import STATIC_NOTE, controls, explorer, render


def test_explorer_updates_on_change():
    box = explorer("article-7b")
    grid, output = box.children[1], box.children[2]
    assert "does not fit" in output.value
    recompute = next(c for c in grid.children if c.description == "recompute")
    offload = next(c for c in grid.children if c.description == "offload optimizer")
    recompute.value, offload.value = "full", "cpu"
    assert ">fits<" in output.value and "CPU" in output.value
    assert "the peak of a training step" in output.value        # the article's model: the timeline models it


def test_explorer_judges_the_sum_where_the_timeline_does_not_model_the_setup():
    html = render({**defaults(), "arch": "mixtral-8x7b"})             # mixture of experts
    assert "the sum of the rows at the end of the forward pass (the step timeline does not model" in html


def test_controls_are_the_shared_description():
    widgets = controls()
    assert list(widgets) == [c.field for c in CONTROLS]
    for c in CONTROLS:
        widget = widgets[c.field]
        assert widget.description == c.label and widget.value == c.default
        if c.is_count:
            assert (widget.min, widget.max) == (1, c.maximum)
        else:
            assert list(widget.options) == c.choices()


def test_invalid_setting_shows_the_error():
    values = defaults()
    values["offload_placement"] = "elsewhere"
    values["offload_optimizer"] = "cpu"
    assert "offload_placement must be one of" in render(values)


def test_error_messages_are_escaped():
    values = {**defaults(), "recipe": "<img src=x onerror=alert(1)>"}
    html = render(values)
    assert "unknown recipe" in html and "<img" not in html and "&lt;img" in html


def test_unknown_gpu_is_an_error_not_a_crash():
    assert "unknown GPU" in render({**defaults(), "gpu": "h100"})


def test_static_note_says_a_kernel_is_needed():
    assert "kernel" in STATIC_NOTE
    assert isinstance(explorer().children[0], w.HTML)
