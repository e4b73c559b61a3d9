"""The command line's real-model commands: ``ledger --pp``, ``fit`` and ``infer``.

Split from :mod:`memledger.cli.main` (which parses the options and reports errors);
each function takes the parsed arguments and returns the text to print.
"""
from .options import UNITS, architecture_from_args, one_of, build_ledger, gpu_bytes
from ..core.units import format_bytes, parse_bytes, parse_count


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
        s["fits"] = s["totals"]["gpu"] <= memory
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
        verdict = "fits" if s["fits"] else "does NOT fit"
        lines.append(f"  {'total on the GPU':<58} {'gpu':<4} {format_bytes(s['totals']['gpu'], units):>14}  {verdict}")
    return "\n".join(lines)


def fit(a):
    from ..answers.fit import fit
    result = fit(build_ledger(a), a.vary, gpu_bytes(a.gpu_memory), measure=a.measure)
    at = result.pop("ledger")
    if a.json:
        import json
        result["ledger"] = None if at is None else at.to_dict()
        return json.dumps(result, indent=2)
    if result["answer"] is None:
        return f"Nothing fits in {format_bytes(result['gpu_memory'], a.units)}: {result['binding']}."
    kind = "smallest" if a.vary in ("dp", "zero") else "largest"
    return (f"The {kind} {a.vary} that fits in {format_bytes(result['gpu_memory'], a.units)}: {result['answer']} "
            f"({result['measure']}: {format_bytes(result['judged_at_answer'], a.units)} per GPU).\n"
            f"Binding: {result['binding']}.")


def infer(a):
    from ..ledger.inference import Inference
    arch = architecture_from_args(a)
    if arch is None:
        raise ValueError("infer needs an architecture: --preset NAME, --config FILE or --hidden/--layers/--heads")
    if a.units not in UNITS:
        raise ValueError(f"units must be one of {one_of(UNITS)}, got {a.units!r}")
    inference = Inference(arch, batch_size=1 if a.batch is None else parse_count(a.batch, "batch_size"),
                          seq_len=2048 if a.seq is None else parse_count(a.seq, "seq_len"),
                          weight_dtype=a.dtype, kv_dtype=a.kv_dtype, tp=parse_count(a.tp, "tp"),
                          overhead_bytes=parse_bytes(a.overhead, "overhead"))
    memory = gpu_bytes(a.gpu_memory)
    if a.json:
        import json
        data = inference.to_dict()
        data["gpu_memory"], data["fits"] = memory, inference.total <= memory
        return json.dumps(data, indent=2)
    lines = [f"{name:<40} {format_bytes(b, a.units):>14}" for name, b in ((r.name, r.bytes) for r in inference.rows)]
    verdict = "fits" if inference.total <= memory else "does NOT fit"
    lines.append(f"{'total per GPU':<40} {format_bytes(inference.total, a.units):>14}  {verdict} in "
                 f"{format_bytes(memory, a.units)}")
    return "\n".join(lines)
