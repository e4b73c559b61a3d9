"""Answers to a practitioner's questions: what a verdict judges (the peak or the sum), the largest
setup that fits, parallel layouts, pipeline stages, communication."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'verdict': ('MARGIN', 'MEASURE', 'assess', 'judge'),
    'fit': ('fit',),
    'parallelism': (),
    'pipeline': (),
    'communication': (),
})
