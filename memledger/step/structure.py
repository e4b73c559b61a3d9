"""What decides a step's programs: :class:`Shape` (a block's choices) and :class:`StepStructure` (read off a
setup's :class:`~memledger.step.inputs.StepInputs`), and the numbers a step is evaluated at
(:func:`step_values`). Free of SymPy, so that the command line can key a compiled step
(:mod:`memledger.step.cache`) without loading it.

Two ledgers with the same structure share compiled programs (:func:`memledger.step.build.build`); only
their numbers differ. B = 1 is part of the structure: q, k and v then stay views of the fused QKV
projection instead of being copied for the batched matmul.
"""
from dataclasses import dataclass

from ..core.keyed import NotWholeBytes
from ..models.features import Features
from ..states.recipes import ALL_RECIPES as RECIPES
from .implementations import check_step as check_library
from .inputs import StepInputs, inputs_of
from .parallel_check import check as check_parallel, modelled as parallel_fields

__all__ = ["AMP_RECIPES", "BNB_KINDS", "COMPILE_REFUSED", "FAMILIES", "FSDP2Plan", "LOSS_IMPLS", "MAX_LOSS_CHUNKS",
           "MODELLED_RECIPES", "OPTIMIZER_OF", "REFUSED_LOSSES", "Shape", "StepStructure", "block_of", "check_amp",
           "check_family", "check_implementation", "check_loss_chunks", "check_loss_impl", "check_modelled",
           "check_offload", "check_packed", "check_recipe", "split_refusal", "step_values", "unmodelled"]

#: The optimizer each recipe the timeline models runs (``torch.optim.AdamW``, ``SGD`` with ``momentum`` 0 or not,
#: ``Adafactor``; :mod:`memledger.step.optim`), with one gradient buffer, with or without FP32 master weights
#: (docs/step.md; checked against PyTorch's MemTracker, tests/step/test_optim.py).
OPTIMIZER_OF = {"bf16-adamw": "adamw", "bf16-adamw-fp32-grads": "adamw", "fp32-adamw": "adamw",
                "bf16-pure-adamw": "adamw", "bf16-sgd": "sgd", "fp32-sgd": "sgd", "bf16-sgd-momentum": "sgd-momentum",
                "fp32-sgd-momentum": "sgd-momentum", "bf16-pure-sgd-momentum": "sgd-momentum",
                "adafactor": "adafactor", "fp16-amp-adamw": "adamw", "bf16-adam8bit-bnb": "adam8bit-bnb",
                "bf16-adam8bit-bnb-nomaster": "adam8bit-bnb", "bf16-adamw32-bnb": "adamw32-bnb"}
#: bitsandbytes' optimizers, modelled from source (memledger.step.bnb): no reference run here (CUDA only).
BNB_KINDS = ("adam8bit-bnb", "adamw32-bnb")
MODELLED_RECIPES = tuple(OPTIMIZER_OF)
_CUDA_ONLY = "bitsandbytes' kernels run on CUDA only, so no reference run here: not modelled op by op"
#: What the timeline lacks for each other recipe of the catalog (for its error message); others: "its optimizer".
UNMODELLED_RECIPES = {
    "bf16-adamw-fp32-accum": "FP32 gradient accumulation, a second gradient buffer",
    "bf16-adam-8bit": "8-bit Adam; " + _CUDA_ONLY,
    "bf16-adafactor": "transformers' Adafactor: FP32 states and FP32 copies of each BF16 gradient and parameter "
                      "inside step(); the step models torch.optim.Adafactor, whose states take the gradient's dtype",
}


#: Why the timeline refuses ``compile`` (the ledger's sum books the partitioner's saved set).
COMPILE_REFUSED = ("compile: the step timeline does not model torch.compile's forward and backward graphs op by op "
                   "(their transients, Inductor's fused kernels); memledger ledger books what the min-cut "
                   "partitioner saves")


def check_recipe(name: str) -> None:
    """``ValueError`` naming what the timeline lacks, unless it models recipe ``name``'s optimizer step."""
    if name not in MODELLED_RECIPES:
        fp8 = name in RECIPES and RECIPES[name].fp8_gemms
        why = UNMODELLED_RECIPES.get(name, "FP8 GEMMs: Transformer Engine or FP8 kernels, which need an FP8 GPU; not "
                                           "modelled op by op" if fp8 else "its optimizer")
        raise ValueError(f"the step timeline does not model recipe {name} ({why}) yet; it models "
                         f"{', '.join(MODELLED_RECIPES)}")


