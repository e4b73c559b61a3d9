"""Recipes people fine-tune and train with beyond the article's: 8-bit Adam, Adafactor, SGD, FP8.

Each is a tuple of :class:`memledger.states.recipe.Component` with dtype, ZeRO role
and source, registered in :data:`memledger.states.recipes.FINETUNE_RECIPES` (and ``ALL_RECIPES``).

* bitsandbytes 8-bit Adam (Dettmers et al. 2022, "8-bit Optimizers via
  Block-wise Quantization"): m and v as uint8 codes with one fp32 absmax per
  block. bitsandbytes-foundation/bitsandbytes ``bitsandbytes/optim/optimizer.py``
  lines 518-529 (95f9af30): blocks of 256 since aa57bd89 (2024-09-20; 2048 before,
  as in the paper); tensors under ``min_8bit_size`` = 4096 elements keep fp32
  states (lines 502-503, 414). Per parameter: 2 x (1 + 4/256) = 2.03125 bytes.
* bitsandbytes 32-bit AdamW on BF16 parameters (``paged_adamw_32bit``, QLoRA's
  default optimizer): FP32 m and v, no master copy; "paged" puts the states in
  CUDA unified memory, which the ledger still books on the GPU.
* Adafactor (Shazeer & Stern 2018; transformers ``optimization.py`` class
  ``Adafactor``): no first moment by default (beta1 = None), a matrix's second
  moment factored into a row and a column vector (fp32), vectors kept whole.
* SGD: no state without momentum, one buffer with.
* FP16 AMP (``fp16-amp-adamw``): FP32 weights, gradients and Adam moments, the forward under
  ``torch.autocast(dtype=torch.float16)``, the loss scaled by ``torch.amp.GradScaler``; autocast's FP16
  weight copies live from each linear's forward to its backward (:mod:`memledger.step.amp`), outside the
  recipe's per-parameter components.
* FP8 training, as the Ultra-Scale Playbook's table states each approach
  (index.html lines 2573-2648): which tensors are FP8, which are kept wider;
  DeepSeek-V3 keeps one fp32 scale per 128 x 128 weight block (Playbook
  line 2567; DeepSeek-V3 report Sec. 3.3).
"""
from ..core.vocabulary import State
from .recipe import Component, Recipe

__all__ = ["EXTRA_RECIPES"]

_BNB = "bitsandbytes optim/optimizer.py lines 518-529 (95f9af30): uint8 codes + fp32 absmax per 256"
_BF16_W = Component("BF16 parameters", "bf16", "param", "the working weights forward and backward read")
_BF16_G = Component("BF16 gradients", "bf16", "grad", "dLoss/dtheta, one per parameter, written by backward")
_FP32_W = Component("FP32 parameters", "fp32", "param", "the weights are their own master copy")
_FP32_G = Component("FP32 gradients", "fp32", "grad", "dLoss/dtheta in FP32")
_MASTER = Component("FP32 master weights", "fp32", "optimizer",
                    "BF16 has 7 fraction bits: small updates round away without an FP32 copy", state=State.MASTER)
_M8 = Component("Adam m (8-bit, block-wise)", "int8", "optimizer", "signed dynamic-map codes; " + _BNB,
                constants=((256, "fp32"),), fp32_below=4096)
_V8 = Component("Adam v (8-bit, block-wise)", "int8", "optimizer", "unsigned dynamic-map codes; " + _BNB,
                constants=((256, "fp32"),), fp32_below=4096, state=State.SECOND_MOMENT)
_BNB32 = "32-bit state of a BF16 parameter (bitsandbytes optim_bits=32)"
_M32 = Component("Adam first moment m", "fp32", "optimizer", _BNB32)
_V32 = Component("Adam second moment v", "fp32", "optimizer", _BNB32, state=State.SECOND_MOMENT)
_FACTORED_V = Component("Adafactor second moment (rows + columns)", "fp32", "optimizer",
                        "a matrix keeps the row and column means of g^2, a vector all of g^2", factored=True,
                        state=State.SECOND_MOMENT)
_PLAYBOOK = "Ultra-Scale Playbook, FP8 table (index.html lines 2573-2648)"


def _fp8(name, title, parts, source=_PLAYBOOK):
    return Recipe(name, title, tuple(parts), source, fp8_gemms=True)


