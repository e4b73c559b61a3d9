"""Activation offloading in the reference decoder: every tensor a block saves for backward goes to a host copy.

PyTorch's own ``torch.autograd.graph.save_on_cpu(pin_memory=True)`` (torch/autograd/graph.py, class
``save_on_cpu``, lines 400-420 in PyTorch 2.13), which FSDP's ``offload_wrapper`` puts around a module
(torch/distributed/algorithms/_checkpoint/checkpoint_wrapper.py: ``OffloadWrapper.forward``, lines 106-109):
each time autograd saves a tensor (each ``SavedVariable``: a tensor two nodes save is copied twice; a
parameter's view, such as ``nn.Linear``'s transposed weight, too), the pack hook allocates a pinned host
tensor of the tensor's size (``torch.empty(size, pin_memory=True)``: a view is copied at its own size) and
copies into it; the device tensor then lives only as long as Python references hold it. In backward, each
node's unpack hook copies its saved tensors back (``tensor.to(device, non_blocking=True)``): device
copies that live while that node's backward runs. The host copies go when the node has run.

torchtune's ``OffloadActivations`` (torchtune/training/_activation_offloading.py at bd2a0fc, ``pack_tensor``,
lines 137-211) differs, and is not what this module runs: it keeps on the device tensors under
``min_offload_size`` (1,024 bytes, line 71), tensors not on the accelerator, and ``nn.Parameter`` and
``nn.Buffer`` instances (lines 154-164: a norm's weight, which autograd hands to the hook as the parameter;
``nn.Linear``'s transposed weight is a plain view and is offloaded, measured with the reference decoder);
it copies into ``torch.empty_like(..., pin_memory=True, device="cpu")`` (lines 182-183); its recipes leave
the output head unoffloaded (``get_act_offloading_ctx_manager``, lines 409-434); and with ``use_streams``
(the default) it copies on a second stream, keeping up to ``max_fwd_stash_size`` (5) offloaded activations
alive on the device until their copy has finished (lines 168-204) and each tensor brought back until the
next node has run (line 297 and the node hook after it). Its rule at torchtune 0.6.1, proved against it under
``FakeTensorMode``: :mod:`memledger.step.torchtune_offload`.

Where the model itself runs on the CPU (the fake-tensor measurement of :mod:`memledger.pytorch.measure`:
the CPU backend stands for the accelerator), the host copies are made on the fake ``meta`` device instead,
so that ``MemTracker``, which counts per device, keeps them apart from the model's device.
"""
import torch

__all__ = ["OffloadSaved"]


class OffloadSaved(torch.autograd.graph.saved_tensors_hooks):
    """``save_on_cpu(pin_memory=True)``'s pack and unpack, with the host the ``meta`` device where the
    saved tensor itself is on the CPU (a stand-in for pinned host memory in a measurement)."""

    def __init__(self):
        def pack(tensor):
            on_cpu = tensor.device.type == "cpu"
            pinnable = not on_cpu and torch.cuda.is_available() and not tensor.is_sparse
            host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout,
                               device="meta" if on_cpu else "cpu", pin_memory=pinnable)
            host.copy_(tensor, non_blocking=pinnable)
            return tensor.device, host

        def unpack(packed):
            device, host = packed
            return host.to(device, non_blocking=True)
        super().__init__(pack, unpack)