@dataclass(frozen=True)
class Shape:
    """The discrete choices a layer's program depends on (see :mod:`memledger.activations.backends`)."""
    style: str              # "gpt" (LayerNorm, GeLU, biases) or "llama" (RMSNorm, SwiGLU)
    attention: str          # "eager", "flash" or "math"
    dropout: bool
    rmsnorm: str            # "fused" or "composite"
    dtype: str              # activation dtype, "bf16" or "fp32"
    stats: bool             # norm statistics booked (inventory rows exist)
    single: bool            # B == 1: q, k, v stay views of the fused projection (no copies)
    grad_dtype: str = "bf16"
    mask_dtype: str = None  # a dropout mask's dtype ("bool": the fused CUDA kernel); None: the activation dtype
    stats_dtype: str = None  # LayerNorm statistics' dtype where booked; None: the activation dtype
    gqa: bool = False       # grouped-query attention: K and V at H_kv heads (LLaMA blocks)
    mqa: bool = False       # H_kv = 1 (multi-query): the eager core's V gradient needs no copy back
    qkv_bias: bool = None   # None: as the style says (GPT yes, LLaMA no); True: LLaMA with QKV biases (Qwen2)
    tied: bool = None       # None: as the style says (GPT tied, LLaMA untied); True: a tied LLaMA decoder (Gemma)
    recompute: str = "none"  # the save policy: none, selective or full recomputation (memledger.step.block)
    head_dim: bool = False  # a head size d_h other than d/H: Q and the output projection's input H*d_h wide
    tp: bool = False        # tensor parallelism as DTensor runs it: a block at H/t heads, F/t (memledger.step.tensor)
    loss_chunks: int = 1    # n > 1: torchtune's chunked cross-entropy (memledger.step.loss)
    loss_impl: str = "torchtune"  # or "litgpt": LitGPT's chunked_cross_entropy, no FP32 upcast
    packed: int = 0         # n >= 1 documents packed in each row (memledger.step.packing)
    packing: str = None     # how attention keeps them apart: the backend's "mask" or "varlen"; "eager": masked_fill
    amp: bool = False       # FP16 autocast on FP32 weights with a GradScaler (memledger.step.amp)
    positions: bool = False  # learned positions added to the embedding (StarCoder; memledger.step.families)
    alibi: bool = False     # ALiBi: a (1, H, 1, S) bias added to the eager core's scores (BLOOM)
    input_norm: bool = False  # a LayerNorm on the embedding output (BLOOM's word_embeddings_layernorm)
    parallel: bool = False  # GPT-NeoX: x + attn(norm1(x)) + mlp(norm2(x)) (memledger.step.parallel)
    shared_norm: bool = False   # Phi: with parallel, one norm feeds attention and MLP
    head_bias: bool = False     # the LM head has a bias (Phi's lm_head)
    attention_dropout: bool = True  # with dropout, the probabilities' dropout runs; False: Phi-2's p = 0 (no tensor)
    implementation: str = "reference"   # whose model code (memledger.step.implementations): its block's variants
    attn_implementation: str = "sdpa"   # transformers' attn_implementation (implementation hf)
    rotary: float = None    # a GPT block's rotary fraction under LitGPT's code (pythia; memledger.step.gpt_style)

    @property
    def attention_dropped(self):
        """The eager core drops out its probabilities (a mask and an output saved): dropout, not at p = 0."""
        return self.dropout and self.attention_dropout

    @property
    def gpt(self):
        return self.style == "gpt"

    @property
    def has_qkv_bias(self):
        return self.gpt if self.qkv_bias is None else self.qkv_bias

    @property
    def is_tied(self):
        return self.gpt if self.tied is None else self.tied

    @property
    def composite(self):
        """RMSNorm as FP32 ops (ATen's composite, or transformers' ``LlamaRMSNorm``: ``rmsnorm`` "hf")."""
        return not self.gpt and self.rmsnorm in ("composite", "hf", "litgpt")

    @property
    def hf(self):
        """transformers' ``LlamaForCausalLM`` (implementation hf): separate q, k, v projections, its rotary code,
        its attention and loss (:mod:`memledger.step.hf`)."""
        return self.implementation == "hf"

    @property
    def upcast(self):
        """Composite RMSNorm copies a 16-bit input to FP32 (an FP32 input is used as is)."""
        return self.composite and self.dtype != "fp32"


