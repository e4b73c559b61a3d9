"""Activation offloading in the step: every tensor a block saves for backward held as a pinned host copy.

The model is PyTorch's ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` around each block (FSDP's
``offload_wrapper``), as the reference decoder runs it (:mod:`memledger.pytorch.offload`, which also says
how torchtune's ``OffloadActivations`` differs). Per block:

* forward: each tensor autograd saves is copied into a host tensor of its size, once per saving node (a
  tensor two nodes save is copied twice; the transposed weight ``nn.Linear`` saves and a norm's weight
  too). On the GPU the block's tensors then die with their last Python reference, as under a checkpoint
  (the save policy ``dropped`` of :mod:`memledger.step.block`), and the block's input when the caller
  rebinds it after the block returns. Host per block: sum over saving nodes of the saved tensor's bytes.
* backward: each node copies the tensors it saved back to the GPU before it runs (``unpack``: GPU
  copies that live while that node runs) and they go once it has run; the host copies go with the block.
* full recomputation: only the checkpoint's input is saved (``_NoopSaveInputs``: ``ctx.save_for_backward``,
  torch/utils/checkpoint.py line 271 in PyTorch 2.13), hence offloaded; its GPU copy comes back before the
  block's forward is re-run, and goes when the re-run stops.

Modelled for the reference decoder's LLaMA block under the CPU backend's conventions (composite RMSNorm,
16-bit or FP32 activations, the flash kernel, multi-head attention, no QKV bias), no or full recomputation, one
GPU rank, and packed rows (:mod:`memledger.step.packing`: each block's additive mask is one more saved tensor,
read by the flash backward; under full recomputation the checkpoint saves the bool mask too, copied back with
the block's input and released when the re-run stops); anything else is refused by name
(:func:`memledger.step.structure.check_offload`). Read off
MemTracker's allocation log (PyTorch 2.13, CPU) and checked by ``tests/step/test_offload.py``.
"""
from ..core.dtypes import nbytes
from . import packing as packing_
from .norms import NODE_ROLES
from .ops import Tensor, block_params, residual_names
from .vocab import Device, Kind, Lifetime, OpRole, Save

__all__ = ["HOST", "READS", "define_host", "host_rows", "offloaded_backward", "offloaded_forward", "packed"]

#: The host tensor that stands for one block's offloaded saved tensors.
HOST = "offloaded saved tensors (pinned host copies)"

#: What each backward node of the block unpacks (copies back to the GPU): (weights, saved rows).
_NORM_READS = {"weight": (("norm{k}.weight",), ("RMSNorm {k} x*rstd",)),
               "x*rstd": ((), ("RMSNorm {k} rstd", "RMSNorm {k} input")),
               "rsqrt": ((), ("RMSNorm {k} rstd",)), "pow": ((), ("RMSNorm {k} input",))}
READS = {OpRole.DOWN_PROJECTION_BACKWARD: (("down.weight",), ("down-projection input",)),
         OpRole.SWIGLU_PRODUCT_BACKWARD: ((), ("SiLU output", "up-projection output")),
         OpRole.UP_PROJECTION_BACKWARD: (("up.weight",), ("MLP input",)),
         OpRole.SILU_BACKWARD: ((), ("gate output",)),
         OpRole.GATE_PROJECTION_BACKWARD: (("gate.weight",), ("MLP input",)),
         OpRole.OUTPUT_PROJECTION_BACKWARD: (("proj.weight",), ("output projection input",)),
         OpRole.FLASH_ATTENTION_BACKWARD: ((), ("Q", "K", "V", "softmax log-sum-exp", "output projection input")),
         OpRole.QKV_PROJECTION_BACKWARD: (("qkv.weight",), ("Q/K/V projection input",))} | {
    NODE_ROLES[k, node]: (tuple(w.format(k=k) for w in ws), tuple(r.format(k=k) for r in rs))
    for k in ("1", "2") for node, (ws, rs) in _NORM_READS.items()}


def packed(c, full: bool) -> list:
    """(saved row or parameter, copies) of what one block's forward packs to the host: under full
    recomputation the checkpoint's input only; else every saved row (the norms' FP32 input and rstd, and
    the tensors two nodes read, twice) and every parameter of the block once (its weight, or weight view)."""
    if full:        # packed rows: the bool mask, the checkpointed call's other input
        return [(residual_names(c)[0], 1)] + [(packing_.MASK, 1)] * (c.packing == "mask")
    twice = {"RMSNorm 1 input", "RMSNorm 1 rstd", "RMSNorm 2 input", "RMSNorm 2 rstd", "output projection input",
             "MLP input"}
    rows = ["RMSNorm 1 input", "RMSNorm 1 rstd", "RMSNorm 1 x*rstd", "Q/K/V projection input", "Q", "K",
            "softmax log-sum-exp", "V", "output projection input", "RMSNorm 2 input", "RMSNorm 2 rstd",
            "RMSNorm 2 x*rstd", "MLP input", "gate output", "SiLU output", "up-projection output",
            "down-projection input"]
    rows += packing_.saved_names(c)         # packed rows: SDPA's additive mask, saved by the flash kernel
    return [(r, 2 if r in twice else 1) for r in rows] + [(name, 1) for name, _ in block_params(c)]


