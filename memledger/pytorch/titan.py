"""torchtitan's own FSDP2 wrapping (``apply_fsdp_to_decoder``) on the reference decoder, measured on a fake process
group: the proof of memledger's ``fsdp_units="torchtitan"`` (:mod:`memledger.step.fsdp2`).

torchtitan 0.3.0 (PyPI) is not installed beside the pinned stack: it asks for ``datasets<4.8`` (and through it
``huggingface_hub<1``) where the shared environment has datasets 5.2 and huggingface_hub 2.5 for transformers 5.25.
Its model and parallelization code need only three of its requirements: ``spmd_types==0.2.3``, ``tyro`` and
``typeguard`` (tyro's). Install them with ``pip install --no-deps torchtitan==0.3.0 spmd_types==0.2.3 tyro
typeguard``. One more thing stands in the way on a CPU build of PyTorch: ``torchtitan.models.common`` imports its
MoE token dispatcher, whose expert-parallel kernels module (``torchtitan/distributed/minimal_async_ep/kernels.py``
line 10) imports ``triton`` at import time. :func:`import_titan` puts an empty stand-in for that one torchtitan
module in ``sys.modules`` (its kernels run only under expert parallelism with MoE blocks; a dense decoder never
reaches them), so that no ``triton`` module exists for PyTorch to find.

What is run is torchtitan's function itself, on the reference decoder given the attribute names torchtitan's
``Decoder`` has (``tok_embeddings``, ``layers``, ``norm``, ``lm_head``, ``enable_weight_tying``), not registered
as modules (``named_parameters`` and the forward order are the reference's). ``apply_fsdp_to_decoder``
(``torchtitan/distributed/fsdp.py``, 0.3.0):

* l. 165-169: ``MixedPrecisionPolicy(param_dtype, reduce_dtype, cast_forward_inputs=False)``;
* l. 176-178, 54-78: ``reshard_after_forward`` from the policy: "default" is ``not pp_enabled`` (True),
  "always" True, "never" False;
* l. 194-199: ``fully_shard(model.tok_embeddings, reshard_after_forward=reshard_after_forward)``: the
  embedding alone;
* l. 200-207: ``fully_shard([model.norm, model.lm_head], reshard_after_forward=policy == "always")``: the final
  norm and the LM head one unit, **not resharded** after forward unless the policy is "always";
* l. 180-192 (tied weights): embedding, norm and head one unit, ``reshard_after_forward=policy == "always"``;
* l. 209-308: ``fully_shard(block, reshard_after_forward=reshard_after_forward)`` for each block;
* l. 310: ``fully_shard(model, **fsdp_config)``: the root, which manages no parameter of its own (every one is in a
  unit above);
* l. 316, 27-41: ``set_gradient_divide_factor(1.0)`` on every FSDP module (torchtitan scales the loss itself).
"""
import sys
import types

from .distributed import DTYPES, _phase_tracker, _propagation_as_in_a_real_run, _rank0_chunks, _tracked_step, \
    fake_world
from .measure import _inputs
from .reference import RefConfig, Trainer, make_model

__all__ = ["POLICIES", "import_titan", "titan_fsdp_step"]

#: torchtitan's ``fsdp_reshard_after_forward`` policies (``torchtitan/distributed/fsdp.py`` l. 66-77).
POLICIES = ("default", "always", "never")
_KERNELS = "torchtitan.distributed.minimal_async_ep.kernels"


def import_titan():
    """``torchtitan.distributed.fsdp`` and ``torchtitan.models.llama3`` (ImportError if torchtitan is not
    installed); the triton-only kernels module of its MoE dispatcher replaced by an empty module first."""
    if _KERNELS not in sys.modules:
        stand_in = types.ModuleType(_KERNELS)
        stand_in.__doc__ = "memledger: an empty stand-in (the real module imports triton; dense models never call it)"
        stand_in.__getattr__ = lambda name: None
        sys.modules[_KERNELS] = stand_in
    import torchtitan
    from torchtitan.distributed import fsdp
    from torchtitan.models import llama3
    return types.SimpleNamespace(version=getattr(torchtitan, "__version__", None), fsdp=fsdp, llama3=llama3)


def _titan_names(model):
    """The reference decoder with torchtitan ``Decoder``'s attribute names (not registered as submodules)."""
    for name, value in (("tok_embeddings", model.embed), ("lm_head", model.head),       # model.norm is its own
                        ("layers", {str(i): block for i, block in enumerate(model.blocks)}),
                        ("enable_weight_tying", model.head.weight is model.embed.weight)):
        object.__setattr__(model, name, value)
    return model


