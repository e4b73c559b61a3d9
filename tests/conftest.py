"""Shared test configuration: nbval's notebook items are slow (each runs a kernel)."""
import pytest


def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.suffix == ".ipynb":
            item.add_marker(pytest.mark.slow)
