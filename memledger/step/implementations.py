"""Whose model code runs the step: memledger's reference decoder, or a library's own (issue 28). Free of SymPy.

``implementation``: ``"reference"`` (the default: :mod:`memledger.pytorch.reference`, the decoder every number of
the book is proved against), ``"hf"`` (Hugging Face transformers' ``LlamaForCausalLM``), ``"torchtune"``
(torchtune's ``llama2``/``llama3`` builders), ``"litgpt"`` (LitGPT's ``GPT``) or ``"torchtitan"`` (torchtitan's
``Llama3Model``). Each library saves other tensors
for backward than the reference decoder does (its norms, its rotary code, its attention), and its code, not the
backend, decides which kernels run: their RMSNorms normalize in FP32 ops, so the cuda backend books no fused
RMSNorm under them (``Shape.rmsnorm``):

* transformers: ``LlamaRMSNorm.forward`` (``transformers/models/llama/modeling_llama.py`` l. 62-67) is written
  out in elementwise ops (``.to(torch.float32)``, ``pow``, ``mean``, ``rsqrt``, products): no norm kernel is
  called at all (:mod:`memledger.step.hf`, rmsnorm "hf").
* LitGPT: ``RMSNorm.forward`` (``litgpt/model.py`` l. 1315-1322) likewise, with ``weight.float()``
  (:mod:`memledger.step.litgpt`, rmsnorm "litgpt").
* torchtune: ``RMSNorm.forward`` (``torchtune/modules/rms_norm.py`` l. 38-43) calls ``F.rms_norm(x.float(),
  weight=self.scale)``: an FP32 input with the BF16 weight; its layer, measured on the CPU, equals the reference
  block with PyTorch's composite ``nn.RMSNorm`` (rmsnorm "composite"). That CUDA's ``rms_norm`` also takes the
  composite path for an FP32 input and a BF16 weight is issue 28's reading of ATen, not checked here against ATen's
  ``layer_norm.cpp``.

The attention kernel under the cuda backend stays the reference's (SDPA's flash kernel: q, k, v, output, FP32
log-sum-exp; the output laid out as q), as measured on the CPU's flash kernel; transformers' eager core is its own
code on every device (``softmax(dtype=torch.float32)`` converts a BF16 input first: ATen's fast path without the
copy is for CUDA Half only).

``attn_implementation``: transformers' ``attn_implementation`` (``"sdpa"``, its default, ``"eager"`` or
``"flash_attention_2"``); the other implementations run SDPA only, so it is ``"sdpa"`` there.

``recompute="full"``: each library's own per-layer checkpointing (:data:`FULL_RECOMPUTE`): transformers'
``gradient_checkpointing_enable()`` (:mod:`memledger.step.hf`), proved at every landmark, phase peak and the peak;
torchtune's ``set_activation_checkpointing`` and LitGPT's ``FSDPStrategy(activation_checkpointing_policy={Block})``
(PyTorch's non-reentrant ``checkpoint_wrapper`` on each layer, :func:`memledger.pytorch.torchtune_litgpt.checkpointing`),
proved per layer (what a layer adds between before and after the forward pass: its input); their steps' transients
are as proved as their steps without recomputation. ``selective`` stays refused under every library (transformers
offers none; torchtune's and torchtitan's op-level policies are not modelled).

Outside the layers, torchtune's step books its shared RoPE buffers, its separate q/k/v projections' AdamW step
counters and what ``full_finetune_single_device``'s loop holds (:mod:`memledger.step.torchtune`); LitGPT's books the
head and ``chunked_cross_entropy`` as ``finetune/full.py`` runs them, its cos/sin buffers, the logits and loss kept
into the next iteration and ``GPT``'s parameter order (:mod:`memledger.step.litgpt_loss`); both are checked against the
library's own step (tests/pytorch/test_torchtune_litgpt.py).

torchtitan 0.3.0 (``"torchtitan"``): its ``Llama3Model`` saves what the reference block saves under either backend's
own norm (its ``nn.RMSNorm`` gets the BF16 input and weight as they are); built with SDPA in every layer, as its
graph_trainer tests build it (``experiments/graph_trainer/common_utils.py`` l. 58-71): its language models otherwise
run FlexAttention or varlen (``models/common/config_utils.py`` l. 71-103), whose kernels need CUDA or
``torch.compile``, not modelled; with one document a row (no positions: packed documents, which gather its RoPE
cache, are refused). Its step (:mod:`memledger.step.torchtitan`): every layer's RoPE cache, the gradients kept
between steps (``zero_grad(set_to_none=False)``), its loss and token count, ``clip_grad_norm_``, its parameter order;
recipe bf16-pure-adamw only (``training.dtype = "bfloat16"``); checked against its own model and ``train_step`` under
``FakeTensorMode`` (tests/pytorch/test_torchtitan.py). ``recompute="full"``: its ``FullAC``
(``distributed/activation_checkpoint.py`` l. 166-182: ``checkpoint_wrapper(preserve_rng_state=True,
early_stop=False)`` on every block), proved at every landmark, phase peak and the peak. Its ``SelectiveAC`` is an op
policy (compute-intensive and collective ops saved, every second mm recomputed, l. 185-287; 0.3.0 has no per-layer
"every k-th block" option); measured on the CPU it saves the block's input and the outputs of wqkv, w1 and w2, but the
CPU's flash kernel is not in its save list where CUDA's is (``torch/_functorch/partitioners.py`` l. 2971-2980), so
what it keeps on a GPU is not measurable here: refused. Its tensor parallelism: one layer on one rank only
(:func:`memledger.step.torchtitan.tp_layer_bytes`, docs/fsdp2.md section 16); its step under TP is refused.

A GPT-style family: pythia (GPT-NeoX: LayerNorm, GeLU, biases, a parallel residual, rotary on a quarter of each
head, an untied head) under LitGPT's and transformers' code (sdpa or eager), each block as
:mod:`memledger.step.gpt_style` runs it, checked against each library's own model and step
(tests/pytorch/test_gpt_style.py); every other GPT-style block under a library's code is refused (:func:`gpt_lacks`),
and so is recomputation with pythia.

LoRA under torchtune's code (``LoraLedger(..., implementation="torchtune")``, ``--lora-rank ... --implementation
torchtune``): ``lora_llama2`` as ``lora_finetune_single_device`` runs it, its adapters in the model's dtype
(``bf16-pure-adamw``), with or without its activation checkpointing (:mod:`memledger.step.lora`: ``first_block``, the
attention's locals; :func:`memledger.step.torchtune.statics` with one RoPE module a layer), checked against its own step
(tests/pytorch/test_torchtune_lora.py); its QLoRA too (torchao's ``NF4Tensor``: q, k, v three projections, each
weight dequantized in forward and backward, :func:`memledger.step.lora._torchao_dequantized`).

What is not modelled yet under a library's code is refused in one line (:func:`check_step`), never computed with
the reference decoder's block in its place.
"""
from ..core.choices import check_choice

