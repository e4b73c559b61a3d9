"""The little of NumPy that building a step's programs uses, for Pyodide (the site's copy has no NumPy).

Shipped as ``numpy.py`` next to memledger in the calculator's Python archive (_ext/memledger_site.py), so
that :func:`memledger.step.cache.step_record` runs in the browser: :mod:`memledger.step.build` and
:mod:`memledger.step.trace` make integer vectors and a matrix of counts with ``array`` and ``zeros`` and
fill them item by item; the record reads them back as Python ints. Anything else fails loudly
(AttributeError), which tests/book/test_browser.py would show as the calculator's error.
"""
int64 = "int64"


class ndarray(list):
    """A row-major list of ints (or of rows): ``a[i]``, ``a[i, j]``, iteration and len, nothing more."""

    def __getitem__(self, index):
        if isinstance(index, tuple):
            row, column = index
            return list.__getitem__(self, row)[column]
        return list.__getitem__(self, index)

    def __setitem__(self, index, value):
        if isinstance(index, tuple):
            row, column = index
            list.__getitem__(self, row)[column] = int(value)
        else:
            list.__setitem__(self, index, int(value))


def zeros(shape, dtype=None):
    if isinstance(shape, tuple):
        rows, columns = shape
        return ndarray(ndarray([0] * columns) for _ in range(rows))
    return ndarray([0] * shape)


def array(values, dtype=None):
    return ndarray(int(v) for v in values)
