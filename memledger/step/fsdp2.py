"""FSDP2's step (PyTorch's ``fully_shard`` on every block, then on the root): its buffers around the plain
step's programs, as ``torch/distributed/fsdp/_fully_shard/`` (PyTorch 2.13) allocates them (docs/fsdp2.md).

N = dp ranks, unit u = a block or the root (embedding, final norm, LM head). A parameter with dim 0 n0 and
n elements is padded to n^ = ceil(n0/N) N (n/n0) (``_fsdp_param.py:304``); P^_u = sum of n^ over the unit.
o, p, r: bytes of the original (sharded) dtype, the ``MixedPrecisionPolicy``'s ``param_dtype`` (None: o)
and ``reduce_dtype`` (None: p).

* resident: FP32 (o) shards o P^/N (``_fsdp_param.py:307``), AdamW's moments on them (rank 0's chunks are
  whole: 2 o P^/N), no persistent BF16 copy; sharded gradients o P^/N after backward;
* pre-forward of u: the all-gather input, a cast copy p P^_u/N when p != o (``_fsdp_collectives.py:419``,
  freed on return), the all-gather output p P^_u (``:351``), then in ``wait_for_unshard`` the unsharded
  parameters p P^_u copied out (``:463``) and the previous unit's output freed as the call returns (dropped
  at ``_fsdp_param_group.py:432`` but held by the local ``prev_all_gather_state``); each output is kept until
  the next unit's copy-out (``:483``) or the root's post-forward;
* post-forward: the unsharded parameters freed when ``reshard_after_forward`` (``_fsdp_param.py:827``);
* pre-backward (a hook on the unit's output gradient): re-gather if resharded (the output freed after the
  copy-out), then prefetch the unit before it in forward order (its all-gather output only,
  ``_fsdp_param_group.py:795``);
* post-backward (when the unit's input gradient is complete; the root's in the final callback,
  ``_fsdp_state.py:415``): unsharded parameters freed, the previous unit's reduce-scatter input freed
  (``:655``), the reduce-scatter input r P^_u (``_fsdp_collectives.py:597``), the unsharded gradients freed
  but the last parameter's (``:606``, ``:580``), the output r P^_u/N (``:612``; cast to o when r != o,
  ``:696``), the last gradient freed; the root's input is cleared in the final callback (``_fsdp_state.py:431``).

``reshard_after_forward`` True or False applies to every unit, the root included (as torchtitan passes True
and ``memledger.pytorch.distributed.fsdp_step`` runs it); None is PyTorch's own default: True for the blocks,
False for the root (``_fully_shard.py:246,260``), whose parameters then stay unsharded through the step. An int
k: each unit's post-forward keeps a clone of this rank's 1/k slice of every parameter (``_fsdp_param.py:709-745``),
re-gathered from it in backward. ``loss_in_root``: the loss runs in the root's forward (its post-forward after
the loss, its pre-backward as ``loss.backward()`` starts). ``CPUOffloadPolicy``: shards, sharded gradients and
AdamW on the host, each shard copied to the device before its all-gather, each gradient to the host after its
reduce-scatter (docs/fsdp2.md section 13).

The stream each buffer is allocated on (:class:`~memledger.step.vocab.Stream`, the caching allocator's pool;
PyTorch 2.13, ``torch/distributed/fsdp/_fully_shard/``):

* all-gather copy-in stream: the all-gather input (the cast copy, ``_fsdp_collectives.py:419``; under offload the
  shard's device copy, ``_fsdp_param.py:897-899``, read by ``_get_param_all_gather_inputs`` at
  ``_fsdp_collectives.py:337``) and output (``:351``), both under ``device_handle.stream(all_gather_copy_in_stream)``
  (``:336``): ``unshard`` passes the separate streams in forward and pre-backward, prefetches included, unless
  ``unshard_async_op`` (``_fsdp_param_group.py:411``, ``FSDPCommContext.get_all_gather_streams`` ``:116-126``);
* default stream: the unsharded parameters (the copy-out in ``wait_for_unshard`` on the current stream,
  ``alloc_all_gather_outputs`` at ``_fsdp_collectives.py:463``, ``_fsdp_param.py:823-825``), the post-forward
  slices (``_fsdp_param.py:733``), the reduce-scatter input (allocated before the reduce-scatter stream is
  entered, ``_fsdp_collectives.py:597-601``), the autograd gradients;
* reduce-scatter stream: the reduce-scatter output (``:611-616``) and, where the reduce dtype is the shards', the
  sharded gradients (its views, ``:703``); the cast to the shards' dtype runs on the post-reduce stream (``:685-696``),
  the reduce-scatter stream, or under HSDP the all-reduce stream (``:652``).

No ``record_stream``: FSDP2 frees a buffer used on another stream only after making the streams wait on an event
(``_wait_all_gather_streams_on_event``, ``_fsdp_param_group.py:430-432, 491-496``; the reduce-scatter input after
the current stream waits on its reduce-scatter, ``:655-658``; ``_fully_shard.py:721``: "no extra stream and no
``record_stream``"), so a freed block returns to its stream's pool at once.
"""
from dataclasses import replace

