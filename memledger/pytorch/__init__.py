"""PyTorch's own numbers: the reference decoder and loops, measuring them (saved-tensor hooks,
MemTracker under FakeTensorMode; FSDP2, tensor parallelism and DDP on a fake or one-rank process group) and
comparing with memledger. Imported only where torch is installed."""
from ..core.lazy import lazy

__getattr__, __dir__, __all__ = lazy(__name__, {
    'reference': ('RefConfig',),
    'measure': (),
    'compare': (),
    'distributed': (),
})
