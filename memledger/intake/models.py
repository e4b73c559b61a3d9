"""Which model a config names: a torchtune builder, a Hugging Face id or a local model directory.

A model becomes ``--preset NAME`` where memledger ships its config (``memledger/models/configs/``, each
preset's Hugging Face id in ``index.json``), or ``--config PATH`` for a ``config.json`` found locally: a model
directory, or a Hugging Face id in the local Hub cache (``$HF_HUB_CACHE``, ``$HF_HOME/hub`` or
``~/.cache/huggingface/hub``; ``models--ORG--NAME/snapshots/*/config.json``), never the network.
"""
import json
import os
from pathlib import Path

__all__ = ["TORCHTUNE_MODELS", "hub_cache", "local_config", "preset_of_id", "torchtune_model"]

#: torchtune's model builders (``torchtune.models.<family>.<builder>``, LoRA/QLoRA ones with the prefix
#: ``lora_``/``qlora_``) whose tensors a preset holds; the note says why where the names differ.
TORCHTUNE_MODELS = {
    "llama2_7b": ("llama2-7b", ""),
    "llama2_13b": ("llama2-13b", ""),
    "llama3_8b": ("llama3-8b", ""),
    "llama3_1_8b": ("llama3-8b", "Llama 3.1 8B has Llama 3 8B's tensors; only its RoPE scaling and context differ"),
    "mistral_7b": ("mistral-7b", ""),
    "gemma_2b": ("gemma-2b", ""),
    "gemma_7b": ("gemma-7b", ""),
    "qwen2_5_0_5b": ("qwen2.5-0.5b", ""),
    "qwen2_5_7b": ("qwen2.5-7b", ""),
    "qwen2_5_7b_instruct": ("qwen2.5-7b", "the instruct model has the base model's tensors"),
}


def torchtune_model(component: str):
    """``(preset, adapters, note)`` for a torchtune builder path: adapters ``None``, ``"lora"`` or ``"qlora"``;
    ``ValueError`` for a builder memledger has no preset for."""
    name = component.rsplit(".", 1)[-1]
    adapters = None
    for prefix in ("qlora_", "lora_"):
        if name.startswith(prefix):
            adapters, name = prefix[:-1], name[len(prefix):]
            break
    if name not in TORCHTUNE_MODELS:
        raise ValueError(f"no preset holds {component}'s tensors; give the model's config.json with --model PATH "
                         f"(presets for: {', '.join(sorted(TORCHTUNE_MODELS))})")
    preset, note = TORCHTUNE_MODELS[name]
    return preset, adapters, note


def _index() -> dict:
    path = Path(__file__).resolve().parents[1] / "models" / "configs" / "index.json"
    return {v["repo"].lower(): k for k, v in json.loads(path.read_text()).items() if isinstance(v, dict)}


def preset_of_id(model_id: str):
    """The preset holding a Hugging Face id's config (``meta-llama/Llama-2-7b-hf`` -> ``llama2-7b``), or None."""
    return _index().get(model_id.strip("/").lower())


def hub_cache() -> Path:
    """Where the Hugging Face Hub keeps downloaded files on this machine (its own rule, ``huggingface_hub``'s
    ``constants.HF_HUB_CACHE``: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``)."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"])
    home = os.environ.get("HF_HOME") or os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface")
    return Path(home).expanduser() / "hub"


def local_config(model: str):
    """``("--preset", name)`` or ``("--config", path)`` for a model directory, a ``config.json`` or a Hugging Face
    id (a preset's, or one in the local Hub cache); ``ValueError`` naming where it looked."""
    path = Path(model)
    if path.is_dir() or path.suffix == ".json":
        config = path / "config.json" if path.is_dir() else path
        if not config.is_file():
            raise ValueError(f"model {model}: no config.json there")
        return "--config", str(config)
    preset = preset_of_id(model)
    if preset:
        return "--preset", preset
    if model.count("/") == 1:
        folder = hub_cache() / ("models--" + model.replace("/", "--")) / "snapshots"
        found = sorted(folder.glob("*/config.json"), key=lambda p: p.stat().st_mtime) if folder.is_dir() else []
        if found:
            return "--config", str(found[-1])
        raise ValueError(f"model {model}: not a preset's id and not in the local Hugging Face cache (looked in "
                         f"{folder}); memledger reads no network: download it first or give its directory")
    raise ValueError(f"model {model}: neither a directory, a config.json nor a Hugging Face id (ORG/NAME)")
