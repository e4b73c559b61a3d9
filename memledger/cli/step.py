"""``memledger step``: the step timeline of one setup, its landmarks and its peak (README, "One training step").

Every ``memledger ledger`` option, plus ``--backend`` (the conventions of
:mod:`memledger.activations.backends`: article, cuda or cpu) and the optimizer's implementation:
``--foreach`` (the multi-tensor step), ``--no-foreach`` (the for-loop) or ``--fused`` (one kernel).
Text by default; ``--json`` prints the object of
the README: inputs, landmarks {gpu, cpu, nvme}, peak {gpu, phase, detail},
rows {name, kind, phase, device, bytes, formula}. The fits verdict compares
the peak with the GPU's memory (:data:`memledger.ledger.hardware.GPU_MEMORY`).
Unlike ``ledger`` this command imports SymPy (the step's programs are built
from the library's formulas on first use).
"""
from ..activations.backends import BACKENDS
from ..core.units import format_bytes
from .options import add, build_ledger, flag, gpu_bytes, ledger_options, output_options
from .paths import MODEL, WORKLOAD, refuse_unread

__all__ = ["add_parser", "implementation", "step", "text"]


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


def step(a) -> str:
    """``memledger step``: every ledger option but --scope (the step runs the whole model), plus the backend."""
    ledger = build_ledger(a)
    reads = set(MODEL) | set(WORKLOAD) | {"units", "gpu_memory", "json", "backend", "foreach", "no_foreach", "fused",
                                          "optimizer_in_backward"}
    if ledger.offload_optimizer == "none":
        reads.discard("offload_placement")
    refuse_unread(a, reads, "memledger step")
    result = ledger.step(a.backend, **implementation(a, ledger.recipe))
    memory = gpu_bytes(a.gpu_memory)
    if a.json:
        import json
        data = result.to_dict()
        data["gpu_memory"] = memory
        data["fits"] = result.fits(memory)
        return json.dumps(data, indent=2)
    return text(result, memory, a.units)


def implementation(a, recipe: str) -> dict:
    """The optimizer implementation ``--foreach``/``--no-foreach``/``--fused`` ask for, as backend changes (none
    given: the backend's own, AdamW()'s default there); more than one, or ``--foreach`` with Adafactor (whose
    only modelled step is its default for-loop), is refused."""
    given = [f for f in ("foreach", "no_foreach", "fused") if getattr(a, f, False)]
    if len(given) > 1:
        raise ValueError(f"give one of --foreach, --no-foreach, --fused, not {' and '.join(flag(f) for f in given)}")
    if a.foreach and recipe in ("adafactor", "bf16-adafactor"):
        raise ValueError("--foreach: torch.optim.Adafactor's foreach step is not modelled (its default is the for-loop)")
    return {"foreach": True} if a.foreach else {"foreach": False} if a.no_foreach else \
        {"foreach": False, "fused": True} if a.fused else {}


def text(result, memory: int, unit: str = "GB") -> str:
    """The landmarks per device, the phase peaks, the peak and what is live there, the verdict."""
    def size(n):
        return format_bytes(n, unit)
    lines = [f"{'landmark':<16} {'GPU':>12} {'CPU':>12} {'NVMe':>12}"]
    for name, devices in result.landmarks.items():
        lines.append(f"{name:<16} {size(devices['gpu']):>12} {size(devices['cpu']):>12} {size(devices['nvme']):>12}")
    lines += ["", "largest GPU total per phase: " + ", ".join(f"{k} {size(v)}" for k, v in result.phase_peaks().items()),
              "", f"peak {size(result.peak.bytes)}: {result.peak.detail}", "live at the peak:"]
    live = result.live_at_peak()
    lines += [f"  {size(b):>12}  {name}" for name, b in live[:12]]
    if len(live) > 12:
        lines.append(f"  {size(sum(b for _, b in live[12:])):>12}  {len(live) - 12} smaller tensors")
    verdict = "fits" if result.fits(memory) else "does NOT fit"
    counted = result.values["P"]
    note = "" if result.ledger.params == counted else (
        f" (parameters counted from the shape: {counted:,}; the nominal {result.ledger.params:,} is not used)")
    lines += ["", f"The step's peak, {size(result.peak.bytes)} per GPU, {verdict} in {size(memory)}{note}."]
    return "\n".join(lines)
