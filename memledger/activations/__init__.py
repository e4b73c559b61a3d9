"""Activations: the saved-tensor inventory of a block, what lies outside the blocks, the backends'
conventions (CPU, CUDA, the article's), FLOPs, and what serving keeps (the KV cache, the
prefill's working buffer)."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'inventory': ('ARTICLE_INVENTORY', 'RELABELLED', 'Saved', 'activation_bytes', 'closed_form', 'inventory',
                  'per_layer_bytes', 'quadratic_share'),
    'outside': ('outside_inventory',),
    'backends': ('BACKENDS', 'Backend', 'get_backend'),
    'flops': (),
    'serving': ('kv_cache_expr', 'working_expr'),
})
