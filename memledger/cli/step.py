"""``memledger step``: the step timeline of one setup, its landmarks and its peak (README, "One training step").

Every ``memledger ledger`` option, plus ``--backend`` (the conventions of
:mod:`memledger.activations.backends`: article, cuda or cpu) and the optimizer's implementation:
``--foreach`` (the multi-tensor step), ``--no-foreach`` (the for-loop) or ``--fused`` (one kernel).
Text by default; ``--json`` prints the object of
the README: inputs, landmarks {gpu, cpu, nvme}, peak {gpu, phase, detail},
rows {name, kind, phase, device, bytes, formula}. The verdict compares
the peak with the GPU's memory (:data:`memledger.ledger.hardware.GPU_MEMORY`) in the words of
:func:`memledger.answers.verdict.sentence`: a fit leaves :data:`~memledger.answers.verdict.MARGIN` free.
Unlike ``ledger`` this command imports SymPy (the step's programs are built
from the library's formulas on first use).
"""
from ..activations.backends import BACKENDS
from ..answers.verdict import CLAUSES, MARGIN, MEASURE, leaves_margin, sentence
from ..core.units import format_bytes
from .options import add, allocator_options, allocator_spec_of, build_ledger, flag, gpu_bytes, ledger_options, \
    output_options
from .paths import FRAMEWORK, IMPLEMENTATION, LORA, LOSS, MODEL, WORKLOAD, allocator_reads, refuse_unread

__all__ = ["LORA_STEP_READS", "add_parser", "implementation", "lora_replay", "lora_step", "output", "step", "text"]


def add_parser(sub, formatter):
    step = sub.add_parser("step", help="one training step phase by phase: landmarks, transients, the peak",
                          formatter_class=formatter)
    ledger_options(step, scope=False)
    output_options(step, link=False)
    conv = step.add_argument_group("backend conventions")
    add(conv, "--backend", f"{', '.join(BACKENDS)}: what kernels keep (dropout masks, norm statistics, attention "
        "kernel, RMSNorm, Adam step counters); article: the article's conventions", "article")
    add(conv, "--foreach", "AdamW(foreach=True): one temporary per moment at once", switch=True)
    add(conv, "--no-foreach", "the optimizer's for-loop (foreach=False; the cuda backend's default is foreach)",
        switch=True)
    add(conv, "--fused", "AdamW/SGD(fused=True): one kernel, no temporaries", switch=True)
    add(conv, "--rmsnorm", "fused (input + FP32 rstd, one kernel) or composite (the FP32 copies PyTorch's composite "
        "ops keep, as torchtune's, transformers' and LitGPT's RMSNorm run even on CUDA); default: the backend's")
    allocator_options(step, "what the fits verdict judges: peak (the step's peak of live tensors)", "peak")
    from .compare import lora_options
    lora_options(step)


def step(a) -> str:
    """``memledger step``: every ledger option but --scope (the step runs the whole model), plus the backend."""
    if a.measure == "total":
        raise ValueError("memledger step judges the step, not the sum of the rows: --measure peak, allocated or "
                         "reserved (memledger ledger --measure total prints the sum)")
    if a.measure == "auto":
        a.measure = "peak"
    spec = allocator_spec_of(a)
    if any(d in a.given for d in LORA):      # --optimizer-in-backward is the adapters' (LoraStep checks it)
        from argparse import Namespace
        return lora_step(a, build_ledger(Namespace(**(vars(a) | {"optimizer_in_backward": False}))))
    ledger = build_ledger(a)
    reads = set(MODEL) | set(WORKLOAD) | set(FRAMEWORK) | set(LOSS) | {"units", "gpu_memory", "json", "backend",
                                                                        "foreach", "no_foreach", "fused", "rmsnorm",
                                                                        "optimizer_in_backward", "offload_activations",
                                                                        "packed", "paged_optimizer", "measure"}
    reads |= allocator_reads(a) | set(IMPLEMENTATION)
    if ledger.offload_optimizer == "none":
        reads.discard("offload_placement")
    if ledger.implementation != "reference":
        reads.discard("rmsnorm")
    refuse_unread(a, reads, "memledger step", {"rmsnorm": f"under --implementation {ledger.implementation} the "
                                                          "library's code decides its RMSNorm"})
    changes = implementation(a, ledger.recipe)
    replay = extra = None
    if spec is not None and spec.measure != "run":
        from ..answers.verdict import replayed
        if spec.measure == "nvidia-smi":
            from ..answers.verdict import nvidia_smi
            nvidia_smi(ledger, spec, a.backend, **changes)     # refusals first (a GPU without a context, ranks)
        replay = replayed(ledger, spec, a.backend, **changes)
    result = ledger.step(a.backend, **changes)
    if spec is not None and spec.measure in ("nvidia-smi", "run"):
        extra = measured(ledger, spec, a, result.peak.bytes, changes)
    return output(result, a, replay, extra)


