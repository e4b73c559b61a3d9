"""Published GPU measurements of fine-tuning runs, each with its setup and source, beside memledger's prediction.

Each :class:`Published` row holds what a project printed (the value and the unit it printed it in, the function it
read: ``torch.cuda.max_memory_reserved``, ``max_memory_allocated`` or NVML's used memory, as ``nvidia-smi`` shows
it), over what part of the run (``run``: since the process started, loading the model included: LitGPT and the
Hugging Face guide never reset the peak, and torchtune resets it after loading but reads reserved, which keeps every
segment loading made; ``load``: after loading, before training), the setup as its source describes it (file and
line, at a pinned commit), and how memledger models that setup.

:func:`compare` computes memledger's prediction for every row with the measure that matches the row's where memledger
has it, and otherwise with what it has, naming what is missing (``missing``). The LoRA and QLoRA rows are whole runs
(or the reading after loading) replayed through the caching allocator's port
(:func:`memledger.ledger.replay.replay_step` with ``load``): building and loading the model as the library did at the
commit that was measured (:mod:`memledger.ledger.library_loading`: ``torchtune-0914d5c``, the tutorials' commit with
its torchao 0.1; ``litgpt-00af8b0``, LitGPT's path as its tables were measured), then two steps, the row's counter
read over all of it. BERT-large after loading is its parameters moved to the GPU through the allocator plus the
context the guide itself measured (``nvidia-smi``); the BERT run is not replayed, because the step does not model
BERT's blocks. The relative error is always printed: it is the point of the table.

Approximations, each a source of error the table does not separate: torchtune's QLoRA rows run torchtune's own step
(implementation torchtune: torchao's ``NF4Tensor``, each projection dequantized as torchao 0.14.1 does) where the
measured run had torchao 0.1 (its loading, :mod:`memledger.ledger.library_loading`, is 0.1's and sets their peak);
the LitGPT LoRA rows run LitGPT's own LoRA step
(:mod:`memledger.step.litgpt_lora_step`), but its QLoRA rows run the reference decoder's LoRA step with the head in
equal chunks, not LitGPT's 128-token ones (:func:`litgpt_lora`); memledger's LoRA step keeps NF4 weights for every
block projection, as both libraries' QLoRA do, but its timeline does not yet tell double quantization from single
(the loading trace does: LitGPT's ``bnb.nf4`` and ``bnb.nf4-dq`` rows keep their own NF4 blocks); LitGPT quantizes
its head too, the step books it in BF16; the BERT run row uses the ledger's sum (the step does not model token types
and a pooler): FP32 weights, gradients and AdamW's two moments, the states the guide's Trainer kept, and the
activations at the end of the forward pass, not the step's peak.
"""
from dataclasses import dataclass
from fractions import Fraction
from functools import cache
from typing import Callable, Optional

__all__ = ["PUBLISHED", "Published", "Prediction", "compare", "bert_large", "published_rows", "torchtune_qlora_loading"]

GB, MiB = 10**9, 2**20

TORCHTUNE = "pytorch/torchtune@bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1"
TORCHTUNE_SETUP = ("LLaMA-2 7B, torchtune's recipe lora_finetune_single_device with its llama2 configs at 0914d5cfb "
                   "(the tutorials' commit, 15 April 2024; torchao==0.1, pyproject.toml line 24): "
                   "batch 2, Alpaca (cleaned) cut at 512 tokens (torchtune/datasets/_alpaca.py line 66), every block "
                   "checkpointed, torch.nn.CrossEntropyLoss, BF16 model and adapters, torch.optim.AdamW, LoRA dropout "
                   "0.05 (models/llama2/_model_builders.py line 61); the peak is read by utils.memory_stats_log "
                   "(torchtune/utils/memory.py lines 186-188: torch.cuda.max_memory_reserved() / 1e9), which then "
                   "resets the peaks (lines 190-191, reset_stats=True), after model init and at every logged "
                   "iteration; reserved segments are never released in between, so the reserved peak after a "
                   "reset is still the largest since the process started")
