from html import unescape
import json
import re
import shlex

import ipywidgets as w
import pytest

from memledger.cli.main import main
from memledger.views.controls import CONTROLS, defaults
from memledger.views.widgets import STATIC_NOTE, controls, explorer, render


def test_explorer_updates_on_change():
    box = explorer("article-7b")
    grid, output = box.children[1], box.children[2]
    assert "does not fit" in output.value
    recompute = next(c for c in grid.children if c.description == "recompute")
    offload = next(c for c in grid.children if c.description == "offload optimizer")
    recompute.value, offload.value = "full", "cpu"
    assert ">fits, " in output.value and "CPU" in output.value
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


#: Settings that the explorer judges by each measure: the article's nominal 7e9 parameters, a step the timeline
#: models (with and without recomputation, offload, FlashAttention), a mixture of experts it does not model.
SETUPS = [
    {},
    dict(arch="llama2-7b", batch_size=2, seq_len=4096, zero_stage=3, dp=8, offload_optimizer="cpu"),
    dict(arch="gpt2", batch_size=61, seq_len=1024, recipe="fp32-adamw", flash_attention=True, gpu="h200"),
    dict(arch="llama3-8b", recompute="full", recipe="bf16-adam-8bit", gpu="rtx-4090"),
    dict(arch="mixtral-8x7b", recompute="selective", zero_stage=3, dp=64),
]


def shown(html):
    """What an explorer's HTML shows: the judged bytes and measure of its verdict, and its command line."""
    verdict = re.search(r'class="memledger-verdict" data-measure="(\w+)" data-bytes="(\d+)"', html)
    command = re.search(r'class="memledger-cli">On the command line: <code[^>]*>([^<]*)</code>', html)
    return verdict and (verdict[1], int(verdict[2])), command and unescape(command[1])


def verdict_line(html):
    """The explorer's verdict as text: the first paragraph of the verdict block, tags dropped."""
    paragraph = re.search(r'class="memledger-verdict"[^>]*><p>(.*?)</p>', html)[1]
    return unescape(re.sub(r"<[^>]+>", "", paragraph))


@pytest.mark.parametrize("changes", SETUPS, ids=lambda c: ",".join(c) or "default")
def test_explorer_shows_the_verdict_of_its_command_line(capsys, changes):
    html = render({**defaults(), **changes})
    (measure, judged), command = shown(html)
    assert main(shlex.split(command)[1:] + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (measure, judged) == (data["measure"], data["judged_bytes"])
    assert main(shlex.split(command)[1:]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines()
                if t.startswith(("fits, ", "no fit: ", "does not fit: ")))
    assert line == verdict_line(html) + "."       # in the same words


def test_explorer_measures_include_the_peak_and_the_sum():
    measures = {shown(render({**defaults(), **c}))[0][0] for c in SETUPS}
    assert measures == {"nominal", "peak", "total"}       # the article's nominal 7e9, a modelled step, MoE


def test_explorer_command_line_follows_the_controls():
    box = explorer("gpt2")
    grid, output = box.children[1], box.children[2]
    assert shown(output.value)[1].startswith("memledger ledger --preset gpt2 --batch 1 ")
    assert "--flash-attention" not in shown(output.value)[1]
    next(c for c in grid.children if c.description == "batch B").value = 8
    next(c for c in grid.children if c.description == "FlashAttention").value = True
    assert "--batch 8 " in shown(output.value)[1] and "--flash-attention" in shown(output.value)[1]


def test_a_refused_value_shows_the_error_and_no_command():
    html = render({**defaults(), "recipe": "no-such-recipe"})
    assert "unknown recipe 'no-such-recipe'" in unescape(html) and shown(html) == (None, None)
