"""The conceptual figures draw the library's objects: each checked against arithmetic from the papers written
out here (Korthikanti et al. 2022 Eq. 1 and Table 2, the ZeRO paper's per-GPU states, Megatron-LM's schedules),
not against the figure's own code."""
from fractions import Fraction

import matplotlib
import pytest

matplotlib.use("Agg")

from memledger.ledger.ledger import Ledger  # noqa: E402
from memledger.models.presets import get_preset  # noqa: E402
from memledger.views import figures  # noqa: E402

pytestmark = pytest.mark.slow

GPT = get_preset("article-7b").with_changes(n_params=None)        # d 4096, H 32, F 4d, V 32000, counted
d, H, V, S = 4096, 32, 32000, 2048
BLOCK = 12 * d * d + 13 * d                                        # a GPT block's parameters
GB, MiB = 10**9, 2**20


def test_a_blocks_saved_tensors_are_korthikantis_and_live_until_its_backward():
    step = Ledger(GPT.with_changes(n_layers=4)).step()
    rows = figures.lifetimes(step, layer=1)
    saved = [r for r in rows if r[4]]
    # Eq. 1 at B = 1: S d (34 + 5 H S / d) bytes per layer (1-byte masks, eager attention)
    assert sum(nbytes for _, nbytes, *_ in saved) == S * d * 34 + 5 * H * S * S
    ops = step.built.ops
    assert all(ops[born].phase == "forward" and ops[freed].phase == "backward" and ops[freed].layer == 1
               for _, _, born, freed, _ in saved)
    transients = {name for name, *_, s in rows if not s}
    assert {"scores QK^T", "scaled scores", "masked scores"} <= transients     # freed before the block returns
    fig = figures.block_lifetimes(step)
    assert len(fig.axes[0].get_yticklabels()) == len(rows) and not fig.axes[0].get_title()


def test_zero_partitions_are_the_papers_per_gpu_states():
    dp, P = 4, 7 * 10**9
    ax = figures.zero_partitions(Ledger(n_params=P, overhead_bytes=0), dp=dp).axes[0]
    bars = [p for p in ax.patches if p.get_height() > 0 and p.get_width() >= 0][:4 * dp * 3]
    per_gpu = [sum(p.get_width() for p in bars[3 * i:3 * i + 3]) for i in range(4 * dp)]
    # Rajbhandari et al. 2020, Sec. 5 (K = 12): 16P, 4P + 12P/N, 2P + 14P/N, 16P/N
    want = [16 * P, 4 * P + 12 * P // dp, 2 * P + 14 * P // dp, 16 * P // dp]
    for stage in range(4):
        for gpu in range(dp):
            assert per_gpu[stage * dp + gpu] == pytest.approx(want[stage] / GB)
    hatched = [p for p in bars if p.get_hatch()]
    assert len(hatched) == dp * (1 + 2 + 3)                          # stage k shards k roles on every GPU


def test_fsdp_schematic_holds_two_blocks_while_prefetching():
    t, params, grads = figures.fsdp_unsharded(GPT, blocks=4)
    root = 2 * (V * d + 2 * d)                                     # tied embedding and the final LayerNorm, BF16
    assert params.min() == root
    assert params.max() == root + 2 * 2 * BLOCK                    # the running block and the prefetched one
    assert grads.max() == 2 * 2 * BLOCK and grads[: len(grads) // 2].max() == 0   # gradients only in backward
    assert len(figures.fsdp_schematic(GPT).axes) == 2


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (4, 8, 2)])
def test_pipeline_figure_shows_the_chunks_in_flight(p, m, v):
    fig = figures.pipeline_schedules(p, m, interleave=2)
    flight = fig.axes[1] if v == 1 else fig.axes[3]
    lines = [line for line in flight.get_lines() if line.get_label().startswith("stage")]
    most = [max(line.get_ydata()) for line in lines]
    if v == 1:
        assert most == [min(p - r, m) for r in range(p)]                       # Korthikanti Sec. 4.2.3
    else:
        assert most == [min(2 * (p - r - 1) + (v - 1) * p + 1, m * v) for r in range(p)]   # Megatron's warm-up + 1
    gantt = fig.axes[0] if v == 1 else fig.axes[2]
    assert len(gantt.patches) == 2 * m * v * p                               # a forward and a backward per chunk


def test_tensor_parallel_split_sums_to_korthikantis_table_2():
    t = 4
    fig = figures.tensor_parallel_split(Ledger(GPT), t)
    right = fig.axes[1]
    groups = {}
    for container in right.containers:
        groups[container.get_label()] = sum(p.get_width() for p in container.patches)
    full, tp, tpsp = (Fraction(groups[k]).limit_denominator(10**6) for k in (
        "one GPU", f"tensor parallel, t = {t}", "+ sequence parallel"))
    sbh = S * d
    assert float(full) == pytest.approx(sbh * (34 + 5 * H * S / d) / MiB)
    assert float(tp) == pytest.approx(sbh * (10 + 24 / t + 5 * H * S / (d * t)) / MiB)
    assert float(tpsp) == pytest.approx(sbh * (34 / t + 5 * H * S / (d * t)) / MiB)
    assert set(figures.ROW_PARALLEL) <= set(t.get_text() for t in fig.axes[0].texts)


def test_loss_phase_peaks_with_three_fp32_logit_sized_tensors():
    step = Ledger(GPT).step()
    ax = figures.loss_tensors(step).axes[0]
    heights = {}
    for p in ax.patches:
        x = round(p.get_x() + p.get_width() / 2)
        heights[x] = max(heights.get(x, 0), p.get_y() + p.get_height())
    # log_softmax backward: its FP32 output, nll_loss's gradient and its own gradient (4 B x S x V each), the
    # final LayerNorm's and the LM head's BF16 inputs, three FP32 scalars (loss, total weight, loss gradient)
    assert max(heights.values()) == pytest.approx((3 * 4 * S * V + 2 * 2 * S * d + 3 * 4) / GB)
