"""The command line, one module per command group, and the options they share."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'main': (),
    'options': (),
    'step': (),
    'models': (),
    'compare': (),
    'paths': (),
})
