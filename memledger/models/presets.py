"""The named models: hand-entered presets (the article's spec, LLaMA-2, GPT-2/3, Korthikanti's Table 3)
and the Hugging Face configs shipped in ``memledger/models/configs/``."""
from functools import cache

from ..core.choices import lookup
from .architecture import Architecture
from .features import swiglu_width
from .hf_config import load_config, shipped_configs

__all__ = ["ARTICLE_PRESET", "PRESETS", "all_presets", "config_presets", "get_preset", "ledger_preset_names",
           "preset_names", "shipped_presets"]


PRESETS = {
    "article-7b": Architecture(4096, 32, 32, 16384, 32000, "gpt", n_params=7 * 10**9,
        description="the article's spec (d 4096, L 32, H 32, d_ff 4d), nominal 7x10^9 "
                    "parameters; vocabulary not given there, LLaMA-2's 32000 assumed for the count"),
    "llama2-7b": Architecture(4096, 32, 32, swiglu_width(4096), 32000, "llama",
        description="LLaMA-2 7B (Touvron et al. 2023): SwiGLU, RMSNorm, untied embeddings"),
    "llama2-13b": Architecture(5120, 40, 40, swiglu_width(5120), 32000, "llama",
        description="LLaMA-2 13B (Touvron et al. 2023)"),
    "gpt2": Architecture(768, 12, 12, 3072, 50257, "gpt", n_positions=1024,
        description="GPT-2 small (Radford et al. 2019), 124M"),
    "gpt3-175b": Architecture(12288, 96, 96, 49152, 50257, "gpt", n_positions=2048,
        description="GPT-3 175B (Brown et al. 2020)"),
    "megatron-22b": Architecture(6144, 48, 64, 24576, 51200, "gpt",
        description="Korthikanti et al. 2022, Table 3, 22B"),
    "mt-nlg-530b": Architecture(20480, 105, 128, 81920, 51200, "gpt",
        description="Korthikanti et al. 2022, Table 3, 530B (MT-NLG)"),
    "megatron-1t": Architecture(25600, 128, 160, 102400, 51200, "gpt",
        description="Korthikanti et al. 2022, Table 3, 1T"),
}
#: The article's own model: the default of every interactive view.
ARTICLE_PRESET = "article-7b"


def preset_names() -> list:
    """Every preset's name: the hand-entered ones, then the shipped configs' (read from their index only)."""
    return list(PRESETS) + [name for name in shipped_configs() if name not in PRESETS]


def ledger_preset_names() -> list:
    """:func:`preset_names` less the shipped encoder-decoders (T5), which every ledger refuses
    (:meth:`Architecture.check_modelled`); read from the configs' ``model_type``, without building them."""
    refused = {name for name, (path, _, _) in shipped_configs().items() if load_config(path).get("model_type") == "t5"}
    return [name for name in preset_names() if name not in refused]


@cache
def config_presets() -> dict:
    """Presets read from the Hugging Face config.json files shipped in ``memledger/models/configs/``
    (kept apart from the hand-entered :data:`PRESETS` the book's chapters tabulate); read on first use."""
    return {name: arch for name, arch in shipped_presets().items() if name not in PRESETS}


def all_presets() -> dict:
    """Every preset: the hand-entered ones, then those from shipped configs."""
    return {**PRESETS, **config_presets()}


def get_preset(name: str) -> Architecture:
    """The preset called ``name`` (hand-entered or from a shipped config); ``ValueError`` listing the known ones."""
    if isinstance(name, str) and name in PRESETS:
        return PRESETS[name]
    return lookup(all_presets(), name, "preset")


def shipped_presets() -> dict:
    """Preset name -> Architecture for every shipped config (read once, at import of the presets)."""
    return {name: Architecture.from_hf_config(path, description=f"{text} [{repo} config.json]")
            for name, (path, repo, text) in shipped_configs().items()}
