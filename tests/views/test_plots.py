import matplotlib
import pytest

matplotlib.use("Agg")

from memledger.models.presets import get_preset  # noqa: E402
from memledger.article.claims import RELABEL_NOTE  # noqa: E402
from memledger.ledger.ledger import Ledger  # noqa: E402
from memledger.views.plots import (PALETTE, activations_vs_seq, colour, largest_fit_chart, layer_breakdown,  # noqa: E402
                             ledger_bars, parameter_breakdown, zero_states_vs_dp)
from memledger.states.recipes import RECIPES  # noqa: E402

pytestmark = pytest.mark.slow


def test_ledger_bars_stack_to_the_gpu_total():
    ledger = Ledger("article-7b", scope="layers")
    ax = ledger_bars({"a": ledger}).axes[0]
    top = max(p.get_y() + p.get_height() for p in ax.patches)
    assert abs(top - 144.601641984) < 1e-9            # 112 + 30.601641984 + 2 GB (article: ~144)
    assert ax.lines[0].get_ydata()[0] == 81920 * 2**20 / 1e9     # the A100 line: 81,920 MiB (nvidia-smi)


def test_one_colour_per_component_in_every_figure():
    def colours(fig):
        return {c.get_label(): c.patches[0].get_facecolor() for c in fig.axes[0].containers}
    a = colours(ledger_bars({"plain": Ledger("article-7b")}))
    b = colours(ledger_bars({r: Ledger(n_params=7 * 10**9, recipe=r, overhead_bytes=0) for r in RECIPES}))
    assert a["BF16 parameters"] == b["BF16 parameters"] and a["Adam first moment m"] == b["Adam first moment m"]
    assert len({a[k] for k in a}) == len(a)          # distinct components, distinct colours
    with pytest.raises(ValueError, match="PALETTE"):
        colour("a row nobody coloured")


def _boxes(fig, texts):
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    return [t.get_window_extent(renderer) for t in texts if t.get_text()]


def test_gpu_label_is_in_the_legend_not_over_the_bars():
    fig = ledger_bars({"nothing": Ledger("article-7b"), "full": Ledger("article-7b", recompute="full")})
    ax = fig.axes[0]
    assert len(ax.texts) == 0                          # no annotation inside the axes
    assert any("85.8993 GB" in t.get_text() for t in ax.get_legend().get_texts())    # 80 GiB


def test_recipe_labels_do_not_collide():
    fig = ledger_bars({r: Ledger(n_params=7 * 10**9, recipe=r, overhead_bytes=0) for r in RECIPES})
    boxes = _boxes(fig, fig.axes[0].get_xticklabels())
    assert len(boxes) == len(RECIPES)
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])


def test_activation_curves_add_up():
    ax = activations_vs_seq().axes[0]
    linear, quadratic, total = (line.get_ydata() for line in ax.lines)
    assert abs((linear + quadratic - total).max()) < 1e-9
    assert quadratic[-1] > linear[-1]              # at S = 8192 the S^2 tensors dominate
    # at S = 2048 (article): 32 x 2048 x 4096 x 34 B linear, 32 x 5 x 32 x 2048^2 B quadratic
    s = ax.lines[0].get_xdata()
    assert abs(float(__import__("numpy").interp(2048, s, total)) - 32 * 2048 * 4096 * 114 / 1e9) < 0.05


def test_layer_breakdown_uses_the_tensors_autograd_keeps():
    ax = layer_breakdown().axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert len(ax.patches) == 15 and not any(name in label for name in RELABEL_NOTE for label in labels)
    assert abs(sum(p.get_width() for p in ax.patches) - 2048 * 4096 * 114 / 2**20) < 1e-9   # 912 MiB
    assert PALETTE["quadratic in S"] in {matplotlib.colors.to_hex(p.get_facecolor()) for p in ax.patches}


