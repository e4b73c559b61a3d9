"""What nvidia-smi counts beside PyTorch's caching allocator, and what it counts inside it that the step does not book:
the constants ``--measure nvidia-smi`` adds to the replayed step, each with its source.

**Inside the caching allocator** (in ``max_memory_reserved()``, booked by :func:`workspaces` into the replay):
cuBLAS's and cuBLASLt's workspaces. PyTorch allocates both through ``c10::cuda::CUDACachingAllocator::get()->
allocate()`` (``aten/src/ATen/cuda/CublasHandlePool.cpp`` at PyTorch commit
``26a39059ec580351411f180816c47e2ef5134ae1``, lines 241-247, ``getNewWorkspace()`` and
``getNewCUDABlasLtWorkspace()``), once per (handle, stream) pair (``setWorkspaceForHandle()``, the map
``cublas_handle_stream_to_workspace()``), when a thread first asks for its handle (``getCurrentCUDABlasHandle()``, at
the first matmul) and kept until ``torch._C._cuda_clearCublasWorkspaces()``. Handles are per thread (a
``thread_local`` pool window, same function): the forward runs on the Python thread, the backward on the autograd
engine's device thread (``torch/csrc/autograd/engine.cpp``, ``Engine::start_device_threads()``: "allocate one thread
for every GPU device"), so a training step holds two of each (the second booked at the first op of the backward).

* cuBLAS: ``parseChosenWorkspaceSize()`` (lines 147-150): ``4096 * 8 * 1024`` = 32 MiB on compute capability 9.0
  (Hopper: H100, H200), else ``4096 * 1024 * 2 + 16 * 1024 * 8`` = 8,519,680 bytes (``:4096:2:16:8``), unless
  ``CUBLAS_WORKSPACE_CONFIG`` says otherwise.
* cuBLASLt: ``parseCUDABlasLtWorkspaceSize()`` (line 186): 1,024 KiB = 1 MiB (``CUBLASLT_WORKSPACE_SIZE``), capped at
  the cuBLAS size (lines 216-239); its own allocation unless ``TORCH_CUBLASLT_UNIFIED_WORKSPACE=1``
  (``getCUDABlasLtWorkspace()``), taken only by matmuls that run through cuBLASLt (``struct CublasLtWorkspace`` of
  ``aten/src/ATen/cuda/CUDABlas.cpp``: ``gemm_and_bias``, the epilogue of a linear with a bias). memledger books it
  for architectures with biased linears (GPT blocks, QKV biases) and not for bias-free ones (LLaMA), whose matmuls
  take cuBLAS's (the preferred BLAS backend on CUDA).

Older PyTorch differs (before the Hopper default, ``:4096:8`` = 4 MiB, then ``:4096:2:16:8``): the sizes here are those
of that commit (PyTorch 2.x of 2025-26); ``CUBLAS_WORKSPACE_CONFIG`` is not read.

**Outside the allocator** (nvidia-smi only; rows of their own):

* The CUDA context: the driver's state and the kernels it has loaded. Since CUDA 11.7 kernels load lazily, and
  PyTorch sets ``CUDA_MODULE_LOADING=LAZY`` when unset (pytorch/pytorch pull request #86509, 1.13: 287,047,680 against
  666,632,192 bytes used after one small tensor); the context grows as new kernels run. Its size depends on the GPU
  (the number of SMs), the driver, CUDA and PyTorch. :data:`CUDA_CONTEXT` holds the published figures with their
  GPU and stack; for a GPU without one, ``--measure nvidia-smi`` is refused unless the context is given
  (``--cuda-context``, what nvidia-smi shows for a process that has run one training step, less its
  ``torch.cuda.memory_reserved()``).
* NCCL's buffers (per channel and peer, ``NCCL_BUFFSIZE`` 4 MiB by default, NVIDIA/nccl issue #285; 544 MB for a
  2-GPU and 688 MB for a 4-GPU communicator on 4 NVLinked A100s, NVIDIA/nccl issue #964; 32 channels per peer for
  all-to-all on 8 H100s, issue #1685): they depend on the topology, the number of channels and communicators and the
  NCCL version, and no constant covers a setup; ``--measure nvidia-smi`` is refused with more than one rank.
"""
from ..core.units import MiB

__all__ = ["CUBLASLT_WORKSPACE", "CUBLAS_WORKSPACE", "CUDA_CONTEXT", "GPU_ARCH", "Outside", "check_ranks",
           "cuda_context", "workspaces"]

#: The source every workspace figure is read from.
CUBLAS_SOURCE = "aten/src/ATen/cuda/CublasHandlePool.cpp, PyTorch 26a39059ec580351411f180816c47e2ef5134ae1"
#: cuBLAS's workspace by compute capability class (``parseChosenWorkspaceSize()``, lines 147-150).
CUBLAS_WORKSPACE = {"sm90": 4096 * 8 * 1024, "other": 4096 * 1024 * 2 + 16 * 1024 * 8}
#: cuBLASLt's workspace (``parseCUDABlasLtWorkspaceSize()``, line 186: 1,024 KiB).
CUBLASLT_WORKSPACE = 1024 * 1024
#: Compute capability of memledger's GPUs (NVIDIA's CUDA GPUs table): A100 8.0, L40S and RTX 4090 8.9, H100 and
#: H200 9.0.
GPU_ARCH = {"a100-80gb": "8.0", "a100-40gb": "8.0", "l40s": "8.9", "rtx-4090": "8.9", "h100-80gb": "9.0",
            "h200": "9.0"}
