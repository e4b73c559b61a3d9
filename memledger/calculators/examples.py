"""The sources' own worked examples, as inputs the conventions read.

Each model is counted from its published configuration, not typed as a total:

* T5 (DeepSpeed's ``docs/code-docs/source/memory.rst``: t5-3b on one node of 8
  GPUs, lines 25-97; t5-large on 4 GPUs, lines 165-183), from the Hugging Face
  configs google-t5/t5-3b (d_model 1024, d_kv 128, d_ff 16384, 32 heads,
  24 layers per stack, vocabulary 32128) and google-t5/t5-large (d_kv 64,
  d_ff 4096, 16 heads). ``T5Model``: Q, K, V, O without biases, a ReLU FFN
  ``wi``/``wo``, weight-only LayerNorms, a relative position bias (32 buckets x
  heads) in each stack's first layer, one shared embedding -- the largest
  module DeepSpeed's docs name.
* bert-base-cased (accelerate's ``model_size_estimator.md``, lines 72-77 and
  125-128): bert-base-uncased's architecture with the cased vocabulary of
  28,996; accelerate's fp32 size also counts ``BertModel``'s two int64
  buffers of 512 entries (``position_ids``, ``token_type_ids``).
* GPT-2 1.5B (ZeRO, Rajbhandari et al. 2020, Sec. 3.2): 48 layers, hidden
  1600, sequence 1K, batch 32.
"""
from ..models.presets import get_preset

__all__ = ["BERT_BUFFERS", "BERT_CASED_VOCAB", "T5_3B", "T5_BUCKETS", "T5_EMBEDDING", "T5_LARGE", "T5_VOCAB", "ZERO_GPT2",
           "bert_base_cased", "bert_base_cased_fp32_bytes", "bert_base_cased_largest_fp32_bytes", "t5_params"]

T5_BUCKETS = 32


def t5_params(d_model: int, d_kv: int, d_ff: int, heads: int, layers: int, vocab: int,
              buckets: int = T5_BUCKETS) -> int:
    """``T5Model`` parameters: per stack L x (attention 4 d H d_kv + FFN 2 d d_ff + norms) + the first
    layer's relative bias (buckets x H) + a final norm; the decoder has cross-attention and a third norm;
    plus one shared vocab x d embedding."""
    attention, ffn, norm = 4 * d_model * heads * d_kv, 2 * d_model * d_ff, d_model
    encoder = layers * (attention + ffn + 2 * norm) + buckets * heads + norm
    decoder = layers * (2 * attention + ffn + 3 * norm) + buckets * heads + norm
    return encoder + decoder + vocab * d_model


T5_VOCAB = 32128
T5_3B = t5_params(1024, 128, 16384, 32, 24, T5_VOCAB)
T5_LARGE = t5_params(1024, 64, 4096, 16, 24, T5_VOCAB)
#: The shared embedding: T5's largest module (DeepSpeed's ``largest_layer_params``).
T5_EMBEDDING = T5_VOCAB * 1024

BERT_CASED_VOCAB = 28996
BERT_BUFFERS = (("position_ids", 512, 8), ("token_type_ids", 512, 8))     # (name, entries, bytes each)


def bert_base_cased():
    """bert-base-cased: the bert-base-uncased preset with the cased vocabulary."""
    return get_preset("bert-base-uncased").with_changes(vocab_size=BERT_CASED_VOCAB,
                                                        description="bert-base-cased")


def bert_base_cased_fp32_bytes() -> int:
    """What ``accelerate estimate-memory`` sizes in float32: 4 bytes per parameter plus the int64 buffers."""
    return 4 * bert_base_cased().params + sum(n * size for _, n, size in BERT_BUFFERS)


def bert_base_cased_largest_fp32_bytes() -> int:
    """The largest layer accelerate reports: the word embeddings, vocab x hidden in fp32."""
    arch = bert_base_cased()
    return 4 * arch.vocab_size * arch.d_model


#: ZeRO Sec. 3.2's activation example: the 1.5B GPT-2 at sequence 1K and batch 32.
ZERO_GPT2 = {"d": 1600, "L": 48, "S": 1024, "B": 32}
