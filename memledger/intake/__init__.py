"""Users' own config files in: torchtune, Hugging Face (TrainingArguments/SFTConfig, PEFT, BitsAndBytesConfig,
config.json), DeepSpeed, accelerate, LitGPT and torchtitan, read into memledger's options, key by key.

:func:`from_config` reads each file as its tool does (:mod:`memledger.intake.files`), recognizes whose it is by its
keys, and records a row for every key (:class:`memledger.intake.rows.Row`): the option it became, or why it was
ignored or refused. ``memledger check FILE ...`` prints those rows, then judges the run with ``memledger step``.
"""
from pathlib import Path

from .files import flatten, load, override, shown
from .rows import Intake, Row

__all__ = ["Intake", "Row", "from_config", "whose"]

_LORA = ("--lora-rank", "--qlora")


def whose(flat: dict) -> str:
    """The tool a flattened config belongs to, by its keys; ``ValueError`` when none is recognized."""
    from . import accelerate, deepspeed, huggingface, litgpt, torchtitan, torchtune
    for tool, test in (("torchtune", torchtune.is_torchtune), ("litgpt", litgpt.is_litgpt),
                       ("torchtitan", torchtitan.is_torchtitan), ("accelerate", accelerate.is_accelerate),
                       ("deepspeed", deepspeed.is_deepspeed), ("peft", huggingface.is_peft),
                       ("bitsandbytes", huggingface.is_bnb), ("model", huggingface.is_model_config),
                       ("transformers", huggingface.is_training_args)):
        if test(flat):
            return tool
    raise ValueError("not a torchtune, LitGPT, torchtitan, accelerate, DeepSpeed, PEFT, BitsAndBytesConfig, "
                     "config.json or TrainingArguments file memledger knows")


def from_config(*files, overrides=(), model=None, gpus=None) -> Intake:
    """What ``files`` say, as memledger options (:class:`Intake`: ``rows`` and ``argv()`` for ``memledger step``).
    ``overrides``: ``key=value`` strings applied to the first file, as ``tune run`` applies its own; ``model``: a
    model directory, ``config.json`` or Hugging Face id (local cache only) that overrides the files' model;
    ``gpus``: the run's GPU count where a file leaves it to the launcher (torchtitan's ``-1``)."""
    from . import accelerate, deepspeed, huggingface, litgpt, torchtitan, torchtune
    if not files:
        raise ValueError("give at least one config file")
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ValueError(f"gpus must be a positive integer, got {gpus!r}")
    intake = Intake()
    for i, file in enumerate(files):
        path = Path(file)
        if path.is_dir():
            path = path / "config.json"
        flat = flatten(load(path))
        for assignment in overrides if i == 0 else ():
            flat = override(flat, assignment)
        name = path.name
        tool = whose(flat)
        if tool == "torchtune":
            torchtune.read_torchtune(intake, name, flat)
        elif tool == "litgpt":
            litgpt.read_litgpt(intake, name, flat)
        elif tool == "torchtitan":
            torchtitan.read_torchtitan(intake, name, flat, gpus)
        elif tool == "accelerate":
            accelerate.read_accelerate(intake, name, flat)
        elif tool == "deepspeed":
            deepspeed.read_deepspeed(intake, name, flat, gpus)
        elif tool == "peft":
            huggingface.read_peft(intake, name, flat)
        elif tool == "bitsandbytes":
            huggingface.read_bnb(intake, name, flat)
        elif tool == "model":
            huggingface.read_model_config(intake, name, flat, str(path))
        else:
            huggingface.read_training_args(intake, name, flat)
    if model is not None:
        from .models import local_config
        flag, value = local_config(str(model))
        for other in ("--preset", "--config"):
            intake.options.pop(other, None)
        intake.option("--model", "model", str(model), flag, value, why="the model given on the command line")
    if not any(f in intake.options for f in _LORA):
        intake.options.pop("--adapter-recipe", None)        # no adapters: the adapters' precision reads nothing
    if not any(f in intake.options for f in ("--preset", "--config")):
        raise ValueError(f"{shown(files[0])}: no model named; give its config.json or directory with --model PATH "
                         "(or a Hugging Face id in the local cache)")
    return intake