#: Published CUDA context sizes: GPU -> (bytes, the stack, the source). nvidia-smi's reading of a process whose
#: caching allocator holds nothing (``torch.cuda.memory_reserved()`` 0). Only GPUs with such a figure are here.
CUDA_CONTEXT = {
    "rtx-6000-ada": (426 * MiB, "PyTorch 2.10.0+cu130, lazy loading",
                     "unslothai/unsloth-zoo pull request #1053: nvidia-smi 426 MiB after torch.cuda.mem_get_info(0), "
                     "allocated / reserved 0 / 0"),
}
#: What the workspaces are booked as in the replay: (phase whose first op allocates them, name).
WORKSPACE_PHASES = ("forward", "backward")


def workspaces(gpu: str, biased: bool = False) -> list:
    """The workspaces a training step's matmuls allocate through the caching allocator on ``gpu`` (a name of
    :data:`GPU_ARCH`): [(phase, name, bytes)], a cuBLAS workspace (and, ``biased`` linears, a cuBLASLt one) for the
    forward's thread and again for the autograd thread's backward. ``ValueError`` in one line for a GPU of unknown
    compute capability."""
    if gpu not in GPU_ARCH:
        raise ValueError(f"--measure nvidia-smi needs a named GPU (gpu, --gpu-memory: one of {', '.join(GPU_ARCH)}): "
                         f"cuBLAS's workspace depends on its compute capability, got {gpu!r}")
    cublas = CUBLAS_WORKSPACE["sm90" if GPU_ARCH[gpu] == "9.0" else "other"]
    return [(phase, f"{lib} workspace ({phase})", size) for phase in WORKSPACE_PHASES
            for lib, size in (("cuBLAS", cublas), ("cuBLASLt", min(CUBLASLT_WORKSPACE, cublas)))
            if lib == "cuBLAS" or biased]


def cuda_context(gpu: str, given=None) -> tuple:
    """(bytes, where the figure comes from) of the CUDA context on ``gpu``: ``given`` (bytes the user measured),
    else :data:`CUDA_CONTEXT`; ``ValueError`` in one line where neither has it."""
    if given is not None:
        if isinstance(given, bool) or not isinstance(given, int) or given < 0:
            raise ValueError(f"cuda_context must be a non-negative number of bytes, got {given!r}")
        return given, "given (--cuda-context)"
    if gpu in CUDA_CONTEXT:
        size, stack, source = CUDA_CONTEXT[gpu]
        return size, f"{stack}; {source}"
    known = "; ".join(f"{name} {size // MiB} MiB ({stack})" for name, (size, stack, _) in CUDA_CONTEXT.items())
    raise ValueError(f"--measure nvidia-smi: no published CUDA context size for {gpu} (it depends on the GPU's SMs, "
                     f"the driver, CUDA and PyTorch; published: {known}); give cuda_context (--cuda-context BYTES), "
                     "what nvidia-smi shows for your process after one training step less "
                     "torch.cuda.memory_reserved()")


def check_ranks(ledger) -> None:
    """``ValueError`` in one line where NCCL's buffers would be on the GPU (more than one rank)."""
    ranks = ledger.dp * ledger.tp
    if ranks > 1 or ledger.framework != "plain":
        raise ValueError(f"--measure nvidia-smi is not modelled with {ranks} ranks (--framework {ledger.framework}): "
                         "NCCL's buffers (NCCL_BUFFSIZE 4 MiB per channel and peer) depend on the topology, channels, "
                         "communicators and NCCL version, and no published constant covers a setup (NVIDIA/nccl "
                         "issues #964, #1685); use --measure reserved")


class Outside:
    """What ``--measure nvidia-smi`` judges: ``reserved`` (the replay's peak of segments, the workspaces included),
    ``context`` (the CUDA context) and where it comes from; ``rows()`` one per part."""

    def __init__(self, reserved: int, workspace_rows: list, context: int, context_source: str, gpu: str):
        self.reserved, self.workspace_rows, self.context, self.context_source = reserved, workspace_rows, context, \
            context_source
        self.gpu = gpu

    @property
    def judged(self) -> int:
        return self.reserved + self.context

    def rows(self) -> list:
        """[{"name", "bytes", "source"}]: the reserved segments (the workspaces within them listed after), the CUDA
        context."""
        rows = [{"name": "reserved segments (max_memory_reserved, the workspaces included)", "bytes": self.reserved,
                 "source": "the step replayed through the caching allocator (memledger.ledger.replay)"}]
        rows += [{"name": f"  of which {name}", "bytes": size, "source": CUBLAS_SOURCE}
                 for _, name, size in self.workspace_rows]
        rows.append({"name": "CUDA context", "bytes": self.context, "source": self.context_source})
        return rows

    def to_dict(self) -> dict:
        return {"gpu": self.gpu, "reserved": self.reserved, "cuda_context": self.context,
                "rows": self.rows(), "nvidia_smi": self.judged}
