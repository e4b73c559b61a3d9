"""bitsandbytes' optimizers in the step, **from source** (its kernels run on CUDA only: no reference run here).

Read off bitsandbytes-foundation/bitsandbytes at 95f9af30:

* **Block size: 256.** ``bitsandbytes/optim/optimizer.py`` ``Optimizer2State.init_state`` (lines 492-533):
  ``blocksize = 256``, ``blocks = (n // blocksize) + bool(n % blocksize)``, ``absmax1`` and ``absmax2`` FP32
  tensors of ``blocks`` elements; and the kernel the Python ``F.optimizer_update_8bit_blockwise`` reaches
  (``backends/cuda/ops.py`` ``_optimizer_update_8bit_blockwise_impl``, line 1118) is launched in
  ``csrc/ops.cu`` lines 154-175 as ``kOptimizerStatic8bit2StateBlockwise<T, OPTIMIZER, BLOCKSIZE_2STATE,
  NUM_2STATE>`` with ``#define BLOCKSIZE_2STATE 256``. The 2,048 of the paper (Dettmers et al. 2022) and of
  ``kQuantizeBlockwise``'s instantiations (``csrc/kernels.cu`` line 1713 on) is the general block-wise
  quantization's, not the optimizer's; the optimizer's CPU and Triton paths use 256 too
  (``backends/cpu/ops.py`` line 490, ``backends/triton/kernels_optim.py`` lines 613 and 760). 2,048 was the
  optimizer's block before commit aa57bd89 (2024-09-20; :mod:`memledger.states.extra`).
* **States** (``init_state``): a tensor of fewer than ``min_8bit_size`` (4,096) elements keeps FP32
  ``state1``/``state2`` (line 502, ``min_8bit_size=4096`` line 414; 8 bytes per element); a larger one uint8
  codes (1 byte each) plus the two absmax vectors, and the two 256-entry FP32 quantization maps ``name2qmap["dynamic"]`` and
  ``["udynamic"]`` (``fill_qmap``, line 157: ``create_dynamic_map``), moved to the device once and shared by
  every tensor (lines 511-521). ``state["step"]`` is a Python int; ``unorm_vec`` exists only with
  ``max_unorm > 0`` (off by default).
* **Update** (``update_step``, lines 535-590): ``p.data.contiguous()`` and ``p.grad.contiguous()`` (no copies
  for the decoder's contiguous tensors), then one in-place kernel per tensor (``optimizer_update_8bit_blockwise``
  or, 32-bit, ``optimizer_update_32bit``): no temporaries.
* **Paged** optimizers (``is_paged=True``: ``PagedAdamW``, ``PagedAdamW8bit``, qlora.py's ``paged_adamw_32bit``):
  ``get_state_buffer`` (lines 374-390) allocates ``state1``/``state2`` of tensors of at least 1e5 elements with
  ``F.get_paged`` (``cudaMallocManaged``: CUDA unified memory, host-backed, outside PyTorch's caching allocator,
  so outside ``torch.cuda.max_memory_allocated()``); smaller ones, the absmax vectors and the qmaps are ordinary
  device tensors. The step books the paged states in a row of their own on the host column.
"""
import sympy as sp

from ..core.symbols import L, V, d
from .ops import block_params
from .outer import head_params
from .structure import Shape

__all__ = ["BLOCKSIZE", "MIN_8BIT_SIZE", "PAGED_MIN", "QMAP_BYTES", "state_bytes"]

#: ``BLOCKSIZE_2STATE`` (csrc/ops.cu line 154) and ``init_state``'s ``blocksize`` (optim/optimizer.py line 524).
BLOCKSIZE = 256
#: ``min_8bit_size``'s default (optim/optimizer.py, ``Optimizer2State.__init__``): smaller tensors keep FP32 states.
MIN_8BIT_SIZE = 4096
#: ``get_state_buffer``: ``p.numel() < 1e5`` is never paged.
PAGED_MIN = 10**5
#: The two 256-entry FP32 maps (``create_dynamic_map(signed=True)``, ``(signed=False)``), on the device once.
QMAP_BYTES = 2 * 256 * 4


def _tensors(c: Shape) -> list:
    """(elements, copies) of every parameter tensor of the reference decoder: each block's L times."""
    return [(n, L) for _, n in block_params(c)] + [(V * d, 1)] + [(n, 1) for _, n in head_params(c)]


def state_bytes(c: Shape, eight_bit: bool, paged: bool) -> tuple:
    """(device bytes, paged bytes) of Adam's two states over the decoder's tensors: 8-bit (codes, absmax,
    qmaps; FP32 below :data:`MIN_8BIT_SIZE`) or 32-bit; with ``paged`` the state buffers of tensors of at least
    :data:`PAGED_MIN` elements in unified memory (the second number; 0 without ``paged``)."""
    device, unified = sp.Integer(0), sp.Integer(0)
    for n, copies in _tensors(c):
        buffers = 2 * (sp.Piecewise((4 * n, n < MIN_8BIT_SIZE), (n, True)) if eight_bit else 4 * n)
        absmax = 2 * 4 * sp.Piecewise((0, n < MIN_8BIT_SIZE), (sp.ceiling(n / BLOCKSIZE), True)) if eight_bit else 0
        if paged:
            device += copies * (absmax + sp.Piecewise((buffers, n < PAGED_MIN), (0, True)))
            unified += copies * sp.Piecewise((0, n < PAGED_MIN), (buffers, True))
        else:
            device += copies * (absmax + buffers)
    return device + (QMAP_BYTES if eight_bit else 0), unified
