"""A whole training setup -> rows (component, group, device, exact bytes), per GPU.

    ledger = Ledger("article-7b", batch_size=1, seq_len=2048)
    ledger.totals            # {"gpu": 144_601_641_984, "cpu": 0, "nvme": 0}

Rows come from three groups: model states (:mod:`memledger.states.placement`),
saved activations (:mod:`memledger.activations.inventory`, L layers) and a runtime
overhead (the article's 1-2 GB of CUDA context and workspace; 2 GB by
default, as in its sums). Each row is a formula of :mod:`memledger.formulas`
(times a whole factor, e.g. a recipe component's bytes per parameter),
evaluated exactly, without SymPy, by its generated plain-Python form.
``ledger.values`` maps symbol names to numbers, ``ledger.bindings`` SymPy
symbols to numbers, and ``ledger.evaluate(expr)`` computes any formula exactly.
"""
from dataclasses import asdict, dataclass, fields
from functools import cached_property, lru_cache
from typing import NamedTuple, Optional

from .. import formulas
from ..core.capacity import MARGIN, leaves_margin
from ..core.keyed import NotWholeBytes
from ..core.rows import DEVICES, Row, Rows
from ..core.vocabulary import Device, Group, Role
from ..models.architecture import Architecture
from ..models.presets import get_preset
from ..core.choices import RECOMPUTE, check_choice, check_count, check_flag, lookup
from ..models.features import Features, ModelKey
from ..states.frameworks import check_framework, framework_buffers
from ..states.placement import OFFLOAD_DEVICES, PLACEMENTS, ZERO_STAGES, check_state_options, component_key, state_specs
from ..states.recipes import ALL_RECIPES
from .amp import weight_copy_row
from .in_backward import check_in_backward
from ..activations.partitioned import check_compiled
from .transfer import Traffic, step_traffic
from ..step.inputs import DDPConfig, FSDP2Config, SetupChoices, StepInputs
from . import knobs
from ..step.implementations import check_fields as check_implementation_fields
from ..step.structure import AMP_RECIPES, BNB_KINDS, OPTIMIZER_OF, check_loss_impl
from ..core.units import GB

__all__ = ["DEFAULT_OVERHEAD", "FIELD_OF", "SCOPES", "Ledger", "RowSpec", "Structure", "activation_dtype", "row_specs",
           "sweep"]

DEFAULT_OVERHEAD = 2 * GB
#: Symbol names of :mod:`memledger.core.symbols`, and the Ledger field that gives each its value.
FIELD_OF = {"B": "batch_size", "S": "seq_len", "d": "d_model", "H": "n_heads", "L": "n_layers", "F": "d_ff",
            "V": "vocab_size", "P": "n_params", "N_d": "dp", "t": "tp", "O": "overhead_bytes"}


class RowSpec(NamedTuple):
    """A row before numbers: its name, group, device, and formula ``factor`` x formulas.expr(``key``)."""
    name: str
    group: str
    device: str
    key: object             # a formulas.ActivationsKey, formulas.OutsideKey, or a plain tuple
    factor: int = 1
    role: str = ""          # model states: param / grad / optimizer (ZeRO's roles), or "gathered"

    @property
    def expr(self):
        return self.factor * formulas.expr(self.key)

    @property
    def formula(self) -> str:
        """The formula as text, without SymPy: ``4*(ceiling(P/(N_d*t)))``."""
        text = formulas.text(self.key)
        return text if self.factor == 1 else f"{self.factor}*({text})"

    def evaluate(self, values: dict) -> int:
        return self.factor * formulas.evaluate(self.key, values)


class Structure(NamedTuple):
    """The discrete choices that decide a ledger's formulas (not its numbers)."""
    recipe: str
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    offload_placement: str
    arch: Optional[Architecture]  # None: no architecture, model states only
    dropout: bool
    flash_attention: bool
    recompute: str
    tensor_parallel: bool
    sequence_parallel: bool
    scope: str = "layers"
    framework: str = "plain"        # issue 15: FRAMEWORKS; DDP's buckets are a row unless gradients are views
    ddp_view: bool = False
    compiled: bool = False          # the blocks under torch.compile (memledger.activations.partitioned)