@dataclass(frozen=True)
class FSDP2Plan:
    """What FSDP2 runs (framework fsdp2; :mod:`memledger.step.fsdp2`), its policy resolved for the step."""
    param: str              # the dtype the units compute in (MixedPrecisionPolicy's param_dtype, else the original)
    reduce: str             # the dtype gradients are reduced in
    original: str           # the parameters' own dtype (the recipe's)
    reshard: object         # reshard_after_forward as fully_shard normalizes it: True, False, None or an int k
    hsdp: bool              # HSDP: replicas of a shard group (a 2-D mesh)
    loss_in_root: bool      # the loss computed inside the root module's forward
    offload: object = None  # CPUOffloadPolicy: None (none), else its pin_memory
    units: str = "per-block"    # per-block (fully_shard on each block, then the root) or torchtitan's apply_fsdp

    @classmethod
    def of(cls, config, original: str, shard_group: int) -> "FSDP2Plan":
        """The plan of ``config`` (:class:`~memledger.step.inputs.FSDP2Config`) over parameters of dtype
        ``original`` sharded over ``shard_group`` ranks."""
        param = config.param_dtype or original
        return cls(param, config.reduce_dtype or param, original, _reshard(config.reshard_after_forward, shard_group),
                   config.dp_replicate > 1, config.loss_in_root,
                   config.offload_pin_memory if config.cpu_offload else None, config.units)


@dataclass(frozen=True)
class StepStructure:
    shape: Shape
    recipe: str
    zero_stage: int
    offload_optimizer: str
    offload_params: str
    offload_placement: str
    recompute: str
    tensor_parallel: bool
    sequence_parallel: bool
    conventions: object
    layers: object          # L when L <= 4, else None (any larger L gives the same program)
    prefetch: bool = True
    framework: str = "plain"    # issue 15: "ddp" adds its gradient buckets (memledger.step.ddp)
    bucket_view: bool = False   # DDP's gradient_as_bucket_view
    fsdp: FSDP2Plan = None  # framework fsdp2: what it runs
    offload_activations: bool = False   # the blocks' saved tensors as pinned host copies (memledger.step.offload)
    in_backward: bool = False   # torchtune's optimizer in backward (memledger.step.optim.in_backward)
    paged_optimizer: bool = False   # bitsandbytes' paged states in unified memory (memledger.step.bnb)

    @classmethod
    def of(cls, setup: StepInputs, conv):
        """The structure of ``setup`` (StepInputs, or a Ledger: its ``step_inputs``) under the backend ``conv``,
        or ``ValueError`` naming what the timeline does not model."""
        setup = inputs_of(setup)
        arch = setup.arch
        if arch is None:
            raise ValueError("the step timeline needs an architecture (a preset or --hidden/--layers/--heads)")
        check_recipe(setup.recipe)
        if setup.compile:
            raise ValueError(COMPILE_REFUSED)
        check_modelled(arch)
        check_library(setup, conv)
        shape, fsdp = _shape(setup, conv)
        if setup.sequence_parallel and setup.recompute == "full":
            raise ValueError("the step timeline runs sequence parallelism as DTensor runs it without full "
                             "recomputation only (its recomputed norms on S/t are not modelled); use selective or "
                             "no recomputation")
        if setup.tp > 1 and (setup.loss_chunks > 1 or setup.loss_impl != "torchtune"):
            raise ValueError("the step timeline runs a chunked loss on one rank's whole vocabulary; under tensor "
                             "parallelism (tp > 1) it runs DTensor's loss_parallel: give loss_chunks 1 or tp 1")
        check_implementation(setup, conv)
        if setup.offload_activations:
            check_offload(shape, setup.recompute, setup.zero_stage, setup.tp > 1, setup.framework)
        framework, bucket_view = _framework(setup)
        return cls(shape=shape, recipe=setup.recipe, zero_stage=setup.zero_stage,
                   offload_optimizer=setup.offload_optimizer, offload_params=setup.offload_params,
                   offload_placement=setup.offload_placement, recompute=setup.recompute,
                   tensor_parallel=setup.tp > 1, sequence_parallel=setup.sequence_parallel, conventions=conv,
                   layers=arch.n_layers if arch.n_layers <= 4 else None, prefetch=True, framework=framework,
                   bucket_view=bucket_view, fsdp=fsdp, offload_activations=setup.offload_activations,
                   in_backward=setup.optimizer_in_backward, paged_optimizer=setup.paged_optimizer)


