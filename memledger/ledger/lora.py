"""LoRA and QLoRA: a frozen base, rank-r adapters, and what autograd then keeps.

LoRA (Hu et al. 2021) freezes every base weight and adds, on chosen
projections W (out x in), a trainable pair A (r x in), B (out x r):
y = W x + B A x (scaled). The base keeps its weights only: no gradients, no
optimizer state. The adapters follow their own recipe (default fp32 AdamW:
peft's ``get_peft_model(..., autocast_adapter_dtype=True)`` upcasts bf16/fp16
adapter weights to float32).

Activations are *derived* from the block's inventory
(:func:`memledger.activations.inventory.inventory`): a row kept only for the weight
gradient of some projections (``Saved.weight_grad_of``) disappears when all of
them are frozen -- PyTorch's linear backward saves its input only if the weight
needs a gradient -- and stays if one of them carries an adapter, because A's
weight gradient needs the same input. Each adapter adds its rank-r
intermediate A x (B's weight gradient needs it), and with LoRA dropout a mask
and a dropped copy of the input per adapted projection (A then reads the copy).
Assumed: adapters computed in the compute dtype, the block input requires
grad (``enable_input_require_grads``, as peft's k-bit preparation does); in the
first layer without it, nothing before the first adapter is saved.

QLoRA (Dettmers et al. 2023): the base projections in 4-bit NormalFloat with
one absmax per 64 weights, double-quantized to 8 bits with one fp32 constant
per 256 absmax values: 4 + 8/64 + 32/(64 x 256) = 4.127 bits per parameter
(the paper's Sec. 3: 0.127 bits of constants instead of 0.5). Embeddings,
norms and the output head stay in BF16 (bitsandbytes quantizes nn.Linear
layers only). bitsandbytes' ``MatMul4Bit`` saves the packed weight, never the
input (``autograd/_functions.py`` lines 357-360, 95f9af30), so the activation
rows are LoRA's. Adapters as the QLoRA code trains them (artidoro/qlora 7f4e95a): BF16
(``qlora.py`` casts every ``LoraLayer`` to bfloat16 under ``--bf16``) with its default optimizer
``paged_adamw_32bit`` (``qlora.py`` line 198: BF16 weights, FP32 m and v, states in paged unified memory,
booked on the GPU), and LoRA dropout (``--lora_dropout 0.1`` in ``scripts/finetune_guanaco_7b.sh`` and
the paper's Appendix for 7B-13B, 0.05 for 33B-65B: a mask and a dropped copy of each adapted input).
"""
from dataclasses import dataclass
from functools import cached_property

import sympy as sp

from ..activations.inventory import RECOMPUTE, Saved, inventory, per_layer_bytes
from ..core.choices import check_choice, check_count, check_flag, lookup
from ..core.dtypes import nbytes
from ..core.rows import Row, Rows
from ..states.bnb import nf4_parts
from ..states.torchao import nf4_bytes
from ..states.recipe import Component
from ..states.recipes import get_recipe
from ..core.symbols import B, L, S, r
from ..models.tensors import PROJECTIONS, parameter_tensors, projections

__all__ = ["BASE_DTYPES", "HEAD", "NF4", "NF4_DOUBLE_QUANT", "LoraConfig", "LoraLedger", "activation_rows",
           "adapter_params", "adapter_shapes", "head_rows", "head_shapes", "qlora", "r_sym", "state_rows"]

BASE_DTYPES = ("bf16", "fp16", "fp32", "nf4")
NF4_DOUBLE_QUANT = Component("NF4 base projections (double-quantized absmax)", "nf4", "param",
                             "QLoRA: 4-bit NormalFloat, 8-bit absmax per 64, fp32 per 256 absmax",
                             constants=((64, "int8"), (64 * 256, "fp32")))
NF4 = Component("NF4 base projections (fp32 absmax)", "nf4", "param", "QLoRA without double quantization",
                constants=((64, "fp32"),))
#: torchtune's QLoRA base: torchao's NF4Tensor per block projection (BF16 constants, a lookup table per tensor)
TORCHAO_NF4 = "frozen NF4 base projections (torchao NF4Tensor: 8-bit scalers per 64, BF16 factor per 256)"
r_sym = r                         # the LoRA rank of the notation (memledger.core.symbols)
#: The LM head as a target (PEFT's ``target_modules`` may name it; one adapter, A: r x d, B: V x r, not per layer).
HEAD = "lm_head"


