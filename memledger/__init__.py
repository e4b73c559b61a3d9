"""memledger: GPU training memory of transformers, derived symbolically.

    import memledger as ml
    ml.Ledger("article-7b")                 # the article's ~144 GB ledger, per GPU
    ml.get_recipe("bf16-adamw").bytes_per_param        # 2 + 2 + 4 + 4 + 4 = 16
    ml.per_layer_bytes(ml.inventory())      # B*S*d*(34 + 5HS/d) at F = 4d

Data flows one way: symbols -> recipes/architecture -> model states and
activations -> ledger -> views (tables, CLI, claims). Names are imported on
first use (PEP 562), so that ``import memledger`` and the command line stay
fast: SymPy is loaded only when a formula is asked for.
"""
from importlib import import_module

__version__ = "0.2.0"

#: public name -> the module that defines it
_EXPORTS = {
    "activations": ("ARTICLE_INVENTORY", "RELABELLED", "Saved", "activation_bytes", "closed_form", "inventory",
                    "per_layer_bytes", "quadratic_share"),
    "architecture": ("PRESETS", "Architecture", "all_presets", "config_presets", "preset_names", "get_preset",
                     "param_count_expr"),
    "conventions": ("CONVENTIONS", "ERRATA", "Setup", "get_convention"),
    "fitting": ("fit",),
    "lora": ("LoraConfig", "LoraLedger", "qlora"),
    "inference": ("Inference",),
    "ledger": ("Ledger", "Row", "sweep"),
    "model_states": ("state_specs", "zero_formula"),
    "recipes": ("RECIPES", "ALL_RECIPES", "FINETUNE_RECIPES", "Recipe", "get_recipe"),
    "hardware": ("GPU_MEMORY", "LINKS", "NOMINAL_MEMORY"),
    "transfer": ("Traffic",),
    "step": ("Step",),
    "outside": ("outside_inventory",),
    "backends": ("BACKENDS", "conventions"),
    "units": ("format_bytes", "in_unit"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
_MODULES = ("activations", "architecture", "backends", "book", "choices", "claim", "claims", "communication", "conventions",
            "display", "dtypes", "evaluate", "features", "fitting", "flops", "formulas", "hardware", "hf_config",
            "host_optimizer", "inference", "ledger", "lora", "measure", "model_states", "outside", "parameters", "pipeline",
            "plots", "recipes", "step", "symbols", "tensors", "transfer", "units", "webcalc", "widgets")
__all__ = sorted(_HOME) + list(_MODULES)


def __getattr__(name):
    if name in _HOME:
        return getattr(import_module(f".{_HOME[name]}", __name__), name)
    if name in _MODULES:
        return import_module(f".{name}", __name__)
    raise AttributeError(f"module 'memledger' has no attribute {name!r}")


def __dir__():
    return __all__