#: "model": the blocks and the tensors outside them; "layers": the blocks only, as the article books them.
SCOPES = ("model", "layers")


def activation_dtype(recipe) -> str:
    """The dtype of the activations a recipe's model saves: its weights' (``"fp32"`` for FP32 training, which
    saves 4-byte tensors: the step timeline's FP32 loop, measured by MemTracker), else the ledger's 16-bit
    ``"bf16"``; FP16 autocast (``fp16-amp-adamw``) books the 16-bit rows, the matmuls' FP16 inputs and outputs
    (the step adds the FP32 residual stream and norms it keeps); FP8 recipes keep 16-bit activations around their
    FP8 matrix multiplies (Transformer Engine
    under BF16 autocast), whatever their master weights."""
    weights = next((c.dtype for c in recipe.components if c.role == "param"), "bf16")
    if recipe.name in AMP_RECIPES:      # FP16 autocast saves the matmuls' 16-bit tensors (memledger.step.amp)
        return "bf16"
    return "fp32" if weights == "fp32" and not recipe.fp8_gemms else "bf16"


@lru_cache(maxsize=256)
def row_specs(s: Structure) -> tuple:
    """Every :class:`RowSpec` of a structure: model states, activations, overhead."""
    recipe = ALL_RECIPES[s.recipe]
    features = s.arch.features if s.arch is not None else None
    specs = [RowSpec(r.name, Group.MODEL_STATES, r.device, r.key(features), r.factor, r.role)
             for r in state_specs(recipe, s.zero_stage, s.offload_optimizer, s.offload_params, s.offload_placement)]
    if s.arch is not None:
        if s.offload_params != "none":
            # ZeRO-3 gathers one module's parameters (and gradients) at a time:
            # DeepSpeed's estimate_zero3_model_states_mem_needs books 4 x largest layer.
            plain = s.arch.features == Features.of(s.arch.style)
            unit = ModelKey("largest unit", s.arch.style if plain else s.arch.features)
            gathered = [c for c in recipe.components if c.role == "param"] + [recipe.grad_component]
            if all(c.plain for c in gathered):
                specs.append(RowSpec("gathered parameters + gradients (largest layer)", Group.MODEL_STATES, Device.GPU,
                                     unit, recipe.role_bytes("param") + recipe.grad_bytes, Role.GATHERED))
            else:
                specs.append(RowSpec("gathered parameters + gradients (largest layer)", Group.MODEL_STATES, Device.GPU,
                                     component_key(gathered, unit), 1, Role.GATHERED))
        f = s.arch.features
        dtype = activation_dtype(recipe)
        specs.append(RowSpec("activations", Group.ACTIVATIONS, Device.GPU, formulas.ActivationsKey(
            s.arch.mlp, s.arch.norm, s.dropout, s.flash_attention, s.recompute, s.tensor_parallel, s.sequence_parallel,
            gqa=f.gqa, head_dim=f.head_dim, moe=f.moe, dtype=dtype, parallel=f.parallel, shared_norm=f.shared_norm,
            compiled=bool(s.compiled), attention_dropout=s.arch.attention_dropout)))
        if s.scope == "model" and s.arch.causal:
            attention = "flash" if s.flash_attention else "eager"
            specs += [RowSpec(name, Group.ACTIVATIONS, Device.GPU, formulas.outside_key(
                s.arch.style, attention, name, s.tensor_parallel, s.sequence_parallel, dtype))
                for name in formulas.outside_names(s.arch.style, attention, f.input_norm)]
    specs += framework_specs(s, recipe)
    specs.append(RowSpec("CUDA context + workspace", Group.OVERHEAD, Device.GPU, ("symbol", "O")))
    return tuple(specs)


