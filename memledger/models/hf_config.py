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
  biases everywhere, the pooler, no output layer, no causal mask;
* ``gpt_neox`` (``modeling_gpt_neox.py``): GPT blocks (biased LayerNorms, fused biased
  ``query_key_value``, biased ``dense``, GeLU MLP), rotary on ``rotary_pct`` of each head,
  ``use_parallel_residual`` (default true: x + attn(ln1(x)) + mlp(ln2(x))), an untied ``embed_out``
  unless ``tie_word_embeddings``;
* ``phi`` (``modeling_phi.py``): one ``input_layernorm`` feeding attention and MLP in parallel, biased
  q/k/v/dense and fc1/fc2, rotary on ``partial_rotary_factor`` of each head, an untied ``lm_head`` with a
  bias; ``qk_layernorm`` refused;
* ``bloom`` (``modeling_bloom.py``): ALiBi (no positions), fused biased ``query_key_value``, an MLP of
  4d (``n_inner`` is not read by ``BloomMLP``), ``word_embeddings_layernorm`` and ``ln_f``, tied head;
* ``gpt_bigcode`` (``modeling_gpt_bigcode.py``): GPT-2's layout with multi-query attention
  (``multi_query``, default true: ``c_attn`` is d x (d + 2 d/H)), learned positions, tied head;
* ``t5`` (``modeling_t5.py``, ``T5ForConditionalGeneration``): encoder-decoder, bias-free, RMS
  ``T5LayerNorm``, ``d_kv`` per head, ReLU (``feed_forward_proj`` "relu") or gated MLP ("gated-gelu"),
  relative-position buckets, shared embedding, head tied unless ``tie_word_embeddings`` is false.