def check_modelled(arch) -> None:
    """``ValueError`` naming the refinements of ``arch`` the step does not model op by op."""
    f = arch.features
    llama = arch.style == "llama"
    # LLaMA blocks may add grouped-query attention, QKV biases (Qwen2) and a tied LM head (Gemma)
    modelled = Features.of(arch.style)._replace(gqa=f.gqa, qkv_bias=f.qkv_bias, tied=f.tied) if llama else \
        Features.of(arch.style)._replace(tied=f.tied if f.is_tied else None, qkv_bias=f.qkv_bias if f.has_qkv_bias
                                         else None)
    # any style: Q and O at H*d_h (Gemma-7B), K and V at H_kv heads (a GPT block's: GPT-BigCode's multi-query)
    modelled = modelled._replace(head_dim=f.head_dim, gqa=f.gqa)
    # GPT decoders: learned positions (StarCoder), ALiBi and an embedding LayerNorm (BLOOM); memledger.step.families
    modelled = modelled._replace(**({} if llama else _refinements(f)))
    modelled = modelled._replace(**parallel_fields(f))   # GPT-NeoX's, Phi's blocks, untied heads (parallel_check)
    if f != modelled:
        family = f" (model_type {arch.model_type!r})" if arch.model_type in FAMILIES else ""
        raise ValueError(f"the step timeline models the reference decoder's GPT and LLaMA blocks (grouped-query "
                         f"attention; LLaMA blocks also with QKV biases and tied embeddings; GPT decoders also "
                         f"with learned positions, ALiBi and an embedding LayerNorm, untied, with a parallel "
                         f"residual; any head size; no, selective or full recomputation); {unmodelled(f)} not "
                         f"modelled op by op{family}")