LITGPT = "Lightning-AI/litgpt@e567dbe8e5d3125af918550254258008b9228a71"
LITGPT_SETUP = ("LLaMA-2 7B or 13B, litgpt finetune_lora at 8641822 (PyTorch 2.1, bitsandbytes 0.41.1, A100 40 GB, "
                "bf16-true): rank 8 on query and value, dropout 0.05, no recomputation, the LM head in chunks of 128 "
                "tokens; the first iteration forced to Alpaca's longest sample, 1,304 tokens (finetune/lora.py "
                "lines 175-212, 286-292); QLoRA with bitsandbytes' PagedAdamW (line 141); 'Memory used' is "
                "torch.cuda.max_memory_allocated() / 1e9 at the end of the run (line 156)")
LITGPT_HUB = "Lightning-AI/litgpt@00af8b0d9b43eaa3f8c812e3e8bd53ef38cbb49d"
LITGPT_HUB_SETUP = ("LLaMA-2 7B, config_hub/finetune/llama-2-7b/lora.yaml or qlora.yaml (A10G, bf16-true): rank 32 on "
                    "query and value, dropout 0.05, micro-batch 2 of at most 512 tokens, no recomputation, the LM head "
                    "in chunks of 128; QLoRA: bnb.nf4 (no double quantization) and bitsandbytes' PagedAdamW; 'Peak "
                    "memory' is litgpt/finetune/lora.py line 234: torch.cuda.max_memory_allocated() / 1e9")
HF = "huggingface/transformers@249ef8164cfbd8e288c2f6d8395539b9e90e8300"
HF_SETUP = ("google-bert/bert-large-uncased, AutoModelForSequenceClassification on a V100 16 GB (CUDA 11.2), the "
            "Trainer in FP32 with its default AdamW, batch 4 of 512 tokens; 'GPU memory occupied' is NVML's used "
            "memory // 1024**2 (nvidia-smi's figure, in MiB although printed 'MB'); the CUDA context alone read "
            "1343 there")

#: what the sources print, and what each measure of memledger would match
METRICS = {"max_memory_reserved": "reserved", "max_memory_allocated": "allocated", "nvidia-smi": "nvidia-smi"}


@dataclass(frozen=True)
class Prediction:
    """memledger's bytes for a row: ``measure`` the one computed, ``missing`` why it is not the row's own (None when it
    is)."""
    bytes: int
    measure: str
    missing: Optional[str] = None


@dataclass(frozen=True)
class Published:
    """One published measurement: ``value`` bytes as printed (``printed``), read with ``metric`` over ``scope``."""
    id: str
    label: str
    source: str                 # owner/repo@commit
    file: str                   # path:line
    url: str
    setup: str
    metric: str                 # max_memory_reserved, max_memory_allocated or nvidia-smi
    scope: str                  # "run" (loading included) or "load"
    printed: str
    predict: Callable[[], Prediction]

    @property
    def value(self) -> int:
        """The printed figure in bytes: GB as 10**9 (each source divides by 1e9), MiB as 2**20 (NVML // 1024**2)."""
        number, unit = self.printed.split()
        return int(Fraction(number) * {"GB": GB, "MiB": MiB}[unit])

    @property
    def measure(self) -> str:
        """memledger's measure that matches the row: the metric, over the whole run where loading is included."""
        return METRICS[self.metric] + (" (whole run)" if self.scope == "run" else " (after loading)")


# --- memledger's side: the setups as memledger models them -------------------------------------------------------

def _lora_step(config, batch, seq, *, recompute="none", loss_chunks=1, loss_impl="torchtune", arch="llama2-7b",
               implementation="reference"):
    """The LoRA step on CUDA (composite RMSNorm, as both libraries' norms upcast), no overhead row: the allocator's
    counters do not see the CUDA context; ``implementation``: whose model code (torchtune's ``lora_llama2`` for
    torchtune's LoRA rows)."""
    from ..ledger.lora import LoraLedger
    return LoraLedger(arch, config, batch_size=batch, seq_len=seq, recompute=recompute, loss_chunks=loss_chunks,
                      loss_impl=loss_impl, overhead_bytes=0, implementation=implementation).step(
        "cuda", rmsnorm="composite")


