"""torchtune's activation offloading (``enable_activation_offloading: True``): which saved tensors its
``OffloadActivations`` moves to the host, and which offloaded ones its second stream keeps on the device.

Read from torchtune 0.6.1:

* ``recipes/full_finetune_single_device.py`` l. 166-174: offloading is refused unless
  ``enable_activation_checkpointing`` is on too (so every ``TransformerSelfAttentionLayer`` is checkpointed:
  ``recompute="full"``); l. 636-637: only ``self._model(**batch)`` runs under the context (the loss does not);
  ``training/_activation_offloading.py`` l. 373-416 (``get_act_offloading_ctx_manager``): the output head
  (``model.output``) runs under ``NoOpManager``, so what it saves stays where it is.
* ``OffloadActivations.pack_tensor`` (l. 133-200): a saved tensor goes to a host copy when it has at least
  ``min_offload_size`` bytes (1,024, l. 71; ``element_size() * nelement()``, l. 126-131) and is neither an
  ``nn.Parameter`` nor an ``nn.Buffer`` (l. 150-153); else it stays on the device as it is. Every pack counts an
  id (l. 121-124), offloaded or not. With ``use_streams`` (the default) each offloaded tensor is kept alive on the
  device in ``fwd_stash`` (l. 189-193) until a later offload with an id at least 5 (``max_fwd_stash_size``)
  higher drops it (l. 154-162); what is left at the end of the forward stays until the first backward node
  that unpacks an offloaded tensor has run (its node hook, l. 328-332).

So under the recipe a forward packs, in order: the token ids (the embedding saves its indices, int64), each
layer's input (the checkpoint saves it: nothing else of the layer is packed), and the final RMSNorm's saved
tensors (torchtune's ``RMSNorm``: ``F.rms_norm(x.float(), weight)``, ATen's composite: the FP32 input for
``pow``, rstd for ``rsqrt``, both again for ``x * rstd``, the weight, ``x * rstd`` for the weight's product).
The final norm's packs come after the last layer's input, so by the end of the forward the stash has dropped
every layer input (freed on the device: L * B*S*d activation bytes fewer than the checkpointed forward keeps) and
holds the final norm's FP32 input, rstd and ``x * rstd`` until its backward.

Checked against torchtune's own ``OffloadActivations`` under ``FakeTensorMode``, its CUDA streams stubbed
(:func:`memledger.pytorch.torchtune_litgpt.torchtune_offload_packs`: every pack's decision and the stash;
:func:`~memledger.pytorch.torchtune_litgpt.torchtune_offload_forward`: MemTracker's device total after the forward,
without and with the context; tests/pytorch/test_torchtune_offload.py). Its backward cannot run on the CPU (the
unpack copies back with ``.to("cuda")``, l. 275): the step's timeline under it (the copies back, each kept in
``bwd_tensor_stash`` until the next unpacking node has run, l. 281, 335-339) is not modelled yet, and
:func:`memledger.step.implementations.check_step` refuses it, naming this.
"""
__all__ = ["HELD", "MAX_FWD_STASH", "MIN_OFFLOAD_BYTES", "device_kept", "embedding_backward_extra",
           "freed_after_forward", "host_bytes",
           "packs", "stash_after_forward"]

#: ``OffloadActivations``' defaults (``training/_activation_offloading.py`` l. 70-71), as the recipes build it.
MIN_OFFLOAD_BYTES, MAX_FWD_STASH = 1024, 5


#: Storages something outside the forward keeps on the device anyway: the batch's token ids, the parameters.
HELD = ("token ids", "final RMSNorm weight")