def _shape(setup: StepInputs, conv) -> tuple:
    """(the :class:`Shape` of ``setup``'s blocks under ``conv``, FSDP2's plan or None), or ``ValueError`` naming
    what is not modelled (the families', packing's, autocast's, parallel blocks' checks, in that order)."""
    arch = setup.arch
    f, llama = arch.features, arch.style == "llama"
    refined = check_family(setup) if not llama else {}
    recipe = RECIPES[setup.recipe]
    act = next(c.dtype for c in recipe.components if c.role == "param")
    grad = next(c.dtype for c in recipe.components if c.role == "grad")
    fsdp = None
    if setup.framework == "fsdp2":     # compute (and the unsharded gradients) in the policy's param dtype
        fsdp = FSDP2Plan.of(setup.fsdp2, act, setup.shard_group)
        act = grad = fsdp.param
    # the attention probabilities' dropout (off at p = 0, Phi-2's) decides SDPA's kernel, not the residual ones
    partial = bool(setup.dropout) and not arch.attention_dropout
    kernel = conv.kernel(arch.style, setup.dropout and not partial, setup.flash_attention)
    if setup.implementation == "hf" and setup.attn_implementation == "eager":
        kernel = "eager"                # transformers' eager_attention_forward (memledger.step.hf)
    if setup.implementation in ("hf", "litgpt") and not llama and setup.attn_implementation == "sdpa":
        kernel = "flash"                # pythia under LitGPT or transformers: SDPA without a mask (its flash kernel)
    if kernel == "math":
        raise ValueError("the math SDPA kernel (CPU, LLaMA blocks with dropout) is not modelled op by op; "
                         "use flash_attention or no dropout")
    opts = conv.inventory_options(arch.style, act, setup.dropout, setup.flash_attention)
    loss_chunks = check_loss_chunks(setup.loss_chunks)
    packed, packing = check_packed(setup, conv, kernel)
    amp = check_amp(setup, conv, kernel)
    # a library's RMSNorm upcasts before normalizing: no fused kernel, on CUDA either (step.implementations)
    # torchtitan's nn.RMSNorm takes the BF16 input and weight as they are: the reference's norm (step.torchtitan)
    rmsnorm = conv.rmsnorm if setup.implementation in ("reference", "torchtitan") else "composite"
    if setup.implementation in ("hf", "litgpt") and act != "fp32":   # LlamaRMSNorm's BF16 normalized input; LitGPT's
        rmsnorm = setup.implementation                              # FP32 copy of the weight
    shape = Shape(style=arch.style, attention=kernel, dropout=bool(setup.dropout), rmsnorm=rmsnorm, dtype=act,
                  stats=conv.norm_stats is not None, single=setup.batch_size == 1, grad_dtype=grad,
                  mask_dtype=opts["mask_dtype"], stats_dtype=opts["norm_stats"], gqa=f.gqa,
                  mqa=f.gqa and arch.kv_heads == 1, qkv_bias=True if llama and f.has_qkv_bias else None,
                  tied=(True if f.is_tied else None) if llama else (None if f.is_tied else False),
                  recompute=setup.recompute, head_dim=f.head_dim, tp=setup.tp > 1, loss_chunks=loss_chunks,
                  loss_impl=setup.loss_impl, packed=packed, packing=packing, amp=amp, **refined,
                  **check_parallel(setup, f, kernel), **({"attention_dropout": False} if partial else {}),
                  **({} if setup.implementation == "reference" else {
                      "implementation": setup.implementation, "attn_implementation": setup.attn_implementation}),
                  **({"rotary": arch.rotary_fraction} if setup.implementation in ("hf", "litgpt") and not llama
                     else {}))
    return shape, fsdp


def _refinements(f: Features) -> dict:
    """The families' refinements of a GPT decoder ``f`` has (memledger.step.families), as Shape's fields."""
    return {k: True for k in ("positions", "alibi", "input_norm") if getattr(f, k)}


def check_family(setup: StepInputs) -> dict:
    """The families' refinements of a GPT decoder the step models ({"positions": ..., "alibi": ..., "input_norm":
    ...}, as set), or ``ValueError`` naming what they are not modelled with: they run in the plain loop on one rank
    (no ZeRO, tensor parallelism or framework), ALiBi with an eager core, learned positions without dropout, with
    the plain loss."""
    f = setup.arch.features
    family = _refinements(f)
    if not family:
        return family
    lacks = [what for what, off in [
        ("ZeRO", setup.zero_stage > 0), ("tensor parallelism", setup.tp > 1),
        ("dropout (the embeddings' own, GPT-2's and GPT-BigCode's embd_pdrop, is not modelled)",
         f.positions and setup.dropout),
        ("a flash attention kernel (ALiBi is added to the eager core's scores)",
         f.alibi and setup.flash_attention),
        (f"framework {setup.framework}", setup.framework != "plain"),
        ("a chunked loss", setup.loss_chunks > 1 or setup.loss_impl != "torchtune"),
        ("the optimizer in backward", setup.optimizer_in_backward),
        ("activation offloading", setup.offload_activations)] if off]
    if lacks:
        names = " and ".join(n for n, on in [("learned positions", f.positions), ("ALiBi", f.alibi),
                                             ("an embedding LayerNorm", f.input_norm)] if on)
        kind = f" (model_type {setup.arch.model_type!r})" if setup.arch.model_type else ""
        raise ValueError(f"the step timeline models {names} in the plain loop on one rank{kind}; not with "
                         f"{', '.join(lacks)}")
    return family


#: The recipes that run under FP16 autocast with a GradScaler (memledger.step.amp).
AMP_RECIPES = ("fp16-amp-adamw",)