def measured(ledger, spec, a, step_peak: int, changes: dict) -> tuple:
    """(judged bytes, JSON keys, text rows, the verdict's clause after the measure) of ``--measure nvidia-smi`` or
    ``run`` on the step (:func:`memledger.cli.verdict.measure_data`)."""
    from ..answers.verdict import nvidia_smi, run_peak
    from .verdict import measure_data, measure_lines
    data = measure_data(ledger, spec, a.backend, step_peak, **changes)
    lines = measure_lines(ledger, spec, a.units, a.backend, step_peak, **changes)
    if spec.measure == "run":
        run = run_peak(ledger, spec, step_peak)
        return run.judged, data, lines, f"; the run's peak is in phase {run.phase!r}"
    return nvidia_smi(ledger, spec, a.backend, **changes).judged, data, lines, ""


def output(result, a, replay=None, extra=None) -> str:
    """A step's JSON object (with the GPU, the verdict with the margin free, the margin, the measure and the bytes
    it judges; under ``--measure allocated|reserved`` the replay, with the segments at the reserved peak) or its
    text."""
    memory = gpu_bytes(a.gpu_memory)
    measure = getattr(a, "measure", "peak")
    judged = result.peak.bytes if replay is None else replay.judged(measure)
    if extra is not None:
        judged = extra[0]
    if a.json:
        import json
        data = result.to_dict()
        data["gpu_memory"] = memory
        data["fits"] = leaves_margin(judged, memory)     # with the margin free (answers.verdict)
        data["margin"] = MARGIN
        data["measure"] = measure
        data["judged_bytes"] = judged
        if replay is not None:
            data["allocator"] = replay.to_dict()
        if extra is not None:
            data.update(extra[1])
        return json.dumps(data, indent=2)
    return text(result, memory, a.units, replay, measure, extra)


def implementation(a, recipe: str) -> dict:
    """The optimizer implementation ``--foreach``/``--no-foreach``/``--fused`` ask for, as backend changes (none
    given: the backend's own, AdamW()'s default there); more than one, or ``--foreach`` with Adafactor (whose
    only modelled step is its default for-loop), is refused."""
    given = [f for f in ("foreach", "no_foreach", "fused") if getattr(a, f, False)]
    if len(given) > 1:
        raise ValueError(f"give one of --foreach, --no-foreach, --fused, not {' and '.join(flag(f) for f in given)}")
    if a.foreach and recipe in ("adafactor", "bf16-adafactor"):
        raise ValueError("--foreach: torch.optim.Adafactor's foreach step is not modelled (its default is the for-loop)")
    changes = {"foreach": True} if a.foreach else {"foreach": False} if a.no_foreach else \
        {"foreach": False, "fused": True} if a.fused else {}
    return changes | norm(a)


def norm(a) -> dict:
    """``--rmsnorm fused|composite`` as a backend change (none given: the backend's own)."""
    if getattr(a, "rmsnorm", None) is None:
        return {}
    from ..activations.backends import RMSNORMS
    from ..core.choices import check_choice
    check_choice("rmsnorm", a.rmsnorm, RMSNORMS)
    return {"rmsnorm": a.rmsnorm}


