"""Real checkpoints side by side: their shapes, their published parameter counts, and what fits where.

The architectures come from the Hugging Face ``config.json`` files shipped in
``memledger/models/configs/`` (:mod:`memledger.models.hf_config`). :data:`PUBLISHED` holds,
for comparison only, the count each publisher states digit for digit (sources
below, as in ``tests/models/test_hf_config.py``); the counts memledger prints are
always derived from the configs.

* Llama 3 8B, Mistral 7B, Mixtral 8x7B: the ``metadata.total_size`` of each
  repository's ``model.safetensors.index.json`` (bytes) over 2 bytes per BF16
  parameter: meta-llama/Meta-Llama-3-8B 16,060,522,496 B;
  mistralai/Mistral-7B-v0.1 14,483,464,192 B; mistralai/Mixtral-8x7B-v0.1
  93,405,585,408 B (the model cards round them to 8B, 7B and 47B).
* Qwen2.5 7B: the Hub's safetensors parameter count of Qwen/Qwen2.5-7B.
* Gemma 7B: Gemma Team 2024 (arXiv:2403.08295), Table 2, non-embedding
  parameters; its embedding count uses the paper's 256,128-token vocabulary,
  while the published config.json has 256,000, so only the non-embedding part
  is compared.
* BERT-base uncased: ``BertModel(bert-base-uncased).num_parameters()`` in
  ``transformers`` (Devlin et al. 2019 round it to 110M).

:func:`fit_grid` runs :func:`memledger.answers.fit.fit` for every model and GPU.
"""
from dataclasses import replace
from typing import NamedTuple

from ..activations.inventory import inventory, per_layer_bytes
from ..models.presets import get_preset
from ..answers.fit import fit_many
from ..core.exact import evaluate_expr
from ..ledger.ledger import Ledger
from ..answers.pipeline import output_rows

__all__ = ["BF16", "MEASURE_LABEL", "PUBLISHED", "Published", "count_table", "counted", "fit_grid", "fit_table",
           "headroom_table", "layer_activation_bytes", "logits_bytes", "logits_table", "serving_table",
           "shape_table"]

BF16 = 2


class Published(NamedTuple):
    """A publisher's parameter count: ``count`` of the ``part`` ("all" or "non-embedding"), and where it is stated."""
    count: int
    part: str
    source: str