def check_amp(setup: StepInputs, conv, kernel) -> bool:
    """Whether the ledger's recipe runs under autocast; ``ValueError`` naming what the step does not model
    with it."""
    if setup.recipe not in AMP_RECIPES:
        return False
    f = setup.arch.features
    lacks = [what for what, off in [
        (f"{setup.arch.style} blocks", setup.arch.style not in ("llama", "gpt")),
        ("parallel attention and MLP", getattr(f, "parallel", False)), ("ALiBi", getattr(f, "alibi", False)),
        ("an embedding norm", getattr(f, "input_norm", False)), ("learned positions", f.positions),
        ("grouped-query attention in a GPT block", f.gpt and f.gqa), ("an untied GPT head", f.gpt and not f.is_tied),
        ("an LM head bias", f.head_bias),
        (f"the {kernel} attention kernel", kernel != "flash"), ("dropout", setup.arch.style == "gpt" and setup.dropout),
        ("tensor parallelism", setup.tp > 1),
        ("ZeRO", setup.zero_stage > 0), ("offloading", setup.offload_optimizer != "none"),
        ("activation offloading", setup.offload_activations),
        ("LitGPT's loss", setup.loss_impl != "torchtune"),
        ("packed documents", setup.packed), ("the optimizer in backward",
                                                             setup.optimizer_in_backward),
        (f"framework {setup.framework}", setup.framework != "plain")] if off]
    if lacks:
        raise ValueError(f"recipe {setup.recipe}: the step models FP16 autocast for the reference decoder's LLaMA "
                         f"and GPT blocks with a flash SDPA kernel (--backend cpu or cuda; GPT: --flash-attention, no "
                         f"dropout); not for {', '.join(lacks)}")
    return True


def check_packed(setup: StepInputs, conv, kernel) -> tuple:
    """(documents per row, the backend's packing) of ``ledger`` (``(0, None)`` unpacked), or ``ValueError`` naming
    what packed documents are not modelled with (:mod:`memledger.step.packing`)."""
    n = setup.packed
    if not n:
        return 0, None
    packing = "eager" if kernel == "eager" else conv.packing    # the eager core: masked_fill's shared bool mask
    if packing is None:
        raise ValueError(f"packed: the {conv.name} backend's {kernel} attention is not modelled with document masks; "
                         "use --backend cpu (SDPA with a block-causal mask) or cuda (flash-attention varlen)")
    offloaded = setup.offload_activations
    f = setup.arch.features
    lacks = [what for what, off in [
        ("tensor parallelism", setup.tp > 1), ("ZeRO-3 (no measured run of it with packing here)",
                                                setup.zero_stage == 3),
        ("activation offloading with the eager core", offloaded and packing == "eager"),
        (f"framework {setup.framework}", setup.framework != "plain"),
        ("learned positions, ALiBi or an embedding norm (no measured run of them with packing here)",
         f.positions or f.alibi or f.input_norm)] if off]
    if lacks:
        raise ValueError(f"packed is modelled for the reference decoder's GPT and LLaMA blocks (eager core or flash "
                         f"kernel), any recomputation, one rank; not for {', '.join(lacks)}")
    return n, packing


def _reshard(value, shard_group: int):
    """FSDP2's ``reshard_after_forward`` as ``fully_shard`` normalizes it (``_fsdp_init.py:174-182``): an int 1 is
    False, the shard group's size True, another divisor k stays k (a post-forward shard group of k ranks)."""
    if value is None or isinstance(value, bool):
        return value
    return False if value == 1 else True if value == shard_group else value


def _framework(setup: StepInputs) -> tuple:
    """(framework, DDP's gradient_as_bucket_view) of ``ledger``, for the step; a chunked loss runs in the plain
    loop only (not checked against PyTorch's DDP or FSDP2)."""
    if setup.framework not in ("plain", "ddp", "fsdp2"):
        raise ValueError(f"the step timeline does not run framework {setup.framework} op by op; its buffers are "
                         "ledger rows (memledger ledger --framework ...)")
    if setup.framework != "plain" and (setup.loss_chunks > 1 or setup.loss_impl != "torchtune"):
        raise ValueError(f"the step timeline runs a chunked loss in the plain loop only, not under framework "
                         f"{setup.framework}: give loss_chunks 1")
    return setup.framework, setup.framework == "ddp" and setup.ddp.gradient_as_bucket_view


#: The most loss chunks the timeline runs op by op (each chunk is a few ops and tensors of its own).
MAX_LOSS_CHUNKS = 64