Any other ``model_type`` is refused with a message naming these. Reading is
bounded: a regular file (not a FIFO or a device) of at most :data:`MAX_BYTES`,
UTF-8 JSON nested at most :data:`MAX_DEPTH` deep; every field read must have
its JSON type (a count an integer, a flag ``true`` or ``false``), or the
error names it.
"""
import json
import os
from pathlib import Path
import stat

from ..core.choices import check_count

__all__ = ["CONFIG_DIR", "MAX_BYTES", "MAX_DEPTH", "SUPPORTED", "architecture_kwargs", "load_config",
           "shipped_configs"]

SUPPORTED = ("bert", "bloom", "gemma", "gpt2", "gpt_bigcode", "gpt_neox", "llama", "mistral", "mixtral", "phi",
             "qwen2", "t5")
CONFIG_DIR = Path(__file__).with_name("configs")
#: The largest config.json read (real ones are a few kB; tokenizer tables and weights are other files).
MAX_BYTES = 1_000_000
#: The deepest nesting of a config.json read (real ones nest two or three levels).
MAX_DEPTH = 32


def _shown(path) -> str:
    """The path, its middle left out past 60 characters (its end, the file's name, kept)."""
    text = str(path)
    return repr(text if len(text) <= 60 else text[:22] + "..." + text[-35:])


def _depth(text: str) -> int:
    """The deepest nesting of JSON arrays and objects in ``text`` (brackets inside strings not counted)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def _read(path: Path) -> bytes:
    """The bytes of a regular file of at most :data:`MAX_BYTES`, opened without blocking (a FIFO never hangs)."""
    try:
        if path.is_dir():
            path = path / "config.json"
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as e:        # ValueError: a NUL in the name
        raise ValueError(f"config: cannot read {_shown(path)} ({getattr(e, 'strerror', None) or e})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):     # checked on the descriptor: os.fdopen refuses a directory itself
            kind = "a directory, not a config.json file" if stat.S_ISDIR(info.st_mode) else "not a regular file"
            raise ValueError(f"config: {_shown(path)} is {kind}")
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > MAX_BYTES:
            raise ValueError(f"config: {_shown(path)} is {info.st_size:,} bytes; a config.json is at most "
                             f"{MAX_BYTES:,}")
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"config: {_shown(path)} is more than {MAX_BYTES:,} bytes")
    return data


def load_config(config) -> dict:
    """A config dict from a dict, or from a ``config.json`` path (str or Path, a file or its folder)."""
    if isinstance(config, dict):
        return config
    if not isinstance(config, (str, Path)):
        raise TypeError(f"config must be a path to a config.json or a dict, got {type(config).__name__}")
    path = Path(config)
    raw = _read(path)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        kind = " (it looks like UTF-16)" if raw[:2] in (b"\xff\xfe", b"\xfe\xff") else ""
        raise ValueError(f"config: {_shown(path)} is not UTF-8 text{kind}; a config.json is UTF-8 JSON") from None
    if _depth(text) > MAX_DEPTH:
        raise ValueError(f"config: {_shown(path)} nests deeper than {MAX_DEPTH} levels; not a config.json")
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as e:
        reason = "a number too long to be a count" if "int_max_str_digits" in str(e) else " ".join(str(e).split())
        raise ValueError(f"config: {_shown(path)} is not valid JSON ({reason})") from None
    if not isinstance(data, dict):
        raise ValueError(f"config: {_shown(path)} must hold a JSON object")
    return data


def _get(config, key, default=...):
    """A count field (a positive integer), or ``default`` where the field is absent or null (``...``: the
    field is required, a null refused)."""
    value = config.get(key)
    if value is None:
        if default is not ...:
            return default
        state = "missing" if key not in config else "null"
        raise ValueError(f"config: model_type {config.get('model_type')!r} needs {key!r} (a positive integer), "
                         f"which is {state}")
    try:
        return check_count(f"config: {key}", value)
    except TypeError:
        raise ValueError(f"config: {key} must be a positive integer, got {_json(value)}") from None


def _flag(config, key, default):
    """A flag field: JSON ``true`` or ``false`` (a string "false" is not false, nor is 0), or ``default`` if absent.

    0 and 1 are refused as transformers' own typed configs refuse them: since its configs became ``@strict``
    dataclasses (``LlamaConfig``: ``tie_word_embeddings: bool = False``, ``models/llama/configuration_llama.py``
    at 008e5743), ``huggingface_hub``'s ``_validate_simple_type`` (``dataclasses.py`` at 0237ed03) raises "expected
    bool, got int" on loading such a config.json. (Older releases stored the value unchecked,
    ``PretrainedConfig.__init__``: ``kwargs.pop("tie_word_embeddings", True)``, and read it by truth: 0 untied.)"""
    value = config.get(key, default)
    if value is not None and not isinstance(value, bool):
        hint = (" (a number is not a flag: transformers' typed configs refuse it too)"
                if isinstance(value, (int, float)) else "")
        raise ValueError(f"config: {key} must be true or false, got {_json(value)}{hint}")
    return value


def _json(value) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list, str)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _refuse_flag(config, key):
    if _flag(config, key, False):
        raise ValueError(f"config: {key}=true is not supported for model_type {config['model_type']!r}")


def architecture_kwargs(config: dict) -> dict:
    """Keyword arguments of :class:`Architecture` for one config dict."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or model_type not in SUPPORTED:
        raise ValueError(f"config: model_type {_json(model_type)} is not supported; supported: {', '.join(SUPPORTED)}")
    if model_type in _FAMILIES:
        return _normalized(dict(_FAMILIES[model_type](config), model_type=model_type))
    if model_type == "gpt2":
        d = _get(config, "n_embd")
        return _normalized(dict(
            d_model=d, n_layers=_get(config, "n_layer"), n_heads=_get(config, "n_head"),
            d_ff=_get(config, "n_inner", None) or 4 * d, vocab_size=_get(config, "vocab_size"), style="gpt",
            n_positions=_get(config, "n_positions"), model_type=model_type,
            tied_embeddings=_flag(config, "tie_word_embeddings", True)))
    common = dict(d_model=_get(config, "hidden_size"), n_layers=_get(config, "num_hidden_layers"),
                  n_heads=_get(config, "num_attention_heads"), d_ff=_get(config, "intermediate_size"),
                  vocab_size=_get(config, "vocab_size"), model_type=model_type)
    if model_type == "bert":
        if config.get("position_embedding_type", "absolute") not in ("absolute", None):
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
                  tied_embeddings=_flag(config, "tie_word_embeddings", model_type == "gemma"))
    if model_type == "gemma":
        kwargs["tied_embeddings"] = True       # GemmaForCausalLM ties its output layer to the embedding
    if model_type == "qwen2":
        kwargs["qkv_bias"] = True
    if model_type == "mixtral":
        kwargs.update(n_experts=_get(config, "num_local_experts"), top_k=_get(config, "num_experts_per_tok"))
    return _normalized(kwargs)


def _dropout_free(config, *keys) -> bool:
    """Whether every dropout probability ``keys`` of the config (absent: the ``transformers`` default) is 0."""
    for key, default in keys:
        value = config.get(key, default)
        if value is None:
            value = default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
            raise ValueError(f"config: {key} must be a probability in [0, 1), got {_json(value)}")
        if value:
            return False
    return True


def _fraction(config, key, default):
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 1:
        raise ValueError(f"config: {key} must be a number in (0, 1], got {_json(value)}")
    return value


def _gpt_neox(config):
    if not _flag(config, "attention_bias", True):
        raise ValueError("config: attention_bias=false is not supported for model_type 'gpt_neox'")
    return dict(d_model=_get(config, "hidden_size"), n_layers=_get(config, "num_hidden_layers"),
                n_heads=_get(config, "num_attention_heads"), d_ff=_get(config, "intermediate_size"),
                vocab_size=_get(config, "vocab_size"), style="gpt",
                tied_embeddings=_flag(config, "tie_word_embeddings", False),
                parallel=_flag(config, "use_parallel_residual", True),
                rotary_fraction=_fraction(config, "rotary_pct", 0.25),
                no_dropout=_dropout_free(config, ("attention_dropout", 0.0), ("hidden_dropout", 0.0)))


