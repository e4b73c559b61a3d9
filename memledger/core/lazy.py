"""Names loaded on first use (PEP 562), so that ``import memledger`` and the command line stay fast:
SymPy and NumPy are imported only when a formula or a sweep is asked for."""
from importlib import import_module

__all__ = ["lazy"]


def lazy(package: str, exports: dict):
    """``(__getattr__, __dir__, __all__)`` for ``package``: ``exports`` maps each submodule (dotted, relative)
    to the public names it defines; a submodule is an attribute too, imported on first use."""
    home = {name: module for module, names in exports.items() for name in names}
    modules = {module.split(".")[0] for module in exports}

    def __getattr__(name):
        if name in home:
            return getattr(import_module(f"{package}.{home[name]}"), name)
        if name in modules:
            return import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    names = sorted(home) + sorted(modules)
    return __getattr__, lambda: names, names
