"""memledger: GPU training memory of transformers, derived symbolically.

    import memledger as ml
    ml.Ledger("article-7b")                 # the article's ~144 GB ledger, per GPU
    ml.get_recipe("bf16-adamw").bytes_per_param        # 2 + 2 + 4 + 4 + 4 = 16
    ml.per_layer_bytes(ml.inventory())      # B*S*d*(34 + 5HS/d) at F = 4d

Data flows one way: symbols -> recipes/architecture -> model states and
activations -> ledger -> views (tables, CLI, claims).
"""
from . import architecture, book, claims, dtypes, evaluate, flops, hardware, symbols, units
from .activations import (ARTICLE_INVENTORY, RELABELLED, Saved, activation_bytes, closed_form, inventory,
                          per_layer_bytes, quadratic_share)
from .architecture import PRESETS, Architecture, get_preset, param_count_expr
from .ledger import Ledger, Row, sweep
from .model_states import state_rows, zero_formula
from .recipes import RECIPES, Recipe, get_recipe
from .hardware import GPU_MEMORY, LINKS
from .transfer import Traffic
from .units import format_bytes, in_unit

__version__ = "0.1.0"
__all__ = [
    "ARTICLE_INVENTORY", "RELABELLED", "Saved", "activation_bytes", "closed_form", "inventory", "per_layer_bytes",
    "quadratic_share", "PRESETS", "Architecture", "get_preset", "param_count_expr", "Ledger", "Row", "sweep",
    "state_rows", "zero_formula", "RECIPES", "Recipe", "get_recipe", "GPU_MEMORY", "LINKS", "Traffic",
    "format_bytes", "in_unit", "architecture", "book", "claims", "dtypes", "evaluate", "flops",
    "hardware", "symbols", "units",
]
