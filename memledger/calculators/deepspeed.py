"""DeepSpeed's model-state estimators, exactly as its code computes and prints them.

Source: microsoft/DeepSpeed at 38327e07 (2025-02-21):
``deepspeed/runtime/zero/stage_1_and_2.py`` lines 2430-2447
(``estimate_zero2_model_states_mem_needs``) and 2486-2528 (the ``_all_cold``
printer); ``deepspeed/runtime/zero/stage3.py`` lines 3008-3044
(``estimate_zero3_model_states_mem_needs``) and 3091-3151 (printer). Docs:
``docs/code-docs/source/memory.rst`` (tables at lines 25-30, 41-46, 68-77, 88-97).

ZeRO-2 (code since f4cb866c, PR #5099, 2024-06-04), N = GPUs in all nodes,
G = GPUs per node, beta = ``additional_buffer_factor`` (1.5):

    GPU = 2P + floor((2 + 4 + 4 + 8)P / N)      (16-bit params replicated; 16- and
                                                32-bit grads, 32-bit params, Adam m, v sharded)
    CPU = P * 4 * G * beta                       (loading the model in fp32 on the node)
    offload_optimizer: GPU = 2P, CPU = P * max(4N, 16) * beta

Before PR #5099 (and in the docs' tables) the GPU line was 4P + floor(16P/N):
convention ``deepspeed-zero2-docs``. ZeRO-3 (unchanged since 0c1802cc, 2021):

    GPU = 4 P_max + floor(18P/N)   (2+2 bytes to gather the largest layer's params and grads;
                                   18 = 2 fp16 params + 16 fp32 params, grads, m, v)
    offload_optimizer: GPU = 4 P_max + floor(2P/N);  offload both: GPU = 4 P_max
    CPU (zero_init) = P_max*4*G*beta | P*16/M*beta | P*18/M*beta; without zero_init
    P*4*G*beta | P*max(4G, 16/M)*beta | P*max(4G, 18/M)*beta

DeepSpeed prints ``x/2**30`` with the label "GB": binary GiB. A row that books
several ZeRO roles in one sum (the code computes ``int(18P/N)``, not one term
per role) has role ``"mixed"``.
"""
import sympy as sp

from ..core.symbols import P
from .base import Convention, Erratum, G, Item, M, P_max, beta, offloads

__all__ = ["ERRATA", "ZERO2", "ZERO2_DOCS", "ZERO3", "print_all_cold", "zero2_items", "zero3_items"]

N = G * M
_ADAM = ("Adam m and v (fp32)", "optimizer", 8)
_ZERO2_SHARDED = (("16-bit gradients", "grad", 2), ("32-bit gradients", "grad", 4),
                  ("32-bit master parameters", "optimizer", 4), _ADAM)
_ZERO3_SHARDED = (("16-bit parameters", "param", 2), ("32-bit master parameters", "optimizer", 4),
                  ("32-bit gradients", "grad", 4), _ADAM)


def _parts(parts) -> str:
    """'2 + 4 + 4 + 8 bytes/param (16-bit gradients, ...)'."""
    return " + ".join(str(b) for _, _, b in parts) + " bytes/param (" + ", ".join(n for n, _, _ in parts) + ")"


def _sharded(parts, count=P) -> sp.Expr:
    """floor(sum(bytes) * count / N): DeepSpeed truncates the sharded sum with ``int()``."""
    return sp.floor(sum(b for _, _, b in parts) * count / N)


def zero2_items(ledger, inputs, docs: bool = False) -> list:
    """The ZeRO-2 estimate as itemized formulas (``docs``: the formula before PR #5099)."""
    if offloads(ledger)[0]:
        return [Item("16-bit parameters", "model_states", "gpu", 2 * P, "param"),
                Item("CPU: optimizer states, grads, fp32 params (x buffer)", "model_states", "cpu",
                     sp.floor(P * sp.Max(4 * N, 16) * beta), "mixed")]
    if docs:
        gpu = [Item("replicated: 4 bytes/param", "model_states", "gpu", 4 * P, "mixed"),
               Item("sharded: 16 bytes/param (fp32 params, grads, m, v)", "model_states", "gpu",
                    sp.floor(16 * P / N), "mixed")]
    else:
        gpu = [Item("16-bit parameters (replicated)", "model_states", "gpu", 2 * P, "param"),
               Item("sharded: " + _parts(_ZERO2_SHARDED), "model_states", "gpu",
                    _sharded(_ZERO2_SHARDED), "mixed")]
    return gpu + [Item("CPU: fp32 model while loading (x buffer)", "model_states", "cpu",
                       sp.floor(P * 4 * G * beta), "param")]