@dataclass(frozen=True)
class LoraConfig:
    """Adapters of ``rank`` on ``targets`` (projection names of :data:`memledger.models.tensors.PROJECTIONS`)."""
    rank: int = 16
    targets: tuple = ("q_proj", "v_proj")
    base: str = "bf16"
    double_quant: bool = True
    adapter_recipe: str = "fp32-adamw"
    dropout: bool = False
    paged: bool = False

    def __post_init__(self):
        object.__setattr__(self, "rank", check_count("rank", self.rank))
        if isinstance(self.targets, str) or not isinstance(self.targets, (tuple, list)):
            raise TypeError(f"targets must be a list of projection names, got {self.targets!r}")
        object.__setattr__(self, "targets", tuple(self.targets))
        if not self.targets:
            raise ValueError("targets must name at least one projection")
        if not all(isinstance(t, str) for t in self.targets):
            raise TypeError(f"targets must be projection names (strings), got {self.targets!r}")
        twice = sorted({t for t in self.targets if self.targets.count(t) > 1})
        if twice:
            raise ValueError(f"targets name {', '.join(twice)} more than once")
        check_choice("base", self.base, BASE_DTYPES)
        for name in ("double_quant", "dropout", "paged"):
            check_flag(name, getattr(self, name))
        get_recipe(self.adapter_recipe)

    def check(self, style: str) -> None:
        unknown = [t for t in self.targets if t not in PROJECTIONS[style] and t != HEAD]
        if unknown:
            raise ValueError(f"targets {', '.join(unknown)} are not projections of a {style} block; "
                             f"choose from {', '.join(PROJECTIONS[style])}, {HEAD}")


def qlora(rank: int = 64, targets=None, style: str = "llama", **changes) -> LoraConfig:
    """QLoRA as Dettmers et al. (2023) train it: NF4 base with double quantization, adapters on all
    linear layers (r = 64 in the paper), BF16 adapters with ``paged_adamw_32bit`` (FP32 moments) and
    LoRA dropout (see the module docstring); ``changes`` override any of them."""
    if "base" in changes:
        raise ValueError(f"QLoRA's base is NF4 (4-bit weights computed in BF16); base={changes['base']!r} cannot "
                         "be given")
    if targets is None:
        targets = tuple(lookup(PROJECTIONS, style, "style"))
    return LoraConfig(rank=rank, targets=targets, base="nf4",
                      adapter_recipe=changes.pop("adapter_recipe", "bf16-adamw32-bnb"),
                      paged=changes.pop("paged", True), dropout=changes.pop("dropout", True), **changes)


def adapter_shapes(features, config: LoraConfig) -> list:
    """(name, shape) of each layer's adapter matrices: A is r x in, B is out x r."""
    from ..models.features import Features
    f = Features.of(features)
    config.check(f.style)
    if f.moe:
        raise ValueError("LoRA on mixture-of-experts blocks is not modelled; choose a dense architecture")
    shapes = []
    for target in (t for t in config.targets if t != HEAD):
        out, inp = projections(f)[target]
        shapes += [(f"{target}.lora_A", (r_sym, inp)), (f"{target}.lora_B", (out, r_sym))]
    return shapes


def head_shapes(config: LoraConfig) -> list:
    """(name, shape) of the LM head's adapter matrices where ``lm_head`` is a target (once, not per layer)."""
    from ..core.symbols import V, d
    return [(f"{HEAD}.lora_A", (r_sym, d)), (f"{HEAD}.lora_B", (V, r_sym))] if HEAD in config.targets else []


def head_rows(config: LoraConfig) -> list:
    """What the LM head's adapter saves (once): its input (with LoRA dropout: the mask and the dropped copy
    instead) for A's weight gradient, and A x for B's."""
    from ..core.symbols import d
    if HEAD not in config.targets:
        return []
    kept = [Saved("LoRA lm_head dropout mask", "LoRA dropout backward needs the mask", (B, S, d), "bool"),
            Saved("LoRA lm_head dropout output", "A's weight gradient needs its (dropped) input", (B, S, d))] \
        if config.dropout else [Saved("LM head input", "the head adapter's A needs it for its weight gradient",
                                      (B, S, d))]
    return kept + [Saved("LoRA lm_head A output", "B's weight gradient needs its input, A x", (B, S, r_sym))]


def _size(arch, config, expr) -> int:
    """An expression of the architecture's symbols and the rank r, as an int."""
    return arch.evaluate(sp.sympify(expr).subs(r_sym, config.rank))


