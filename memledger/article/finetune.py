"""Fine-tuning one model on one GPU: the usual methods side by side, and serving it for contrast.

A *method* is one way to train the same model with less memory: full
training with the article's recipe, cheaper optimizer states (bitsandbytes'
8-bit Adam with and without an FP32 master, Adafactor, pure BF16 AdamW where
the recipe exists), LoRA (Hu et al. 2021) and QLoRA (Dettmers et al. 2023).
:func:`methods` builds each as a ledger of memledger's own
(:class:`~memledger.ledger.ledger.Ledger`, :class:`~memledger.ledger.lora.LoraLedger`)
for one workload, :func:`serving` the same model's
:class:`~memledger.ledger.inference.Inference`; :func:`parts_table` and
:func:`fits_table` lay them out by part (:mod:`memledger.calculators.parts`) and against
the GPUs people fine-tune on.

GPUs: the GeForce RTX 4090 (sold as 24 GB), the L40S (48 GB, the "single
48GB GPU" class of the QLoRA paper's abstract) and the A100 (80 GB), each with
the capacity ``nvidia-smi`` reports (:data:`memledger.ledger.hardware.GPU_MEMORY`).

The full-training ledgers book the transformer blocks only (``scope="layers"``,
as the article and :class:`~memledger.ledger.lora.LoraLedger` do), so that every
method is compared on the same activations; the tensors outside the blocks
(above all the FP32 log-softmax of the logits) come on top of each alike.
"""
from ..activations.inventory import inventory
from ..models.architecture import BLOCKS
from ..core.table import Table
from ..ledger.hardware import GPU_MEMORY
from ..ledger.inference import Inference
from ..ledger.ledger import Ledger
from ..ledger.lora import LoraConfig, LoraLedger, activation_rows, adapter_params, qlora
from ..calculators.parts import PARTS, gpu_parts
from ..states.recipes import ALL_RECIPES
from ..models.tensors import PROJECTIONS
from ..core.units import format_bytes

__all__ = ["LORA_RANK", "ONE_GPU", "OPTIMIZER_METHODS", "activation_changes", "activation_changes_table",
           "dropped_bytes_per_layer", "fits_on", "fits_table", "frozen_base_bytes", "methods", "parts_table",
           "serving", "trainable_params"]

#: The GPUs of the chapter's question, smallest first: label -> bytes.
ONE_GPU = {"RTX 4090": GPU_MEMORY["rtx-4090"], "L40S": GPU_MEMORY["l40s"], "A100 80GB": GPU_MEMORY["a100-80gb"]}
#: Full training with a cheaper optimizer: label -> recipe name (those that exist in this library).
OPTIMIZER_METHODS = {"full, BF16 + AdamW": "bf16-adamw", "full, 8-bit Adam": "bf16-adam8bit-bnb",
                     "full, pure BF16 AdamW": "bf16-pure-adamw",
                     "full, 8-bit Adam, no master": "bf16-adam8bit-bnb-nomaster",
                     "full, BF16 Adafactor": "bf16-adafactor"}
LORA_RANK = 16


def methods(preset="llama2-7b", batch_size: int = 1, seq_len: int = 2048, recompute: str = "none") -> dict:
    """label -> ledger of each method for one workload (same model, batch, sequence, recomputation).

    LoRA: rank 16 on Q and V (the LoRA paper's choice of projections), then on every projection;
    QLoRA as its paper trains (NF4 base, rank 64 on every projection, paged 8-bit AdamW)."""
    work = dict(batch_size=batch_size, seq_len=seq_len, recompute=recompute)
    views = {label: Ledger(preset, recipe=recipe, scope="layers", **work)
             for label, recipe in OPTIMIZER_METHODS.items() if recipe in ALL_RECIPES}
    arch = views["full, BF16 + AdamW"].arch
    views["LoRA r=16, Q and V"] = LoraLedger(arch, LoraConfig(rank=LORA_RANK), **work)
    views["LoRA r=16, every projection"] = LoraLedger(
        arch, LoraConfig(rank=LORA_RANK, targets=tuple(PROJECTIONS[arch.style])), **work)
    views["QLoRA r=64, every projection"] = LoraLedger(arch, qlora(style=arch.style), **work)
    return views


def serving(preset="llama2-7b", batch_size: int = 1, seq_len: int = 2048) -> Inference:
    """The same model served (BF16 weights and KV cache) to ``batch_size`` sequences of ``seq_len`` tokens."""
    return Inference(preset, batch_size=batch_size, seq_len=seq_len)


