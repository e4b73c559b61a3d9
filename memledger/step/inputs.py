"""What the step reads of a setup: :class:`StepInputs`, typed, with each framework's knobs in its own small config
(:class:`FSDP2Config`, :class:`DDPConfig`). The choices a setup makes (:class:`SetupChoices`) are declared once,
here: the :class:`~memledger.ledger.ledger.Ledger` and :class:`StepInputs` both extend them. A Ledger produces it
(``Ledger.step_inputs``); nothing in :mod:`memledger.step` reads a Ledger's attributes, so the layer contract
(the step under the ledger) shows everything the step depends on: this module. Free of SymPy.

DeepSpeed's and Megatron-LM's knobs are not here: the step refuses those frameworks (their buffers are ledger
rows, :mod:`memledger.states.frameworks`).
"""
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping, Optional, Union

from ..models.architecture import Architecture
from ..states.recipes import DEFAULT_RECIPE

__all__ = ["DDPConfig", "FSDP2Config", "SetupChoices", "StepInputs", "inputs_of"]


@dataclass(frozen=True)
class FSDP2Config:
    """``fully_shard``'s knobs as the setup gives them (framework fsdp2; :mod:`memledger.step.fsdp2`)."""
    param_dtype: Optional[str] = "bf16"     # MixedPrecisionPolicy(param_dtype); None: no cast
    reduce_dtype: Optional[str] = "fp32"    # MixedPrecisionPolicy(reduce_dtype); None: the param dtype
    reshard_after_forward: Union[bool, int, None] = True    # True, False, None (PyTorch: the root False) or an int k
    dp_replicate: int = 1                   # HSDP: replicas of a dp / dp_replicate shard group
    loss_in_root: bool = False              # the loss computed inside the root module's forward
    cpu_offload: bool = False               # CPUOffloadPolicy: shards, gradients and states on the host
    offload_pin_memory: bool = True         # CPUOffloadPolicy(pin_memory=...)
    units: str = "per-block"                # the units: per-block (each block, the root) or torchtitan's grouping


@dataclass(frozen=True)
class DDPConfig:
    """``DistributedDataParallel``'s knobs (framework ddp; :mod:`memledger.step.ddp`)."""
    bucket_mb: Optional[float] = None       # bucket_cap_mb; None: PyTorch's 25 MiB (the first bucket 1 MiB)
    gradient_as_bucket_view: bool = False


@dataclass(frozen=True)
class SetupChoices:
    """The choices of one training setup that the step reads, declared once: the :class:`StepInputs` and the
    :class:`~memledger.ledger.ledger.Ledger` (which checks them and books its sum from them) extend this.
    ``arch``: an :class:`Architecture` (a Ledger also takes a preset name, or None with ``n_params``);
    ``dropout`` None (a Ledger's default): as the architecture says."""
    arch: Union[Architecture, str, None] = None
    batch_size: int = 1
    seq_len: int = 2048
    recipe: str = DEFAULT_RECIPE
    recompute: str = "none"
    tp: int = 1
    sequence_parallel: bool = False
    zero_stage: int = 0
    dp: int = 1
    offload_optimizer: str = "none"
    offload_params: str = "none"
    offload_placement: str = "article"
    dropout: Optional[bool] = None
    flash_attention: bool = False
    loss_chunks: int = 1
    loss_impl: str = "torchtune"
    framework: str = "plain"
    offload_activations: bool = False
    optimizer_in_backward: bool = False     # torchtune's optimizer_in_bwd: the step's peak honours it
    packed: int = 0         # documents packed in each row (memledger.step.packing): the step under cpu/cuda reads it
    compile: bool = False   # the blocks under torch.compile: what the min-cut partitioner saves (sum only)
    paged_optimizer: bool = False           # bitsandbytes' paged states (unified memory): the step's peak honours it
    #: whose model code runs the step: reference, hf, torchtune or litgpt (:mod:`memledger.step.implementations`)
    implementation: str = "reference"
    #: transformers' attn_implementation (sdpa, eager, flash_attention_2; hf only); sdpa under the others
    attn_implementation: str = "sdpa"


@dataclass(frozen=True)
class StepInputs(SetupChoices):
    """Everything the step timeline reads of one training setup, per GPU: the model, the workload and strategy
    (:class:`SetupChoices`, the architecture resolved and dropout decided), the framework's config, and the symbol
    values the formulas are evaluated at."""
    ddp: DDPConfig = DDPConfig()
    fsdp2: FSDP2Config = FSDP2Config()
    #: symbol name -> value (``Ledger.values``: B, S, d, H, L, F, V, P, N_d, t, O and the architecture's own)
    values: Mapping[str, int] = field(default_factory=dict, compare=False)
    #: the setup's inputs as ``memledger step --json`` prints them (``Ledger.inputs()``)
    record: Mapping[str, object] = field(default_factory=dict, compare=False)

    def __post_init__(self):
        object.__setattr__(self, "values", MappingProxyType(dict(self.values)))
        object.__setattr__(self, "record", MappingProxyType(dict(self.record)))

    @property
    def chunked_loss(self) -> bool:
        """A chunked or LitGPT loss (not the plain unchunked cross-entropy)."""
        return self.loss_chunks > 1 or self.loss_impl != "torchtune"

    @property
    def shard_group(self) -> int:
        """The ranks a state is sharded over: dp, or under FSDP2's HSDP dp / dp_replicate."""
        return self.dp // self.fsdp2.dp_replicate if self.framework == "fsdp2" else self.dp


def inputs_of(setup) -> StepInputs:
    """``setup`` if it is a :class:`StepInputs`, else the ones it produces (``Ledger.step_inputs``): the step's
    entry points (``Step``, ``StepStructure.of``, ``step_values``, ``step_peak``) accept a Ledger this way."""
    if isinstance(setup, StepInputs):
        return setup
    try:
        inputs = setup.step_inputs
    except AttributeError:
        raise TypeError(f"the step reads StepInputs (Ledger.step_inputs), got {type(setup).__name__}") from None
    if not isinstance(inputs, StepInputs):
        raise TypeError(f"{type(setup).__name__}.step_inputs must be StepInputs, got {type(inputs).__name__}")
    return inputs