import sympy as sp

from ..core.dtypes import nbytes
from ..core.symbols import F, L, N_d, V, d
from .ops import ProgramOp, Ref, Tensor, block_params, qkv_width
from .fsdp2_tp import local
from .outer import Param, head_params
from .params import param_tensors
from .structure import block_of
from .trace import GRADIENT_LUMP, Part
from .vocab import Device, Kind, Lifetime, OpRole, Phase, Scope, Stream

__all__ = ["UNIT_TENSORS", "FSDP2", "dim0", "shard", "unit_params", "wrap"]

#: The per-unit buffers, by role (their names carry the dtype and, for the root, ", root").
UNIT_TENSORS = ("all-gather input", "all-gather output", "unsharded parameters", "reduce-scatter input",
                "reduce-scatter output", "sharded gradients")
_CLEARED = "finalize_backward; reduce-scatter states cleared (final callback)"
_MATRIX_ROWS = {"qkv.weight": None, "proj.weight": d, "gate.weight": F, "up.weight": F, "down.weight": d,
                "embedding.weight": V, "head.weight": V}


def dim0(key: str, n, c):
    """Dim 0 of parameter ``key`` (its name in its module, ``n`` elements): a weight's output features (nn.Linear
    stores (out, in)), the vocabulary of the embedding and head; a vector's length."""
    if key in _MATRIX_ROWS:
        return qkv_width(c) if key == "qkv.weight" else _MATRIX_ROWS[key]
    return n


def shard(name: str, n, c):
    """Rank 0's elements of ``name``: ceil(n0/N) rows (``torch.chunk``: rank 0's chunk is whole) = n^/N; under
    FSDP2 x TP n0 and n are the TP-local tensor's (:func:`memledger.step.fsdp2_tp.local`)."""
    rows = dim0(name, n, c)
    if c.tp:
        rows, n = local(name, n, c)
    return sp.ceiling(rows / N_d) * sp.cancel(n / rows)


def unit_params(c, units: str = "per-block") -> dict:
    """{"block": [(name, n)], "root": [(name, n)]} in registration order (the group's parameter order); torchtitan's
    units: {"block", "embedding": the embedding's weight, "head": the final norm's and the LM head's}."""
    if units == "torchtitan":
        return {"block": block_params(c), "embedding": [("embedding.weight", V * d)], "head": head_params(c)}
    return {"block": block_params(c), "root": [("embedding.weight", V * d)] + head_params(c)}


#: How a buffer's name says which unit outside the blocks it belongs to.
_UNIT_SUFFIX = {"block": "", "root": ", root", "embedding": ", embedding", "head": ", final norm and LM head",
                "LM head": ", LM head", "final norm": ", final norm"}
#: torchtitan's head unit is reduce-scattered in two parts (:meth:`FSDP2.wrap_titan`): {part: its parameters}.
_HEAD_PARTS = {"LM head": ("head.weight",), "final norm": ("final norm.weight",)}


def _label(dtype):
    return {"bf16": "BF16", "fp16": "FP16", "fp32": "FP32"}[dtype]