def check_packed_field(n, seq_len: int, arch) -> None:
    """``ValueError`` naming ``packed`` unless it is 0 or a number of documents that divides ``seq_len``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"packed must be a whole number of documents per row >= 0, got {n!r}")
    if n and arch is None:
        raise ValueError("packed: documents are masked in attention; give an architecture")
    if n and seq_len % n:
        raise ValueError(f"packed: the step packs documents of S/n tokens; seq_len ({seq_len}) must be a multiple of "
                         f"packed ({n})")


def framework_specs(s: Structure, recipe) -> list:
    """The buffers a framework adds to the model states (:mod:`memledger.states.frameworks`)."""
    if s.framework == "ddp" and not s.ddp_view:     # the gradients a second time, in DDP's buckets
        return [RowSpec("DDP gradient buckets", Group.MODEL_STATES, Device.GPU, ("elements", False),
                        recipe.grad_bytes, Role.GRAD)]
    return []


#: The Ledger's keywords, in the order :meth:`Ledger.inputs` (the JSON's ``inputs``) and its ``repr`` give them: its
#: fields (:class:`~memledger.step.inputs.SetupChoices`' and its own) and each framework knob (:mod:`.knobs`).
KEYWORDS = ("arch", "n_params", "batch_size", "seq_len", "recipe", "recompute", "tp", "sequence_parallel",
            "zero_stage", "dp", "offload_optimizer", "offload_params", "offload_placement", "overhead_bytes", "dropout",
            "flash_attention", "scope", "loss_chunks", "loss_impl", "framework", "ddp_bucket_mb",
            "gradient_as_bucket_view", "deepspeed_reduce_bucket_size", "deepspeed_contiguous_gradients",
            "deepspeed_overlap_comm", "deepspeed_prefetch_bucket_size", "deepspeed_max_live_parameters",
            "deepspeed_param_persistence_threshold", "megatron_gradient_accumulation_fusion", "fsdp_param_dtype",
            "fsdp_reduce_dtype", "reshard_after_forward", "dp_replicate", "offload_activations",
            "optimizer_in_backward", "packed", "compile", "fsdp_loss_in_root", "fsdp_cpu_offload",
            "fsdp_offload_pin_memory", "fsdp_units", "paged_optimizer", "implementation", "attn_implementation")


@dataclass(frozen=True)
class Ledger(SetupChoices):
    """Memory of one training setup, per GPU.

    ``arch``: an :class:`Architecture` or a preset name; without one, give
    ``n_params`` and get model states only. ``n_params`` with ``arch`` overrides
    the architecture's count. ``dropout=None`` follows the architecture
    (GPT-style yes, LLaMA-style no). ``loss_chunks`` n > 1: torchtune's chunked
    cross-entropy (:mod:`memledger.step.loss`), modelled by the step's peak; the sum
    books the tensors the unchunked loss keeps. ``loss_impl``: ``"torchtune"`` (FP32 upcast per
    chunk) or ``"litgpt"`` (LitGPT's ``chunked_cross_entropy``: no upcast, S a multiple of the chunks).
    ``offload_activations``: the blocks' saved tensors as pinned host
    copies (``save_on_cpu``), read by the step timeline (:meth:`step` with ``backend="cpu"``,
    :mod:`memledger.step.offload`); the sum of :attr:`rows` still books the activations on the GPU.
    ``packed``: n >= 1 documents in each row of S tokens, attending only to themselves
    (:mod:`memledger.step.packing`), read by the step under the cpu and cuda backends; the sum of :attr:`rows`
    does not change (0, the default: one sequence per row).
    ``optimizer_in_backward``: torchtune's optimizer stepped in backward
    (:mod:`memledger.ledger.in_backward`): the step's peak (:attr:`peak`, :meth:`step`) honours it; the rows,
    the sum at the end of the forward pass, do not change.
    ``compile``: the blocks run under ``torch.compile`` (Inductor or ``aot_eager_decomp_partition``): the
    activations row books what AOTAutograd's min-cut partitioner saves
    (:mod:`memledger.activations.partitioned`, measured); the step timeline does not model compiled graphs
    (:attr:`peak` is None, :meth:`step` refuses it). ``paged_optimizer``: bitsandbytes' paged optimizer
    (its recipes only): Adam's states of tensors of at least 1e5 elements in CUDA unified memory, outside the
    caching allocator's count; the step (:mod:`memledger.step.bnb`) books them on the host column, the rows do not.

    The setup's choices are :class:`~memledger.step.inputs.SetupChoices`' fields (declared once, shared with the
    step's :class:`~memledger.step.inputs.StepInputs`); the framework's knobs are one config object,
    ``framework_config`` (:mod:`memledger.ledger.knobs`: DDP's, FSDP2's, DeepSpeed's or Megatron-LM's; None for the
    plain loop), each also a keyword and an attribute of its own (``fsdp_units``, ``deepspeed_overlap_comm``, ...).
    """
    n_params: Optional[int] = None
    overhead_bytes: int = DEFAULT_OVERHEAD
    scope: str = "model"
    #: the framework's knobs (:mod:`memledger.ledger.knobs`), set by their own keywords; None: the plain loop's none
    framework_config: object = None

    def __init__(self, *args, **keywords):
        """The fields as a dataclass takes them, and each framework knob as its own keyword (:data:`knobs.KNOBS`):
        they make ``framework_config``."""
        names = [f.name for f in fields(self)]
        if len(args) > len(names):
            raise TypeError(f"Ledger.__init__() takes at most {len(names)} positional arguments")
        given = dict(zip(names, args))
        for name, value in keywords.items():
            if name in given:
                raise TypeError(f"Ledger.__init__() got multiple values for argument {name!r}")
            if name not in names and name not in knobs.KNOBS:
                raise TypeError(f"Ledger.__init__() got an unexpected keyword argument {name!r}")
            given[name] = value
        set_knobs = {k: given.pop(k) for k in tuple(given) if k in knobs.KNOBS}
        framework = given.get("framework", Ledger.framework)
        config, foreign = knobs.configure(framework, given.pop("framework_config", None), set_knobs)
        for f in fields(self):
            object.__setattr__(self, f.name, given.get(f.name, f.default))
        object.__setattr__(self, "framework_config", config)
        object.__setattr__(self, "_foreign", foreign)
        self.__post_init__()

    @classmethod
    def keywords(cls) -> dict:
        """Keyword -> default of every keyword the Ledger takes, in :data:`KEYWORDS`' order."""
        defaults = {f.name: f.default for f in fields(cls)}
        return {k: defaults[k] if k in defaults else knobs.default(k) for k in KEYWORDS}

    def __repr__(self) -> str:
        """The architecture and the fields that differ from their defaults: what the setup chose."""
        chosen = [f"{name}={getattr(self, name)!r}" for name, default in self.keywords().items()
                  if name == "arch" or getattr(self, name) != default]
        return f"{type(self).__name__}({', '.join(chosen)})"

    def __post_init__(self):
        arch = get_preset(self.arch) if isinstance(self.arch, str) else self.arch
        if arch is not None and not isinstance(arch, Architecture):
            raise TypeError(f"arch must be an Architecture, a preset name or None, got {self.arch!r}")
        object.__setattr__(self, "arch", arch)
        if arch is None and self.n_params is None:
            raise ValueError("give an architecture (a preset or d_model/n_layers/n_heads) or n_params")
        counts = ("batch_size", "seq_len", "tp", "dp", "loss_chunks", "dp_replicate")
        for name in counts + (("n_params",) if self.n_params is not None else ()):
            self._set(name, check_count(name, getattr(self, name)))
        object.__setattr__(self, "overhead_bytes", check_count("overhead_bytes", self.overhead_bytes, minimum=0))
        recipe = lookup(ALL_RECIPES, self.recipe, "recipe")
        factored = [c.name for c in recipe.components if c.factored]
        if factored and arch is None:
            raise ValueError(f"{factored[0]} needs the matrix shapes: give an architecture")
        check_choice("recompute", self.recompute, RECOMPUTE)
        check_choice("scope", self.scope, SCOPES)
        check_choice("zero_stage", self.zero_stage, ZERO_STAGES)
        check_choice("offload_optimizer", self.offload_optimizer, OFFLOAD_DEVICES)
        check_choice("offload_params", self.offload_params, OFFLOAD_DEVICES)
        check_choice("offload_placement", self.offload_placement, PLACEMENTS)
        check_state_options(self.zero_stage, self.offload_params)
        for name in ("sequence_parallel", "flash_attention", "optimizer_in_backward", "paged_optimizer"):
            check_flag(name, getattr(self, name))
        check_flag("dropout", self.dropout, allow_none=True)
        if self.loss_chunks > self.seq_len:
            raise ValueError(f"loss_chunks ({self.loss_chunks}) must not exceed the tokens of a sequence "
                             f"(seq_len {self.seq_len}): each chunk needs at least one")
        check_loss_impl(self.loss_impl, self.loss_chunks, self.seq_len)
        check_implementation_fields(self.implementation, self.attn_implementation, arch)
        if self.implementation != "reference" and arch is None:
            raise ValueError(f"implementation {self.implementation}: a library's model code runs an architecture; "
                             "give a preset or --hidden/--layers/--heads")
        if (self.loss_chunks > 1 or self.loss_impl != "torchtune") and arch is None:
            raise ValueError("loss_chunks needs an architecture: the chunked loss splits the LM head's logits")
        check_flag("offload_activations", self.offload_activations)
        check_packed_field(self.packed, self.seq_len, arch)
        check_flag("compile", self.compile)
        if self.compile:
            if arch is None:
                raise ValueError("compile: torch.compile changes what the blocks save; without an architecture "
                                 "(model states only) there is none: give a preset or --hidden/--layers/--heads")
            check_compiled(arch.features, self.recompute, self.tp, self.offload_activations)
        if self.offload_activations and arch is None:
            raise ValueError("offload_activations: nothing is saved for backward without an architecture (model "
                             "states only); give a preset or --hidden/--layers/--heads")
        if self.sequence_parallel and self.tp == 1:
            raise ValueError("sequence_parallel needs tensor parallelism: tp must be > 1")
        if arch is not None:
            arch.check_tensor_parallel(self.tp)
            arch.check_modelled()
        check_framework(self, ALL_RECIPES[self.recipe])
        del self.__dict__["_foreign"]       # every other framework's knob is at its default: the config holds all
        if self.dropout is None:
            object.__setattr__(self, "dropout", arch.dropout if arch is not None else False)
        if self.optimizer_in_backward:
            check_in_backward(self, recipe)
        if self.paged_optimizer and OPTIMIZER_OF.get(self.recipe) not in BNB_KINDS:
            raise ValueError(f"paged_optimizer: bitsandbytes' paged optimizers keep their states in CUDA unified "
                             f"memory; recipe {self.recipe} is not a bitsandbytes one (use bf16-adam8bit-bnb, "
                             f"bf16-adam8bit-bnb-nomaster or bf16-adamw32-bnb)")
        if self.framework == "fsdp2":     # FSDP2 books no sum of rows (its step is the answer)
            return
        _ = self.rows         # every row a whole number of bytes, or a ValueError naming the one that is not

    def _set(self, name: str, value) -> None:
        """Set a field, or a knob (in the framework config, or among the foreign ones while checked)."""
        if name not in knobs.KNOBS:
            object.__setattr__(self, name, value)
        elif name in knobs.knobs_of(self.framework_config):
            object.__setattr__(self, "framework_config", knobs.with_knob(self.framework_config, name, value))
        elif name in self._foreign:
            self._foreign[name] = value

    @property
    def params(self) -> int:
        """The parameter count the ledger books."""
        return self.n_params if self.n_params is not None else self.arch.params

    @property
    def structure(self) -> Structure:
        return Structure(self.recipe, self.zero_stage, self.offload_optimizer, self.offload_params,
                         self.offload_placement, self.arch, self.dropout, self.flash_attention, self.recompute,
                         self.tp > 1, self.sequence_parallel, self.scope,
                         self.framework, self.framework == "ddp" and self.gradient_as_bucket_view, self.compile)

    @cached_property
    def values(self) -> dict:
        """Symbol name -> value: {"B": batch_size, "S": seq_len, "d": d_model, ..., "O": overhead_bytes}.
        Without an architecture the shape symbols are 1 (no row uses them)."""
        a = self.arch
        shape = (a.d_model, a.n_heads, a.n_layers, a.d_ff, a.vocab_size) if a else (1, 1, 1, 1, 1)
        values = dict(zip(FIELD_OF, (self.batch_size, self.seq_len, *shape, self.params, self.dp, self.tp,
                                     self.overhead_bytes)))
        return {**a.values, **values} if a else values     # + H_kv, d_h, E, k, n_positions, n_token_types

    @property
    def bindings(self) -> dict:
        """SymPy symbol -> value, for ``expr.subs`` and :meth:`evaluate`."""
        from ..core import symbols
        by_name = {s.name: s for s in vars(symbols).values() if isinstance(s, symbols.sp.Symbol)}
        return {by_name[name]: value for name, value in self.values.items()}

    def evaluate(self, expr) -> int:
        """Any memledger formula at this ledger's values, as an exact int (e.g. ``ledger.evaluate(closed_form())``)."""
        from ..core.exact import evaluate_expr
        return evaluate_expr(expr, self.values)

    @cached_property
    def rows(self) -> Rows:
        """The rows, each a whole number of bytes: a tensor split over tp ranks that tp does not divide (the
        vocabulary-parallel log-softmax, B x S x V x 4 / t) is refused, naming the row."""
        if self.framework == "fsdp2":
            raise ValueError("the ledger's sum does not book FSDP2's shards and buffers; under framework fsdp2 use "
                             "the step timeline (Ledger.step(), memledger step --framework fsdp2)")
        rows = []
        for spec in row_specs(self.structure):
            try:
                rows.append(Row(spec.name, spec.group, spec.device, spec.evaluate(self.values), spec.role,
                                spec.formula))
            except NotWholeBytes as e:
                share = e.value
                raise ValueError(f"{spec.name} would be {share} bytes per rank at tp {self.tp}: tp must divide "
                                 "the tensors it splits (Megatron-LM pads the vocabulary to a multiple of tp; "
                                 "memledger does not)") from None
        rows += [Row(b.name, Group.MODEL_STATES, Device.GPU, b.bytes, b.role, b.formula + " (from source)")
                 for b in self.framework_buffers if b.live == "whole step" and not b.booked]
        if self.recipe in AMP_RECIPES and self.arch is not None:   # autocast's FP16 weight copies
            rows.append(weight_copy_row(self))
        return Rows(rows)

    @cached_property
    def framework_buffers(self) -> list:
        """DeepSpeed's or Megatron-LM's buffers read from their sources (:mod:`memledger.states.frameworks`);
        those live the whole step are rows too, the others transients beside the sum."""
        return framework_buffers(self)

    @property
    def totals(self) -> dict:
        """Bytes per device: {"gpu": ..., "cpu": ..., "nvme": ...}."""
        return self.rows.totals

    def group_total(self, group: str, device: Optional[str] = None) -> int:
        """Bytes of one group (on one device, or on all)."""
        return self.rows.total(device, group)

    @cached_property
    def step_inputs(self) -> StepInputs:
        """What the step timeline reads of this setup (:class:`memledger.step.inputs.StepInputs`): the model, the
        workload and strategy, the framework with its config, the values, the inputs it echoes."""
        shared = {f.name: getattr(self, f.name) for f in fields(SetupChoices)}
        config = self.framework_config
        return StepInputs(**shared | {"dropout": bool(self.dropout)},
                          ddp=config if isinstance(config, DDPConfig) else DDPConfig(),
                          fsdp2=config if isinstance(config, FSDP2Config) else FSDP2Config(),
                          values=self.values, record=self.inputs())

    def step(self, backend=None, **conventions):
        """The step timeline of this setup (:class:`memledger.step.timeline.Step`): landmarks, transients, peak.
        ``backend`` None: the article's conventions for the reference decoder, cuda under a library's code (which
        decides its own kernels)."""
        from ..step.timeline import Step
        if backend is None:
            backend = "article" if self.implementation == "reference" else "cuda"
        return Step(self, backend, **conventions)

    @cached_property
    def peak(self) -> Optional[int]:
        """The GPU peak of a training step (:meth:`step`, the article's conventions), or None where the
        timeline does not model the setup (no architecture, MoE or encoder blocks).
        Evaluated from the step compiled to plain Python (:mod:`memledger.step.cache`): no SymPy once cached.
        Under a library's code (``implementation`` other than reference) the library decides its kernels: the
        step runs under the cuda backend, and a setup it does not model yet is refused (``ValueError``), not judged
        by the reference decoder's sum."""
        from ..step.cache import step_peak
        if self.implementation != "reference":
            from ..activations.backends import get_backend
            from ..step.structure import StepStructure
            StepStructure.of(self.step_inputs, get_backend("cuda"))        # the refusal, in one line
            peak = step_peak(self.step_inputs, "cuda")
            return None if peak is None else peak[0]
        peak = step_peak(self.step_inputs)
        return None if peak is None else peak[0]

    def fits(self, gpu_bytes: int, peak: bool = False, margin: int = MARGIN) -> bool:
        """Whether the run fits on a GPU of ``gpu_bytes``: what it is judged by (:meth:`judged_bytes`: the GPU
        total, or with ``peak`` the step's peak) leaves ``margin`` free (:mod:`memledger.core.capacity`), as every
        verdict of memledger asks. Where the ledger books a nominal parameter count (the article's 7x10^9) that
        the timeline, which counts tensors, does not see, the larger of the two decides."""
        return leaves_margin(self.judged_bytes(peak), gpu_bytes, margin)

    def within(self, gpu_bytes: int, peak: bool = False) -> bool:
        """Whether what it is judged by is at most ``gpu_bytes``, nothing to spare: the article's bare
        comparison ("fits in 80 GB"), not a fit (:meth:`fits` leaves the margin)."""
        return self.judged_bytes(peak) <= gpu_bytes

    def judged_bytes(self, peak: bool = False) -> int:
        """What :meth:`fits` compares with the GPU: the GPU total, or (``peak``) the step's peak (a framework's
        step under fsdp2: always its peak, the ledger booking no sum for FSDP2)."""
        if self.framework == "fsdp2":
            return self.peak
        if not peak or self.peak is None:
            return self.totals["gpu"]
        nominal = self.n_params is not None or self.arch.n_params is not None
        return max(self.peak, self.totals["gpu"]) if nominal else self.peak

    @property
    def traffic(self) -> Traffic:
        """Host<->device bytes per optimizer step for this rank (see :mod:`memledger.ledger.transfer`)."""
        shard = formulas.evaluate(("elements", self.zero_stage >= 1), self.values)
        return step_traffic(ALL_RECIPES[self.recipe], self.offload_optimizer, self.offload_params, shard)

    def inputs(self) -> dict:
        """Every keyword's value (:data:`KEYWORDS`; the architecture's fields, ``n_params`` the count booked): the
        JSON's ``inputs``."""
        fields = {name: getattr(self, name) for name in KEYWORDS}
        fields["arch"] = None if self.arch is None else {
            k: v for k, v in asdict(self.arch).items() if k != "description"}
        fields["n_params"] = self.params
        return fields

    def to_dict(self) -> dict:
        """The CLI's JSON object: inputs, rows (exact integer bytes, formula), totals, model states by
        ZeRO role (:meth:`by_role`), traffic."""
        return {
            "inputs": self.inputs(),
            "rows": [r.to_dict("formula") for r in self.rows],
            "totals": self.totals,
            "model_states_by_role": self.by_role(),
            "traffic": asdict(self.traffic),
            "framework_buffers": [b._asdict() for b in self.framework_buffers],
        }

    def by_role(self, device: Optional[str] = None) -> dict:
        """Model-state bytes by ZeRO role: {"param": ..., "grad": ..., "optimizer": ...} (all devices, or one);
        "gathered" too under ZeRO-3 parameter offload (a unit's parameters and gradients on the GPU)."""
        return self.rows.by_role(device)

    def table(self, unit: str = "GB"):
        """The rows and per-device totals as a :class:`~memledger.core.table.Table`
        (prints as text; renders as HTML in Jupyter; ``.markdown()`` for Markdown)."""
        from .table import ledger_table
        return ledger_table(self, unit)

    def __str__(self):
        return self.table().text()

    def _repr_html_(self):
        return self.table().html()

    def _repr_markdown_(self):
        return self.table().markdown()



for _keyword in knobs.KNOBS:     # each framework knob read as an attribute of its own (fsdp_units, ...)
    setattr(Ledger, _keyword, knobs.Knob(_keyword))


def sweep(template: Ledger, measure: str = "total", **arrays) -> dict:
    """Per-device totals of ``template``'s structure over NumPy arrays of inputs, or its step's peak.

    Keyword names are :data:`memledger.core.symbols.NOTATION` fields
    (``batch_size``, ``seq_len``, ``dp`` ...); the rest is taken from
    ``template``. Values must be whole numbers >= 1 (``overhead_bytes`` >= 0).
    ``measure="total"``: {"gpu": array, "cpu": array, "nvme": array} in float64 (exact below 2^53 bytes).
    ``measure="peak"``: {"gpu": the peak of a training step (:attr:`Ledger.peak`), exact integers} over inputs
    that keep the step's structure (``batch_size``, ``seq_len``, ``dp``, ``overhead_bytes``; B = 1 and B > 1
    are evaluated apart), int64 while every intermediate stays below 2^62, else Python integers
    (:mod:`memledger.step.sweep`); a ValueError where the timeline does not model the setup.
    """
    import numpy as np
    from ..core.exact import vectorized_function
    from ..core import symbols
    fields = {field: name for name, field in FIELD_OF.items()}
    check_choice("measure", measure, ("total", "peak"))
    unknown = set(arrays) - set(fields)
    if unknown:
        raise ValueError(f"cannot sweep over {', '.join(sorted(unknown))}; choose from {', '.join(fields)}")
    for name, array in arrays.items():
        values = np.asarray(array, dtype=np.float64)
        low = 0 if name == "overhead_bytes" else 1
        if not (np.all(np.isfinite(values)) and np.all(values == np.round(values)) and np.all(values >= low)):
            raise ValueError(f"{name} must hold whole numbers >= {low}")
    if measure == "peak":
        return {"gpu": _peak_sweep(template, arrays)}
    names = tuple(FIELD_OF)
    values = [np.asarray(arrays.get(FIELD_OF[n], template.values[n]), dtype=np.float64) for n in names]
    specs = row_specs(template.structure)
    results = vectorized_function(tuple(getattr(symbols, n) for n in names), tuple(s.expr for s in specs))(*values)
    shape = np.broadcast_shapes(*(np.shape(v) for v in values))
    out = {dev: np.zeros(shape) for dev in DEVICES}
    for spec, value in zip(specs, results):
        out[spec.device] = out[spec.device] + value
    return out


def _peak_sweep(template: Ledger, arrays: dict):
    """The step's peak over ``arrays`` (checked by :func:`sweep`), B = 1 and B > 1 apart."""
    import numpy as np
    from dataclasses import replace
    from ..activations.backends import get_backend
    from ..step.structure import StepStructure, step_values
    from ..step.sweep import SWEEPABLE, peak_program
    if template.dp_replicate > 1 and "dp" in arrays:
        raise ValueError("measure='peak' does not sweep dp under HSDP (the shard group is dp / dp_replicate)")
    k = template.reshard_after_forward
    if isinstance(k, int) and not isinstance(k, bool) and "dp" in arrays:
        raise ValueError(f"measure='peak' does not sweep dp with an int reshard_after_forward ({k}): it must divide "
                         "every dp")
    names = tuple(n for n in SWEEPABLE if FIELD_OF[n] in arrays)
    if set(arrays) - {FIELD_OF[n] for n in names}:
        raise ValueError(f"measure='peak' sweeps only inputs that keep the step's structure: "
                         f"{', '.join(FIELD_OF[n] for n in SWEEPABLE)}; got {', '.join(sorted(arrays))}")
    values = [np.asarray(arrays[FIELD_OF[n]]) for n in names]
    if any(v.dtype.kind == "f" and np.any(np.abs(v) > 2**53) for v in values):
        raise ValueError("give values above 2^53 as integers: a float64 cannot hold them exactly")
    values = [v.astype(np.int64) if v.dtype != object else v for v in values]
    shape = np.broadcast_shapes(*(v.shape for v in values))
    values = [np.broadcast_to(v, shape) for v in values]
    single = values[names.index("B")] == 1 if "B" in names else np.full(shape, template.batch_size == 1)
    out = None
    for is_single in (True, False):
        mask = single == is_single
        if not mask.any():
            continue
        ledger = replace(template, batch_size=1 if is_single else max(template.batch_size, 2))
        structure = StepStructure.of(ledger.step_inputs, get_backend("article"))
        fixed = tuple(sorted((k, v) for k, v in step_values(ledger.step_inputs).items() if k not in names))
        peaks = peak_program(structure, fixed, names).peak([v[mask] for v in values])
        if out is None:
            out = np.zeros(shape, dtype=peaks.dtype)
        elif out.dtype != peaks.dtype:
            out = out.astype(object)
        out[mask] = peaks
    return out