EXTRA_RECIPES = [
    Recipe("bf16-adam8bit-bnb", "BF16 + FP32 master + bitsandbytes 8-bit Adam (10.03 B/param)",
           (_BF16_W, _BF16_G, _MASTER, _M8, _V8),
           "Dettmers et al. 2022; " + _BNB),
    Recipe("bf16-adam8bit-bnb-nomaster", "BF16 weights updated by bitsandbytes 8-bit Adam, no FP32 master "
           "(6.03 B/param)", (_BF16_W, _BF16_G, _M8, _V8),
           "bitsandbytes 8-bit Adam on BF16 parameters (optimizer.py update_step casts in-kernel)"),
    Recipe("bf16-adamw32-bnb", "BF16 weights updated by bitsandbytes' 32-bit AdamW (paged_adamw_32bit), no FP32 "
           "master (12 B/param)", (_BF16_W, _BF16_G, _M32, _V32),
           "bitsandbytes optim/optimizer.py init_state lines 495-510 (95f9af30): optim_bits 32 keeps state1 and state2 "
           "in float32 whatever the parameter's dtype; PagedAdamW32bit (optim/adamw.py) is the same in paged memory; "
           "QLoRA's qlora.py line 198 (artidoro/qlora 7f4e95a) makes it the default optim"),
    Recipe("adafactor", "FP32 weights + Adafactor, factored second moment, no first moment",
           (_FP32_W, _FP32_G, _FACTORED_V),
           "Shazeer & Stern 2018; transformers optimization.py Adafactor (beta1=None, factored for ndim >= 2)"),
    Recipe("bf16-adafactor", "BF16 weights + Adafactor (factored second moment, no master copy)",
           (_BF16_W, _BF16_G, _FACTORED_V),
           "transformers Adafactor on BF16 parameters (FP32 copies only inside step())"),
    Recipe("bf16-sgd", "BF16 mixed precision + plain SGD (8 B/param)", (_BF16_W, _BF16_G, _MASTER),
           "SGD without momentum keeps no state; the FP32 master copy remains"),
    Recipe("bf16-pure-sgd-momentum", "pure BF16 + SGD with momentum, no master copy (6 B/param)",
           (_BF16_W, _BF16_G, Component("SGD momentum (BF16)", "bf16", "optimizer",
                                        "torch.optim.SGD's momentum_buffer: grad.clone(), the parameters' dtype")),
           "torch/optim/sgd.py _single_tensor_sgd: buf = grad.detach().clone()"),
    Recipe("fp32-sgd", "pure FP32 + plain SGD (8 B/param)", (_FP32_W, _FP32_G), "torch.optim.SGD, momentum=0"),
    Recipe("fp32-sgd-momentum", "pure FP32 + SGD with momentum (12 B/param)",
           (_FP32_W, _FP32_G, Component("SGD momentum", "fp32", "optimizer", "running gradient average")),
           "torch.optim.SGD momentum buffer; HF model memory anatomy (4 bytes of state)"),
    Recipe("fp16-amp-adamw", "FP16 autocast (AMP) on FP32 weights + AdamW with a GradScaler (16 B/param + autocast's "
           "FP16 weight copies, 2 B per linear weight while saved)",
           (_FP32_W, _FP32_G, Component("Adam first moment m", "fp32", "optimizer", "AdamW on the FP32 weights"),
            Component("Adam second moment v", "fp32", "optimizer", "AdamW on the FP32 weights", state=State.SECOND_MOMENT)),
           "PyTorch AMP: torch.autocast(dtype=torch.float16) + torch.amp.GradScaler (torch/amp/grad_scaler.py); "
           "the FP16 weight copies: aten/src/ATen/autocast_mode.cpp cached_cast (008ec6b1, l. 120-146), cleared at "
           "the region's exit (clear_cache, l. 87-90), kept by autograd until each matmul's backward "
           "(memledger.step.amp)"),
    _fp8("fp8-transformer-engine", "FP8 GEMMs (Transformer Engine): FP32 weights, grads, Adam (16 B/param)",
         (_FP32_W, _FP32_G, Component("Adam m", "fp32", "optimizer", "FP32"),
          Component("Adam v", "fp32", "optimizer", "FP32", state=State.SECOND_MOMENT))),
    _fp8("fp8-deepseek-v3", "FP8 as DeepSeek-V3: FP8 weights (128x128-block scales), BF16 grads and moments "
         "(15 B/param + scales)",
         (Component("FP32 master weights", "fp32", "optimizer", "updates applied in FP32", state=State.MASTER),
          Component("FP32 accumulated gradients", "fp32", "grad", "gradients accumulated in FP32"),
          Component("FP8 weights", "fp8", "param", "one FP32 scale per 128 x 128 block",
                    constants=((128 * 128, "fp32"),)),
          Component("BF16 gradients", "bf16", "grad", "as the table states"),
          Component("Adam m (BF16)", "bf16", "optimizer", "BF16 optimizer states"),
          Component("Adam v (BF16)", "bf16", "optimizer", "BF16 optimizer states", state=State.SECOND_MOMENT)),
         _PLAYBOOK + "; DeepSeek-V3 technical report Sec. 3.3"),
    _fp8("fp8-lm-o3", "FP8-LM level O3: FP16 master, FP8 weights/grads, FP8 + FP16 Adam (9 B/param)",
         (Component("FP16 master weights", "fp16", "optimizer", "FP8-LM O3", state=State.MASTER),
          Component("FP16 accumulated gradients", "fp16", "grad", "FP8-LM O3"),
          Component("FP8 weights", "fp8", "param", "FP8-LM O3"),
          Component("FP8 gradients", "fp8", "grad", "FP8-LM O3"),
          Component("Adam m (FP8)", "fp8", "optimizer", "FP8-LM O3"),
          Component("Adam v (FP16)", "fp16", "optimizer", "FP8-LM O3", state=State.SECOND_MOMENT))),
    _fp8("fp8-nanotron", "Nanotron FP8: BF16 master, FP32 accumulation, FP8 weights/grads/Adam (10 B/param)",
         (Component("BF16 master weights", "bf16", "optimizer", "Nanotron FP8", state=State.MASTER),
          Component("FP32 accumulated gradients", "fp32", "grad", "Nanotron FP8"),
          Component("FP8 weights", "fp8", "param", "Nanotron FP8"),
          Component("FP8 gradients", "fp8", "grad", "Nanotron FP8"),
          Component("Adam m (FP8)", "fp8", "optimizer", "Nanotron FP8"),
          Component("Adam v (FP8)", "fp8", "optimizer", "Nanotron FP8", state=State.SECOND_MOMENT))),
]