def _replayed(step, measure: str, load: str = None) -> int:
    """``measure`` ("allocated" or "reserved") of ``step`` replayed twice through the caching allocator's port, after
    loading as ``load`` does (:mod:`memledger.ledger.library_loading`): the peak of the whole run."""
    from ..ledger.replay import replay_step
    replay = replay_step(step, load=load)
    return replay.allocated if measure == "allocated" else replay.reserved


def _after_loading(step, measure: str, load: str) -> int:
    """``measure`` at its largest while loading as ``load`` does, before the first step: the reading after model
    init."""
    from ..ledger.replay import replay_step
    series = [s for s in replay_step(step, load=load).series if s[0] == 0]
    return max(s[3] if measure == "allocated" else s[4] for s in series)


#: the loading traces the published runs used (memledger.ledger.library_loading): the tutorials' torchtune commit
#: with its torchao 0.1, and LitGPT as its tables were measured (no StableEmbedding swap)
TT_LOAD, LG_LOAD = "torchtune-0914d5c", "litgpt-00af8b0"
QV = ("q_proj", "v_proj")
ALL_BUT_HEAD = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ALL = ALL_BUT_HEAD + ("lm_head",)


def _torchtune_config(rank, targets, quantized):
    from ..ledger.lora import LoraConfig, qlora
    if quantized:
        return qlora(rank, targets, "llama", double_quant=True, dropout=True, adapter_recipe="bf16-pure-adamw",
                     paged=False)
    return LoraConfig(rank=rank, targets=targets, adapter_recipe="bf16-pure-adamw", dropout=True)


def _torchtune_implementation(quantized) -> str:
    """torchtune's rows run its ``lora_llama2`` (implementation torchtune, :mod:`memledger.step.lora`: each layer's
    RoPE buffers, the first layer without an input gradient, its attention's locals under the checkpoint) with
    0.6.1's recipe loop; the tutorials' loop at 0914d5c differs (``logits[..., :-1, :].contiguous()``, kept through
    backward, recipes/lora_finetune_single_device.py l. 447-468 there). QLoRA too: torchao's NF4Tensor per projection,
    q, k, v three projections, each dequantized in forward and backward (torchao 0.14.1's ``get_original_weight``)."""
    return "torchtune"


def torchtune_lora(rank, targets, quantized=False):
    def predict():
        step = _lora_step(_torchtune_config(rank, targets, quantized), 2, 512, recompute="full",
                          implementation=_torchtune_implementation(quantized))
        return Prediction(_replayed(step, "reserved", TT_LOAD), f"reserved (whole run, --load {TT_LOAD})")
    return predict


def torchtune_load(quantized=False):
    """The reading after model init: reserved while building and loading the model as torchtune at 0914d5c did."""
    def predict():
        config = _torchtune_config(8, ALL_BUT_HEAD if quantized else QV, quantized)
        step = _lora_step(config, 2, 512, recompute="full", implementation=_torchtune_implementation(quantized))
        return Prediction(_after_loading(step, "reserved", TT_LOAD), f"reserved (after loading, --load {TT_LOAD})")
    return predict


def torchtune_qlora_loading(load: str = TT_LOAD) -> dict:
    """torchtune's QLoRA of LLaMA-2 7B (the tt-qlora row's setup) loaded as ``load`` does: {"weights": the NF4 model the
    step starts with, "allocated" and "reserved": their largest while loading, "step_reserved": the step alone
    replayed, without loading}."""
    from ..ledger.replay import replay_step
    step = _lora_step(_torchtune_config(8, ALL_BUT_HEAD, True), 2, 512, recompute="full",
                      implementation=_torchtune_implementation(True))
    return {"weights": step.landmarks["before forward"]["gpu"], "allocated": _after_loading(step, "allocated", load),
            "reserved": _after_loading(step, "reserved", load), "step_reserved": replay_step(step).reserved}


