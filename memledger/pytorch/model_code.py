"""Which part of a library's decoder layer saves what (chapter 19, "Your model's code decides").

The libraries' own models are built and measured by :mod:`memledger.pytorch.libraries` (transformers'
``LlamaForCausalLM``, torchtune's ``llama2``, LitGPT's ``GPT``, each from its own config without weights, under
``FakeTensorMode``, pure BF16). :func:`saved_by_part` runs the same census (``saved_tensors_hooks``, each storage
counted once, parameters and buffers skipped) on a model with two layers and attributes every storage the second
layer saves first to the part of the layer that was running when it was saved: its two norms, its attention (the
projections, the rotary code, the attention kernel) or its MLP; what the layer saves between them (the residual
additions save nothing) is "other". The parts add up to the layer's bytes, which equal the harness's "two layers
minus one" figure (tests/views/test_model_code_figure.py holds them to it).
"""
from contextlib import ExitStack

import torch

from .libraries import _unpacked, make_library_model
from .torchtune_litgpt import _built

__all__ = ["FAMILY", "PARTS", "SUBMODULES", "saved_by_part"]

#: The parts of a layer, in the order figures stack them.
PARTS = ("norms", "attention", "MLP", "other")
#: Each library's names for the submodules of its LLaMA layer (transformers ``LlamaDecoderLayer``, torchtune
#: ``TransformerSelfAttentionLayer``, LitGPT ``Block``).
SUBMODULES = {
    "hf": {"input_layernorm": "norms", "post_attention_layernorm": "norms", "self_attn": "attention", "mlp": "MLP"},
    "torchtune": {"sa_norm": "norms", "mlp_norm": "norms", "attn": "attention", "mlp": "MLP"},
    "litgpt": {"norm_1": "norms", "norm_2": "norms", "attn": "attention", "mlp": "MLP"},
}
#: The LLaMA-2 builder or config name each library builds from.
FAMILY = {"torchtune": "llama2", "litgpt": "Llama-2-7b-hf"}


def _model(library, d, H, F, V, attn, seq):
    """(the model's forward on ids, its layers) with two layers, under the current (fake) mode."""
    if library == "hf":
        model = make_library_model("hf", d, H, F, V, 2, attn)
        return (lambda ids: model.loss(ids, ids)), list(model.model.model.layers), model
    if attn != "sdpa":
        raise ValueError(f"attn for {library} must be sdpa (only transformers offers eager), got {attn!r}")
    model, layers = _built(library, FAMILY[library], d, 2, H, F, V, None, max(4096, seq))
    return model, layers, model


def saved_by_part(library: str, d: int, H: int, F: int, V: int, batch: int, seq: int, attn: str = "sdpa") -> dict:
    """{"norms", "attention", "MLP", "other": bytes the second of two layers saves first in that part, "layer":
    their sum, "tensors": [(part, bytes, dtype, shape)] sorted} for ``library``'s LLaMA model in BF16 (one forward
    pass under ``FakeTensorMode``; transformers' with its loss and its packed-sequence check patched away)."""
    if library not in SUBMODULES:
        raise ValueError(f"library must be one of {', '.join(SUBMODULES)}, got {library!r}")
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode(), ExitStack() as stack:
        forward, layers, model = _model(library, d, H, F, V, attn, seq)
        skip = {id(t.untyped_storage()) for t in (*model.parameters(), *model.buffers())}
        where, seen = ["outside"], {}
        hooks = [layers[1].register_forward_pre_hook(lambda m, a: where.__setitem__(0, "other")),
                 layers[1].register_forward_hook(lambda m, a, o: where.__setitem__(0, "outside"))]
        for name, part in SUBMODULES[library].items():
            sub = getattr(layers[1], name)
            hooks.append(sub.register_forward_pre_hook(lambda m, a, part=part: where.__setitem__(0, part)))
            hooks.append(sub.register_forward_hook(lambda m, a, o: where.__setitem__(0, "other")))
        for h in hooks:
            stack.callback(h.remove)

        def pack(t):
            st = t.untyped_storage()
            if id(st) not in skip and id(st) not in seen:
                seen[id(st)] = (st, where[0], st.nbytes(), str(t.dtype).replace("torch.", ""), tuple(t.shape))
            return t
        ids = torch.randint(0, V, (batch, seq))
        with _unpacked() if library == "hf" else ExitStack(), \
                torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = forward(ids)
        del out
    tensors = sorted(v[1:] for v in seen.values() if v[1] != "outside")
    result = {part: sum(t[1] for t in tensors if t[0] == part) for part in PARTS}
    result["layer"] = sum(result[part] for part in PARTS)
    result["tensors"] = tensors
    return result