def _phi(config):
    _refuse_flag(config, "qk_layernorm")
    return dict(d_model=_get(config, "hidden_size"), n_layers=_get(config, "num_hidden_layers"),
                n_heads=_get(config, "num_attention_heads"), d_ff=_get(config, "intermediate_size"),
                vocab_size=_get(config, "vocab_size"), style="gpt", n_kv_heads=_get(config, "num_key_value_heads", None),
                tied_embeddings=_flag(config, "tie_word_embeddings", False), parallel=True, shared_norm=True,
                head_bias=True, rotary_fraction=_fraction(config, "partial_rotary_factor", 0.5),
                **_phi_dropout(config))


def _phi_dropout(config) -> dict:
    """Phi's dropout sites (``modeling_phi.py``): ``embed_dropout`` (embd_pdrop) on the embedding,
    ``resid_dropout`` (resid_pdrop) on the attention and MLP branches, and ``attention_dropout`` on the
    probabilities in ``PhiAttention``. ATen's dropout with p == 0 returns its input (``_dropout_impl``,
    ``aten/src/ATen/native/Dropout.cpp``): no mask, no copy. So where resid_pdrop is set but attention_dropout is 0
    (microsoft/phi-2), the blocks drop their residual branches only (``attention_dropout=False``). The embedding's
    dropout is not booked (:mod:`memledger.step.structure` refuses it with learned positions only); Phi-2's is 0."""
    free = _dropout_free(config, ("resid_pdrop", 0.0), ("attention_dropout", 0.0), ("embd_pdrop", 0.0))
    if free or not _dropout_free(config, ("attention_dropout", 0.0)):
        return dict(no_dropout=free)
    return dict(no_dropout=False, attention_dropout=False)


def _bloom(config):
    d = _get(config, "hidden_size", None) or _get(config, "n_embed", None) or 64   # BloomConfig's default 64
    return dict(d_model=d, n_layers=_get(config, "n_layer", None) or _get(config, "num_hidden_layers", 2),
                n_heads=_get(config, "n_head", None) or _get(config, "num_attention_heads", 8), d_ff=4 * d,
                vocab_size=_get(config, "vocab_size"), style="gpt", alibi=True, input_norm=True,
                tied_embeddings=_flag(config, "tie_word_embeddings", True),
                no_dropout=_dropout_free(config, ("hidden_dropout", 0.0), ("attention_dropout", 0.0)))


def _gpt_bigcode(config):
    d = _get(config, "n_embd")
    return dict(d_model=d, n_layers=_get(config, "n_layer"), n_heads=_get(config, "n_head"),
                d_ff=_get(config, "n_inner", None) or 4 * d, vocab_size=_get(config, "vocab_size"), style="gpt",
                n_positions=_get(config, "n_positions"), n_kv_heads=1 if _flag(config, "multi_query", True) else None,
                tied_embeddings=_flag(config, "tie_word_embeddings", True),
                no_dropout=_dropout_free(config, ("attn_pdrop", 0.1), ("resid_pdrop", 0.1), ("embd_pdrop", 0.1)))


def _t5(config):
    projection = config.get("feed_forward_proj", "relu")
    if projection not in ("relu", "gated-gelu", "gated-relu", "gelu", "gated-silu", "silu"):
        raise ValueError(f"config: feed_forward_proj {_json(projection)} is not supported for model_type 't5'")
    d, heads, d_kv = _get(config, "d_model"), _get(config, "num_heads"), _get(config, "d_kv")
    layers = _get(config, "num_layers")
    return dict(d_model=d, n_layers=layers, n_heads=heads, d_ff=_get(config, "d_ff"),
                vocab_size=_get(config, "vocab_size"), style="llama",
                head_size=None if heads * d_kv == d else d_kv, gated=projection.startswith("gated-"),
                n_decoder_layers=_get(config, "num_decoder_layers", layers),
                relative_buckets=_get(config, "relative_attention_num_buckets", 32),
                tied_embeddings=_flag(config, "tie_word_embeddings", True))


#: model_type -> the reader of its config (the five families of issue 16).
_FAMILIES = {"gpt_neox": _gpt_neox, "phi": _phi, "bloom": _bloom, "gpt_bigcode": _gpt_bigcode, "t5": _t5}


def _normalized(kwargs):
    """Leave out what equals the style's default, so a config and a hand preset compare equal."""
    if kwargs.get("n_kv_heads") == kwargs["n_heads"]:
        kwargs["n_kv_heads"] = None
    if kwargs.get("tied_embeddings") == (kwargs["style"] == "gpt"):
        kwargs["tied_embeddings"] = None
    if kwargs.get("gated") == (kwargs["style"] == "llama"):
        kwargs["gated"] = None
    return kwargs


def shipped_configs() -> dict:
    """Preset name -> (config path, Hub repository, description) for the configs in ``configs/``."""
    index = json.loads((CONFIG_DIR / "index.json").read_text(encoding="utf-8"))
    return {name: (CONFIG_DIR / f"{name}.json", entry["repo"], entry["description"])
            for name, entry in index.items() if not name.startswith("_")}
