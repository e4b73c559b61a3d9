"""The command line's real-model commands: ``ledger --pp``, ``fit`` and ``infer``.

Split from :mod:`memledger.cli.main` (which parses the options and reports errors);
each function takes the parsed arguments and returns the text to print.
"""
from ..core.units import format_bytes, parse_bytes, parse_count
from .options import (DEFAULT_OVERHEAD, add, allocator_options, allocator_spec_of, architecture_from_args,
                      build_ledger, check_units, gpu_bytes, implementation_options,
                      ledger_options, model_options, output_options)
from .paths import (FRAMEWORK, IMPLEMENTATION, IN_BACKWARD_WHY, LOSS, MODEL, WORKLOAD, allocator_reads, in_backward_reads,
                    refuse_unread)
from .verdict import verdict_line
from ..answers.verdict import MARGIN, assess, leaves_margin

__all__ = ["add_parsers", "fit", "infer", "pipeline_section", "pipeline_text"]

#: The option each ``fit --vary`` searches over (so it is not read as given).
SEARCHED = {"batch": "batch", "seq": "seq", "layers": "layers", "dp": "dp", "zero": "zero"}


def add_parsers(sub, formatter):
    """The ``fit`` and ``infer`` commands."""
    fit = sub.add_parser("fit", help="the largest batch, sequence or model that fits (or the smallest dp/ZeRO)",
                         formatter_class=formatter)
    add(fit, "--vary", "batch, seq or layers (largest that fits); dp or zero (smallest that fits)").required = True
    allocator_options(fit, "what a candidate is judged by: auto (the step's peak where the timeline models the "
                      "setup, else the sum of the rows at the end of the forward pass), peak, total (the sum)", "auto")
    ledger_options(fit)
    output_options(fit, link=False)
    inf = sub.add_parser("infer", help="inference for contrast: weights + KV cache + working buffer",
                         formatter_class=formatter)
    model_options(inf, params=False)
    add(inf, "--batch", "sequences served at once B", "1")
    add(inf, "--seq", "tokens per sequence, prompt + generated", "2048")
    add(inf, "--dtype", "weight dtype: bf16, fp16, fp8, int8, fp32", "bf16")
    add(inf, "--kv-dtype", "KV-cache dtype", "bf16")
    add(inf, "--tp", "tensor-parallel degree", "1")
    add(inf, "--overhead", "runtime overhead (CUDA context, workspace)", DEFAULT_OVERHEAD)
    add(inf, "--weights", "bitsandbytes linear weights: none, nf4 (load_in_4bit) or int8 (LLM.int8); --dtype is "
        "then the compute dtype of the rest (bf16, fp16, fp32)", "none")
    add(inf, "--no-double-quant", "NF4 without double quantization (FP32 absmax)", switch=True)
    add(inf, "--attention", "flash, sdpa (no S x S scores) or eager (transformers' eager_attention_forward: "
        "B*H*S*S scores, softmax in FP32)", "flash")
    add(inf, "--backend", "where eager attention's softmax runs: cuda or cpu", "cuda")
    implementation_options(inf)
    add(inf, "--logits-to-keep", "positions the op-by-op prefill's LM head runs on: 1 (generate's default) or 0 "
        "(all)", "1")
    output_options(inf, link=False)


def pipeline_section(a, ledger, memory):
    """The ledger split over --pp stages: rows of the first and last stage, the schedule's numbers."""
    if a.pp is None:
        if a.microbatches is not None or a.interleave is not None:
            raise ValueError("--microbatches and --interleave need --pp")
        return None
    from ..answers.pipeline import schedule_summary, stage_ledgers
    p = parse_count(a.pp, "pp")
    m = parse_count(a.microbatches, "microbatches") if a.microbatches is not None else p
    v = parse_count(a.interleave, "interleave") if a.interleave is not None else 1
    stages = stage_ledgers(ledger, p, m, v)
    for s in stages:
        s["fits"] = leaves_margin(s["totals"]["gpu"], memory)      # with the margin free (answers.verdict)
        s["assessment"] = assess(s["totals"]["gpu"], memory, a.units)
        s["rows"] = [r.to_dict() for r in s["rows"]]
    return {"schedule": schedule_summary(p, m, v), "stages": stages}


def pipeline_text(pipe, units):
    sched = pipe["schedule"]
    lines = [f"Pipeline: {sched['pp']} stages, {sched['microbatches']} micro-batches, "
             f"{sched['interleave']} chunk(s) per device; bubble {sched['bubble_fraction_exact']} of the ideal step "
             f"({100 * sched['bubble_fraction']:.1f}%)."]
    for s in pipe["stages"]:
        lines.append(f"stage {s['stage']} ({s['n_params']:,} parameters):")
        lines += [f"  {r['name']:<58} {r['device']:<4} {format_bytes(r['bytes'], units):>14}" for r in s["rows"]]
        lines.append(f"  {'total on the GPU':<58} {'gpu':<4} {format_bytes(s['totals']['gpu'], units):>14}  "
                     f"{s['assessment']}")
    return "\n".join(lines)