def check_loss_chunks(n: int) -> int:
    """``n``, or ``ValueError`` where the timeline would not run n chunks op by op."""
    if n > MAX_LOSS_CHUNKS:
        raise ValueError(f"the step timeline runs up to {MAX_LOSS_CHUNKS} loss chunks op by op, not loss_chunks {n}")
    return n


#: The cross-entropies the timeline runs op by op: torchtune's (each chunk upcast to FP32; without chunks the
#: reference decoder's own ``F.cross_entropy(logits.float())``) and LitGPT's ``chunked_cross_entropy`` (no upcast).
LOSS_IMPLS = ("torchtune", "litgpt")
#: Fused linear cross-entropy kernels, refused by name: what they keep is not measured here.
REFUSED_LOSSES = {
    "liger": "Liger's LigerFusedLinearCrossEntropyLoss computes the logits' gradients chunk by chunk inside its "
             "forward with Triton kernels (src/liger_kernel/ops/fused_linear_cross_entropy.py), CUDA only: no run "
             "here can measure what it allocates",
    "cce": "Apple's Cut Cross-Entropy computes the loss in Triton kernels without materializing the logits, CUDA "
           "only: no run here can measure what it allocates",
}


def check_loss_impl(impl: str, chunks: int, seq_len: int) -> None:
    """``ValueError`` naming ``loss_impl`` unless it is one of :data:`LOSS_IMPLS` (LitGPT's chunks: ``split`` by a
    chunk size, so S a multiple of the chunks)."""
    if impl in REFUSED_LOSSES:
        raise ValueError(f"loss_impl {impl!r} is not modelled: {REFUSED_LOSSES[impl]}")
    if impl not in LOSS_IMPLS:
        raise ValueError(f"loss_impl must be one of {', '.join(LOSS_IMPLS)}, got {impl!r}")
    if impl == "litgpt" and seq_len % chunks:
        raise ValueError(f"loss_impl 'litgpt' splits the sequence by a chunk size: seq_len ({seq_len}) must be a "
                         f"multiple of loss_chunks ({chunks})")


def check_offload(c: Shape, recompute: str, zero_stage: int, tensor_parallel: bool,
                  framework: str = "plain") -> None:
    """``ValueError`` naming what of the setup activation offloading (:mod:`memledger.step.offload`) is not
    modelled for."""
    lacks = [what for what, off in [
        ("GPT blocks", c.gpt), ("the eager attention core (the article backend's; use --backend cpu)",
                                not c.gpt and c.attention != "flash"),
        ("a fused RMSNorm kernel (use --backend cpu)", not c.gpt and not c.composite),
        ("grouped-query attention", c.gqa),
        ("QKV biases", bool(c.qkv_bias)), ("dropout", c.dropout), ("a head size other than d/H", c.head_dim),
        ("selective recomputation", recompute == "selective"), ("ZeRO-3", zero_stage == 3),
        ("tensor parallelism", tensor_parallel), (f"framework {framework}", framework != "plain")] if off]
    if lacks:
        raise ValueError(f"offload_activations is modelled for the reference decoder's LLaMA block under the CPU "
                         f"backend, no or full recomputation; not for {', '.join(lacks)}")


