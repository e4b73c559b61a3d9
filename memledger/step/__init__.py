"""The step timeline: what is live at every op of one training step, and its peak (structure, op
programs, one block, the head and loss, the optimizer, the timeline, the peak cached per structure)."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'timeline': ('Step', 'LANDMARKS'),
    'vocab': (),
    'structure': (),
    'build': (),
    'ops': (),
    'block': (),
    'norms': (),
    'outer': (),
    'params': (),
    'trace': (),
    'cache': ('step_peak',),
    'table': (),
})