def zero3_items(ledger, inputs) -> list:
    """The ZeRO-3 estimate as itemized formulas."""
    gather = Item("largest layer: 16-bit params + grads gathered", "model_states", "gpu", 4 * P_max, "mixed")
    optimizer, params = offloads(ledger)
    if params and not optimizer:
        raise ValueError("DeepSpeed's ZeRO-3 estimator has no case of offloaded parameters without an offloaded "
                         "optimizer (offload_param=cpu needs offload_optimizer=cpu)")
    if optimizer and params:
        gpu, per = [gather], 18
    elif optimizer:
        gpu, per = [gather, Item("16-bit parameters (sharded)", "model_states", "gpu",
                                 sp.floor(2 * P / N), "param")], 16
    else:
        gpu = [gather, Item("sharded: " + _parts(_ZERO3_SHARDED), "model_states",
                            "gpu", _sharded(_ZERO3_SHARDED), "mixed")]
        cpu = (P_max if inputs.zero_init else P) * 4 * G * beta
        return gpu + [Item("CPU: fp32 model while loading (x buffer)", "model_states", "cpu", sp.floor(cpu), "param")]
    share = sp.Rational(per) / M
    cpu = P * (share if inputs.zero_init else sp.Max(4 * G, share)) * beta
    return gpu + [Item(f"CPU: offloaded states, {per} bytes/param over the nodes (x buffer)", "model_states", "cpu",
                       sp.floor(cpu), "mixed")]


def _head(ledger, inputs, zero3: bool) -> list:
    per_node = inputs.per_node(ledger)
    nodes = "nodes" if inputs.nodes > 1 else "node"
    gpus = "GPUs" if per_node > 1 else "GPU"
    software = f"SW: Model with {int(ledger.params / 1e6)}M total params"
    software += f", {int(inputs.largest(ledger) / 1e6)}M largest layer params." if zero3 else "."
    return ["Estimated memory needed for params, optim states and gradients for a:",
            f"HW: Setup with {inputs.nodes} {nodes}, {per_node} {gpus} per node.", software,
            "  per CPU  |  per GPU |   Options"]


def _line(cpu: int, gpu: int, options: str) -> str:
    return f" {cpu / 2**30:7.2f}GB | {gpu / 2**30:6.2f}GB | {options}"


def print_all_cold(convention, ledger, inputs) -> str:
    """The table ``estimate_zero{2,3}_model_states_mem_needs_all_cold`` prints, for every option (the ledger's
    and the inputs' offload and ``zero_init`` choices replaced by each of the tool's)."""
    from dataclasses import replace
    zero3 = convention.name == "deepspeed-zero3"
    lines = _head(ledger, inputs, zero3)
    cpu = "cpu "                                        # f'{OffloadDeviceEnum.cpu:4}'
    if zero3:
        for opt, par, init in [(o, p, i) for o in (True, False) for p in (True, False) if o or not p
                               for i in (True, False)]:
            e = convention.estimate(replace(ledger, zero_stage=3, offload_optimizer="cpu" if opt else "none",
                                            offload_params="cpu" if par else "none"), replace(inputs, zero_init=init))
            lines.append(_line(e.total("cpu"), e.total("gpu"), f"offload_param={cpu if par else 'none'}, "
                               f"offload_optimizer={cpu if opt else 'none'}, zero_init={int(init)}"))
    else:
        for opt in (True, False):
            e = convention.estimate(replace(ledger, offload_optimizer="cpu" if opt else "none"), inputs)
            lines.append(_line(e.total("cpu"), e.total("gpu"), f"offload_optimizer={cpu if opt else 'none'}"))
    return "\n".join(lines)