#: What the LoRA step reads: the model, one GPU's workload, --recipe for the base's precision, the LoRA options.
LORA_STEP_READS = set(MODEL) | {"batch", "seq", "recompute", "flash_attention", "overhead", "recipe", "units",
                                "gpu_memory", "json", "backend", "foreach", "rmsnorm", "loss_chunks", "loss_impl",
                                "optimizer_in_backward", "implementation"} | set(LORA)


def lora_step(a, ledger, lora=None) -> str:
    """``step --lora-rank R`` / ``--qlora``: the step of a LoRA or QLoRA run (:class:`memledger.step.lora.LoraStep`);
    ``--recipe`` gives the frozen base's precision (its weights' dtype). ``lora``: the LoRA ledger ``memledger ledger
    --lora-rank`` built (its options already checked), judged by the step under an allocator measure or the run."""
    from ..ledger.lora import LoraLedger
    from ..states.recipes import get_recipe
    from ..step.implementations import lora_not_modelled
    from .compare import lora_config
    if lora is not None:
        return _lora_output(a, lora, lora.step("cuda"))
    from .compare import lora_implementation
    lora_implementation(ledger)
    reads = LORA_STEP_READS | {"measure", "implementation"} | allocator_reads(a) | (
        {"load"} if a.measure == "run" else set())
    refused = [d for d in a.given if d not in reads]
    refuse_unread(a, reads, "the LoRA step", {d: "the LoRA step runs on one GPU, without ZeRO, "
                                                          "offload or parallelism" for d in refused} | {
        "offload_activations": "activation offloading of a LoRA block (its frozen weights and NF4 tensors saved "
                               "too) is not modelled",
        "implementation": lora_not_modelled(ledger.implementation)})
    if ledger.arch is None:
        raise ValueError("LoRA needs an architecture: --preset, --config or a shape")
    base = next(c.dtype for c in get_recipe(ledger.recipe).components if c.role == "param")
    if a.qlora and "recipe" in a.given and base not in ("bf16", "fp16"):
        raise ValueError(f"--qlora quantizes a 16-bit base to NF4 and computes in BF16; --recipe {ledger.recipe} "
                         f"gives an {base.upper()} base")
    config = lora_config(a, ledger.arch, base, ledger.implementation)
    lora = LoraLedger(ledger.arch, config, ledger.batch_size, ledger.seq_len, ledger.recompute,
                      ledger.flash_attention, ledger.overhead_bytes, ledger.loss_chunks,
                      ledger.loss_impl, bool(getattr(a, "optimizer_in_backward", False)),
                      implementation=ledger.implementation)
    return _lora_output(a, lora, lora.step(a.backend, foreach=a.foreach, **norm(a)))


def _lora_output(a, lora, result) -> str:
    """The LoRA step's output, judged by ``a.measure``."""
    extra = replay = None
    spec = allocator_spec_of(a)
    if spec is not None and spec.measure != "run":
        replay, extra = lora_replay(lora, result, spec, a.units)
        if spec.load is not None:               # the verdict names the loading replayed before the step
            tail = f"; loading by {spec.load} replayed first (memledger.ledger.library_loading)"
            extra = (replay.judged(spec.measure), {"load": spec.load}, [], tail) if extra is None else \
                (extra[0], extra[1] | {"load": spec.load}, extra[2], tail)
    if a.measure == "run":
        from ..core.units import format_bytes
        from ..ledger.loading import lora_run_phases
        run = lora_run_phases(lora, result.peak.bytes, a.load)
        lines = ["", f"the run, loading by {run.load} (the overhead row in each phase):"]
        lines += [f"  {p:<16} {format_bytes(b, a.units):>12}  {w}" for p, b, w in run.phases]
        extra = (run.judged, {"run": run.to_dict()}, lines, f"; the run's peak is in phase {run.phase!r}")
    return output(result, a, replay, extra)