def _saved(B: int, S: int, d: int, L: int, act_bytes: int) -> list:
    """(name, storage, bytes, is a parameter) of every tensor the forward packs, in order; a storage packed twice
    (the final norm's FP32 input and rstd, each saved by two nodes) is named the same."""
    bsd, bs = B * S * d, B * S
    x32, rstd = "final RMSNorm FP32 input", "final RMSNorm rstd"
    return ([("token ids (the embedding's indices, int64)", "token ids", 8 * bs, False)]
            + [(f"layer {i} input (the checkpoint's)", f"layer {i} input", act_bytes * bsd, False) for i in range(L)]
            + [(f"{x32} (pow)", x32, 4 * bsd, False), (f"{rstd} (rsqrt)", rstd, 4 * bs, False),
               (f"{rstd} (x * rstd)", rstd, 4 * bs, False), (f"{x32} (x * rstd)", x32, 4 * bsd, False),
               ("final RMSNorm weight (a parameter)", "final RMSNorm weight", act_bytes * d, True),
               ("final RMSNorm x * rstd (the weight's product)", "final RMSNorm x * rstd", 4 * bsd, False)])


def packs(B: int, S: int, d: int, L: int, act_bytes: int = 2) -> list:
    """(name, bytes, offloaded) of every tensor torchtune's forward packs, in order (the module's docstring)."""
    return [(name, size, not parameter and size >= MIN_OFFLOAD_BYTES)
            for name, _, size, parameter in _saved(B, S, d, L, act_bytes)]


def host_bytes(B: int, S: int, d: int, L: int, act_bytes: int = 2) -> int:
    """Bytes of the host copies one forward makes: the offloaded packs' sizes summed (a tensor packed twice is
    copied twice)."""
    return sum(size for _, size, offloaded in packs(B, S, d, L, act_bytes) if offloaded)


def device_kept(B: int, S: int, d: int, L: int, act_bytes: int = 2) -> list:
    """(name, bytes) of the packs left on the device (under ``min_offload_size``, or a parameter)."""
    return [(name, size) for name, size, offloaded in packs(B, S, d, L, act_bytes) if not offloaded]


def _stash(B, S, d, L, act_bytes) -> dict:
    """{id: (name, storage, bytes)} of ``fwd_stash`` when the forward ends: an offload with id t drops the stashed
    ids up to t - 5 (ids count every pack, from 1)."""
    stash = {}
    for tensor_id, (name, storage, size, parameter) in enumerate(_saved(B, S, d, L, act_bytes), start=1):
        if not parameter and size >= MIN_OFFLOAD_BYTES:
            stash = {k: v for k, v in stash.items() if k > tensor_id - MAX_FWD_STASH}
            stash[tensor_id] = (name, storage, size)
    return stash


def stash_after_forward(B: int, S: int, d: int, L: int, act_bytes: int = 2) -> list:
    """(name, bytes) of the offloaded tensors ``fwd_stash`` still holds on the device when the forward ends."""
    return [(name, size) for name, _, size in _stash(B, S, d, L, act_bytes).values()]


def freed_after_forward(B: int, S: int, d: int, L: int, act_bytes: int = 2) -> int:
    """Device bytes offloading frees by the end of the model's forward, against the same checkpointed forward: the
    offloaded storages neither stashed nor held elsewhere (:data:`HELD`). Under the recipe these are the L layers'
    inputs, L * B*S*d activation bytes: the final norm's 6 packs come after the last of them, so the stash has
    dropped every one, and keeps the final norm's own until its backward."""
    stashed = {storage for _, storage, _ in _stash(B, S, d, L, act_bytes).values()}
    freed = {storage: size for _, storage, size, parameter in _saved(B, S, d, L, act_bytes)
             if not parameter and size >= MIN_OFFLOAD_BYTES and storage not in stashed and storage not in HELD}
    return sum(freed.values())


def embedding_backward_extra(B: int, S: int, d: int, L: int, act_bytes: int = 2) -> int:
    """Device bytes the offloaded step holds at the token embedding's backward beyond the checkpointed step: the
    token ids' copy brought back for it (unpacked on that node, l. 275; the checkpointed step reads the batch's own)
    and layer 0's input copy, which ``bwd_tensor_stash`` keeps until the next unpacking node, the embedding's, has
    run (l. 281, 335-339), where the checkpointed step freed layer 0's input with its backward."""
    saved = _saved(B, S, d, L, act_bytes)
    return saved[0][2] + saved[1][2]
