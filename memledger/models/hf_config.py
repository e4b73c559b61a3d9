"""Hugging Face ``config.json`` -> :class:`~memledger.models.architecture.Architecture`, offline.

Reads the ``transformers`` configuration format from a local file or a dict,
with no network and no ``transformers`` import. What each model type means
for the parameter tensors follows the ``transformers`` modeling code:

* ``llama``, ``mistral``: RMSNorm, bias-free SwiGLU MLP, grouped-query
  attention (``num_key_value_heads``), untied unless ``tie_word_embeddings``
  (``modeling_llama.py``, ``modeling_mistral.py``; Mistral's sliding window
  changes no parameter);
* ``qwen2``: as llama, plus biases on Q, K and V (``Qwen2Attention``:
  ``bias=True`` for q/k/v_proj, ``bias=False`` for o_proj);
* ``gemma``: as llama with a GeGLU MLP, an explicit ``head_dim`` and always
  tied embeddings (``GemmaForCausalLM``);
* ``mixtral``: as mistral with ``num_local_experts`` SwiGLU experts, top
  ``num_experts_per_tok`` routing and a bias-free router (``MixtralSparseMoeBlock``);
* ``gpt2``: ``n_embd``/``n_layer``/``n_head``/``n_inner`` (None: 4d), learned
  positions ``n_positions``, biases everywhere, tied output layer;
* ``bert``: ``BertModel`` (what ``AutoModel`` loads): learned positions,
  ``type_vocab_size`` token types, embedding LayerNorm, post-LN blocks with
  biases everywhere, the pooler, no output layer, no causal mask.

Any other ``model_type`` is refused with a message naming these.
"""
import json
from pathlib import Path

SUPPORTED = ("bert", "gemma", "gpt2", "llama", "mistral", "mixtral", "qwen2")
CONFIG_DIR = Path(__file__).with_name("configs")


def load_config(config) -> dict:
    """A config dict from a dict, or from a ``config.json`` path (str or Path)."""
    if isinstance(config, dict):
        return config
    if not isinstance(config, (str, Path)):
        raise TypeError(f"config must be a path to a config.json or a dict, got {type(config).__name__}")
    path = Path(config)
    if path.is_dir():
        path = path / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"config: cannot read {str(path)!r} ({e.strerror or e})") from None
    try:
        data = json.loads(text)
    except ValueError as e:
        raise ValueError(f"config: {str(path)!r} is not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise ValueError(f"config: {str(path)!r} must hold a JSON object")
    return data


def _get(config, key, default=...):
    value = config.get(key, default)
    if value is ...:
        raise ValueError(f"config: model_type {config.get('model_type')!r} needs {key!r}, which is missing")
    return value


def _refuse_flag(config, key):
    if config.get(key):
        raise ValueError(f"config: {key}=true is not supported for model_type {config['model_type']!r}")


def architecture_kwargs(config: dict) -> dict:
    """Keyword arguments of :class:`Architecture` for one config dict."""
    model_type = config.get("model_type")
    if model_type not in SUPPORTED:
        raise ValueError(f"config: model_type {model_type!r} is not supported; supported: {', '.join(SUPPORTED)}")
    if model_type == "gpt2":
        d = _get(config, "n_embd")
        return _normalized(dict(
            d_model=d, n_layers=_get(config, "n_layer"), n_heads=_get(config, "n_head"),
            d_ff=_get(config, "n_inner", None) or 4 * d, vocab_size=_get(config, "vocab_size"), style="gpt",
            n_positions=_get(config, "n_positions"), model_type=model_type,
            tied_embeddings=bool(config.get("tie_word_embeddings", True))))
    common = dict(d_model=_get(config, "hidden_size"), n_layers=_get(config, "num_hidden_layers"),
                  n_heads=_get(config, "num_attention_heads"), d_ff=_get(config, "intermediate_size"),
                  vocab_size=_get(config, "vocab_size"), model_type=model_type)
    if model_type == "bert":
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError("config: bert with position_embedding_type other than 'absolute' is not supported")
        return dict(common, style="gpt", n_positions=_get(config, "max_position_embeddings"),
                    n_token_types=_get(config, "type_vocab_size", 2), pooler=True, embedding_norm=True,
                    causal=False, tied_embeddings=None)       # BertModel: one V x d matrix, no output layer
    for key in ("attention_bias", "mlp_bias"):
        _refuse_flag(config, key)
    kv = _get(config, "num_key_value_heads", None)
    head_dim = _get(config, "head_dim", None)
    kwargs = dict(common, style="llama", n_kv_heads=kv,
                  head_size=None if head_dim is None or head_dim * common["n_heads"] == common["d_model"] else head_dim,
                  tied_embeddings=bool(config.get("tie_word_embeddings", model_type == "gemma")))
    if model_type == "gemma":
        kwargs["tied_embeddings"] = True       # GemmaForCausalLM ties its output layer to the embedding
    if model_type == "qwen2":
        kwargs["qkv_bias"] = True
    if model_type == "mixtral":
        kwargs.update(n_experts=_get(config, "num_local_experts"), top_k=_get(config, "num_experts_per_tok"))
    return _normalized(kwargs)


def _normalized(kwargs):
    """Leave out what equals the style's default, so a config and a hand preset compare equal."""
    if kwargs.get("n_kv_heads") == kwargs["n_heads"]:
        kwargs["n_kv_heads"] = None
    if kwargs.get("tied_embeddings") == (kwargs["style"] == "gpt"):
        kwargs["tied_embeddings"] = None
    return kwargs


def shipped_configs() -> dict:
    """Preset name -> (config path, Hub repository, description) for the configs in ``configs/``."""
    index = json.loads((CONFIG_DIR / "index.json").read_text(encoding="utf-8"))
    return {name: (CONFIG_DIR / f"{name}.json", entry["repo"], entry["description"])
            for name, entry in index.items() if not name.startswith("_")}