def trainable_params(view) -> int:
    """Parameters the method updates: all of them, the adapters only, or none (serving)."""
    if isinstance(view, LoraLedger):
        return adapter_params(view.arch, view.config)
    if isinstance(view, Inference):
        return 0
    return view.params


def parts_table(views: dict, unit: str = "GB") -> Table:
    """One row per part (those any view has), one column per view, and the GPU totals."""
    parts = {label: gpu_parts(v) for label, v in views.items()}
    used = [p for p in PARTS if any(parts[label][p] for label in views)]
    rows = [(p,) + tuple(format_bytes(parts[label][p], unit) for label in views) for p in used]
    totals = [("GPU total",) + tuple(format_bytes(sum(parts[label].values()), unit) for label in views)]
    return Table(("part",) + tuple(views), rows, totals=totals, numeric=range(1, len(views) + 1))


def fits_on(total: int, gpus: dict = None) -> str:
    """The labels of ``gpus`` (default :data:`ONE_GPU`) whose memory holds ``total`` bytes, or "none"."""
    fitting = [label for label, size in (gpus or ONE_GPU).items() if total <= size]
    return ", ".join(fitting) or "none"


def fits_table(by_recompute: dict, unit: str = "GB", gpus: dict = None) -> Table:
    """``by_recompute``: recomputation mode -> {label: view} (same labels). One row per method: trainable
    parameters, then per mode the GPU total and the GPUs it fits on."""
    modes = list(by_recompute)
    labels = list(by_recompute[modes[0]])
    header = ("method", "trainable parameters")
    for mode in modes:
        header += (f"GPU total ({mode})", f"fits on ({mode})")
    rows = []
    for label in labels:
        row = (label, f"{trainable_params(by_recompute[modes[0]][label]):,}")
        for mode in modes:
            total = sum(gpu_parts(by_recompute[mode][label]).values())
            row += (format_bytes(total, unit), fits_on(total, gpus))
        rows.append(row)
    return Table(header, rows, numeric=(1,) + tuple(2 + 2 * i for i in range(len(modes))))


def activation_changes(style: str, config: LoraConfig, dropout: bool = False) -> tuple:
    """(saved tensors full training keeps and LoRA does not, saved tensors LoRA adds) for one block of
    ``style``: the first are inputs kept only for frozen projections' weight gradients, the second the
    adapters' rank-r intermediates (and LoRA-dropout tensors)."""
    full = inventory(*BLOCKS[style], dropout)
    lora = activation_rows(style, config, dropout)
    full_names, lora_names = {r.name for r in full}, {r.name for r in lora}
    return [r for r in full if r.name not in lora_names], [r for r in lora if r.name not in full_names]


def frozen_base_bytes(view: LoraLedger) -> int:
    """Bytes of the frozen base model of a LoRA/QLoRA ledger (BF16 rows and NF4 blocks), without the adapters."""
    from ..ledger.lora import state_rows
    return sum(b for name, _, _, b in state_rows(view.arch, view.config) if name.startswith("frozen"))


def _layer_bytes(rows, preset, config) -> list:
    values = dict(Ledger(preset).values, r=config.rank)
    from ..core.exact import evaluate_expr
    return [evaluate_expr(r.bytes, values) for r in rows]


def dropped_bytes_per_layer(preset, config: LoraConfig) -> int:
    """Bytes per layer of the saved tensors LoRA drops, at ``preset``'s spec (B = 1, S = 2048)."""
    arch = Ledger(preset).arch
    return sum(_layer_bytes(activation_changes(arch.style, config, arch.dropout)[0], preset, config))


def activation_changes_table(preset, config: LoraConfig, unit: str = "MiB") -> Table:
    """The saved tensors LoRA drops and adds in one block of ``preset`` at its spec, with their sizes."""
    arch = Ledger(preset).arch
    removed, added = activation_changes(arch.style, config, arch.dropout)
    rows = []
    for change, saved in (("dropped", removed), ("added", added)):
        rows += [(change, r.name, " × ".join(map(str, r.shape)), format_bytes(n, unit))
                 for r, n in zip(saved, _layer_bytes(saved, preset, config))]
    return Table(("change", "saved tensor", "shape", f"{unit} per layer"), rows, numeric=(3,))
