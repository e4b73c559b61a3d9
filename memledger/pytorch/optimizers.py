"""The reference loops' optimizers: which ``torch.optim`` class each recipe runs, in which implementation,
and the optimizer stepped in backward (torchtune's ``optimizer_in_bwd``).

* :data:`LOOP_OPTIMIZERS`: recipe -> (the model's dtype, FP32 masters held by the optimizer, optimizer).
  ``adamw``: ``torch.optim.AdamW()``; ``sgd``: ``torch.optim.SGD(lr=1e-3)``, ``sgd-momentum`` with
  ``momentum=0.9``; ``adafactor``: ``torch.optim.Adafactor()`` (PyTorch 2.13, ``torch/optim/_adafactor.py``).
* Implementations: for-loop (``foreach=False``), ``foreach=True`` and ``fused=True`` (AdamW and SGD;
  Adafactor has no fused kernel, and its ``foreach=None`` default is the for-loop on every device).
* :func:`in_backward_hooks`: one optimizer per parameter, stepped in the parameter's
  ``register_post_accumulate_grad_hook`` and its gradient then set to None: pytorch/torchtune (bd2a0fc7c)
  ``torchtune/training/memory.py`` ``register_optim_in_bwd_hooks`` (lines 222-245: ``optim_dict[param].step();
  optim_dict[param].zero_grad()``, the hook registered on every parameter that requires a gradient), its
  ``optim_dict`` one optimizer per parameter (``p: config.instantiate(cfg_optimizer, [p])``, the docstring of
  ``OptimizerInBackwardWrapper``, lines 72 and 82; ``create_optim_in_bwd_wrapper``, line 200, only wraps it
  for checkpoints).
* :class:`ScalarsAnswered`: Adafactor reads scalars off tensors (``step_t.item()``, ``param.norm(2).item()``),
  which fake tensors cannot give; this dispatch mode answers ``aten._local_scalar_dense`` with 1.0 so that
  the step runs under ``FakeTensorMode``. The scalars decide values, never what is allocated.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["AMP_LOOPS", "IMPLEMENTATIONS", "LOOP_OPTIMIZERS", "ScalarsAnswered", "Scaler", "in_backward_hooks",
           "make_optimizer"]

LOOP_OPTIMIZERS = {
    "fp32-adamw": ("fp32", False, "adamw"),
    "bf16-pure-adamw": ("bf16", False, "adamw"),
    "bf16-adamw": ("bf16", True, "adamw"),
    "fp32-sgd": ("fp32", False, "sgd"),
    "fp32-sgd-momentum": ("fp32", False, "sgd-momentum"),
    "bf16-sgd": ("bf16", True, "sgd"),
    "bf16-sgd-momentum": ("bf16", True, "sgd-momentum"),
    "bf16-pure-sgd-momentum": ("bf16", False, "sgd-momentum"),
    "adafactor": ("fp32", False, "adafactor"),
    "bf16-adafactor": ("bf16", False, "adafactor"),
    "fp16-amp-adamw": ("fp32", False, "adamw"),          # under FP16 autocast and a GradScaler (AMP_LOOPS)
}
#: The loops that run forward under ``torch.autocast(dtype=torch.float16)`` and step through ``torch.amp.GradScaler``.
AMP_LOOPS = ("fp16-amp-adamw",)
IMPLEMENTATIONS = ("for-loop", "foreach", "fused")


def make_optimizer(kind: str, params, implementation: str = "for-loop"):
    """``torch.optim`` optimizer ``kind`` over ``params`` in ``implementation`` (:data:`IMPLEMENTATIONS`)."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"implementation must be one of {', '.join(IMPLEMENTATIONS)}, got {implementation!r}")
    impl = dict(foreach=implementation == "foreach", fused=implementation == "fused")
    if kind == "adamw":
        return torch.optim.AdamW(params, **impl)
    if kind in ("sgd", "sgd-momentum"):
        return torch.optim.SGD(params, lr=1e-3, momentum=0.9 if kind == "sgd-momentum" else 0.0, **impl)
    if kind == "adafactor":
        if implementation == "fused":
            raise ValueError("torch.optim.Adafactor has no fused implementation")
        return torch.optim.Adafactor(params, foreach=impl["foreach"])
    raise ValueError(f"unknown optimizer {kind!r}")


def in_backward_hooks(params, optimizers: dict) -> list:
    """Register torchtune's hook on each parameter: its optimizer steps, then its gradient is set to None."""
    def optim_step(param):
        optimizers[param].step()
        optimizers[param].zero_grad(set_to_none=True)
    return [p.register_post_accumulate_grad_hook(optim_step) for p in params]


class ScalarsAnswered(TorchDispatchMode):
    """Answers ``Tensor.item()`` (``aten._local_scalar_dense``) with 1.0; every other op runs as it is."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            return 1.0
        return func(*args, **(kwargs or {}))


class Scaler(torch.amp.GradScaler):
    """``torch.amp.GradScaler`` whose step reads no inf: ``_maybe_opt_step`` sums ``found_inf.item()`` over the
    devices (``torch/amp/grad_scaler.py``), a host read that fake tensors cannot answer and that allocates
    nothing; the optimizer then steps, as it does whenever no gradient overflowed."""

    def _maybe_opt_step(self, optimizer, optimizer_state, *args, **kwargs):
        return optimizer.step(*args, **kwargs)