def _printed(ledger, inputs, rows) -> str:
    cpu = sum(r.bytes for r in rows if r.device == "cpu")
    gpu = sum(r.bytes for r in rows if r.device == "gpu")
    return _line(cpu, gpu, "").rstrip(" |")


_T5_3B = ("t5-3b: P = 2,851,598,336 and a 32,899,072-parameter largest layer (the shared embedding) "
          "reproduce the docs' live tables")
ERRATA = (
    Erratum("DeepSpeed docs", "docs/code-docs/source/memory.rst lines 29-30 and 45-46 (ZeRO-2, offload_optimizer=none)",
            "15.93GB per GPU", "11.29GB (live t5-3b) / 11.28GB (2851e6 params)",
            "the tables print the formula before PR #5099 (f4cb866c, 2024-06-04): (4P + 16P/8)/2^30 = "
            "6 x 2,851,598,336/2^30 = 15.93; the code since gives (2P + floor(18P/8))/2^30 = "
            "12,119,292,928/2^30 = 11.29", "outdated"),
    Erratum("DeepSpeed docs", "docs/code-docs/source/memory.rst line 137 (ZeRO-2 GPU RAM)",
            "4 * params + 16 * params / (total number of gpus)", "2 * params + 18 * params / total_gpus",
            "stage_1_and_2.py line 2445 books 2 bytes of replicated 16-bit parameters and shards 2 + 4 + 4 + 8 = 18 "
            "bytes (16-bit grads, 32-bit grads, 32-bit params, m and v): 20P at N = 1, not the docs' 20P split "
            "4 + 16", "outdated"),
    Erratum("DeepSpeed docs", "docs/code-docs/source/memory.rst line 205 (ZeRO-2 CPU with offload)",
            "params * max(4 * n_gpus, 16) * buffer, n_gpus = GPUs on one node",
            "params * max(4 * total_gpus, 16) * buffer",
            "stage_1_and_2.py line 2441 uses total_gpus = num_nodes * num_gpus_per_node: on 2 nodes of 8 GPUs "
            "the code books max(64, 16) = 64 bytes/param of CPU memory per node, the docs max(32, 16) = 32",
            "inconsistent"),
)

ZERO2 = Convention(
    "deepspeed-zero2", "DeepSpeed estimate_zero2_model_states_mem_needs (code since 2024-06)",
    "microsoft/DeepSpeed deepspeed/runtime/zero/stage_1_and_2.py lines 2430-2447 (38327e07)",
    zero2_items, reads=("dp", "tp", "gpus_per_node", "nodes", "buffer_factor", "offload_optimizer"), printed=_printed,
    zero_stage=2,
    differs="model states only, no activations; 16-bit parameters replicated but 16- and 32-bit gradients both "
            "booked (18 sharded bytes + 2 = 20 B/param at one GPU, memledger's recipe 16); floor() of the sharded "
            "part; CPU side is the fp32 model while loading x 1.5, not resident state; prints GiB as 'GB'",
    errata=ERRATA)
ZERO2_DOCS = Convention(
    "deepspeed-zero2-docs", "DeepSpeed ZeRO-2 estimate as its docs print it (formula before PR #5099)",
    "microsoft/DeepSpeed docs/code-docs/source/memory.rst lines 25-46 and 137; code before f4cb866c",
    lambda ledger, inputs: zero2_items(ledger, inputs, docs=True), reads=ZERO2.reads, printed=_printed, zero_stage=2,
    differs="4 bytes/param replicated + 16 sharded (20 B/param at one GPU); superseded by PR #5099")
ZERO3 = Convention(
    "deepspeed-zero3", "DeepSpeed estimate_zero3_model_states_mem_needs",
    "microsoft/DeepSpeed deepspeed/runtime/zero/stage3.py lines 3008-3044 (38327e07)",
    zero3_items, reads=("dp", "tp", "largest_layer", "gpus_per_node", "nodes", "buffer_factor", "offload_optimizer",
                        "offload_params", "zero_init"), printed=_printed, zero_stage=3,
    differs="model states only; 18 B/param sharded (fp16 params + fp32 params, fp32 grads, m, v; no 16-bit "
            "gradients booked) plus 4 bytes x the largest module for gathered params and grads; floor() of the "
            "sharded part; prints GiB as 'GB'")