def state_rows(arch, config: LoraConfig, implementation: str = "reference") -> list:
    """(name, role, device, bytes) of the model states, exact per tensor; under ``implementation`` litgpt an NF4 base
    is LitGPT's (:data:`memledger.step.litgpt_lora.NF4_LINEARS`: the fused QKV one tensor, the LM head quantized),
    under torchtune torchao's ``NF4Tensor`` per projection (:func:`memledger.states.torchao.nf4_bytes`)."""
    config.check(arch.style)
    size = lambda shape: _size(arch, config, sp.prod(shape))
    quantized = NF4_DOUBLE_QUANT if config.double_quant else NF4
    dense, packed = 0, 0
    nf4 = {m: (m,) for m in PROJECTIONS[arch.style]}
    if implementation == "litgpt":
        from ..step.litgpt_lora import NF4_LINEARS
        nf4 = {group[0]: group for group in NF4_LINEARS} | {HEAD: (HEAD,)}
    shapes = {t.module: t.shape for t in parameter_tensors(arch.features) if t.name == "weight"}
    for t in parameter_tensors(arch.features):
        count = arch.n_layers if t.per_layer else 1
        if config.base == "nf4" and t.name == "weight" and any(t.module in group for group in nf4.values()):
            if t.module in nf4:         # one NF4 tensor per group (LitGPT's fused QKV)
                n = sum(size(shapes[m]) for m in nf4[t.module])
                packed += count * int(nf4_bytes(n) if implementation == "torchtune" else
                                      sum(nf4_parts(n, config.double_quant).values()))   # states.torchao, states.bnb
        else:
            dense += count * size(t.shape) * nbytes("bf16" if config.base == "nf4" else config.base)
    rows = [(f"frozen base weights ({'bf16' if config.base == 'nf4' else config.base}; no grads, no states)",
             "param", "gpu", dense)]
    if config.base == "nf4":
        name = TORCHAO_NF4 if implementation == "torchtune" else f"frozen {quantized.name}"
        rows.append((name, "param", "gpu", packed))
    recipe = get_recipe(config.adapter_recipe)
    shapes = [size(shape) for _, shape in adapter_shapes(arch.features, config)]
    for c in recipe.components:
        paged = " (paged)" if config.paged and c.role == "optimizer" else ""
        total = arch.n_layers * sum(int(c.bytes_for(n)) for n in shapes) + sum(
            int(c.bytes_for(size(shape))) for _, shape in head_shapes(config))
        rows.append((f"LoRA adapters: {c.name}{paged}", c.role, "gpu", total))
    return rows


def adapter_params(arch, config: LoraConfig) -> int:
    """Trainable parameters: L x sum over the block targets of r (in + out), plus r (d + V) for ``lm_head``."""
    return arch.n_layers * sum(_size(arch, config, sp.prod(s)) for _, s in adapter_shapes(arch.features, config)) \
        + sum(_size(arch, config, sp.prod(s)) for _, s in head_shapes(config))


def activation_rows(style: str, config: LoraConfig, dropout: bool = False, flash_attention: bool = False,
                    **refinements) -> list:
    """One block's saved tensors under LoRA, derived from the full-training inventory
    (``refinements``: :func:`memledger.activations.inventory.inventory`'s ``gqa``, ``head_dim``)."""
    config.check(style)
    rows = inventory("swiglu" if style == "llama" else "gelu", "RMSNorm" if style == "llama" else "LayerNorm",
                     dropout, flash_attention, **refinements)
    adapted = set(config.targets)
    kept = [r for r in rows if not r.weight_grad_of or (not config.dropout and adapted & set(r.weight_grad_of))]
    for target in (t for t in config.targets if t != HEAD):
        inp = projections(style)[target][1]
        if config.dropout:
            kept += [Saved(f"LoRA {target} dropout mask", "LoRA dropout backward needs the mask", (B, S, inp),
                           "bool"),
                     Saved(f"LoRA {target} dropout output", "A's weight gradient needs its (dropped) input",
                           (B, S, inp))]
        kept.append(Saved(f"LoRA {target} A output", "B's weight gradient needs its input, A x",
                          (B, S, r_sym)))
    return kept


