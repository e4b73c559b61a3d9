"""Which of the model families' blocks the step timeline runs op by op, and what it refuses with them (plain
Python: :mod:`memledger.step.structure` reads it without SymPy).

GPT-NeoX (``modeling_gpt_neox.py``, ``use_parallel_residual``: x + attn(ln1(x)) + mlp(ln2(x))) and Phi
(``modeling_phi.py``: one ``input_layernorm`` feeding attention and MLP) are GPT blocks with a parallel residual
(:mod:`memledger.step.parallel`), an untied LM head and, Phi's, a bias on it. Rotary embeddings (GPT-NeoX's
``rotary_pct``, Phi's ``partial_rotary_factor``) are not in the reference decoder, as LLaMA's are not, and the step,
like the ledger's inventory, books no tensor of theirs. What that leaves out: the cos/sin tables, and the rotated
query and key, which Hugging Face's ``_attn_projections_and_rope`` (``modeling_gpt_neox.py``) concatenates into new
tensors (``torch.cat((query, query_pass), dim=-1)``, the same for the key) that the attention core then saves,
while the value, a view of the fused projection's output, keeps all of it alive: 2 B*S*d more per block than the
reference's q and k views, and the rotation's temporaries. (Phi's separate q, k and v projections, ``modeling_phi.py``,
leave the rotated copies in place of their outputs: the same saved bytes as the reference's views.)
"""
from ..models.features import Features
from .inputs import StepInputs

__all__ = ["check", "modelled"]


def modelled(f: Features) -> dict:
    """The fields of ``f`` the step models beyond the plain GPT block: a parallel residual (with one shared
    norm), an untied LM head and a bias on it; empty for LLaMA blocks."""
    if not f.gpt:
        return {}
    return dict(parallel=f.parallel, shared_norm=f.shared_norm, tied=False if not f.is_tied else None,
                head_bias=f.head_bias and not f.is_tied)


def check(setup: StepInputs, f: Features, kernel: str) -> tuple:
    """{"parallel": ..., "shared_norm": ..., "head_bias": ...}: the step's :class:`~memledger.step.structure.Shape`
    fields (empty where none applies), or
    ``ValueError`` naming what a parallel block or an untied GPT head (checked against PyTorch in the plain loop
    only) is not modelled with."""
    if not f.gpt or not (f.parallel or f.head_bias or not f.is_tied):
        return {}
    lacks = [what for what, off in [
        (f"the {kernel} attention kernel (use the eager core)", kernel != "eager" and setup.implementation == "reference"),
        ("grouped-query attention", f.gqa), ("a head size other than d/H", f.head_dim),
        ("tensor parallelism", setup.tp > 1), ("ZeRO-3", setup.zero_stage == 3),
        (f"framework {setup.framework}", setup.framework != "plain"),
        ("a chunked loss", setup.loss_chunks > 1 or setup.loss_impl != "torchtune"),
        ("activation offloading", setup.offload_activations),
        ("packed documents", setup.packed),
        ("the optimizer in backward", setup.optimizer_in_backward)] if off]
    if lacks:
        family = ("Phi's one-norm parallel attention and MLP" if f.shared_norm else "GPT-NeoX's parallel attention "
                  "and MLP" if f.parallel else "an untied GPT decoder")
        named = f" (model_type {setup.arch.model_type!r})" if setup.arch.model_type else ""
        raise ValueError(f"the step timeline models {family}{named} with the eager core (no, selective or full "
                         f"recomputation), one rank, the plain loop; not with {', '.join(lacks)}")
    return dict(parallel=f.parallel, shared_norm=f.shared_norm, head_bias=bool(f.head_bias))
