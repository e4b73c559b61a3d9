"""Model states: the precision/optimizer recipes (what a run keeps per parameter) and their placement
under ZeRO sharding and offloading."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'recipe': ('Component', 'Recipe'),
    'recipes': ('RECIPES', 'ALL_RECIPES', 'FINETUNE_RECIPES', 'get_recipe'),
    'extra': (),
    'placement': ('state_specs', 'zero_formula'),
})
