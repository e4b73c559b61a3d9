"""A framework's knobs, grouped in its own config object, and the Ledger keywords that set them.

Each framework that has knobs has one frozen config (:class:`~memledger.step.inputs.DDPConfig`,
:class:`~memledger.step.inputs.FSDP2Config`, :class:`~memledger.states.frameworks.DeepSpeedConfig`,
:class:`~memledger.states.frameworks.MegatronConfig`); a :class:`~memledger.ledger.ledger.Ledger` holds the one of
its framework (``framework_config``; None for the plain loop). The Ledger still takes each knob as its own keyword
(``Ledger(..., fsdp_units="torchtitan")``, as the CLI, the JSON and the chapters name them) and reads it back as an
attribute: :data:`KNOBS` says which config field each keyword is, and the config's field its default. A knob of
another framework than the Ledger's is refused unless at its default (:func:`memledger.states.frameworks.check_framework`),
so the Ledger keeps such a knob only while it checks it (:func:`configure`'s ``foreign``).
"""
from dataclasses import fields, replace

from ..states.frameworks import DeepSpeedConfig, MegatronConfig
from ..step.inputs import DDPConfig, FSDP2Config

__all__ = ["CONFIGS", "KNOBS", "Knob", "configure", "default", "knobs_of"]

#: The config of each framework that has knobs.
CONFIGS = {"ddp": DDPConfig, "fsdp2": FSDP2Config, "deepspeed": DeepSpeedConfig, "megatron": MegatronConfig}

#: Ledger keyword -> (framework, the field of its config).
KNOBS = {"ddp_bucket_mb": ("ddp", "bucket_mb"), "gradient_as_bucket_view": ("ddp", "gradient_as_bucket_view"),
         "deepspeed_reduce_bucket_size": ("deepspeed", "reduce_bucket_size"),
         "deepspeed_contiguous_gradients": ("deepspeed", "contiguous_gradients"),
         "deepspeed_overlap_comm": ("deepspeed", "overlap_comm"),
         "deepspeed_prefetch_bucket_size": ("deepspeed", "prefetch_bucket_size"),
         "deepspeed_max_live_parameters": ("deepspeed", "max_live_parameters"),
         "deepspeed_param_persistence_threshold": ("deepspeed", "param_persistence_threshold"),
         "megatron_gradient_accumulation_fusion": ("megatron", "gradient_accumulation_fusion"),
         "fsdp_param_dtype": ("fsdp2", "param_dtype"), "fsdp_reduce_dtype": ("fsdp2", "reduce_dtype"),
         "reshard_after_forward": ("fsdp2", "reshard_after_forward"), "dp_replicate": ("fsdp2", "dp_replicate"),
         "fsdp_loss_in_root": ("fsdp2", "loss_in_root"), "fsdp_cpu_offload": ("fsdp2", "cpu_offload"),
         "fsdp_offload_pin_memory": ("fsdp2", "offload_pin_memory"), "fsdp_units": ("fsdp2", "units")}


def default(keyword: str):
    """A knob's default: its config field's."""
    framework, name = KNOBS[keyword]
    return next(f.default for f in fields(CONFIGS[framework]) if f.name == name)


def knobs_of(config) -> dict:
    """Keyword -> value of each knob ``config`` holds (none for None)."""
    return {keyword: getattr(config, name) for keyword, (framework, name) in KNOBS.items()
            if config is not None and type(config) is CONFIGS[framework]}


def configure(framework: str, config, given: dict) -> tuple:
    """``(config, foreign)``: ``framework``'s config (None where it has no knobs) from ``config`` (a Ledger's, or
    None) with the knobs ``given`` (keyword -> value) set; ``foreign``: the knobs, given or held by a config of
    another framework, that are not ``framework``'s (to be refused where not at their defaults)."""
    knobs = {**knobs_of(config), **given}
    own = {KNOBS[k][1]: v for k, v in knobs.items() if KNOBS[k][0] == framework}
    foreign = {k: v for k, v in knobs.items() if KNOBS[k][0] != framework}
    made = CONFIGS[framework](**own) if framework in CONFIGS else None
    return made, foreign


def with_knob(config, keyword: str, value):
    """``config`` with the knob ``keyword`` set to ``value``."""
    return replace(config, **{KNOBS[keyword][1]: value})


class Knob:
    """A Ledger attribute reading one knob: its framework config's field where the Ledger runs that framework,
    else the knob as given while the Ledger checks it, else its default (also read off the class:
    ``Ledger.fsdp_units``)."""

    def __init__(self, keyword: str):
        self.keyword, self.framework, self.name = keyword, *KNOBS[keyword]
        self.default = default(keyword)
        self.__doc__ = f"The {self.framework} knob {self.name} (``framework_config.{self.name}``)."

    def __get__(self, ledger, owner=None):
        if ledger is None:
            return self.default
        config = ledger.framework_config
        if type(config) is CONFIGS[self.framework]:
            return getattr(config, self.name)
        return ledger.__dict__.get("_foreign", {}).get(self.keyword, self.default)
