import matplotlib

matplotlib.use("Agg")

from memledger.ledger import Ledger
from memledger.plots import activations_vs_seq, layer_breakdown, ledger_bars, parameter_breakdown


def test_ledger_bars_stack_to_the_gpu_total():
    ledger = Ledger("article-7b")
    fig = ledger_bars({"a": ledger})
    ax = fig.axes[0]
    top = max(p.get_y() + p.get_height() for p in ax.patches)
    assert abs(top - ledger.totals["gpu"] / 1e9) < 1e-6
    assert ax.lines[0].get_ydata()[0] == 80.0       # the A100 line


def test_activation_curves_add_up():
    ax = activations_vs_seq().axes[0]
    linear, quadratic, total = (line.get_ydata() for line in ax.lines)
    assert abs((linear + quadratic - total).max()) < 1e-9
    assert quadratic[-1] > linear[-1]              # at S = 8192 the S^2 tensors dominate


def test_layer_breakdown_has_fifteen_rows():
    assert len(layer_breakdown().axes[0].patches) == 15


def test_parameter_breakdown_sums_to_count():
    from memledger.architecture import get_preset
    ax = parameter_breakdown(["llama2-7b"]).axes[0]
    assert abs(sum(p.get_height() for p in ax.patches) - get_preset("llama2-7b").computed_params / 1e9) < 1e-9