def fit(a):
    """``memledger fit --vary X``: every ledger option but --X (the search sets it) and --link."""
    from ..answers.fit import VARY, fit
    from ..answers.verdict import CHOICES, is_nominal, uses_peak
    from ..core.choices import check_choice
    check_choice("vary", a.vary, VARY)
    check_choice("measure", a.measure, CHOICES)
    spec = allocator_spec_of(a)
    where = f"memledger fit --vary {a.vary}"
    searched = SEARCHED[a.vary]
    if searched in a.given:
        raise ValueError(f"{where} searches over --{searched}: leave --{searched} out")
    if a.vary == "layers" and a.preset is None and a.config is None and (a.hidden or a.heads):
        a.layers = "1"                      # a shape's layer count is what the search sets
    if a.vary == "dp" and a.framework == "fsdp2":
        a.dp = "2"                          # the search starts where FSDP2 shards: 2 ranks
    ledger = build_ledger(a)
    if ledger.framework != "plain" and a.vary == "zero":        # issue 15: each framework has its own stages
        raise ValueError(f"{where}: framework {ledger.framework} runs its own ZeRO stages; give --zero, or use "
                         "--framework plain")
    reads = set(MODEL) | set(WORKLOAD) | set(FRAMEWORK) | {"units", "gpu_memory", "json", "measure", "vary"}
    if ledger.arch is None:
        reads.discard("measure")
    else:
        reads |= allocator_reads(a)
    if ledger.arch is not None and uses_peak(ledger, a.measure):
        reads |= set(LOSS) | set(IMPLEMENTATION)    # they change the peak, not the sum
    if ledger.offload_optimizer == "none":
        reads.discard("offload_placement")
    if "scope" in a.given and uses_peak(ledger, a.measure) and not is_nominal(ledger):
        reads.discard("scope")
    reads |= in_backward_reads(a)
    refuse_unread(a, reads, where, {"scope": "the step's peak decides, and the step runs the whole model "
                                             "(--measure total judges the sum, which --scope changes)",
                                    **IN_BACKWARD_WHY})
    split = None if spec is None else spec.max_split_size_mb
    result = fit(ledger, a.vary, gpu_bytes(a.gpu_memory), measure=a.measure,
                 expandable_segments=spec is not None and spec.expandable_segments, max_split_size_mb=split)
    at = result.pop("ledger")
    if a.json:
        import json
        result["ledger"] = None if at is None else at.to_dict() if at.framework == "plain" else {
            "inputs": at.inputs()}        # a framework's ledger has no sum: its step is what fit judged
        return json.dumps(result, indent=2)
    if result["answer"] is None:
        return f"Nothing fits in {format_bytes(result['gpu_memory'], a.units)}: {result['binding']}."
    kind = "smallest" if a.vary in ("dp", "zero") else "largest"
    return (f"The {kind} {a.vary} that fits in {format_bytes(result['gpu_memory'], a.units)} with "
            f"{format_bytes(result['margin'], a.units)} free: {result['answer']}.\n"
            f"There: {verdict_line(at, result['gpu_memory'], a.measure, a.units, spec)}\n"
            f"Binding: {result['binding']}.")


def _whole(text, name) -> int:
    """A whole number >= 0 (0 allowed, unlike a count)."""
    raw = str(text).strip()
    if not raw.isdigit():
        raise ValueError(f"{name} must be a whole number >= 0, got {raw!r}")
    return int(raw)


def _prefill_line(inference, units) -> str:
    """The op-by-op prefill's peak and its op (memledger.step.prefill), or why it is not modelled."""
    p = inference.prefill
    if p is None:
        return f"Prefill op by op: not modelled ({inference.prefill_unmodelled})."
    where = "after the blocks" if p.peak.layer is None else f"block {p.peak.layer}"
    return (f"Prefill peak, op by op: {format_bytes(p.peak.bytes, units)} at {p.peak.op!r} ({where}; weights, ids, "
            f"the KV cache written so far and the op's transients, no overhead).")


def infer(a):
    from ..ledger.inference import Inference
    reads = set(a.given) - ({"backend"} if a.attention != "eager" else set())
    refuse_unread(a, reads, "memledger infer", {"backend": "it places eager attention's softmax: give --attention "
                                                           "eager"})                 # --units not under --json
    from ..step.implementations import check_fields, not_modelled
    implementation = a.implementation or "reference"
    check_fields(implementation, a.attn_implementation or "sdpa")
    if implementation != "reference":
        raise not_modelled(implementation, "inference (the KV cache, the prefill)")
    arch = architecture_from_args(a)
    if arch is None:
        raise ValueError("infer needs an architecture: --preset NAME, --config FILE or --hidden/--layers/--heads")
    check_units(a)
    inference = Inference(arch, batch_size=parse_count(a.batch, "batch_size"), seq_len=parse_count(a.seq, "seq_len"),
                          weight_dtype=a.dtype, kv_dtype=a.kv_dtype, tp=parse_count(a.tp, "tp"),
                          overhead_bytes=parse_bytes(a.overhead, "overhead"), quantization=a.weights,
                          double_quant=not a.no_double_quant, attention=a.attention, backend=a.backend,
                          logits_to_keep=_whole(a.logits_to_keep, "logits_to_keep"))
    memory = gpu_bytes(a.gpu_memory)
    if a.json:
        import json
        data = inference.to_dict()
        data["gpu_memory"], data["fits"] = memory, leaves_margin(inference.total, memory)
        data["margin"] = MARGIN
        data["implementation"], data["attn_implementation"] = implementation, a.attn_implementation or "sdpa"
        return json.dumps(data, indent=2)
    w = max([40] + [len(r.name) for r in inference.rows])
    lines = [f"{name:<{w}} {format_bytes(b, a.units):>14}" for name, b in ((r.name, r.bytes) for r in inference.rows)]
    lines.append(f"{'total per GPU':<{w}} {format_bytes(inference.total, a.units):>14}  "
                 f"{assess(inference.total, memory, a.units)} in {format_bytes(memory, a.units)}")
    if inference.quantization != "none":
        lines.append(f"get_memory_footprint() would say {format_bytes(inference.footprint, a.units)} "
                     "(parameters and buffers: no absmax, scales or tables).")
    lines.append(_prefill_line(inference, a.units))
    if inference.quantization == "int8":
        from ..states.bnb import INT8_OUTLIER_NOTE
        lines.append(INT8_OUTLIER_NOTE + ".")
    return "\n".join(lines)
