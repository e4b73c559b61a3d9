"""The ledger: one setup's rows (model states, activations, overhead) with exact bytes per device,
and its kin: inference, LoRA/QLoRA, host transfers, the host optimizer, GPU capacities."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'ledger': ('Ledger', 'sweep'),
    'inference': ('Inference',),
    'lora': ('LoraConfig', 'LoraLedger', 'qlora'),
    'transfer': ('Traffic',),
    'host_optimizer': (),
    'hardware': ('GPU_MEMORY', 'LINKS', 'NOMINAL_MEMORY'),
    'table': (),
})
