"""The model: its architecture (shape and features), parameter counts and tensors, Hugging Face
config.json files (read offline) and the named presets."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'architecture': ('Architecture',),
    'features': ('Features',),
    'parameters': ('param_count_expr',),
    'hf_config': (),
    'tensors': (),
    'presets': ('PRESETS', 'all_presets', 'get_preset', 'preset_names', 'config_presets'),
})