__all__ = ["ATTN_IMPLEMENTATIONS", "FAMILIES", "IMPLEMENTATIONS", "LIBRARY", "NO_SELECTIVE", "TORCHTUNE_OFFLOAD",
           "check_fields", "check_library_options", "check_step", "check_torchtune_chunks", "gpt_lacks",
           "lora_not_modelled", "not_modelled"]

#: The implementations the step knows by name, the reference decoder first (the default).
IMPLEMENTATIONS = ("reference", "hf", "torchtune", "litgpt", "torchtitan")
#: transformers' attention implementations (``LlamaConfig(attn_implementation=...)``).
ATTN_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2")
#: Each library's name, as messages print it.
LIBRARY = {"reference": "memledger's reference decoder", "hf": "transformers", "torchtune": "torchtune",
           "litgpt": "LitGPT", "torchtitan": "torchtitan"}
#: The model families (Hugging Face ``model_type``) each library ships a model of; transformers ships every family
#: of ``memledger presets``. torchtune 0.6.1: ``torchtune/models/`` (llama2, llama3*, code_llama2, mistral, gemma,
#: gemma2, qwen2, qwen2_5, phi3, phi4; its ``t5`` is Flux's encoder); LitGPT 0.5.13: ``litgpt/config.py``'s
#: configs (Llama, CodeLlama, Mistral, Mixtral, Qwen2.5, Gemma, pythia and StableLM (GPT-NeoX), Phi, Falcon).
FAMILIES = {"torchtune": ("llama", "mistral", "gemma", "qwen2", "phi3"),
            "litgpt": ("llama", "mistral", "mixtral", "qwen2", "gemma", "gpt_neox", "phi", "falcon"),
            "torchtitan": ("llama",)}