def check_implementation(setup: StepInputs, conv) -> None:
    """``ValueError`` where the optimizer has no such implementation: Adafactor has no fused kernel, and its
    ``foreach=None`` default is the for-loop on every device (``torch/optim/_adafactor.py``), so the cuda
    backend's foreach (AdamW's and SGD's default there) does not apply to it, and foreach asked elsewhere is
    not modelled; Adafactor's factored moments need whole matrices (no ZeRO, no tensor parallelism).
    bitsandbytes' optimizers are their own kernels (no foreach or fused choice) over whole tensors; ``paged_optimizer``
    is theirs only."""
    kind = OPTIMIZER_OF[setup.recipe]
    paged = setup.paged_optimizer
    if paged and kind not in BNB_KINDS:
        raise ValueError(f"paged_optimizer: bitsandbytes' paged optimizers keep their states in unified memory; "
                         f"recipe {setup.recipe} runs torch.optim (use bf16-adam8bit-bnb, "
                         f"bf16-adam8bit-bnb-nomaster or bf16-adamw32-bnb)")
    if kind in BNB_KINDS:
        if getattr(conv, "fused", False) or (conv.foreach and conv.name != "cuda"):
            raise ValueError(f"foreach/fused: recipe {setup.recipe} runs bitsandbytes' own in-place kernel per "
                             "tensor, not torch.optim's implementations")
        if setup.zero_stage or setup.tp > 1:
            raise ValueError("the step models bitsandbytes' optimizers (from source) on whole tensors: no ZeRO, tp 1")
        if setup.optimizer_in_backward:
            raise ValueError("optimizer_in_backward: one bitsandbytes optimizer per parameter (each with its own "
                             "qmaps) is not modelled")
        return
    if kind != "adafactor":
        return
    if getattr(conv, "fused", False):
        raise ValueError("fused: torch.optim.Adafactor has no fused implementation")
    if conv.foreach and conv.name != "cuda":
        raise ValueError("foreach: Adafactor's foreach step is not modelled (its default is the for-loop)")
    if setup.zero_stage or setup.tp > 1:
        raise ValueError("the step models Adafactor's factored moments on whole matrices: no ZeRO, tp 1")


#: The model families of issue 16 the step refuses by name (memledger.models.hf_config).
FAMILIES = ("gpt_neox", "phi", "bloom", "gpt_bigcode", "t5")


def unmodelled(f: Features) -> str:
    """What of ``f`` the step timeline refuses, in words (for its error message)."""
    llama = not f.gpt           # a GPT decoder's positions, ALiBi and embedding LayerNorm are modelled
    named = [("mixture of experts", f.moe), ("a GPT block without QKV biases", f.gpt and not f.has_qkv_bias),
             ("learned positions", f.positions and llama), ("token types", f.token_types), ("a pooler", f.pooler),
             ("an embedding norm", f.embedding_norm),
             ("parallel attention and MLP in a LLaMA block", f.parallel and llama),
             ("an LM head bias on a tied head", f.head_bias and f.is_tied),
             ("ALiBi score biases", f.alibi and llama), ("an embedding LayerNorm", f.input_norm and llama),
             ("an encoder-decoder", f.encoder_decoder)]
    found = [name for name, on in named if on]
    return (", ".join(found) if found else "this architecture's refinements") + (" is" if len(found) == 1 else " are")


def step_values(setup: StepInputs) -> dict:
    """Symbol name -> number for the step: the ledger's values, with P the architecture's counted
    parameters (the timeline books tensors, not a nominal count such as the article's 7x10^9); under FSDP2
    N_d is the shard group's size."""
    setup = inputs_of(setup)
    values = dict(setup.values)
    values["P"] = setup.arch.computed_params
    if setup.framework == "fsdp2":         # FSDP2 shards over its shard group (HSDP: dp / dp_replicate ranks)
        values["N_d"] = setup.shard_group
    return values


def split_refusal(names, sizes, values) -> ValueError:
    """The error for a step whose tensor is not a whole number of bytes per rank: ``sizes(j)`` evaluates tensor
    ``j`` exactly (:class:`~memledger.core.keyed.NotWholeBytes` where it is not whole); the first such of ``names``
    is named, as the ledger names a row tp does not divide (:attr:`memledger.ledger.ledger.Ledger.rows`)."""
    for j, name in enumerate(names):
        try:
            sizes(j)
        except NotWholeBytes as e:
            share = e.value
            tokens = values.get("B", 1) * values.get("S", 1)
            t = values.get("t", 1)
            why = (f" (sequence parallelism splits the B x S = {tokens:,} token{'s' * (tokens != 1)} over the {t} ranks)"
                   if tokens % t else "")
            return ValueError(f"the step's {name!r} would be {share} bytes per rank at tp {t}: tp must divide the "
                              f"tensors it splits{why}")
    return ValueError("a tensor of the step is not a whole number of bytes at these values")


def block_of(layer, lumped: bool, n_layers: int):
    """The block index of a program's ``layer`` (None outside the blocks); with ``lumped`` programs
    (L > 4) blocks 3 and 4 of the program are the model's L-2 and L-1."""
    if not isinstance(layer, int):
        return None
    return n_layers - 5 + layer if lumped and layer >= 3 else layer