def lora_replay(lora, result, spec, units: str) -> tuple:
    """The LoRA step replayed through the caching allocator (:func:`memledger.ledger.replay.replay_step`) as ``spec``
    asks, loading first where ``spec.load`` names a library's trace; under nvidia-smi with cuBLAS's workspaces and the
    CUDA context: (the replay, None or the nvidia-smi ``extra`` of :func:`output`)."""
    from ..core.units import format_bytes
    from ..ledger.outside import Outside, cuda_context, workspaces
    from ..ledger.replay import replay_step
    resident, rows, context = (), [], None
    if spec.measure == "nvidia-smi":
        context, source = cuda_context(spec.gpu, spec.cuda_context)      # refused first, before a replay
        rows = workspaces(spec.gpu, biased=lora.arch.style == "gpt" or bool(lora.arch.qkv_bias))
        resident = tuple((phase, size) for phase, _, size in rows)
    replay = replay_step(result, spec.expandable_segments, spec.max_split_size_mb, resident=resident,
                         load=spec.load)
    if spec.measure != "nvidia-smi":
        return replay, None
    smi = Outside(replay.reserved, rows, context, source, spec.gpu)
    lines = ["", f"what nvidia-smi would show on {smi.gpu} (the overhead row left out):"]
    lines += [f"  {r['name']:<62} {format_bytes(r['bytes'], units):>12}  ({r['source']})" for r in smi.rows()]
    lines.append(f"  nvidia-smi: {format_bytes(smi.judged, units)}")
    return replay, (smi.judged, {"nvidia_smi": smi.to_dict()}, lines, "")


def text(result, memory: int, unit: str = "GB", replay=None, measure: str = "peak", extra=None) -> str:
    """The landmarks per device, the phase peaks, the peak and what is live there, the verdict; with a ``replay``
    through the caching allocator, its allocated and reserved bytes per phase beside the live tensors', and the
    segments at the reserved peak."""
    def size(n):
        return format_bytes(n, unit)
    lines = [f"{'landmark':<16} {'GPU':>12} {'CPU':>12} {'NVMe':>12}"]
    led = result.ledger
    if getattr(led, "framework", "plain") == "fsdp2":     # a LoraLedger has no framework
        units = ("torchtitan's apply_fsdp_to_decoder (the embedding, each block, the final norm and LM head kept "
                 "unsharded after forward)" if led.fsdp_units == "torchtitan" else "fully_shard per block and the root")
        lines[:0] = [f"framework fsdp2: {units} over {led.dp} ranks, MixedPrecisionPolicy("
                     f"param_dtype={led.fsdp_param_dtype}, reduce_dtype={led.fsdp_reduce_dtype}), "
                     f"reshard_after_forward={led.reshard_after_forward}"
                     + (f"; HSDP: {led.dp_replicate} replicas of {led.dp // led.dp_replicate} ranks"
                        if led.dp_replicate > 1 else "")
                     + (f"; FSDP2 x TP: parallelize_module over the tp sub-mesh of a ({led.dp}, {led.tp}) (dp, tp) mesh"
                        + (", sequence parallel" if led.sequence_parallel else "") if led.tp > 1 else "")
                     + ("; the loss inside the root's forward" if led.fsdp_loss_in_root else "")
                     + (f"; CPUOffloadPolicy(pin_memory={led.fsdp_offload_pin_memory})" if led.fsdp_cpu_offload
                        else ""), ""]
    for name, devices in result.landmarks.items():
        lines.append(f"{name:<16} {size(devices['gpu']):>12} {size(devices['cpu']):>12} {size(devices['nvme']):>12}")
    lines += ["", "largest GPU total per phase: " + ", ".join(f"{k} {size(v)}" for k, v in result.phase_peaks().items()),
              "", f"peak {size(result.peak.bytes)}: {result.peak.detail}", "live at the peak:"]
    live = result.live_at_peak()
    lines += [f"  {size(b):>12}  {name}" for name, b in live[:12]]
    if len(live) > 12:
        lines.append(f"  {size(sum(b for _, b in live[12:])):>12}  {len(live) - 12} smaller tensors")
    counted = result.values["P"]
    note = "" if getattr(result.ledger, "params", counted) == counted else (
        f"; parameters counted from the shape: {counted:,}, the nominal {result.ledger.params:,} is not used")
    if getattr(result.ledger, "framework", "plain") == "fsdp2":        # FSDP2 books no sum of rows
        clause = f", {MEASURE['peak']} under FSDP2" + note
    else:
        clause = CLAUSES["peak"].format(peak_measure=MEASURE["peak"], total_measure=MEASURE["total"],
                                        total=size(result.ledger.totals["gpu"])) + note
    judged = result.peak.bytes
    if replay is not None:
        lines += allocator_lines(result, replay, unit)
        judged = replay.judged(measure)
        clause = f", {MEASURE[measure]} ({MEASURE['peak']}: {size(result.peak.bytes)})"
    if extra is not None:
        judged, _, more, tail = extra
        lines += more
        clause = f", {MEASURE[measure]} ({MEASURE['peak']}: {size(result.peak.bytes)}){tail}"
    lines += ["", f"{sentence(judged, memory, clause, unit)}."]
    return "\n".join(lines)