def check_fields(implementation: str, attn_implementation: str, arch=None) -> None:
    """``ValueError`` naming the field unless ``implementation`` and ``attn_implementation`` are known and go
    together, and the library ships ``arch``'s family (its ``model_type``; a preset or shape without one: a
    LLaMA-style decoder for torchtune)."""
    check_choice("implementation", implementation, IMPLEMENTATIONS)
    check_choice("attn_implementation", attn_implementation, ATTN_IMPLEMENTATIONS)
    if attn_implementation != "sdpa" and implementation != "hf":
        raise ValueError(f"attn_implementation {attn_implementation!r} is transformers' option (implementation hf); "
                         f"{LIBRARY[implementation]} runs F.scaled_dot_product_attention: give attn_implementation "
                         "sdpa")
    if arch is None or implementation in ("reference", "hf"):
        return
    family = getattr(arch, "model_type", "") or ""
    if family and family not in FAMILIES[implementation]:
        raise ValueError(f"implementation {implementation}: {LIBRARY[implementation]} ships no {family} model (its "
                         f"families: {', '.join(FAMILIES[implementation])})")
    if not family and implementation in ("torchtune", "torchtitan") and arch.style != "llama":
        raise ValueError(f"implementation {implementation}: {LIBRARY[implementation]} ships no GPT-style decoder "
                         f"(LayerNorm, GeLU): its families are {', '.join(FAMILIES[implementation])}")


#: Library names that end in an s, whose possessive is a bare apostrophe.
PLURAL_NAMES = {"transformers"}


def _of(implementation: str) -> str:
    """The library's name in the possessive ("transformers'", "torchtune's")."""
    name = LIBRARY[implementation]
    return name + ("'" if name in PLURAL_NAMES else "'s")


def not_modelled(implementation: str, what: str) -> ValueError:
    """The one-line refusal of ``what`` under a library's code."""
    return ValueError(f"implementation {implementation} ({_of(implementation)} model code): {what} not "
                      "modelled yet (implementation reference models memledger's reference decoder)")


def lora_not_modelled(implementation: str) -> str:
    """What the LoRA step says of LoRA under a library's code it does not model (the end of a one-line refusal).
    transformers' LoRA is PEFT's (``get_peft_model``, PEFT 0.22.0 beside torchao 0.14.1: 0.19-0.21 raise ImportError
    in ``get_peft_model`` for a torchao older than 0.16), modelled by :mod:`memledger.step.hf_lora` with SDPA, without
    dropout or QLoRA; torchtune's ``lora_llama2`` by :mod:`memledger.step.lora`; LitGPT's by
    :mod:`memledger.step.litgpt_lora_step`."""
    if implementation == "litgpt":
        return ("QLoRA and adapters beyond the fused QKV projection under LitGPT's code are not modelled yet in the "
                "step (memledger.step.litgpt_lora_step models its LoRA on q, k, v with a BF16 base)")
    return f"LoRA and QLoRA under {LIBRARY.get(implementation, implementation)}'s code are not modelled yet"


