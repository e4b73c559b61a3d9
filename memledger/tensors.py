"""The parameter tensors of an architecture, module by module, with symbolic shapes.

What the whole-model count ``P`` hides and several conventions need: which
tensors are matrices (Adafactor factors their second moment into rows +
columns), which linear layers exist to carry LoRA adapters, and the largest
single module (DeepSpeed's ``largest_layer_params`` counts each module's own
parameters, ``recurse=False``: one linear layer or one embedding, not a block).

Shapes follow PyTorch's ``nn.Linear`` (out, in) and ``nn.Embedding`` (V, d);
the sum over tensors reproduces :func:`memledger.architecture.param_count_expr`
exactly (a test proves it).
"""
from dataclasses import dataclass
from math import prod

import sympy as sp

from .symbols import F, L, V, d

#: The linear projections of one block, by style: name -> (out, in). LoRA targets are these names.
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

    @property
    def numel(self) -> sp.Expr:
        return prod(self.shape)

    @property
    def count(self) -> sp.Expr:
        """Elements in the whole model: L x numel for per-layer tensors."""
        return L * self.numel if self.per_layer else self.numel

    @property
    def is_matrix(self) -> bool:
        return len(self.shape) >= 2


def parameter_tensors(style: str = "gpt", n_positions: int = 0) -> list:
    """Every parameter tensor of the architecture style (see :mod:`memledger.architecture`).

    gpt: LayerNorms (weight, bias), biased Q/K/V/O and up/down projections, tied
    embedding, optional learned positions. llama: RMSNorm weights, no biases,
    SwiGLU gate/up/down, untied input and output embeddings.
    """
    if style not in PROJECTIONS:
        raise ValueError(f"style must be one of {', '.join(PROJECTIONS)}, got {style!r}")
    tensors = []
    biased = style == "gpt"
    norm_names = ("weight", "bias") if biased else ("weight",)
    for i in (1, 2):
        tensors += [ParamTensor(f"norm{i}", n, (d,)) for n in norm_names]
    for module, (out, inp) in PROJECTIONS[style].items():
        tensors.append(ParamTensor(module, "weight", (out, inp)))
        if biased:
            tensors.append(ParamTensor(module, "bias", (out,)))
    tensors += [ParamTensor("final_norm", n, (d,), per_layer=False) for n in norm_names]
    tensors.append(ParamTensor("embed_tokens", "weight", (V, d), per_layer=False))
    if n_positions and style == "gpt":
        tensors.append(ParamTensor("embed_positions", "weight", (n_positions, d), per_layer=False))
    if style == "llama":
        tensors.append(ParamTensor("lm_head", "weight", (V, d), per_layer=False))
    return tensors


def total_params_expr(style: str = "gpt", n_positions: int = 0) -> sp.Expr:
    """Sum of all tensors' elements; equals :func:`memledger.architecture.param_count_expr`."""
    return sp.expand(sum(t.count for t in parameter_tensors(style, n_positions)))


def module_params_exprs(style: str = "gpt", n_positions: int = 0) -> dict:
    """Each module's own parameters (PyTorch ``parameters(recurse=False)``)."""
    modules = {}
    for t in parameter_tensors(style, n_positions):
        modules[t.module] = modules.get(t.module, 0) + t.numel
    return modules


def _values(arch) -> dict:
    return {d: arch.d_model, F: arch.d_ff, V: arch.vocab_size, L: arch.n_layers}


def largest_module_params(arch) -> int:
    """DeepSpeed's ``largest_layer_params`` (stage3.py ``model_to_params``): the most parameters any one
    module owns itself, e.g. the 32000 x 4096 embedding of LLaMA-2 7B."""
    values = _values(arch)
    return max(int(sp.sympify(e).subs(values)) for e in module_params_exprs(arch.style, arch.n_positions).values())


def factored_elements_expr(style: str = "gpt", n_positions: int = 0) -> sp.Expr:
    """Adafactor's second-moment elements for the whole model: rows + columns for each matrix,
    every element for a vector (Shazeer & Stern 2018; transformers' ``Adafactor._get_options``)."""
    total = 0
    for t in parameter_tensors(style, n_positions):
        per = (prod(t.shape[:-1]) + prod(t.shape[:-2]) * t.shape[-1]) if t.is_matrix else t.numel
        total += L * per if t.per_layer else per
    return sp.expand(total)