def allocator_lines(result, replay, unit: str) -> list:
    """The caching allocator beside the live tensors: per phase, the largest live total, allocated and reserved
    (over the two replayed steps, the overhead row added to each as to the peak), and the segments at the reserved
    peak with their free bytes."""
    def size(n):
        return format_bytes(n, unit)
    live = result.phase_peaks()
    options = ", ".join(o for o in ((replay.expandable_segments and "expandable_segments:True"),
                                    (replay.max_split_size_mb is not None
                                     and f"max_split_size_mb:{replay.max_split_size_mb}")) if o) or "defaults"
    lines = ["", f"caching allocator, two steps replayed ({options}); the overhead row "
             f"{size(replay.outside)} added to allocated and reserved:",
             f"  {'phase':<10} {'live tensors':>14} {'allocated':>14} {'reserved':>14}"]
    for phase, (allocated, reserved) in replay.phase_peaks().items():
        lines.append(f"  {phase:<10} {size(live.get(phase, 0)):>14} {size(allocated + replay.outside):>14} "
                     f"{size(reserved + replay.outside):>14}")
    step, op, phase = replay.reserved_at
    free = sum(s["free_size"] for s in replay.segments)
    lines += [f"  peak: allocated {size(replay.allocated + replay.outside)}, reserved "
              f"{size(replay.reserved + replay.outside)} (step {step}, {phase}), of which {size(free)} free in "
              f"{len(replay.segments)} segments:"]
    streams = {}
    for seg in replay.segments:
        total, unused = streams.get(seg["stream"], (0, 0))
        streams[seg["stream"]] = (total + seg["total_size"], unused + seg["free_size"])
    if len(streams) > 1:        # a pool per stream (FSDP2's side streams)
        lines += [f"    {name} stream: {size(total)} in segments, {size(unused)} free"
                  for name, (total, unused) in sorted(streams.items(), key=lambda kv: kv[0] != "default")]
    for seg in sorted(replay.segments, key=lambda s: -s["total_size"])[:8]:
        on = "" if seg["stream"] == "default" else f", {seg['stream']} stream"
        lines.append(f"    {seg['pool']:<5} {'expandable ' if seg['expandable'] else ''}segment "
                     f"{size(seg['total_size']):>12}, {size(seg['free_size']):>12} free{on}")
    if len(replay.segments) > 8:
        rest = replay.segments
        rest = sorted(rest, key=lambda s: -s["total_size"])[8:]
        lines.append(f"    {len(rest)} smaller segments {size(sum(s['total_size'] for s in rest)):>12}, "
                     f"{size(sum(s['free_size'] for s in rest)):>12} free")
    return lines
