"""Views: tables, figures, the interactive controls, the Jupyter explorer and the static calculator's data."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'display': (),
    'plots': (),
    'stepplots': (),
    'figures': (),
    'controls': (),
    'widgets': ('explorer',),
    'bigint': (),
    'webcalc': (),
    'webpeak': (),
})