@dataclass(frozen=True)
class LoraLedger:
    """Per-GPU memory of a LoRA/QLoRA run: model states (exact, per tensor) and L layers of activations."""
    arch: object
    config: LoraConfig
    batch_size: int = 1
    seq_len: int = 2048
    recompute: str = "none"
    flash_attention: bool = False
    overhead_bytes: int = 2 * 10**9
    loss_chunks: int = 1            # the step's loss: torchtune's chunked cross-entropy in n chunks (step/lora_loss.py)
    loss_impl: str = "torchtune"    # or LitGPT's chunked_cross_entropy; the sum books no logits either way
    optimizer_in_backward: bool = False     # the step: one AdamW per adapter tensor, stepped in its grad hook
    implementation: str = "reference"       # or PEFT on transformers' model, torchtune's lora_llama2, LitGPT's GPT

    def __post_init__(self):
        from ..models.architecture import Architecture
        from ..models.presets import get_preset
        arch = get_preset(self.arch) if isinstance(self.arch, str) else self.arch
        if not isinstance(arch, Architecture):
            raise TypeError(f"arch must be an Architecture or a preset name, got {self.arch!r}")
        object.__setattr__(self, "arch", arch)
        arch.check_modelled()
        if not isinstance(self.config, LoraConfig):
            raise TypeError(f"config must be a LoraConfig (or qlora()), got {self.config!r}")
        for name in ("batch_size", "seq_len"):
            object.__setattr__(self, name, check_count(name, getattr(self, name)))
        object.__setattr__(self, "overhead_bytes", check_count("overhead_bytes", self.overhead_bytes, minimum=0))
        check_choice("recompute", self.recompute, RECOMPUTE)
        object.__setattr__(self, "loss_chunks", check_count("loss_chunks", self.loss_chunks))
        check_flag("flash_attention", self.flash_attention)
        check_flag("optimizer_in_backward", self.optimizer_in_backward)
        from ..step.implementations import check_fields, not_modelled
        check_fields(self.implementation, "sdpa", arch)
        if self.implementation not in ("reference", "hf", "torchtune", "litgpt"):
            from ..step.implementations import lora_not_modelled
            raise ValueError(f"implementation {self.implementation}: {lora_not_modelled(self.implementation)}")
        self.config.check(self.arch.style)
        if self.implementation == "torchtune" and self.config.base == "nf4" and not self.config.double_quant:
            raise not_modelled("torchtune", "QLoRA without double quantization (torchao's to_nf4 always "
                               "double-quantizes its scalers)")
        if self.implementation == "litgpt":
            self._check_litgpt()

    def _check_litgpt(self):
        """``ValueError`` for what LitGPT's LoRA model is not modelled with (one line, naming it)."""
        from ..step.implementations import check_fields, not_modelled
        from ..step.litgpt_lora import check_targets
        check_fields("litgpt", "sdpa", self.arch)
        check_targets(self.config.targets)
        f = self.arch.features
        lacks = [what for what, off in [
            ("a GPT-style block (LayerNorm, GeLU)", self.arch.style != "llama"), ("grouped-query attention", f.gqa),
            ("QKV biases", f.has_qkv_bias), ("a tied LM head", f.is_tied), ("a head size other than d/H", f.head_dim),
            ("dropout", self.arch.dropout), (f"recompute {self.recompute}", self.recompute != "none"),
            ("FP32 adapters (finetune/lora.py trains in bf16-true: BF16 adapters)",
             next(c.dtype for c in get_recipe(self.config.adapter_recipe).components if c.role == "param") != "bf16"),
            ("a base in " + self.config.base, self.config.base not in ("bf16", "nf4"))] if off]
        if lacks:
            raise not_modelled("litgpt", "LoRA with " + ", ".join(lacks))

    @property
    def rows(self) -> Rows:
        """Model states (counted tensor by tensor), L blocks of activations, the overhead."""
        rows = [Row(n, "model_states", dev, b, role) for n, role, dev, b in state_rows(self.arch, self.config,
                                                                                         self.implementation)]
        f = self.arch.features
        family = dict(parallel=f.parallel, shared_norm=f.shared_norm) if f.parallel else {}   # GPT-NeoX, Phi
        if self.implementation == "litgpt":     # LitGPT's layers, the first one's input needing no gradient
            from ..step.litgpt_lora import activations
            act = activations(self.config.targets, self.config.dropout)
        else:
            act = L * per_layer_bytes(activation_rows(self.arch.style, self.config, self.arch.dropout,
                                                      self.flash_attention, gqa=f.gqa, head_dim=f.head_dim,
                                                      **family), self.recompute)
        size = act.subs({r_sym: self.config.rank, B: self.batch_size, S: self.seq_len})
        rows.append(Row("activations", "activations", "gpu", self.arch.evaluate(size), formula=str(act)))
        head = sum((x.bytes for x in head_rows(self.config)), sp.Integer(0))
        if head:
            size = head.subs({r_sym: self.config.rank, B: self.batch_size, S: self.seq_len})
            rows.append(Row("LM head adapter: saved input and A x", "activations", "gpu", self.arch.evaluate(size),
                            formula=str(head)))
        rows.append(Row("CUDA context + workspace", "overhead", "gpu", self.overhead_bytes, formula="O"))
        return Rows(rows)

    @property
    def totals(self) -> dict:
        return self.rows.totals

    def by_role(self) -> dict:
        return self.rows.by_role()

    def inputs(self) -> dict:
        """The run's inputs as its JSON object echoes them."""
        c = self.config
        return {"arch": self.arch.description or self.arch.style, "rank": c.rank, "targets": list(c.targets),
                "base": c.base, "double_quant": c.double_quant, "adapter_recipe": c.adapter_recipe,
                "lora_dropout": c.dropout, "paged": c.paged, "batch_size": self.batch_size,
                "seq_len": self.seq_len, "recompute": self.recompute, "trainable_params": adapter_params(self.arch, c)} | (
                    {"implementation": self.implementation} if self.implementation != "reference" else {})

    def to_dict(self) -> dict:
        landmarks = {"landmarks": self.landmarks()} if self.implementation == "litgpt" else {}
        return {"inputs": self.inputs(),
                "rows": [r.to_dict() for r in self.rows],
                "model_states_by_role": self.by_role(), "totals": self.totals} | landmarks

    def landmarks(self) -> dict:
        """Under ``implementation`` litgpt: the step's bytes at its four landmarks as ``finetune/lora.py`` runs it
        (:func:`memledger.step.litgpt_lora.landmarks`, CUDA's one-byte dropout mask; no CUDA context), with the
        adapters' recipe ``bf16-pure-adamw`` (torch.optim.AdamW on BF16 adapters); else ``ValueError``."""
        from ..step.implementations import not_modelled
        from ..step.litgpt_lora import landmarks
        if self.implementation != "litgpt" or self.config.base != "bf16" or \
                self.config.adapter_recipe != "bf16-pure-adamw":
            raise not_modelled(self.implementation, "the LoRA landmarks but LitGPT's with a BF16 base and "
                                                    "adapter_recipe bf16-pure-adamw are")
        values = {B: self.batch_size, S: self.seq_len, r_sym: self.config.rank}
        return {k: self.arch.evaluate(v.subs(values))
                for k, v in landmarks(self.config.targets, self.config.dropout).items()}

    @cached_property
    def peak(self):
        """The GPU peak of the step under CUDA's conventions (:meth:`step`: SDPA's flash kernel, fused RMSNorm,
        AdamW's foreach), or None where the step does not model the run (then the sum judges); under a library's
        code (``implementation``) the step's refusal stands where the sum is the reference decoder's (LitGPT's rows
        are its own layers: :mod:`memledger.step.litgpt_lora`)."""
        try:
            return self.step("cuda").peak.bytes
        except ValueError:
            if self.implementation not in ("reference", "litgpt"):
                raise
            return None

    def judged_bytes(self) -> int:
        """What a fits verdict compares with the GPU: the step's :attr:`peak` where modelled, else the sum."""
        return self.totals["gpu"] if self.peak is None else self.peak

    def step(self, backend="article", **conventions):
        """The step timeline of this run (:class:`memledger.step.lora.LoraStep`): landmarks, transients, peak."""
        from ..step.lora import LoraStep
        from .ledger import Ledger
        if self.implementation == "litgpt":     # memledger.step.litgpt_lora_step
            from ..step.implementations import not_modelled
            from ..step.litgpt_lora_step import check
            lacks = check(self.config.targets, self.seq_len, self.config.adapter_recipe, self.config.base) + [
                what for what, off in [("a chunked loss (finetune/lora.py's own 128-token chunks are modelled)",
                                        self.loss_chunks != 1 or self.loss_impl != "torchtune"),
                                       ("the optimizer in backward", self.optimizer_in_backward)] if off]
            if lacks:
                raise not_modelled("litgpt", "the LoRA step with " + ", ".join(lacks))
        if self.implementation == "hf":
            from ..step import hf_lora  # noqa: F401 (registers PEFT's LoRA on transformers' model)
        ledger = Ledger(self.arch, batch_size=self.batch_size, seq_len=self.seq_len, recipe="bf16-pure-adamw",
                        overhead_bytes=self.overhead_bytes, dropout=False, flash_attention=self.flash_attention,
                        recompute=self.recompute, loss_chunks=self.loss_chunks, loss_impl=self.loss_impl,
                        optimizer_in_backward=self.optimizer_in_backward, implementation=self.implementation)
        return LoraStep(ledger.step_inputs, self.config, backend, record=self.inputs(), origin=self,
                        **conventions)

    def table(self, unit: str = "GB"):
        """Rows and totals as a :class:`memledger.core.table.Table` (text, Markdown, HTML)."""
        from .table import ledger_table
        return ledger_table(self, unit)
