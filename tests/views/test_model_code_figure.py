"""Chapter 19's figure: what one layer saves, per implementation, stacked by the part of the layer that saved it.

The fast test checks the drawing against numbers written out here; the slow one draws the libraries' own
measurement (:func:`memledger.pytorch.model_code.saved_by_part`, transformers', torchtune's and LitGPT's own models
under ``FakeTensorMode``) and checks each bar's segments against it, and each bar's height against the other
harness's whole-layer figure (:mod:`memledger.pytorch.libraries`: the model with two layers minus the model with
one), so a census that lost or double-counted a tensor, or a figure that stacked the wrong part, fails.
"""
import pytest

from memledger.views.plots import saved_parts_bars


def segments(fig):
    """{(bar index, part): height} and {bar index: top} of the figure's stacked bars (MB)."""
    ax = fig.axes[0]
    heights, tops = {}, {}
    for container in ax.containers:
        for x, bar in enumerate(container.patches):
            heights[(x, container.get_label())] = bar.get_height()
            tops[x] = max(tops.get(x, 0), bar.get_y() + bar.get_height())
    return heights, tops


def test_bars_stack_each_part_in_its_colour():
    import matplotlib
    from memledger.views.plots import PALETTE
    fig = saved_parts_bars({"a": {"norms": 10**6, "attention": 2 * 10**6, "MLP": 3 * 10**6, "other": 0},
                            "b": {"norms": 4 * 10**6, "attention": 0, "MLP": 1, "other": 5 * 10**6}})
    heights, tops = segments(fig)
    assert heights[(0, "attention")] == 2 and heights[(1, "other")] == 5 and heights[(1, "MLP")] == pytest.approx(1e-6)
    assert tops == {0: 6, 1: pytest.approx(9 + 1e-6)}
    colours = {c.get_label(): c.patches[0].get_facecolor() for c in fig.axes[0].containers}
    assert colours["norms"] == matplotlib.colors.to_rgba(PALETTE["norms"])
    assert [t.get_text() for t in fig.axes[0].texts] == ["6", "9"]


@pytest.mark.slow
def test_bars_are_the_libraries_own_measurement():
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    pytest.importorskip("torchtune")
    pytest.importorskip("litgpt")
    from memledger.pytorch.libraries import saved_per_layer
    from memledger.pytorch.torchtune_litgpt import layer_saved
    from memledger.pytorch.model_code import FAMILY, PARTS, saved_by_part
    small = dict(d=256, H=4, F=688, V=1000, batch=2, seq=64)
    runs = {"transformers sdpa": ("hf", "sdpa"), "transformers eager": ("hf", "eager"),
            "torchtune": ("torchtune", "sdpa"), "LitGPT": ("litgpt", "sdpa")}
    measured = {label: saved_by_part(lib, **small, attn=attn) for label, (lib, attn) in runs.items()}
    whole = {label: saved_per_layer("hf", **small, attn=attn)["layer"] if lib == "hf"
             else layer_saved(lib, FAMILY[lib], **small)["layer"] for label, (lib, attn) in runs.items()}
    heights, tops = segments(saved_parts_bars(measured, unit="B"))
    for x, label in enumerate(runs):
        assert sum(measured[label][p] for p in PARTS) == measured[label]["layer"] == whole[label]
        assert tops[x] == whole[label]
        for part in PARTS:
            assert heights.get((x, part), 0) == measured[label][part]
    # what differs is where the sources say (docs: chapter 19): the norms (FP32 x*rstd in torchtune and LitGPT),
    # LitGPT's attention (the fused QKV storage), eager attention (the S x S softmax outputs); the MLP is the same
    assert len({m["MLP"] for m in measured.values()}) == 1
    assert measured["torchtune"]["attention"] == measured["transformers sdpa"]["attention"]
    assert measured["LitGPT"]["norms"] - measured["torchtune"]["norms"] == 2 * 4 * 256      # two FP32 weight copies