def titan_fsdp_step(c: RefConfig, loop: str = "fp32-adamw", batch: int = 1, seq: int = 2048, world: int = 8, *,
                    param_dtype: str = "bf16", reduce_dtype: str = "fp32", policy: str = "default",
                    trace: bool = False) -> dict:
    """``FSDPMemTracker``'s account of the second training step of ``c`` wrapped by torchtitan's own
    ``apply_fsdp_to_decoder`` (rank 0 of a fake world of ``world`` ranks, ``pp_enabled=False``,
    ``reshard_after_forward_policy=policy``). The optimizer's state is made as a first step leaves it
    (``Trainer.init_state``), as ``memledger.pytorch.distributed.fsdp_step(track_first=False)`` does. Returns what
    ``fsdp_step`` returns."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh

    if policy not in POLICIES:
        raise ValueError(f"policy must be one of {', '.join(POLICIES)}, got {policy!r}")
    for name, value in (("param_dtype", param_dtype), ("reduce_dtype", reduce_dtype)):
        if value not in DTYPES or value is None:
            raise ValueError(f"{name} must be one of bf16, fp32, fp16, got {value!r}")
    titan = import_titan()
    with fake_world(world):
        dp_mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("fsdp",))
        fake = FakeTensorMode()
        with fake:
            model = _titan_names(make_model(c, loop))
        with _rank0_chunks():
            titan.fsdp.apply_fsdp_to_decoder(model, dp_mesh, param_dtype=DTYPES[param_dtype],
                                             reduce_dtype=DTYPES[reduce_dtype], pp_enabled=False,
                                             reshard_after_forward_policy=policy)
        with fake:
            trainer = Trainer(model, loop)
            ids, targets = _inputs(c, batch, seq)
            tracker = _phase_tracker(FSDPMemTracker)(model, trainer.opt)
            tracker.track_inputs((ids, targets))
            trainer.init_state()
            with _propagation_as_in_a_real_run(), tracker:
                return _tracked_step(tracker, trainer, ids, targets, trace=trace)


def titan_block_saved(d: int, H: int, F: int, batch: int, seq: int, attention: str = "sdpa") -> int:
    """The bytes autograd saves in one forward of torchtitan's own ``Llama3TransformerBlock`` (0.3.0: fused QKV
    with contiguous q, k, v, ``ComplexRoPE``, ``nn.RMSNorm``, SwiGLU ``FeedForward``), BF16 parameters and input
    of (batch, seq, d), under FakeTensorMode on the CPU; each storage once, parameters and buffers (the RoPE
    cache) left out. ``attention="sdpa"``: ``ScaledDotProductAttention`` in place of the block's inner attention:
    torchtitan 0.3.0 builds language models with ``flex`` or ``varlen`` only (``models/common/config_utils.py``
    ``get_attention_config``), which need torch.compile or CUDA; the SDPA module is torchtitan's own (it serves
    Flux) and takes the same (B, L, N, H) q, k, v."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode

    if attention != "sdpa":
        raise ValueError(f"attention must be sdpa (flex and varlen need torch.compile or CUDA), got {attention!r}")
    titan = import_titan()
    from torchtitan.models.common import ComplexRoPE, Embedding, Linear, RMSNorm
    from torchtitan.models.common.attention import ScaledDotProductAttention
    llama3 = titan.llama3
    chosen = llama3.get_attention_config
    llama3.get_attention_config = lambda backend: ScaledDotProductAttention.Config()
    try:
        layers = llama3._build_llama3_layers(fuse_qkv=True, n_layers=1, dim=d, n_heads=H, hidden_dim=F,
                                             rope=ComplexRoPE.Config(dim=d // H, max_seq_len=seq, theta=10000),
                                             attn_backend="sdpa")
    finally:
        llama3.get_attention_config = chosen
    config = llama3.Llama3Model.Config(dim=d, vocab_size=8, tok_embeddings=Embedding.Config(
        num_embeddings=8, embedding_dim=d), norm=RMSNorm.Config(normalized_shape=d),
        lm_head=Linear.Config(in_features=d, out_features=8), layers=layers)
    before = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with FakeTensorMode():
            model = config.build()
            skip = {t.untyped_storage()._cdata for t in (*model.parameters(), *model.buffers())}
            x = torch.randn(batch, seq, d, requires_grad=True)
            seen = {}

            def pack(t):
                seen.setdefault(t.untyped_storage()._cdata, t.untyped_storage().nbytes())
                return t
            with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model.layers["0"](x, None, None)
            return sum(n for k, n in seen.items() if k not in skip)
    finally:
        torch.set_default_dtype(before)