PUBLISHED = {
    "llama3-8b": Published(16_060_522_496 // BF16, "all", "Meta-Llama-3-8B safetensors index, bytes / 2"),
    "mistral-7b": Published(14_483_464_192 // BF16, "all", "Mistral-7B-v0.1 safetensors index, bytes / 2"),
    "qwen2.5-7b": Published(7_615_616_512, "all", "Qwen2.5-7B safetensors metadata"),
    "gemma-7b": Published(7_751_248_896, "non-embedding", "Gemma Team 2024, Table 2"),
    "mixtral-8x7b": Published(93_405_585_408 // BF16, "all", "Mixtral-8x7B-v0.1 safetensors index, bytes / 2"),
    "bert-base-uncased": Published(109_482_240, "all", "transformers BertModel.num_parameters()"),
}


def counted(name: str, part: str = "all") -> int:
    """The count memledger derives from the config: all parameters, or those outside the embeddings."""
    arch = get_preset(name)
    return arch.computed_params - (arch.parts()["embeddings"] if part == "non-embedding" else 0)


def shape_table(names):
    """What each config sets: widths, heads (query and key/value), head size, vocabulary, tying, experts."""
    from ..core.table import Table
    rows = []
    for name in names:
        a = get_preset(name)
        rows.append((name, a.d_model, a.n_layers, a.n_heads, a.kv_heads, a.head_dim, a.d_ff, f"{a.vocab_size:,}",
                     "yes" if a.features.is_tied else "no", f"{a.top_k} of {a.n_experts}" if a.n_experts else "",
                     f"{a.computed_params / 1e9:.2f}"))
    return Table(("model", "d", "L", "H", "H_kv", "d_h", "F", "V", "tied", "experts", "params (B)"), rows,
                 numeric=(1, 2, 3, 4, 5, 6, 7, 10))


def count_table(names):
    """memledger's count from each config beside the publisher's (:data:`PUBLISHED`)."""
    from ..core.table import Table
    rows = []
    for name in names:
        pub = PUBLISHED[name]
        ours = counted(name, pub.part)
        rows.append((name, pub.part, f"{ours:,}", f"{pub.count:,}", "yes" if ours == pub.count else "no", pub.source))
    return Table(("model", "parameters", "memledger", "published", "equal", "published in"), rows, numeric=(2, 3))


def layer_activation_bytes(arch, batch_size: int, seq_len: int, flash_attention: bool = True,
                           repeat_kv: bool = False) -> int:
    """One block's saved activations (:func:`memledger.activations.inventory.inventory` with the config's
    refinements); ``repeat_kv`` keeps K and V expanded to all H heads, as an eager implementation does."""
    arch = get_preset(arch) if isinstance(arch, str) else arch
    f = arch.features
    rows = inventory(arch.mlp, arch.norm, dropout=arch.dropout, flash_attention=flash_attention, gqa=f.gqa,
                     head_dim=f.head_dim, repeat_kv=repeat_kv, moe=f.moe, attention_dropout=arch.attention_dropout)
    return evaluate_expr(per_layer_bytes(rows), dict(arch.values, B=batch_size, S=seq_len))


def logits_bytes(arch, batch_size: int, seq_len: int) -> int:
    """The FP32 logits a causal LM keeps for the cross-entropy backward, 4*B*S*V (Korthikanti et al.
    2022, Sec. 4.3); 0 for an encoder without an output layer (BERT's ``BertModel``)."""
    arch = get_preset(arch) if isinstance(arch, str) else arch
    logits = [r for r in output_rows(arch.features) if r.name.startswith("logits")]
    return sum(evaluate_expr(r.bytes, dict(arch.values, B=batch_size, S=seq_len)) for r in logits)


def fit_grid(template: Ledger, names, gpus: dict, vary: str) -> dict:
    """``fit(template with each model, vary, gpu)`` for every model and GPU: {name: {gpu name: result}}, each
    model's GPUs in one search over the step's peak where it judges (:func:`memledger.answers.fit.fit_many`).

    Each model trains with its own dropout default (GPT-style and BERT blocks with dropout, LLaMA-style
    without), whatever the template's model did; a model with learned positions (BERT) is run at
    ``min(template.seq_len, n_positions)``.
    """
    grid = {}
    for name in names:
        arch = get_preset(name)
        seq = min(template.seq_len, arch.n_positions) if arch.n_positions else template.seq_len
        model = replace(template, arch=arch, seq_len=seq, dropout=arch.dropout)
        grid[name] = dict(zip(gpus, fit_many(model, vary, gpus.values())))
    return grid


#: How :func:`fit_table` and :func:`headroom_table` name each measure of :data:`memledger.answers.verdict.MEASURE`.
MEASURE_LABEL = {"peak": "peak of a step", "nominal": "peak of a step (or sum)", "total": "sum at end of forward"}


def fit_table(grid: dict, label: str):
    """The answers of :func:`fit_grid`, one row per model, one column per GPU ("none" where nothing fits), and
    what each model's answers judged (:mod:`memledger.answers.verdict`)."""
    from ..core.table import Table
    gpus = list(next(iter(grid.values())))
    rows = [(name, *("none" if r["answer"] is None else f"{r['answer']:,}" for r in per_gpu.values()),
             MEASURE_LABEL[next(iter(per_gpu.values()))["measure_key"]])
            for name, per_gpu in grid.items()]
    return Table((label,) + tuple(gpus) + ("judged by",), rows, numeric=tuple(range(1, len(gpus) + 1)))


def logits_table(names, seq_len: int):
    """Per sequence of ``seq_len`` tokens: one layer's saved activations beside the FP32 logits."""
    from ..core.table import Table
    from ..core.units import format_bytes
    rows = []
    for name in names:
        arch = get_preset(name)
        layer, logits = layer_activation_bytes(arch, 1, seq_len), logits_bytes(arch, 1, seq_len)
        rows.append((name, f"{arch.vocab_size:,}", format_bytes(layer), format_bytes(logits),
                     f"{logits / layer:.1f}" if logits else "no output layer"))
    return Table(("model", "vocabulary", "one layer", "FP32 logits", "logits / layer"), rows, numeric=(1, 2, 3, 4))


def headroom_table(grid: dict, gpu: str):
    """For each model's answer on ``gpu`` (a :func:`fit_grid` batch grid): what it was judged by, the room it
    leaves, and two transients that a sum of the rows leaves out and a step's peak holds: ZeRO-3's gathered
    block (:func:`memledger.answers.parallelism.gather_buffer_bytes`) and the FP32 copy of the micro-batch's logits
    (``logits.float()`` before the loss, 4*B*S*V bytes, beside the log-softmax that the sum books)."""
    from ..core.table import Table
    from ..answers.parallelism import gather_buffer_bytes
    from ..core.units import format_bytes
    rows = []
    for name, per_gpu in grid.items():
        result = per_gpu[gpu]
        if result["answer"] is None:
            rows.append((name, "none", "", "", "", ""))
            continue
        ledger, in_peak = result["ledger"], result["measure_key"] != "total"
        rows.append((name, f"{result['answer']:,}", MEASURE_LABEL[result["measure_key"]],
                     format_bytes(result["gpu_memory"] - result["judged_at_answer"]),
                     "in the peak" if in_peak else format_bytes(gather_buffer_bytes(ledger)),
                     "in the peak" if in_peak else format_bytes(logits_bytes(ledger.arch, result["answer"],
                                                                             ledger.seq_len))))
    return Table(("model", "micro-batch", "judged by", "room left", "ZeRO-3 gathered block", "FP32 copy of the logits"),
                 rows, numeric=(1, 3, 4, 5))


def serving_table(names, seq_len: int):
    """Serving one sequence of ``seq_len`` tokens (:class:`memledger.ledger.inference.Inference`) beside the
    model states that training keeps (the 16 B/param recipe, one GPU)."""
    from ..core.table import Table
    from ..ledger.inference import Inference
    from ..core.units import format_bytes
    rows = []
    for name in names:
        serving = Inference(name, seq_len=seq_len)
        parts = serving.rows
        rows.append((name, format_bytes(parts.bytes_of(f"weights ({serving.weight_dtype})")),
                     format_bytes(parts.bytes_of(f"KV cache ({serving.kv_dtype})")), format_bytes(serving.total),
                     format_bytes(Ledger(name).group_total("model_states"))))
    return Table(("model", "weights", "KV cache", "serving total", "training model states"), rows,
                 numeric=(1, 2, 3, 4))
