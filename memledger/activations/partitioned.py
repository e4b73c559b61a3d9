"""What a block compiled by ``torch.compile`` saves for backward: AOTAutograd's min-cut partitioner.

``torch.compile`` traces a block's forward and backward into one joint graph, decomposes it (Inductor's
decomposition table) and splits it with ``min_cut_rematerialization_partition(..., compiler="inductor")``
(``torch/_functorch/partitioners.py`` l. 3725, PyTorch 2.13.0; Inductor calls it from ``partition_fn``,
``torch/_inductor/compile_fx.py`` l. 2273-2318, after its joint-graph passes; ``backend=
"aot_eager_decomp_partition"`` calls the same partitioner with the same table,
``torch/_dynamo/backends/debugging.py`` l. 442-470). The forward keeps a minimum cut of the joint graph;
pointwise ops are recomputed in backward unless a backward op that cannot fuse with them (a matmul) must
read them materialized (``should_ban_recomputation``, ``partitioners.py`` l. 2200-2256). Measured on the
reference block (:mod:`memledger.pytorch.compiled`, real tensors, CPU, several shapes and LLaMA-2 7B's),
one block's saved set is the eager inventory (:func:`memledger.activations.inventory.inventory`) with:

* **RMSNorm decomposed**: its input and an FP32 rstd per token (the fused kernel's pair), whatever the eager
  backend's ``nn.RMSNorm`` saves (on CPU, composite: FP32 copies); LayerNorm its input, mean and rstd (the
  reference casts the statistics to the input's dtype on CPU, ``torch/_refs/__init__.py``
  ``native_layer_norm`` l. 3505-3507; FP32 on CUDA): ``rmsnorm="fused"``, the backend's norm statistics;
* **dropout decomposed** into ``rand_like(x) > p`` (``torch/_decomp/decompositions.py`` ``native_dropout``
  l. 1288): a 1-byte bool mask (``mask_dtype="bool"``), on every backend;
* **SiLU(gate) recomputed**: the SwiGLU MLP keeps the gate and up outputs and their product (the down
  projection's weight gradient, a matmul, reads it), not SiLU(gate): one B*S*F tensor less per block.

Everything else is the eager set, byte for byte (the norm 2 input is saved as the output projection's output,
x + that being recomputed: the same bytes). Not modelled: Inductor's fused kernels' workspace and the
graphs' transients (what is alive inside a compiled forward or backward), CUDA graphs' private pools
(``mode="reduce-overhead"``), the partitioner under an activation memory budget
(``torch._functorch.config.activation_memory_budget`` < 1), recomputation or tensor parallelism under
``torch.compile``, and the tensors outside the blocks (the embedding, final norm, head and loss run
eagerly).
"""
from ..core.choices import check_choice

__all__ = ["NOT_MODELLED", "RECOMPUTED", "check_compiled", "compiled_options", "compiled_rows"]

#: The eager inventory's rows the partitioner recomputes in backward instead of saving (measured).
RECOMPUTED = ("SiLU output",)
#: What the compiled block's bookings leave out (for error messages and tables).
NOT_MODELLED = ("Inductor's fused kernels' workspace and the compiled graphs' transients, CUDA graphs' pools, "
                "an activation memory budget")


def compiled_options(options: dict) -> dict:
    """:func:`~memledger.activations.inventory.inventory` options of a compiled block from an eager backend's
    (:meth:`memledger.activations.backends.Backend.inventory_options`): RMSNorm's input and FP32 rstd, 1-byte
    dropout masks. The math SDPA (CPU, LLaMA blocks with dropout) is refused: not measured compiled."""
    attention = options.get("attention", "eager")
    check_choice("attention", attention, ("eager", "flash", "math"))
    if attention == "math":
        raise ValueError("compile: the math SDPA kernel (LLaMA blocks with dropout on CPU) is not measured "
                         "compiled; use flash attention or no dropout")
    return {**options, "rmsnorm": "fused", "mask_dtype": "bool"}


def compiled_rows(rows) -> list:
    """The rows of an inventory built with :func:`compiled_options` that a compiled block saves (all but
    :data:`RECOMPUTED`)."""
    return [r for r in rows if r.name not in RECOMPUTED]


def check_compiled(features, recompute: str = "none", tp: int = 1, offload_activations: bool = False) -> None:
    """``ValueError`` naming ``compile`` and what of the setup the compiled block was not measured with: the
    reference decoder's GPT and LLaMA blocks (LLaMA also with grouped-query attention), no recomputation, one
    tensor-parallel rank, activations on the GPU."""
    lacks = [what for what, on in [
        ("mixture of experts", features.moe), ("a head size other than d/H", features.head_dim),
        ("QKV biases in a LLaMA block", not features.gpt and bool(features.qkv_bias)),
        ("grouped-query attention in a GPT block", features.gpt and features.gqa),
        ("learned positions, token types, a pooler or an embedding norm",
         features.positions or features.token_types or features.pooler or features.embedding_norm),
        ("a parallel block (GPT-NeoX, Phi)", getattr(features, "parallel", False)),
        ("ALiBi or an input LayerNorm (BLOOM)", getattr(features, "alibi", False) or getattr(features, "input_norm", False)),
        (f"recompute {recompute} (torch.utils.checkpoint under torch.compile)", recompute != "none"),
        ("tensor parallelism", tp > 1), ("offloaded activations", offload_activations)] if on]
    if lacks:
        raise ValueError(f"compile: the min-cut partitioner's saved set is measured on the reference decoder's GPT "
                         f"and LLaMA blocks without recomputation; not for {', '.join(lacks)}")