def check_step(setup, conv) -> None:
    """``ValueError`` (:func:`not_modelled`) for what the step does not model yet under ``setup``'s library
    implementation (nothing under the reference decoder)."""
    impl = setup.implementation
    if impl == "reference":
        return
    if conv.name == "article":
        raise ValueError(f"implementation {impl}: {_of(impl)} code decides which kernels run, not the article's "
                         "conventions: give backend cpu or cuda")
    if setup.flash_attention and setup.attn_implementation == "eager":
        raise ValueError("flash_attention and attn_implementation eager contradict each other: transformers' "
                         "eager_attention_forward keeps the S x S probabilities (give attn_implementation sdpa)")
    check_library_options(setup)
    arch = setup.arch
    f = arch.features
    gpt = arch.style != "llama"
    lacks = gpt_lacks(setup) + [what for what, off in [
        ("grouped-query attention" + (" with the eager core (repeat_kv's copies)" if impl == "hf" else ""),
         f.gqa and impl != "torchtitan" and (impl != "hf" or setup.attn_implementation == "eager")),
        ("QKV biases", f.has_qkv_bias and arch.style == "llama"), ("a tied LM head", f.is_tied and not gpt),
        ("a head size other than d/H", f.head_dim),
        ("dropout", setup.dropout), (f"recompute {setup.recompute}" + (TITAN_SELECTIVE if impl == "torchtitan" else ""),
                                     setup.recompute != "none" and not (
            setup.recompute == "full" and impl in FULL_RECOMPUTE and not gpt)),
        ("tensor or sequence parallelism", setup.tp > 1 or setup.sequence_parallel),
        (f"framework {setup.framework}", setup.framework != "plain"),
        ("FP16 autocast (recipe fp16-amp-adamw)", setup.recipe == "fp16-amp-adamw"),
        (f"recipe {setup.recipe} (torchtitan's training.dtype bfloat16 on one device: recipe bf16-pure-adamw)",
         impl == "torchtitan" and setup.recipe not in ("bf16-pure-adamw", "fp16-amp-adamw")),
        ("packed documents", bool(setup.packed)), (TORCHTUNE_OFFLOAD if impl == "torchtune" else
                                                   "activation offloading", setup.offload_activations),
        # torchtune's CEWithChunkedOutputLoss is modelled under its own code (memledger.step.loss); LitGPT's
        # chunked_cross_entropy as finetune/full.py runs it (memledger.step.litgpt_loss), its head chunked not yet
        ("a chunked or LitGPT loss", (setup.loss_chunks > 1 and impl not in ("torchtune", "litgpt"))
         or (setup.loss_impl != "torchtune" and impl != "litgpt")),
        ("LitGPT's head chunked by 128 tokens (finetune/lora.py; loss_chunks 1 runs finetune/full.py's loss)",
         setup.loss_chunks > 1 and impl == "litgpt"),
        ("attn_implementation flash_attention_2 (the flash-attn package's kernels, CUDA only)",
         setup.attn_implementation == "flash_attention_2")] if off]
    if impl in UNMODELLED_BLOCKS:
        lacks.insert(0, "the block (its norms, rotary code and attention)")
    if lacks:
        raise not_modelled(impl, ", ".join(lacks))
    if impl == "torchtune":
        check_torchtune_chunks(setup.loss_chunks, setup.seq_len)


def gpt_lacks(setup) -> list:
    """What a GPT-style ``setup`` has that its library's block is not modelled with ([] where it is, or for a LLaMA
    block): LitGPT's pythia only (GPT-NeoX: a parallel residual, two LayerNorms, partial rotary, an untied head
    without a bias; :mod:`memledger.step.gpt_style`); its recomputation is refused in :func:`check_step`."""
    arch = setup.arch
    if arch.style == "llama":
        return []
    if setup.implementation not in ("hf", "litgpt"):
        return ["a GPT-style block (LayerNorm, GeLU)"]
    f = arch.features
    neox = f.parallel and not f.shared_norm and not f.is_tied and not f.head_bias and bool(arch.rotary_fraction) \
        and not (f.positions or f.alibi or f.input_norm or f.gqa or f.head_dim)
    if not neox:
        return ["a GPT-style block other than GPT-NeoX's (pythia: a parallel residual, two LayerNorms, rotary, an "
                "untied head)"]
    return []


