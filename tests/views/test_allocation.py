"""The allocator's figure draws the rules of memledger.ledger.allocator: whole unsplit blocks only above 10 MiB."""
import pytest

import matplotlib

matplotlib.use("Agg")

from memledger.core.units import MiB                                     # noqa: E402
from memledger.views.allocation import allocator_chart, request_sizes    # noqa: E402

pytestmark = pytest.mark.slow


def test_chart_has_both_panels_and_the_boundaries():
    fig = allocator_chart(16 * MiB)
    top, bottom = fig.axes
    unsplit, rounded = (c.get_offsets() for c in top.collections)
    beyond = [x for (x, y), (_, r) in zip(unsplit, rounded) if y > r]
    assert beyond and min(beyond) > 10 * MiB          # a segment of its own, less than 1 MiB left: unsplit
    assert {1 * MiB, 10 * MiB} <= set(request_sizes(16 * MiB))
    assert bottom.get_xscale() == "log"