class FSDP2:
    """The FSDP2 tensors of one step structure (``s.fsdp``: its :class:`~memledger.step.structure.FSDP2Plan`)."""

    def __init__(self, c, s):
        self.c, self.s = c, s
        plan = s.fsdp
        self.param, self.reduce, self.original, reshard = plan.param, plan.reduce, plan.original, plan.reshard
        self.hsdp, self.loss_in_root, self.offload = plan.hsdp, plan.loss_in_root, plan.offload
        # None: PyTorch's default, True for every block and False for the root (_fully_shard.py:246, 260)
        self.reshard, self.root_reshard = (True, False) if reshard is None else (reshard, reshard)
        # torchtitan's apply_fsdp_to_decoder (torchtitan/distributed/fsdp.py, 0.3.0): the embedding resharded as the
        # blocks (l. 194-199), the final norm and LM head never with its "default" and "never" policies (l. 200-207:
        # reshard_after_forward=policy == "always"), the root without parameters (l. 310)
        self.titan = plan.units == "torchtitan"
        if self.titan:
            self.root_reshard = False
        # an int k: each unit keeps a clone of its 1/k slice after forward (_fsdp_param.py:709-745)
        self.k = reshard if isinstance(reshard, int) and not isinstance(reshard, bool) else None
        self.held = self.hsdp and self.reduce != self.original    # HSDP keeps each reduce-dtype output
        self.p, self.r, self.o = nbytes(self.param), nbytes(self.reduce), nbytes(self.original)
        self.cast = self.param != self.original
        # CPUOffloadPolicy (self.offload: its pin_memory, or None): shards, sharded gradients, AdamW on the host
        self.host = "pinned host memory" if self.offload else "host memory"
        self.device = Device.CPU if self.offload is not None else Device.GPU
        self.units = unit_params(c, plan.units)
        self.first = "embedding" if self.titan else "root"
        self.shards = {u: sum((shard(n, e, c) for n, e in ps), sp.Integer(0)) for u, ps in self.units.items()}

    @property
    def post_reduce_stream(self) -> Stream:
        """Where ``foreach_reduce`` casts the reduced shard to the shards' dtype: the reduce-scatter stream, or under
        HSDP the all-reduce stream (``_fsdp_collectives.py:633, 652, 685-696``)."""
        return Stream.ALL_REDUCE if self.hsdp else Stream.REDUCE_SCATTER

    @property
    def gradient_stream(self) -> Stream:
        """The stream of the sharded gradients on the device: views of the reduce-scatter output (the reduce-scatter
        stream) where the reduce dtype is the shards', else the cast's (:attr:`post_reduce_stream`)."""
        return Stream.REDUCE_SCATTER if self.reduce == self.original else self.post_reduce_stream

    def name(self, role, unit):
        dtype = {"all-gather input": self.param, "all-gather output": self.param, "unsharded parameters": self.param,
                 "post-forward slices": self.param, "all-gather input from the slices": self.param,
                 "device gradients": self.original,
                 "reduce-scatter input": self.reduce, "reduce-scatter output": self.reduce,
                 "sharded gradients": self.original}[role]
        host = f", {self.host}" if self.offload is not None and role == "sharded gradients" else ""
        return f"FSDP2 {role} ({_label(dtype)}{host})" + _UNIT_SUFFIX[unit]

    def resharded(self, unit) -> bool:
        """Whether ``unit``'s post-forward frees its unsharded parameters (or, int k, keeps a slice)."""
        return bool(self.reshard if unit in ("block", "embedding") else self.root_reshard)

    @property
    def block_names(self) -> tuple:
        """The names of a block's FSDP2 buffers (a step names the blocks they are live in)."""
        return tuple(self.name(role, "block") for role in UNIT_TENSORS)

    def block_index(self, name, layer, lumped, n_layers):
        """The model block of buffer ``name`` at program ``layer``: in a lumped program (L > 4) layer 2 holds
        the all-gather buffers of block L-3 (gathered as the lump ends, prefetched by block L-2) and the
        reduce-scatter input of block 2 (the lump's last post-backward)."""
        if lumped and layer == 2:
            scattered = (self.name("reduce-scatter input", "block"), self.name("reduce-scatter output", "block"))
            return 2 if name in scattered else n_layers - 3
        return block_of(layer, lumped, n_layers)

    @property
    def total_shards(self):
        """P^/N: every parameter's rank-0 shard."""
        return L * self.shards["block"] + sum((n for u, n in self.shards.items() if u != "block"), sp.Integer(0))

    def define(self, tensors):
        """Add every unit's buffers to the step's tensor table; the lumped blocks' sharded gradients."""
        why = {"all-gather input": "the shards cast to the param dtype (foreach copy), freed as the all-gather "
                                   "returns (_fsdp_collectives.py:419)",
               "all-gather output": "the unit's gathered flat parameters, padded (_fsdp_collectives.py:351)",
               "unsharded parameters": "the unit's parameters, copied out of the all-gather output "
                                       "(_fsdp_collectives.py:463)",
               "reduce-scatter input": "the unit's gradients, padded, in the reduce dtype (_fsdp_collectives.py:597),"
                                       " kept until the next unit's reduce-scatter (_fsdp_param_group.py:655)",
               "reduce-scatter output": "this rank's reduced shard before its cast to the sharded dtype "
                                        "(_fsdp_collectives.py:612)",
               "sharded gradients": "this rank's gradient shards (views of the reduce-scatter output, "
                                    "_fsdp_collectives.py:704)"}
        streams = {"all-gather input": Stream.ALL_GATHER_COPY_IN, "all-gather output": Stream.ALL_GATHER_COPY_IN,
                   "reduce-scatter output": Stream.REDUCE_SCATTER, "sharded gradients": self.gradient_stream}
        for unit, n in self.shards.items():
            sizes = {"all-gather input": self.p * n, "all-gather output": self.p * n * N_d,
                     "unsharded parameters": self.p * n * N_d, "reduce-scatter input": self.r * n * N_d,
                     "reduce-scatter output": self.r * n, "sharded gradients": self.o * n}
            for role, size in sizes.items():
                name = self.name(role, unit)
                kind = Kind.PARAM if role in UNIT_TENSORS[:3] else Kind.GRAD
                life = Lifetime.GRADIENT if role == "sharded gradients" else Lifetime.TEMPORARY
                tensors[name] = Tensor(name, size, kind, life, self.device if role == "sharded gradients" else
                                       Device.GPU, why=why[role], stream=streams.get(role, Stream.DEFAULT))
        if self.titan:         # the head unit's two reduce-scatters (wrap_titan)
            for part, keys in _HEAD_PARTS.items():
                n = sum((shard(k, e, self.c) for k, e in self.units["head"] if k in keys), sp.Integer(0))
                for role, size in (("reduce-scatter input", self.r * n * N_d), ("reduce-scatter output", self.r * n),
                                   ("sharded gradients", self.o * n)):
                    name = self.name(role, part)
                    tensors[name] = Tensor(name, size, Kind.GRAD, Lifetime.GRADIENT if role == "sharded gradients"
                                           else Lifetime.TEMPORARY, why=why[role] + f" ({part} only)",
                                           stream=streams.get(role, Stream.DEFAULT))
        if self.offload is not None:
            self._define_copies(tensors)
        if self.k:
            self._define_slices(tensors)
        held = "FSDP2 reduce-scatter outputs, blocks 2..L-3"
        tensors[held] = Tensor(held, (L - 4) * self.r * self.shards["block"], Kind.GRAD, Lifetime.TEMPORARY,
                               why="HSDP: kept by each group's all-reduce state (_fsdp_param_group.py:759)",
                               stream=Stream.REDUCE_SCATTER)
        self.held_lump = held
        lump = "FSDP2 unsharded parameters, blocks 2..L-3"
        tensors[lump] = Tensor(lump, (L - 4) * self.p * self.shards["block"] * N_d, Kind.PARAM, Lifetime.TEMPORARY,
                               why="kept after forward (reshard_after_forward=False)")
        self.unsharded_lump = lump

    def _copy_name(self, unit, param):
        return f"FSDP2 host-to-device copy of {param} ({_label(self.original)})" + (", root" if unit == "root" else "")

    def _input_name(self, unit, j):
        """The all-gather inputs of ``unit``'s first j + 1 parameters (all of them: the unit's input)."""
        whole = self.name("all-gather input", unit)
        return whole if j == len(self.units[unit]) - 1 else f"{whole}, the first {j + 1}"

    def _define_copies(self, tensors):
        """CPUOffloadPolicy: before the all-gather each shard is copied to the device on its own
        (``_fsdp_param.py:896-901``: ``.to(self.device, non_blocking=True)``, then cast to the param dtype, the
        copy freed as the property returns; no foreach copy under offload, ``_fsdp_collectives.py:391``); the
        inputs are kept until the all-gather returns (``_fsdp_collectives.py:348-371``, the flat list). After the
        reduce-scatter each sharded gradient is copied to the host (``_fsdp_collectives.py:737``), the device
        buffer freed as ``foreach_reduce`` returns."""
        for unit, params in self.units.items():
            elements = [shard(n, e, self.c) for n, e in params]
            for j, (param, _) in enumerate(params):
                name = self._copy_name(unit, param)
                tensors[name] = Tensor(name, self.o * elements[j], Kind.PARAM, Lifetime.TEMPORARY,
                                       why="the shard copied to the device (_fsdp_param.py:898)",
                                       stream=Stream.ALL_GATHER_COPY_IN)
                if j < len(params) - 1:
                    name = self._input_name(unit, j)
                    tensors[name] = Tensor(name, self.p * sum(elements[:j + 1], sp.Integer(0)), Kind.PARAM,
                                           Lifetime.TEMPORARY, why="the all-gather inputs so far (_fsdp_collectives.py:348)",
                                           stream=Stream.ALL_GATHER_COPY_IN)
            name = self.name("device gradients", unit)
            tensors[name] = Tensor(name, self.o * self.shards[unit], Kind.GRAD, Lifetime.TEMPORARY,
                                   why="the reduce-scatter output cast to the sharded dtype, on the device until "
                                       "foreach_reduce returns (_fsdp_collectives.py:696)", stream=self.post_reduce_stream)

    def _slice_name(self, unit, j):
        """The post-forward slices of ``unit``'s first j + 1 parameters (all of them: the unit's slices)."""
        whole = self.name("post-forward slices", unit)
        return whole if j == len(self.units[unit]) - 1 else f"{whole}, the first {j + 1}"

    def _rest_name(self, unit, j):
        """``unit``'s unsharded parameters but the first j + 1 (freed one by one after each clone)."""
        return f"{self.name('unsharded parameters', unit)}, all but the first {j + 1}"

    def _define_slices(self, tensors):
        """int k: each parameter's 1/k slice of its unsharded (padded) data, cloned in the post-forward
        (``_fsdp_param.py:729-733``, ``.narrow(...).clone()``), its unsharded storage freed right after
        (``:744`` ``free_unsharded_param``); the all-gather in backward reads the slices (``:902-909``): its
        input copy (when cast) is p P^_u / k (``_fsdp_collectives.py:388-423``)."""
        k = self.k
        for unit, params in self.units.items():
            full = [self.p * shard(n, e, self.c) * N_d for n, e in params]
            for j in range(len(params)):
                name = self._slice_name(unit, j)
                tensors[name] = Tensor(name, sum(full[:j + 1], sp.Integer(0)) / k, Kind.PARAM, Lifetime.TEMPORARY,
                                       why=f"reshard_after_forward={k}: this rank's 1/{k} slice of each parameter, "
                                           "kept from the post-forward to the re-gather (_fsdp_param.py:733)")
                if j < len(params) - 1:
                    rest = self._rest_name(unit, j)
                    tensors[rest] = Tensor(rest, sum(full[j + 1:], sp.Integer(0)), Kind.PARAM, Lifetime.TEMPORARY,
                                           why="freed parameter by parameter (_fsdp_param.py:744)")
            name = self.name("all-gather input from the slices", unit)
            tensors[name] = Tensor(name, self.p * self.shards[unit] * N_d / k, Kind.PARAM, Lifetime.TEMPORARY,
                                   why="the slices cast-copied into one flat input (_fsdp_collectives.py:419)",
                                   stream=Stream.ALL_GATHER_COPY_IN)
        lump = "FSDP2 post-forward slices, blocks 2..L-3"
        tensors[lump] = Tensor(lump, (L - 4) * self.p * self.shards["block"] * N_d / k, Kind.PARAM,
                               Lifetime.TEMPORARY, why=f"kept after forward (reshard_after_forward={k})")
        self.slices_lump = lump

    def _post_forward(self, unit) -> list:
        """The post-forward of ``unit``: its unsharded parameters freed (True), kept (False), or (int k) each
        parameter's 1/k slice cloned and then its unsharded storage freed, in the group's parameter order."""
        resharded = self.resharded(unit)
        u = self.name("unsharded parameters", unit)
        if not self.k or not resharded:
            return [ProgramOp("FSDP2 post-forward: reshard", (u,), ())] if resharded else []
        ops, n = [], len(self.units[unit])
        for j, (param, _) in enumerate(self.units[unit]):
            ops.append(ProgramOp(f"FSDP2 post-forward: {param}'s 1/{self.k} slice cloned",
                                 (self._slice_name(unit, j - 1),) if j else (), (self._slice_name(unit, j),)))
            ops.append(ProgramOp(f"{param}'s unsharded storage freed", (self._rest_name(unit, j - 1) if j else u,),
                                 (self._rest_name(unit, j),) if j < n - 1 else ()))
        return ops

    def gradient_lump(self) -> Tensor:
        """What the lumped blocks 2..L-3 leave after their backward: their sharded gradients."""
        return Tensor(GRADIENT_LUMP, (L - 4) * self.o * self.shards["block"], Kind.GRAD, Lifetime.GRADIENT,
                      self.device, why="their sharded gradients" + (f" ({self.host})" if self.offload is not None
                                                                      else ""), stream=self.gradient_stream)

    # ---- the programs -------------------------------------------------------------------------------------

    def _gather(self, unit, ref=lambda n: n, sliced=False):
        """All-gather of ``unit``: the input copy (when cast), the output, the input freed on return;
        ``sliced``: from the post-forward slices (int k, in backward)."""
        ag_in, ag_out = (ref(self.name(r, unit)) for r in UNIT_TENSORS[:2])
        copied = self.cast and not (sliced and self.offload is not None)    # offload: the slices are the input
        if sliced:
            ag_in = ref(self.name("all-gather input from the slices", unit))
        if self.offload is not None and not sliced:
            ops, copied = self._copies(unit, ref), True
        else:
            ops = [ProgramOp("FSDP2 all-gather input (cast copy of the shards)", (), (ag_in,))] if copied else []
        ops.append(ProgramOp("FSDP2 all-gather output", (), (ag_out,)))
        if copied:
            ops.append(ProgramOp("all-gather input released", (ag_in,), ()))
        return ops

    def _copies(self, unit, ref) -> list:
        """CPUOffloadPolicy: each shard copied to the device, then cast (the copy freed), one by one."""
        ops = []
        for j, (param, _) in enumerate(self.units[unit]):
            before = (ref(self._input_name(unit, j - 1)),) if j else ()
            copy = ref(self._copy_name(unit, param))
            if self.cast:
                ops += [ProgramOp(f"FSDP2 {param}'s shard copied to the device", (), (copy,)),
                        ProgramOp(f"cast to {_label(self.param)}", before, (ref(self._input_name(unit, j)),)),
                        ProgramOp("device copy released", (copy,), ())]
            else:       # the device copy is the all-gather input
                ops.append(ProgramOp(f"FSDP2 {param}'s shard copied to the device", before,
                                     (ref(self._input_name(unit, j)),)))
        return ops

    def _copy_out(self, unit, free=()):
        """``wait_for_unshard``: the unsharded parameters copied out; ``free`` (in forward, the previous unit's
        all-gather output) dies as the call returns, its local ``prev_all_gather_state`` holding it to then."""
        ops = [ProgramOp("FSDP2 copy-out: unsharded parameters", (), (self.name("unsharded parameters", unit),))]
        return ops + ([ProgramOp("previous all-gather output released", tuple(free), ())] if free else [])

    def _slices_freed(self, unit) -> list:
        """int k: the post-forward slices freed by ``to_unsharded`` after the copy-out (``_fsdp_param.py:758``)."""
        if not self.k or not self.resharded(unit):
            return []
        return [ProgramOp("FSDP2 post-forward slices freed (to_unsharded)", (self.name("post-forward slices", unit),),
                          ())]

    def _reduce(self, unit, grads, previous, part=None):
        """post_backward of ``unit``: reshard, the previous reduce-scatter input freed, reduce-scatter (of ``part``'s
        gradients, when only some of the unit's have one)."""
        rs_in, rs_out, sg = (self.name(r, part or unit) for r in UNIT_TENSORS[3:])
        ops = [ProgramOp("FSDP2 post-backward: reshard; reduce-scatter input",
                         (self.name("unsharded parameters", unit),) + ((previous,) if previous else ()), (rs_in,)),
               ProgramOp("unsharded gradients released (but the last parameter's)", tuple(grads[:-1]), ())]
        if self.offload is not None:
            device = rs_out
            ops.append(ProgramOp("reduce-scatter output", (), (rs_out,)))
            if self.reduce != self.original:
                device = self.name("device gradients", unit)
                ops += [ProgramOp(f"cast to {_label(self.original)}", (), (device,)),
                        ProgramOp("reduce-scatter output released", (rs_out,), ())]
            ops += [ProgramOp(f"sharded gradients copied to the host ({self.host})", (), (sg,)),
                    ProgramOp("device gradients released", (device,), ())]
        elif self.reduce == self.original:
            ops.append(ProgramOp("reduce-scatter output: the sharded gradients", (), (sg,)))
        else:
            ops += [ProgramOp("reduce-scatter output", (), (rs_out,)),
                    ProgramOp(f"sharded gradients cast to {_label(self.original)}", (), (sg,))]
            if not self.held:      # HSDP: kept by the group's all-reduce state until finalize_backward
                ops.append(ProgramOp("reduce-scatter output released", (rs_out,), ()))
        ops.append(ProgramOp("last unsharded gradient released", (grads[-1],), ()))
        return ops

    def wrap_blocks(self, fwd, bwd):
        """FSDP2's hooks around one block's forward and backward programs."""
        block = "block"
        ag_out = self.name("all-gather output", block)
        previous_out = Ref(Scope.PREVIOUS, ag_out, self.name("all-gather output", self.first))
        pre = self._gather(block) + self._copy_out(block, [previous_out])
        fwd.ops[:] = pre + fwd.ops + self._post_forward(block)
        pre = []
        if self.reshard:        # re-gathered (prefetched by the unit after it), then the unit before prefetched
            pre = self._copy_out(block) + self._slices_freed(block) + [
                ProgramOp("all-gather output released", (ag_out,), ())]
            # block 0 prefetches the unit before it in forward order: torchtitan's embedding (resharded)
            edge = {self.name(r, block): self.name(r, "embedding") for r in UNIT_TENSORS[:2]} if self.titan else {}
            pre += self._gather(block, lambda n: Ref(Scope.PREVIOUS, n, edge.get(n)), bool(self.k))
        grads = [f"grad {n}" for n, _ in self.units[block]]
        # the last block's post-backward frees the reduce-scatter input before it: torchtitan's final norm's
        rs_edge = self.name("reduce-scatter input", "final norm") if self.titan else None
        post = self._reduce(block, grads, Ref(Scope.NEXT, self.name("reduce-scatter input", block), rs_edge))
        bwd.ops[:] = pre + bwd.ops + post

    def wrap_titan(self, outside):
        """torchtitan's units outside the blocks (``apply_fsdp_to_decoder``, torchtitan/distributed/fsdp.py 0.3.0).

        The embedding: gathered as its lookup starts, resharded after it (l. 194-199), its all-gather output freed
        by block 0's copy-out; in backward prefetched by block 0, copied out by its pre-backward hook on its
        output's gradient, reduce-scattered in the root's final callback (its input, the ids, needs no gradient).
        The final norm and LM head (l. 200-207): gathered before the norm, the copy-out freeing the last block's
        all-gather output, kept unsharded after forward (``reshard_after_forward=policy == "always"``), their
        all-gather output freed by the root's post-forward as the model returns the logits. The root (l. 310)
        holds no parameter.

        Their backward: PyTorch 2.13 runs a grouped unit's pre-forward on each of its modules
        (``_fsdp_state.py:542-600``, ``_fsdp_param_group.py:540-566``), so a post-backward hook is registered on the
        norm's input and on the LM head's. The logits' pre-backward finds the unit unsharded and prefetches the unit
        itself (its post-forward was recorded last): nothing; after the LM head's backward the first post-backward
        reshards and reduce-scatters the LM head's gradient (the norm's does not exist yet); the pre-backward on
        the norm's output gradient gathers the whole unit again and prefetches the last block; after the norm's
        backward the second post-backward reduce-scatters the norm's gradient."""
        emb, head = "embedding", "head"
        ops = outside[Part.FORWARD_START]
        at = _index(ops, OpRole.EMBEDDING)
        post = ([ProgramOp("FSDP2 post-forward: reshard", (self.name("unsharded parameters", emb),), ())]
                if self.resharded(emb) else [])
        ops[at:at + 1] = self._gather(emb) + self._copy_out(emb) + [ops[at]] + post
        ops = outside[Part.FORWARD_END]
        ops[:0] = self._gather(head) + self._copy_out(head, [Ref(Scope.LAST, self.name("all-gather output", "block"))])
        at = _index(ops, OpRole.LM_HEAD) + 1
        at += at < len(ops) and ops[at].role is OpRole.FINAL_NORM_INPUT_RELEASED
        ops[at:at] = [ProgramOp("FSDP2 root post-forward", (self.name("all-gather output", head),), ())]
        ops = outside[Part.BACKWARD_START]
        at = _index(ops, OpRole.LM_HEAD_BACKWARD) + 2      # after the op that frees the LM head's saved input
        regather = self._gather(head) + self._copy_out(head) + [
            ProgramOp("all-gather output released", (self.name("all-gather output", head),), ())]
        prefetch = self._gather("block", lambda n: Ref(Scope.LAST, n)) if self.reshard else []
        ops[at:at] = self._reduce(head, ["grad head.weight"], None, "LM head") + regather + prefetch
        ops += self._reduce(head, ["grad final norm.weight"], self.name("reduce-scatter input", "LM head"),
                            "final norm")
        ops = outside[Part.BACKWARD_END]
        if self.resharded(emb):
            at = _index(ops, OpRole.EMBEDDING_BACKWARD)
            ops[at:at] = self._copy_out(emb) + [ProgramOp("all-gather output released",
                                                          (self.name("all-gather output", emb),), ())]
        at = _index(ops, OpRole.LOSS_RELEASED)
        ops[at:at] = self._reduce(emb, ["grad embedding.weight"], Ref(Scope.FIRST, self.name("reduce-scatter input",
                                                                                             "block"))) + [
            ProgramOp(_CLEARED, (self.name("reduce-scatter input", emb),), (), role=OpRole.FSDP2_CLEARED)]

    def wrap_outside(self, outside):
        """The root's hooks: pre-forward before the embedding, post-forward after the LM head, pre-backward on
        the logits' gradient, post-backward in the final callback (before the loss is released)."""
        root = "root"
        u = self.name("unsharded parameters", root)
        last_out = Ref(Scope.LAST, self.name("all-gather output", "block"))
        outside[Part.FORWARD_START][:0] = self._gather(root) + self._copy_out(root)
        ops = outside[Part.FORWARD_END]
        if self.loss_in_root:       # the root's forward returns the loss: its post-forward after the loss
            at = _index(ops, OpRole.LOSS_COMPUTED) + 1
        else:
            at = _index(ops, OpRole.LM_HEAD) + 1
            at += at < len(ops) and ops[at].role is OpRole.FINAL_NORM_INPUT_RELEASED
        if self.k and self.root_reshard:      # the root's slices cloned, then the last block's output freed
            ops[at:at] = self._post_forward(root) + [ProgramOp("FSDP2 root post-forward", (last_out,), ())]
        else:
            ops[at:at] = [ProgramOp("FSDP2 root post-forward", ((u,) if self.root_reshard else ()) + (last_out,),
                                    ())]
        pre = []
        if self.root_reshard:
            pre = self._gather(root, sliced=bool(self.k)) + self._copy_out(root) + self._slices_freed(root) + [
                ProgramOp("all-gather output released", (self.name("all-gather output", root),), ())]
        if self.reshard:
            pre += self._gather("block", lambda n: Ref(Scope.LAST, n), bool(self.k))
        ops = outside[Part.BACKWARD_START]
        # the root's pre-backward hook is on its output's gradient: the logits' (before the LM head's backward)
        # or, with the loss inside the root, the loss's (as loss.backward() starts, before the loss's backward)
        at = _index(ops, OpRole.LOSS_BACKWARD) + 1 if self.loss_in_root else _index(ops, OpRole.LM_HEAD_BACKWARD)
        ops[at:at] = pre
        ops = outside[Part.BACKWARD_END]
        grads = [f"grad {n}" for n, _ in self.units[root]]
        at = _index(ops, OpRole.LOSS_RELEASED)
        ops[at:at] = self._reduce(root, grads, Ref(Scope.FIRST, self.name("reduce-scatter input", "block"))) + [
            ProgramOp(_CLEARED, (self.name("reduce-scatter input", root),), (), role=OpRole.FSDP2_CLEARED)]

    def lump(self, phase, n_layers):
        """(frees, allocs) the lumped blocks 2..L-3 add to the plain lump op, qualified ``(layer, name)``."""
        block = "block"
        ag, u, rs = (self.name(r, block) for r in ("all-gather output", "unsharded parameters",
                                                    "reduce-scatter input"))
        kept = ((None, self.slices_lump),) if self.k else ()
        if phase is Phase.FORWARD:
            allocs = ((n_layers - 3, ag),) + (() if self.reshard else ((None, self.unsharded_lump),)) + kept
            return ((1, ag),), allocs
        held = ((None, self.held_lump),) if self.held else ()
        if self.reshard:
            return ((n_layers - 2, rs), (n_layers - 3, ag)) + kept, ((2, rs), (1, ag)) + held
        return ((n_layers - 2, rs), (None, self.unsharded_lump)), ((2, rs),) + held

    def finalize(self, ops) -> list:
        """HSDP with a reduce dtype other than the shards': ``finalize_backward`` (the root's final callback,
        after the root's post-backward, ``_fsdp_state.py:420``) drops every group's all-reduce state, the
        reduce-dtype outputs held since each unit's reduce-scatter. Adds those frees to the flat op list."""
        if not self.held:
            return ops
        out = self.name("reduce-scatter output", "block")
        held = sorted({n for op in ops for n in op.allocs if n[1] in (out, self.held_lump)}, key=str)
        at = next(i for i, op in enumerate(ops) if op.role is OpRole.FSDP2_CLEARED)
        ops[at] = replace(ops[at], frees=ops[at].frees + tuple(held)
                          + ((None, self.name("reduce-scatter output", "root")),))
        return ops

    def optimizer_params(self, layers) -> list:
        """AdamW's parameters on this rank: each parameter's rank-0 shard, in ``model.parameters()`` order."""
        c = self.c
        out = []
        for x in param_tensors(c, layers):
            if x.lump:
                out.append(Param(x.name, (L - 2) * self.shards["block"], lump=True))
            else:
                out.append(Param(x.name, shard(x.key, x.elements, c)))
        return out

    def static(self) -> list:
        """(name, bytes, kind, why, device) of what FSDP2 keeps the whole step, besides the step counters and ids;
        under CPUOffloadPolicy on the host (the shards pinned with pin_memory, ``_fsdp_param.py:312-315``; the
        moments are zeros_like of them: pageable)."""
        o = _label(self.original)
        on = self.offload is not None
        shards = f"FSDP2 sharded parameters ({o}, {self.host})" if on else f"FSDP2 sharded parameters ({o})"
        moments = f" ({o}, host memory)" if on else f" ({o})"
        return [(shards, self.o * self.total_shards, Kind.PARAM,
                 "every parameter's padded shard (_fsdp_param.py:307), the optimizer's parameters", self.device),
                ("AdamW exp_avg on the shards" + moments, self.o * self.total_shards, Kind.OPTIMIZER,
                 "zeros_like of rank 0's shards (torch/optim/adamw.py)", self.device),
                ("AdamW exp_avg_sq on the shards" + moments, self.o * self.total_shards, Kind.OPTIMIZER,
                 "zeros_like of rank 0's shards (torch/optim/adamw.py)", self.device)]


def _index(ops, role: OpRole) -> int:
    """The index of the op of ``role`` in a program FSDP2 hooks into."""
    for i, op in enumerate(ops):
        if op.role is role:
            return i
    raise AssertionError(f"no op {role.value!r} in the program FSDP2 hooks into")


def wrap(tensors, outside, fwd, bwd, c, s) -> FSDP2:
    """Add FSDP2's tensors and hooks to a step's programs; returns the :class:`FSDP2` (for the lump, the
    optimizer's shards and the static rows)."""
    f = FSDP2(c, s)
    f.define(tensors)
    f.wrap_blocks(fwd, bwd)
    (f.wrap_titan if f.titan else f.wrap_outside)(outside)
    return f