def test_parameter_breakdown_sums_to_count():
    ax = parameter_breakdown(["llama2-7b"]).axes[0]
    assert abs(sum(p.get_height() for p in ax.patches) - 6_738_415_616 / 1e9) < 1e-9   # released checkpoint
    assert get_preset("llama2-7b").computed_params == 6_738_415_616


def test_parts_bars_stack_to_each_views_total_in_one_palette():
    from memledger.calculators import get_convention
    from memledger.ledger.inference import Inference
    from memledger.views.plots import parts_bars
    views = {"ledger": Ledger("article-7b", scope="layers"),
             "ds": get_convention("deepspeed-zero2").estimate(Ledger(n_params=7 * 10**9)),
             "serving": Inference("llama2-7b")}
    fig = parts_bars(views, {"A100": 80 * 10**9, "24 GB": 24 * 10**9})
    ax = fig.axes[0]
    right = {}
    for bar in ax.patches:
        y = round(bar.get_y() + bar.get_height() / 2)
        right[y] = max(right.get(y, 0), bar.get_x() + bar.get_width())
    # top to bottom: 16P + ACT + 2 GB; 2P + int(18P/N) (DeepSpeed, one GPU); BF16 Llama-2-7b + KV + buffer + 2 GB
    assert abs(right[2] - (112 + 32 * 2048 * 4096 * 114 / 1e9 + 2)) < 1e-9
    assert abs(right[1] - 140) < 1e-9
    assert right[0] > 2 * 6.738415616 + 2
    colours = {c.get_label(): c.patches[0].get_facecolor() for c in ax.containers}
    assert colours["weights"] == matplotlib.colors.to_rgba(PALETTE["weights"])
    assert len(set(colours.values())) == len(colours)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "A100 (80 GB)" in labels and "24 GB" in labels


def test_step_timeline_stacks_to_the_step_totals():
    from memledger.views.plots import step_timeline
    step = Ledger("llama2-7b", batch_size=2).step("cuda")
    fig = step_timeline(step)
    ax = fig.axes[0]
    x, by_kind, marks = step.series()
    assert (sum(by_kind.values()) == step.totals).all()             # the kinds partition every moment
    assert max(sum(by_kind.values())) == step.peak.bytes
    assert ax.lines[0].get_ydata()[0] == 81920 * 2**20 / 1e9        # the A100's 80 GiB
    assert len(marks) == 4 and sorted(marks.values()) == list(marks.values())


def test_zero_lines_follow_the_papers_formulas():
    # ZeRO Sec. 5 with K = 12: 16P, 4P + 12P/N_d, 2P + 14P/N_d, 16P/N_d (P = 7e9 -> GB)
    ax = zero_states_vs_dp(max_dp=64).axes[0]
    lines = {line.get_label(): line for line in ax.lines}
    at8 = {k: lines[k].get_ydata()[list(lines[k].get_xdata()).index(8)] for k in ("no ZeRO", "ZeRO-1", "ZeRO-2", "ZeRO-3")}
    assert at8 == pytest.approx({"no ZeRO": 112, "ZeRO-1": 28 + 84 / 8, "ZeRO-2": 14 + 98 / 8, "ZeRO-3": 112 / 8})
    assert lines["ZeRO-3"].get_color() == PALETTE["ZeRO-3"]
    assert ax.get_xscale() == "log"


def test_fit_chart_leaves_out_what_does_not_fit():
    gb = 10**9
    ax = largest_fit_chart({"llama3-8b": {24 * gb: None, 80 * gb: 2, 141 * gb: 5},
                            "mixtral-8x7b": {24 * gb: None, 80 * gb: None}}, "largest micro-batch").axes[0]
    assert [line.get_label() for line in ax.lines] == ["llama3-8b"]
    assert list(ax.lines[0].get_xdata()) == [80.0, 141.0] and list(ax.lines[0].get_ydata()) == [2, 5]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["24.0", "80.0", "141.0"]      # one decimal: 79.6 GiB
