"""memledger: GPU training memory of transformers, derived symbolically.

    import memledger as ml
    ml.Ledger("article-7b")                 # the article's ~144 GB ledger, per GPU
    ml.get_recipe("bf16-adamw").bytes_per_param        # 2 + 2 + 4 + 4 + 4 = 16
    ml.per_layer_bytes(ml.inventory())      # B*S*d*(34 + 5HS/d) at F = 4d

Packages by idea, arrows one way (an import-linter contract in pyproject.toml):
core -> models -> states, activations -> formulas -> step -> ledger -> answers, calculators, pytorch
-> measure -> views, article -> cli. Names load on first use (PEP 562), so that ``import memledger`` and the
command line stay fast: SymPy is loaded only when a formula is asked for.
"""
from .core.lazy import lazy

__version__ = "0.3.0"

__getattr__, __dir__, __all__ = lazy(__name__, {
    "activations.inventory": ("ARTICLE_INVENTORY", "RELABELLED", "Saved", "activation_bytes", "closed_form",
                              "inventory", "per_layer_bytes", "quadratic_share"),
    "activations.outside": ("outside_inventory",),
    "activations.backends": ("BACKENDS",),
    "models.architecture": ("Architecture",),
    "models.parameters": ("param_count_expr",),
    "models.presets": ("PRESETS", "all_presets", "config_presets", "preset_names", "get_preset"),
    "states.recipes": ("RECIPES", "ALL_RECIPES", "FINETUNE_RECIPES", "get_recipe"),
    "states.recipe": ("Recipe",),
    "states.placement": ("state_specs", "zero_formula"),
    "ledger.ledger": ("Ledger", "sweep"),
    "core.rows": ("Row", "Rows"),
    "ledger.lora": ("LoraConfig", "LoraLedger", "qlora"),
    "ledger.inference": ("Inference",),
    "ledger.hardware": ("GPU_MEMORY", "LINKS", "NOMINAL_MEMORY"),
    "ledger.transfer": ("Traffic",),
    "step.timeline": ("Step",),
    "answers.fit": ("fit",),
    "intake": ("from_config",),
    "answers.verdict": ("MARGIN", "assess"),
    "calculators": ("CONVENTIONS", "ERRATA", "ConventionInputs", "get_convention"),
    "core.units": ("format_bytes", "in_unit"),
    "formulas": (),
    "core": (), "models": (), "states": (), "step": (), "ledger": (), "answers": (), "pytorch": (), "measure": (),
    "views": (), "cli": (), "article": (),
})
