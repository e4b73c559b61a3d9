"""One GPU's memory by *part*, for any of memledger's views, so that figures compare like with like.

The parts are what a reader asks about when two estimates differ: the
weights, the gradients, the optimizer states (ZeRO's three roles,
Rajbhandari et al. 2020), model states that a source books as one sum of
several roles (DeepSpeed's sharded ``int(18P/N)``, accelerate's largest
phase), the activations kept for backward, the KV cache and working buffer
of inference, and everything else (CUDA context, workspace, communication
buffers).

:func:`gpu_parts` reads a training :class:`~memledger.ledger.ledger.Ledger`, a
:class:`~memledger.ledger.lora.LoraLedger`, an :class:`~memledger.ledger.inference.Inference`
or a convention's :class:`~memledger.calculators.base.Estimate`; its values
are exact integer bytes that add up to the view's own GPU total.
"""

__all__ = ["PARTS", "ROLE_PART", "gpu_parts", "gpu_total"]
PARTS = ("weights", "gradients", "optimizer states", "model states, roles not split", "activations",
         "KV cache", "working buffer", "overhead")
#: A model-state role (a recipe component's, a convention row's) -> its part. "mixed": one sum over several
#: roles, as the source computes it; "gathered": ZeRO-3's gathered parameters and gradients of one unit.
ROLE_PART = {"param": "weights", "grad": "gradients", "optimizer": "optimizer states",
             "mixed": "model states, roles not split", "gathered": "model states, roles not split"}
_INFERENCE_PART = {"weights": "weights", "KV cache": "KV cache", "working buffer": "working buffer",
                   "CUDA context": "overhead", "NF4 dequantization": "working buffer", "NF4 ": "weights",
                   "LLM.int8 matmul": "working buffer", "LLM.int8 ": "weights"}


def _empty() -> dict:
    return dict.fromkeys(PARTS, 0)


def _ledger_parts(ledger) -> dict:
    parts = _empty()
    for role, nbytes in ledger.by_role("gpu").items():
        parts[ROLE_PART[role]] += nbytes
    parts["activations"] = ledger.group_total("activations", "gpu")
    parts["overhead"] = ledger.group_total("overhead", "gpu")
    return parts


def _lora_parts(ledger) -> dict:
    parts = _empty()
    for row in ledger.rows:
        if row.device == "gpu":
            parts[ROLE_PART[row.role] if row.group == "model_states" else row.group] += row.bytes
    return parts


def _inference_parts(inference) -> dict:
    parts = _empty()
    for row in inference.rows:
        part = next(p for prefix, p in _INFERENCE_PART.items() if row.name.startswith(prefix))
        parts[part] += row.bytes
    return parts


def _estimate_parts(estimate) -> dict:
    parts = _empty()
    for row in estimate.rows:
        if row.device != "gpu":
            continue
        if row.group == "model_states":
            parts[ROLE_PART[row.role]] += row.bytes
        else:
            parts["activations" if row.group == "activations" else "overhead"] += row.bytes
    return parts


def gpu_parts(view) -> dict:
    """Exact GPU bytes of ``view`` by part (every key of :data:`PARTS`, zeros included).

    ``TypeError`` for anything that is not a ledger, a LoRA ledger, an inference or a convention's estimate.
    """
    from .base import Estimate
    from ..ledger.inference import Inference
    from ..ledger.ledger import Ledger
    from ..ledger.lora import LoraLedger
    readers = ((Ledger, _ledger_parts), (LoraLedger, _lora_parts), (Inference, _inference_parts),
               (Estimate, _estimate_parts))
    for kind, read in readers:
        if isinstance(view, kind):
            return read(view)
    raise TypeError(f"view must be a Ledger, LoraLedger, Inference or a convention's Estimate, got {view!r}")


def gpu_total(view) -> int:
    """The view's GPU total, as the sum of its parts."""
    return sum(gpu_parts(view).values())
