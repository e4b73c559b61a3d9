"""The source article audited: its claims recomputed, the book's glue helpers, surveys of real
models and the fine-tuning comparison."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'claim': (),
    'claims': ('CLAIMS',),
    'book': (),
    'survey': (),
    'finetune': (),
    'knobs': (),
})
