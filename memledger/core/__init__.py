"""Notation and machinery every other package uses: the symbols, units (GB vs GiB), dtypes, the vocabulary
(StrEnums), input checks, the one Row type, exact evaluation (keyed formulas and their generated code), the one
table type and lazy loading."""
from .lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'symbols': ('NOTATION',),
    'units': ('format_bytes', 'in_unit', 'GB', 'GiB'),
    'dtypes': (),
    'choices': (),
    'exact': (),
    'keyed': (),
    'compiled': (),
    'table': ('Table',),
    'rows': ('Row', 'Rows'),
    'vocabulary': ('Device', 'Group', 'Kind', 'Norm', 'Role', 'Style'),
    'lazy': (),
})