def check_library_options(setup) -> None:
    """``ValueError`` where ``setup`` asks a library for what it has no option for (:data:`NO_SELECTIVE`), or for
    what its recipe refuses: torchtune's activation offloading without its activation checkpointing."""
    impl = setup.implementation
    if setup.recompute == "selective" and impl in NO_SELECTIVE:
        raise ValueError(f"recompute selective under implementation {impl}: {NO_SELECTIVE[impl]}; give recompute "
                         "none or full")
    if impl == "torchtune" and setup.offload_activations and setup.recompute != "full":
        raise ValueError("offload_activations under implementation torchtune: its recipe refuses "
                         "enable_activation_offloading without enable_activation_checkpointing (torchtune 0.6.1, "
                         "recipes/full_finetune_single_device.py l. 166-174): give recompute full")


def check_torchtune_chunks(chunks: int, seq_len: int) -> None:
    """``ValueError`` naming ``loss_chunks`` where torchtune 0.6.1's ``h.chunk(n, dim=1)`` (ceil(S/n) tokens a
    chunk, :func:`memledger.step.loss.torchtune_chunk_tokens`) would make fewer chunks than asked."""
    size = -(-seq_len // chunks)
    if chunks > 1 and size * (chunks - 1) >= seq_len:
        raise ValueError(f"loss_chunks {chunks}: torchtune's h.chunk({chunks}, dim=1) makes {-(-seq_len // size)} "
                         f"chunks of {size} tokens at seq_len {seq_len}, not {chunks}; give a loss_chunks that "
                         f"splits {seq_len} tokens into that many")


#: Why ``recompute="selective"`` (the attention core re-run in backward, Korthikanti et al. 2022, Sec. 5) has no
#: counterpart under each library: none of them has that option, each checkpoints whole layers.
NO_SELECTIVE = {
    "hf": "transformers 5.25 has no such option: activation_checkpointing_enable checkpoints whole decoder layers, "
          "every every_n_layers-th (transformers/modeling_utils.py l. 3121-3184); an op-level policy would be the "
          "user's own context_fn in activation_checkpointing_kwargs, passed to torch.utils.checkpoint.checkpoint",
    "torchtune": "torchtune 0.6.1 has no such option: its ac_mode 'selective' (recipes/full_finetune_distributed.py "
                 "l. 566-575) checkpoints every ac_option-th layer whole (torchtune/training/activations.py "
                 "l. 30-57; ac_option 'op', named in its docstring, fails at int('op'))",
    "litgpt": "LitGPT 0.5.13 has no such option: finetune/full.py checkpoints each Block whole "
              "(FSDPStrategy(activation_checkpointing_policy={Block}), l. 107-114, on more than one device only)"}
#: What of torchtune's activation offloading the step lacks (its rule: :mod:`memledger.step.torchtune_offload`).
TORCHTUNE_OFFLOAD = ("activation offloading as torchtune's OffloadActivations runs it (which tensors it offloads is "
                     "memledger.step.torchtune_offload's rule, proved against torchtune 0.6.1; the step's timeline "
                     "under it, its host copies and its second stream's fwd_stash, is not)")
#: The implementations whose ``recompute full`` the step models (each library's own per-layer checkpointing).
FULL_RECOMPUTE = ("hf", "torchtune", "litgpt", "torchtitan")
#: Why torchtitan's ``SelectiveAC`` is refused (torchtitan 0.3.0 has no per-layer selective option any more).
TITAN_SELECTIVE = (" (torchtitan's SelectiveAC op policy: mm outputs saved but every second, SDPA saved only through "
                   "its CUDA kernels, activation_checkpoint.py l. 31-94, 246-276)")
#: The implementations whose block the step does not model yet.
UNMODELLED_BLOCKS = ()
