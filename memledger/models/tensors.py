"""The parameter tensors of an architecture, module by module, with symbolic shapes.

What the whole-model count ``P`` hides and several conventions need: which
tensors are matrices (Adafactor factors their second moment into rows +
columns), which linear layers exist to carry LoRA adapters, and the largest
single module (DeepSpeed's ``largest_layer_params`` counts each module's own
parameters, ``recurse=False``: one linear layer or one embedding, not a block).

Shapes follow PyTorch's ``nn.Linear`` (out, in) and ``nn.Embedding`` (rows, d);
which tensors exist is decided by a :class:`memledger.models.features.Features` record,
as in :mod:`memledger.models.parameters`, and the sum over tensors reproduces
:func:`memledger.models.parameters.param_count_expr` exactly (a test proves it).
"""
from dataclasses import dataclass
from math import prod

import sympy as sp

from .features import Features
from .parameters import widths
from ..core.symbols import E, F, H, L, L_dec, N_pos, N_rb, N_tt, V, d

__all__ = ["PROJECTIONS", "ParamTensor", "factored_elements_expr", "largest_module_params", "module_params_exprs",
           "parameter_tensors", "projections", "total_params_expr"]

#: The linear projections of one dense block, by style: name -> (out, in) before GQA / head-size
#: refinements (:func:`projections` applies them). LoRA targets are these names.
PROJECTIONS = {
    "gpt": {"q_proj": (d, d), "k_proj": (d, d), "v_proj": (d, d), "o_proj": (d, d),
            "up_proj": (F, d), "down_proj": (d, F)},
    "llama": {"q_proj": (d, d), "k_proj": (d, d), "v_proj": (d, d), "o_proj": (d, d),
              "gate_proj": (F, d), "up_proj": (F, d), "down_proj": (d, F)},
}


@dataclass(frozen=True)
class ParamTensor:
    """One parameter tensor: its module, its name there, its shape; ``per_layer`` ones exist L times."""
    module: str
    name: str
    shape: tuple
    per_layer: bool = True
    decoder: bool = False       # a T5 decoder block's tensor: L_dec of them (per_layer)

    @property
    def numel(self) -> sp.Expr:
        return prod(self.shape)

    @property
    def layers(self) -> sp.Expr:
        """How many blocks hold it: L (L_dec for an encoder-decoder's decoder blocks), 1 outside the blocks."""
        return (L_dec if self.decoder else L) if self.per_layer else 1

    @property
    def count(self) -> sp.Expr:
        """Elements in the whole model: L x numel for per-layer tensors."""
        return self.layers * self.numel

    @property
    def is_matrix(self) -> bool:
        return len(self.shape) >= 2


def projections(features="gpt") -> dict:
    """name -> (out, in) of one block's dense projections, with grouped-query K/V and head size."""
    f = Features.of(features)
    q, kv = widths(f)
    shapes = dict(PROJECTIONS[f.style])
    shapes.update({"q_proj": (q, d), "k_proj": (kv, d), "v_proj": (kv, d), "o_proj": (d, q)})
    if not f.is_gated:
        shapes.pop("gate_proj", None)           # T5 1.0's ReLU MLP: wi, wo
    return shapes


def parameter_tensors(features="gpt") -> list:
    """Every parameter tensor the features imply (see :mod:`memledger.models.parameters` for the choices)."""
    f = Features.of(features)
    norm_names = ("weight", "bias") if f.gpt else ("weight",)
    tensors = [ParamTensor(f"norm{i}", n, (d,)) for i in ((1,) if f.shared_norm else (1, 2)) for n in norm_names]
    q, kv = widths(f)
    biases = {"q_proj": q, "k_proj": kv, "v_proj": kv} if f.has_qkv_bias else {}
    if f.gpt:
        biases.update({"o_proj": d, "up_proj": F, "down_proj": d})
    for module, (out, inp) in projections(f).items():
        mlp = module in ("gate_proj", "up_proj", "down_proj")
        if mlp and f.moe:
            tensors.append(ParamTensor(f"experts.{module}", "weight", (E, out, inp)))
            continue
        tensors.append(ParamTensor(module, "weight", (out, inp)))
        if module in biases:
            tensors.append(ParamTensor(module, "bias", (biases[module],)))
    if f.moe:
        tensors.append(ParamTensor("router", "weight", (E, d)))
    if f.encoder_decoder:       # T5's decoder blocks: self-attention, cross-attention, MLP, three norms
        block = list(tensors)
        tensors += [ParamTensor(f"decoder.{t.module}", t.name, t.shape, decoder=True) for t in block]
        tensors += [ParamTensor(f"decoder.cross_{t.module}", t.name, t.shape, decoder=True) for t in block
                    if t.module in ("q_proj", "k_proj", "v_proj", "o_proj")]
        tensors += [ParamTensor("decoder.norm3", n, (d,), decoder=True) for n in norm_names]
        tensors += [ParamTensor("decoder.final_norm", n, (d,), per_layer=False) for n in norm_names]
    if f.relative_bias:
        tensors += [ParamTensor(f"{stack}relative_attention_bias", "weight", (N_rb, H), per_layer=False)
                    for stack in (("", "decoder.") if f.encoder_decoder else ("",))]
    if f.input_norm:
        tensors += [ParamTensor("embedding_norm", n, (d,), per_layer=False) for n in norm_names]
    final = "embedding_norm" if f.embedding_norm else "final_norm"
    tensors += [ParamTensor(final, n, (d,), per_layer=False) for n in norm_names]
    tensors.append(ParamTensor("embed_tokens", "weight", (V, d), per_layer=False))
    if f.positions:
        tensors.append(ParamTensor("embed_positions", "weight", (N_pos, d), per_layer=False))
    if f.token_types:
        tensors.append(ParamTensor("embed_token_types", "weight", (N_tt, d), per_layer=False))
    if not f.is_tied:
        tensors.append(ParamTensor("lm_head", "weight", (V, d), per_layer=False))
    if f.head_bias:
        tensors.append(ParamTensor("lm_head", "bias", (V,), per_layer=False))
    if f.pooler:
        tensors += [ParamTensor("pooler", "weight", (d, d), per_layer=False),
                    ParamTensor("pooler", "bias", (d,), per_layer=False)]
    return tensors


def total_params_expr(features="gpt") -> sp.Expr:
    """Sum of all tensors' elements; equals :func:`memledger.models.parameters.param_count_expr`."""
    return sp.expand(sum(t.count for t in parameter_tensors(features)))


def module_params_exprs(features="gpt") -> dict:
    """Each module's own parameters (PyTorch ``parameters(recurse=False)``)."""
    modules = {}
    for t in parameter_tensors(features):
        modules[t.module] = modules.get(t.module, 0) + t.numel
    return modules


def largest_module_params(arch) -> int:
    """DeepSpeed's ``largest_layer_params`` (stage3.py ``model_to_params``): the most parameters any one
    module owns itself, e.g. the 32000 x 4096 embedding of LLaMA-2 7B."""
    return max(arch.evaluate(e) for e in module_params_exprs(arch.features).values())


def factored_elements_expr(features="gpt") -> sp.Expr:
    """Adafactor's second-moment elements for the whole model: rows + columns for each matrix,
    every element for a vector (Shazeer & Stern 2018; ``torch.optim.Adafactor``, transformers'
    ``Adafactor``: factored for tensors of 2 or more dimensions)."""
    total = 0
    for t in parameter_tensors(features):
        per = (prod(t.shape[:-1]) + prod(t.shape[:-2]) * t.shape[-1]) if t.is_matrix else t.numel
        total += t.layers * per
    return sp.expand(total)