def litgpt_lora(rank, batch, seq, arch="llama2-7b", quant=None):
    """A LitGPT row's prediction. LoRA: LitGPT's own LoRA step (:mod:`memledger.step.litgpt_lora_step`:
    ``finetune/lora.py``'s loop over ``litgpt.lora.GPT``, its head in 128-token chunks, the last one shorter), proved
    against LitGPT's model to the byte. QLoRA: the reference decoder's LoRA step with an NF4 base in equal chunks (LitGPT's
    NF4 base, its fused QKV and its head quantized, is not in LitGPT's step yet)."""
    def predict():
        from ..ledger.lora import LoraConfig, LoraLedger, qlora
        if not quant:
            config = LoraConfig(rank=rank, targets=QV, adapter_recipe="bf16-pure-adamw", dropout=True)
            step = LoraLedger(arch, config, batch_size=batch, seq_len=seq, overhead_bytes=0,
                              implementation="litgpt").step("cuda")
            return Prediction(_replayed(step, "allocated", LG_LOAD), f"allocated (whole run, --load {LG_LOAD})")
        config = qlora(rank, QV, "llama", double_quant=quant == "bnb.nf4-dq", dropout=True)
        # LitGPT's head runs in chunks of 128 tokens, the last one shorter; here the chunks are equal: the most chunks
        # of at least 128 tokens that divide S (1304 = 8 x 163; 512 = 4 x 128)
        chunks = next(n for n in range(seq // 128, 0, -1) if seq % n == 0)
        step = _lora_step(config, batch, seq, loss_chunks=chunks, loss_impl="litgpt", arch=arch)
        return Prediction(_replayed(step, "allocated", LG_LOAD), f"allocated (whole run, --load {LG_LOAD})")
    return predict


def bert_large():
    """BERT-large (Devlin et al. 2019): BERT-base's config with d 1024, 24 layers, 16 heads, F 4096."""
    from ..models.presets import get_preset
    return get_preset("bert-base-uncased").with_changes(d_model=1024, n_layers=24, n_heads=16, d_ff=4096)


BERT_CONTEXT = 1343 * MiB        # model_memory_anatomy.md line 87: torch.ones((1, 1)).to("cuda"), then NVML


def bert_run():
    def predict():
        from ..ledger.ledger import Ledger
        ledger = Ledger(bert_large(), batch_size=4, seq_len=512, recipe="fp32-adamw", overhead_bytes=0)
        return Prediction(ledger.judged_bytes() + BERT_CONTEXT, "sum of the rows + the source's context",
                          "the step does not model BERT op by op (token types, a pooler, post-norm encoder blocks), so "
                          "neither the allocator's replay nor nvidia-smi has a step to replay: the sum of the rows at "
                          "the end of the forward pass, plus the context the same guide measured")
    return predict


def bert_parameters() -> list:
    """Bytes of each FP32 parameter and buffer of transformers' ``BertForSequenceClassification`` for BERT-large, in
    the order ``Module._apply`` (``.to("cuda")``) moves them: the children depth first, a module's own tensors after
    its children's (embeddings: words, positions, token types, LayerNorm, then the ``position_ids`` and
    ``token_type_ids`` buffers, int64 of 512; 24 layers of query, key, value, output (weight, bias), their LayerNorm,
    intermediate 4096 x 1024 and output 1024 x 4096 (weight, bias), LayerNorm; the pooler; the 2-label classifier)."""
    d, f, v, p = 1024, 4096, 30522, 512
    embeddings = [4 * v * d, 4 * p * d, 4 * 2 * d, 4 * d, 4 * d, 8 * p, 8 * p]
    layer = [4 * d * d, 4 * d] * 4 + [4 * d, 4 * d] + [4 * f * d, 4 * f, 4 * d * f, 4 * d, 4 * d, 4 * d]
    return embeddings + layer * 24 + [4 * d * d, 4 * d, 4 * 2 * d, 4 * 2]


def bert_load():
    def predict():
        from ..ledger.caching import CachingAllocator
        allocator = CachingAllocator()
        for size in bert_parameters():          # each parameter copied to a new tensor on the GPU, kept
            allocator.malloc(size)
        return Prediction(allocator.reserved + BERT_CONTEXT, "nvidia-smi (after loading): the parameters' segments "
                          "through the allocator + the source's context")
    return predict


TT_URL = "https://github.com/pytorch/torchtune/blob/bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1/docs/source/tutorials/"
LG_URL = "https://github.com/Lightning-AI/litgpt/blob/e567dbe8e5d3125af918550254258008b9228a71/tutorials/resource-tables.md"
HUB_URL = ("https://github.com/Lightning-AI/litgpt/blob/00af8b0d9b43eaa3f8c812e3e8bd53ef38cbb49d/config_hub/finetune/"
           "README.md")
HF_URL = ("https://github.com/huggingface/transformers/blob/249ef8164cfbd8e288c2f6d8395539b9e90e8300/docs/source/en/"
          "model_memory_anatomy.md")


def _rows():
    tt = dict(source=TORCHTUNE, metric="max_memory_reserved", scope="run")
    lg = dict(source=LITGPT, url=LG_URL, metric="max_memory_allocated", scope="run")
    return (
        Published("tt-lora", "torchtune LoRA, q v, r 8", file="docs/source/tutorials/lora_finetune.rst:358",
                  url=TT_URL + "lora_finetune.rst",
                  setup=TORCHTUNE_SETUP + "; 7B_lora_single_device.yaml: rank 8 on q_proj, v_proj",
                  printed="15.57 GB", predict=torchtune_lora(8, QV), **tt),
        Published("tt-lora-all", "torchtune LoRA, all + head, r 8", file="docs/source/tutorials/lora_finetune.rst:363",
                  url=TT_URL + "lora_finetune.rst", setup=TORCHTUNE_SETUP + "; rank 8 on every projection, the MLP and "
                  "the output head", printed="15.87 GB", predict=torchtune_lora(8, ALL), **tt),
        Published("tt-lora-r64", "torchtune LoRA, q v, r 64", file="docs/source/tutorials/lora_finetune.rst:368",
                  url=TT_URL + "lora_finetune.rst", setup=TORCHTUNE_SETUP + "; rank 64 on q_proj, v_proj",
                  printed="15.86 GB", predict=torchtune_lora(64, QV), **tt),
        Published("tt-lora-all-r64", "torchtune LoRA, all + head, r 64",
                  file="docs/source/tutorials/lora_finetune.rst:373", url=TT_URL + "lora_finetune.rst",
                  setup=TORCHTUNE_SETUP + "; rank 64 on every projection, the MLP and the output head",
                  printed="17.04 GB", predict=torchtune_lora(64, ALL), **tt),
        Published("tt-qlora", "torchtune QLoRA, all, r 8", file="docs/source/tutorials/qlora_finetune.rst:168",
                  url=TT_URL + "qlora_finetune.rst", setup=TORCHTUNE_SETUP + "; 7B_qlora_single_device.yaml: NF4 base "
                  "(torchao, double-quantized scales), rank 8 on q, k, v, output_proj and the MLP",
                  printed="9.29 GB", predict=torchtune_lora(8, ALL_BUT_HEAD, quantized=True), **tt),
        Published("tt-lora-load", "torchtune LoRA, after loading", file="docs/source/tutorials/qlora_finetune.rst:167",
                  url=TT_URL + "qlora_finetune.rst", setup=TORCHTUNE_SETUP + "; read after model init",
                  printed="13.98 GB", predict=torchtune_load(), source=TORCHTUNE, metric="max_memory_reserved",
                  scope="load"),
        Published("tt-qlora-load", "torchtune QLoRA, after loading",
                  file="docs/source/tutorials/qlora_finetune.rst:168", url=TT_URL + "qlora_finetune.rst",
                  setup=TORCHTUNE_SETUP + "; 7B_qlora_single_device, read after model init", printed="9.13 GB",
                  predict=torchtune_load(quantized=True), source=TORCHTUNE, metric="max_memory_reserved",
                  scope="load"),
        Published("lg-lora", "LitGPT LoRA 7B, batch 1", file="tutorials/resource-tables.md:53",
                  setup=LITGPT_SETUP + "; micro-batch 1", printed="21.30 GB", predict=litgpt_lora(8, 1, 1304), **lg),
        Published("lg-lora-b2", "LitGPT LoRA 7B, batch 2", file="tutorials/resource-tables.md:56",
                  setup=LITGPT_SETUP + "; micro-batch 2", printed="29.07 GB", predict=litgpt_lora(8, 2, 1304), **lg),
        Published("lg-lora-13b", "LitGPT LoRA 13B, batch 1", file="tutorials/resource-tables.md:59",
                  setup=LITGPT_SETUP + "; LLaMA-2 13B, micro-batch 1", printed="38.12 GB",
                  predict=litgpt_lora(8, 1, 1304, arch="llama2-13b"), **lg),
        Published("lg-qlora", "LitGPT QLoRA 7B (nf4)", file="tutorials/resource-tables.md:54",
                  setup=LITGPT_SETUP + "; bnb.nf4, micro-batch 1", printed="14.14 GB",
                  predict=litgpt_lora(8, 1, 1304, quant="bnb.nf4"), **lg),
        Published("lg-qlora-dq", "LitGPT QLoRA 7B (nf4-dq)", file="tutorials/resource-tables.md:55",
                  setup=LITGPT_SETUP + "; bnb.nf4-dq, micro-batch 1", printed="13.84 GB",
                  predict=litgpt_lora(8, 1, 1304, quant="bnb.nf4-dq"), **lg),
        Published("lg-hub-lora", "LitGPT hub LoRA 7B", source=LITGPT_HUB, file="config_hub/finetune/README.md:33",
                  url=HUB_URL, setup=LITGPT_HUB_SETUP + "; lora.yaml", metric="max_memory_allocated", scope="run",
                  printed="19.77 GB", predict=litgpt_lora(32, 2, 512)),
        Published("lg-hub-qlora", "LitGPT hub QLoRA 7B", source=LITGPT_HUB, file="config_hub/finetune/README.md:35",
                  url=HUB_URL, setup=LITGPT_HUB_SETUP + "; qlora.yaml", metric="max_memory_allocated", scope="run",
                  printed="13.68 GB", predict=litgpt_lora(32, 2, 512, quant="bnb.nf4")),
        Published("hf-bert", "HF BERT-large, batch 4", source=HF, file="docs/source/en/model_memory_anatomy.md:178",
                  url=HF_URL, setup=HF_SETUP, metric="nvidia-smi", scope="run", printed="14949 MiB",
                  predict=bert_run()),
        Published("hf-bert-load", "HF BERT-large, after loading", source=HF,
                  file="docs/source/en/model_memory_anatomy.md:103", url=HF_URL,
                  setup=HF_SETUP + "; read after from_pretrained(...).to('cuda')", metric="nvidia-smi", scope="load",
                  printed="2631 MiB", predict=bert_load()),
    )


PUBLISHED = _rows()


@cache
def compare() -> tuple:
    """Every published row with memledger's prediction: dicts of id, label, source, file, url, setup, metric, scope,
    printed, measured (bytes), predicted (bytes), measure (memledger's that matches), computed (what was computed),
    missing (why it is not the matching one, or None) and error ((predicted - measured) / measured, a Fraction)."""
    out = []
    for row in PUBLISHED:
        p = row.predict()
        out.append(dict(id=row.id, label=row.label, source=row.source, file=row.file, url=row.url, setup=row.setup,
                        metric=row.metric, scope=row.scope, printed=row.printed, measured=row.value,
                        predicted=p.bytes, measure=row.measure, computed=p.measure, missing=p.missing,
                        error=Fraction(p.bytes - row.value, row.value)))
    return tuple(out)


def published_rows(unit: str = "GB") -> list:
    """The table the book prints: source, setup, metric, measured, predicted, error, what memledger computed."""
    from ..core.units import format_bytes
    return [[r["label"], f"{r['source'].split('@')[0]} {r['file']}", r["metric"] + (" (after loading)" if r["scope"] ==
             "load" else ""), format_bytes(r["measured"], unit), format_bytes(r["predicted"], unit),
             f"{float(r['error']) * 100:+.1f} %", r["computed"] + (" (not yet the matching measure)" if r["missing"]
                                                                     else "")] for r in compare()]
