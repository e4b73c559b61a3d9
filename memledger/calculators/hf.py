"""Hugging Face "Model training anatomy" and Stas Bekman's "Machine Learning Engineering".

HF: huggingface/transformers ``docs/source/en/model_memory_anatomy.md``
(section "Anatomy of Model's Memory"): mixed-precision AdamW needs 18 bytes
per parameter = 6 (a model in fp32 and one in fp16) + 8 (AdamW's two states)
+ 4 (gradients, "always kept in fp32"), plus activations; 8-bit AdamW 2
bytes of states, SGD with momentum 4; inference 6 bytes/param.

Bekman: stas00/ml-engineering (744d01e1) ``training/performance/README.md``
lines 227-347 ("Anatomy of Model's Memory Usage"): the same 18 bytes, and a
worked Llama-3.1-8B activation budget (lines 265-347):

    hidden_states  = dtype * bs * seqlen * hidden                 (0.25 GiB)
    one layer      = copies * hidden_states, copies measured: 28  (7 GiB)
    checkpoints    = num_layers * hidden_states                   (8 GiB)
    no checkpoints = num_layers * one layer                       (224 GiB)
    logits         = 4 * bs * seqlen * vocab                      (15.7 GiB, "~16")
    total          = 7 + 8 + 16 = 31 GiB with, 224 + 16 = 240 GiB without checkpointing
"""
import sympy as sp

from ..core.symbols import B, L, P, S, V, d
from .base import Convention, Item

__all__ = ["BEKMAN", "HF_ANATOMY", "HIDDEN_STATE_COPIES", "LLAMA3_8B_COPIES", "bekman_activations", "hidden_states"]

#: Bekman's measured hidden-state copies per layer (training/performance/README.md lines 304-309).
HIDDEN_STATE_COPIES = {"HuggingFaceTB/SmolLM2-360M": 24, "meta-llama/Llama-3.1-8B-Instruct": 28,
                       "mistralai/Mistral-7B-Instruct-v0.3": 28, "Qwen/Qwen3-4B": 38, "google/gemma-1.1-2b-it": 48}
LLAMA3_8B_COPIES = HIDDEN_STATE_COPIES["meta-llama/Llama-3.1-8B-Instruct"]


def hidden_states(dtype_size: int = 2) -> sp.Expr:
    return dtype_size * B * S * d


def bekman_activations(copies: int = LLAMA3_8B_COPIES, checkpointing: bool = True, dtype_size: int = 2) -> dict:
    """Bekman's activation parts, bytes: working memory of one layer, checkpoints or all layers, logits."""
    layer = copies * hidden_states(dtype_size)
    parts = {"one layer's working memory": layer} if checkpointing else {}
    parts["checkpoints (num_layers x hidden_states)" if checkpointing else "all layers' activations"] = (
        L * hidden_states(dtype_size) if checkpointing else L * layer)
    parts["fp32 logits"] = 4 * B * S * V
    return parts


def _anatomy_items(ledger, inputs) -> list:
    items = [Item("model weights: fp32 + fp16 copies (6 bytes/param)", "model_states", "gpu", 6 * P, "param"),
             Item("AdamW states (8 bytes/param)", "model_states", "gpu", 8 * P, "optimizer"),
             Item("gradients, fp32 (4 bytes/param)", "model_states", "gpu", 4 * P, "grad")]
    return items


def _bekman_items(ledger, inputs) -> list:
    items = _anatomy_items(ledger, inputs)
    if ledger.arch is not None:
        checkpointing = ledger.recompute != "none"
        items += [Item(name, "activations", "gpu", expr)
                  for name, expr in bekman_activations(checkpointing=checkpointing).items()]
    return items


HF_ANATOMY = Convention(
    "hf-anatomy", "Hugging Face 'Model training anatomy' (18 B/param)",
    "huggingface/transformers docs/source/en/model_memory_anatomy.md, 'Anatomy of Model's Memory'",
    _anatomy_items, reads=(),
    differs="fp32 gradients (4 bytes) and an fp16 working copy counted with the fp32 weights: 6 + 8 + 4 = 18 "
            "B/param, no sharding; activations named but not given a formula")
BEKMAN = Convention(
    "bekman", "Stas Bekman, ML Engineering: 18 B/param + hidden-state-copies activations",
    "stas00/ml-engineering training/performance/README.md lines 227-347 (744d01e1)",
    _bekman_items, reads=("recompute", "batch_size", "seq_len"),
    differs="18 B/param as HF's anatomy; activations from a measured number of hidden-state copies (28 for "
            "Llama-3.1-8B) plus fp32 logits, not an itemized inventory; with checkpointing one layer's working "
            "memory + one checkpoint per layer")
