"""``accelerate estimate-memory``: an inference size turned into a "Training using Adam" figure.

Source: huggingface/accelerate at 16cb6eb8, ``src/accelerate/commands/estimate.py``
lines 224-256 (``estimate_training_usage``), 259-291 (``gather_data``) and
294-308 (printing); ``convert_bytes`` in ``src/accelerate/utils/other.py``
lines 521-528. The model is built by ``AutoModel`` in fp32 on the meta device:
the *base* model, without an untied output head. Its size S is every
parameter and buffer at 4 bytes (fp32).

Training figure (code since 8644e23b, 2024-03-26): the *largest* of four
phases, not their sum,

    float32:            max(model S, grads S, optimizer 2S, step 4S)       = 4S
    float16 / bfloat16: max(model S, grads S + S//2, optimizer 2S, step 2S) = 2S
    int8, int4:         "N/A"

Before that commit (409a9df0, 2023-08-24, to 8644e23b) the figure was 4 x the
size at the chosen dtype, S, S/2, S/4 or S/8: convention
``accelerate-docs``, which the usage guide's tables still print
(``docs/source/usage_guides/model_size_estimator.md`` lines 72-77, 92-97,
106-111, 125-128). Sizes print in base-1024 units labelled KB/MB/GB/TB.
"""
import sympy as sp

from ..core.symbols import P
from .base import Convention, Erratum, Item, weight_dtype

__all__ = ["ACCELERATE", "ACCELERATE_DOCS", "DIVISOR", "DTYPES", "ERRATA", "convert_bytes", "model_bytes", "table",
           "training_phases"]

DTYPES = ("float32", "float16", "int8", "int4")
#: The size at each dtype as a fraction of the fp32 size (gather_data, lines 281-289).
DIVISOR = {"float32": 1, "float16": 2, "int8": 4, "int4": 8}


def convert_bytes(size) -> str:
    """accelerate's ``convert_bytes``: base 1024, Python's ``round(size, 2)``."""
    for unit in ["bytes", "KB", "MB", "GB", "TB"]:
        if size < 1024.0:
            return f"{round(size, 2)} {unit}"
        size /= 1024.0
    return f"{round(size, 2)} PB"


def training_phases(fp32_bytes: int, dtype: str) -> dict:
    """``estimate_training_usage``: bytes of each phase (-1 where accelerate has no rule)."""
    fp16 = fp32_bytes // 2
    if dtype == "float32":
        return {"model": fp32_bytes, "gradients": fp32_bytes, "optimizer": 2 * fp32_bytes, "step": 4 * fp32_bytes}
    if dtype in ("float16", "bfloat16"):
        return {"model": fp32_bytes, "gradients": fp32_bytes + fp16, "optimizer": 2 * fp32_bytes,
                "step": 2 * fp32_bytes}
    return {"model": -1, "optimizer": -1, "gradients": -1, "step": -1}


def table(fp32_bytes: int, largest_fp32_bytes: int, dtypes=DTYPES, docs: bool = False) -> list:
    """The rows ``accelerate estimate-memory`` prints: [dtype, largest layer, total, training]."""
    rows = []
    for dtype in dtypes:
        size, largest = fp32_bytes / DIVISOR[dtype], largest_fp32_bytes / DIVISOR[dtype]
        if docs:
            training = convert_bytes(size * 4)
        else:
            peak = max(training_phases(fp32_bytes, dtype).values())
            training = convert_bytes(peak) if peak != -1 else "N/A"
        rows.append([dtype, convert_bytes(largest), convert_bytes(size), training])
    return rows


def _accelerate_dtype(ledger) -> str:
    """``--dtypes``: float32 for a recipe with FP32 working weights, else float16 (bfloat16 books the same)."""
    return "float32" if weight_dtype(ledger) == "fp32" else "float16"


def model_bytes(ledger) -> sp.Expr:
    """S: 4 bytes x the parameters ``AutoModel`` builds (the untied output head is not among them)."""
    from ..core.symbols import V, d
    untied = ledger.arch is not None and not ledger.arch.features.is_tied
    if untied and ledger.params <= ledger.arch.vocab_size * ledger.arch.d_model:
        raise ValueError(f"n_params ({ledger.params:,}) is not larger than the untied LM head (V x d = "
                         f"{ledger.arch.vocab_size * ledger.arch.d_model:,}): accelerate's AutoModel count, the "
                         "parameters without the head, would not be positive")
    return 4 * (P - V * d) if untied else 4 * P


def _items(ledger, inputs, docs=False) -> list:
    size = model_bytes(ledger)
    dtype = _accelerate_dtype(ledger)
    if docs:
        return [Item(f"4 x the model at {dtype}", "model_states", "gpu", 4 * size / DIVISOR[dtype], "mixed")]
    phases = {"float32": {"model": size, "gradients": size, "optimizer": 2 * size, "step": 4 * size},
              "float16": {"model": size, "gradients": size + sp.floor(size / 2), "optimizer": 2 * size,
                          "step": 2 * size}}[dtype]
    return [Item(f"max of the phases ({', '.join(phases)})", "model_states", "gpu", sp.Max(*phases.values()),
                 "mixed")]


def _printed(ledger, inputs, rows) -> str:
    return convert_bytes(sum(r.bytes for r in rows if r.device == "gpu"))


ERRATA = (
    Erratum("accelerate docs", "docs/source/usage_guides/model_size_estimator.md line 74 (bert-base-cased, float32)",
            "418.18 MB", "413.18 MB",
            "half of it is the float16 row's 206.59 MB (2 x 206.59 = 413.18), the second table (line 127) and the "
            "caveat (line 134) print 413.18 MB, and 433,249,280 bytes / 1024^2 = 413.18", "typo"),
    Erratum("accelerate docs", "docs/source/usage_guides/model_size_estimator.md lines 76-77, 96-97, 110-111",
            "int8 / int4 'Training using Adam' sizes (e.g. 413.18 MB, 206.59 MB for bert-base-cased)", "N/A",
            "the tables were printed by the first version (training = 4 x the size at that dtype); since "
            "8644e23b (2024-03-26) estimate_training_usage returns -1 for int8 and int4 and the CLI prints N/A",
            "outdated"),
)

ACCELERATE = Convention(
    "accelerate", "accelerate estimate-memory, 'Training using Adam' (code since 2024-03)",
    "huggingface/accelerate src/accelerate/commands/estimate.py lines 224-256, 294-308 (16cb6eb8)",
    _items, reads=("recipe",), printed=_printed, errata=ERRATA,
    differs="the largest phase, not the sum: max(model, grads, optimizer, step) = 8 bytes/param for "
            "float16/bfloat16 (16 for float32) of the model AutoModel builds (no untied output head); no "
            "activations; base-1024 units labelled MB/GB")
ACCELERATE_DOCS = Convention(
    "accelerate-docs", "accelerate estimate-memory as its docs print it (4 x the size at the dtype)",
    "huggingface/accelerate docs/source/usage_guides/model_size_estimator.md lines 70-128; code 409a9df0-8644e23b",
    lambda ledger, inputs: _items(ledger, inputs, docs=True), reads=("recipe",), printed=_printed,
    differs="4 x the model's size at the chosen dtype (8 bytes/param at float16), first version of the tool")