def _bytes(tensors, c, name):
    """Bytes of a saved row, or of a block parameter in the parameter dtype."""
    if name in tensors and tensors[name].lifetime is not Lifetime.TEMPORARY:
        return tensors[name].expr
    return dict(block_params(c))[name] * nbytes(c.dtype)


def host_rows(tensors, c, full: bool) -> list:
    """(row name, bytes of one block) of the host copies, the parameters' as one row."""
    rows, weights = [], 0
    params = dict(block_params(c))
    for name, copies in packed(c, full):
        if name in params:
            weights += params[name] * nbytes(c.dtype)
        else:
            label = "layer input (checkpoint)" if full and name == residual_names(c)[0] else name
            rows.append((f"{label}, host copy" + (f" x{copies}" if copies > 1 else ""), copies * tensors[name].expr))
    return rows + ([("block parameters, host copies", weights)] if weights else [])


def offloaded_forward(p, c, block_forward):
    """One block's forward with its saved tensors packed to the host: the program of the ``dropped`` save
    policy, the block's input released when the block returns, and the host copies made (:data:`HOST`)."""
    q = p.fork()
    block_forward(q, c, (Save.DROPPED, Save.DROPPED))
    last, x = q.ops[-1], residual_names(c)[0]
    q.ops[-1] = last._replace(frees=last.frees + (x,))
    first = next(i for i, op in enumerate(q.ops) if op.allocs)     # the host copies: counted from the block's start
    q.ops[first] = q.ops[first]._replace(allocs=q.ops[first].allocs + (HOST,))
    p.ops.extend(q.ops)


def define_host(tensors, c, full: bool):
    """Add :data:`HOST` (one block's host copies, on the CPU) to ``tensors``."""
    total = sum((b for _, b in host_rows(tensors, c, full)), 0)
    tensors[HOST] = Tensor(HOST, total, Kind.ACTIVATION, Lifetime.SAVED, Device.CPU,
                           "every tensor the block saved, copied to pinned host memory (save_on_cpu)")


def offloaded_backward(p, c, block_backward, share):
    """One block's backward with its saved tensors unpacked node by node (or, under full recomputation, the
    checkpoint's input copied back first); the host copies go when the block is done."""
    q = p.fork()
    block_backward(q, c, share)
    if c.recompute == "full":   # the copy is the re-run's input: with a 16-bit input (its FP32 copy saved) it
        x = residual_names(c)[0]    # goes when the re-run stops; an FP32 input norm 1 saves, until its backward
        mask = None                 # packed rows: the bool mask's GPU copy, until the re-run stops
        if c.packing == "mask":
            mask = f"{packing_.MASK} (GPU copy)"
            p.tensors[mask] = Tensor(mask, p.tensors[packing_.MASK].expr, Kind.TRANSIENT, Lifetime.TEMPORARY,
                                     Device.GPU, "unpacked from the host for the re-run")
        p.op("checkpoint input copied back", alloc=[x, mask])
        frame = packing_.frame(c)
        for op in q.ops:
            frees = tuple(n for n in op.frees if n not in frame)    # the frame's mask is the host copy
            if c.upcast:
                frees = frees + (x,) if op.role is OpRole.RECOMPUTATION_STOPS else tuple(n for n in frees if n != x)
            if mask and op.role is OpRole.RECOMPUTATION_STOPS:
                frees = frees + (mask,)
            p.ops.append(op._replace(frees=frees))
    else:
        t = p.tensors

        def saved(n):
            return isinstance(n, str) and t[n].lifetime is Lifetime.SAVED
        for op in q.ops:
            frees = tuple(n for n in op.frees if not saved(n))
            reads = READS.get(op.role)
            if reads and op.role is OpRole.FLASH_ATTENTION_BACKWARD:   # packed rows: the additive mask too
                reads = (reads[0], reads[1] + tuple(packing_.saved_names(c)))
            if not reads:
                p.ops.append(op._replace(frees=frees))
                continue
            copies = []
            for name in reads[0] + reads[1]:
                copy = f"{name} (GPU copy)"
                t[copy] = Tensor(copy, _bytes(t, c, name), Kind.TRANSIENT, Lifetime.TEMPORARY, Device.GPU,
                                 "unpacked from the host for this node's backward")
                copies.append(copy)
            p.op(f"{op.label}: saved tensors copied back", free=frees, alloc=copies)
            p.op(op.label, alloc=op.allocs, role=op.role)
            p.op("GPU copies released", free=copies)
    p.op("host copies released", free=[HOST])
