"""The interactive controls, described once: what a reader can set, its options and default.

Both front ends read this description: the ipywidgets explorer
(:mod:`memledger.views.widgets`, Jupyter) and the static calculator
(:mod:`memledger.views.webcalc`, the built book). Options and defaults come from the
library's own tuples (presets, recipes, recompute modes, ZeRO stages, offload
devices and placements, GPUs) and from :class:`~memledger.ledger.ledger.Ledger`'s
defaults, so a new recipe or GPU appears in both without an edit here.

A control is a *choice* (one of ``options``) or a *count* (a positive integer
up to :data:`memledger.core.choices.LIMIT`, read from text exactly as the CLI reads
it, :func:`memledger.core.units.parse_count`, so both refuse the same input with the
same message). ``field`` is the :class:`Ledger` keyword it sets; ``gpu`` is the
one control that is not a ledger input (it sets the memory of the verdict).
:func:`cli_command` writes a setting of the controls as the ``memledger ledger`` command that
reproduces it (the static calculator shows it; so does the Jupyter explorer).
"""
from dataclasses import dataclass
import json
import shlex

from ..models.presets import ARTICLE_PRESET, ledger_preset_names
from ..core.choices import LIMIT, RECOMPUTE, check_choice
from ..ledger.hardware import ARTICLE_GPU, GPU_MEMORY
from ..ledger.ledger import Ledger
from ..states.placement import OFFLOAD_DEVICES, PLACEMENTS, ZERO_STAGES
from ..states.recipes import DEFAULT_RECIPE, RECIPES
from ..core.units import MiB, parse_count

__all__ = ["BY_FIELD", "CLI_FLAGS", "CONTROLS", "Control", "GPU_FIELD", "IGNORED_WHEN", "SEQUENCE_CHOICES", "cli_argv",
           "cli_command", "defaults", "ledger_settings", "option_text"]

#: Sequence lengths the interactive views (widget, static calculator) offer.
SEQUENCE_CHOICES = (512, 1024, 2048, 4096, 8192, 16384, 32768)


@dataclass(frozen=True)
class Control:
    """One input: ``options`` (with display ``labels``) for a choice, none for a count."""
    field: str
    label: str
    default: object
    options: tuple = ()
    labels: tuple = ()

    @property
    def is_count(self) -> bool:
        return not self.options

    @property
    def maximum(self) -> int:
        """Largest value a count accepts: the CLI's limit."""
        return LIMIT

    def choices(self) -> list:
        """(label, value) pairs of a choice."""
        return list(zip(self.labels or [str(o) for o in self.options], self.options))

    def parse(self, value):
        """The value this control stands for: a count from text (CLI rules), or one of the options.

        Raises ``ValueError`` naming :attr:`field` otherwise.
        """
        if self.is_count:
            return parse_count(value, self.field)
        return check_choice(self.field, value, self.options)


def option_text(value) -> str:
    """An option as the static page writes it: strings as they are, numbers and booleans as JSON."""
    return value if isinstance(value, str) else json.dumps(value)


def _gpu_label(name: str) -> str:
    """``"rtx-4090 (24,564 MiB)"``: the capacity as nvidia-smi prints it, not rounded decimal gigabytes (which made
    a "24 GB" card read "26 GB")."""
    return f"{name} ({GPU_MEMORY[name] // MiB:,} MiB)"


CONTROLS = (
    Control("arch", "model", ARTICLE_PRESET, tuple(ledger_preset_names())),
    Control("batch_size", "batch B", Ledger.batch_size),
    Control("seq_len", "sequence S", Ledger.seq_len, SEQUENCE_CHOICES),
    Control("recipe", "recipe", DEFAULT_RECIPE, tuple(RECIPES)),
    Control("recompute", "recompute", Ledger.recompute, RECOMPUTE),
    Control("flash_attention", "FlashAttention", Ledger.flash_attention, (False, True), ("no", "yes")),
    Control("zero_stage", "ZeRO stage", Ledger.zero_stage, ZERO_STAGES),
    Control("dp", "data parallel", Ledger.dp),
    Control("offload_optimizer", "offload optimizer", Ledger.offload_optimizer, OFFLOAD_DEVICES),
    Control("offload_placement", "placement", Ledger.offload_placement, PLACEMENTS),
    Control("gpu", "GPU", ARTICLE_GPU, tuple(GPU_MEMORY), tuple(_gpu_label(n) for n in GPU_MEMORY)),
)
BY_FIELD = {c.field: c for c in CONTROLS}
#: The control that is not a Ledger keyword: the GPU whose memory the verdict compares against.
GPU_FIELD = "gpu"


def ledger_settings(values: dict) -> dict:
    """The :class:`Ledger` keywords among control ``values`` (all but the GPU)."""
    return {k: v for k, v in values.items() if k != GPU_FIELD}


def defaults(preset: str = ARTICLE_PRESET) -> dict:
    """Every control's starting value, by field; ``preset`` chooses the model."""
    values = {c.field: c.default for c in CONTROLS}
    values["arch"] = BY_FIELD["arch"].parse(preset)
    return values


#: Each control's ``memledger ledger`` option (memledger.cli.options); a boolean control is a flag given when true.
CLI_FLAGS = {"arch": "--preset", "batch_size": "--batch", "seq_len": "--seq", "recipe": "--recipe",
             "recompute": "--recompute", "flash_attention": "--flash-attention", "zero_stage": "--zero",
             "dp": "--dp", "offload_optimizer": "--offload-optimizer", "offload_placement": "--offload-placement",
             "gpu": "--gpu-memory"}


#: A control the ledger ignores while another holds a value (the CLI refuses it then): the placement of
#: offloaded optimizer states, with nothing offloaded.
IGNORED_WHEN = {"offload_placement": ("offload_optimizer", "none")}


def cli_argv(state: dict) -> list:
    """``state`` (field -> value, as the controls hold it) as ``memledger ledger`` arguments, every control
    given but one the ledger ignores there (:data:`IGNORED_WHEN`); a value is checked by its control
    (:meth:`Control.parse`) first."""
    argv = ["ledger"]
    values = {control.field: control.parse(state[control.field]) for control in CONTROLS}
    for control in CONTROLS:
        value = values[control.field]
        other = IGNORED_WHEN.get(control.field)
        if other and values[other[0]] == other[1]:
            continue
        if isinstance(value, bool):
            argv += [CLI_FLAGS[control.field]] if value else []
        else:
            argv += [CLI_FLAGS[control.field], option_text(value)]
    return argv


def cli_command(state: dict) -> str:
    """The shell command that reproduces ``state``: ``memledger ledger --preset article-7b --batch 1 ...``."""
    return shlex.join(["memledger"] + cli_argv(state))
