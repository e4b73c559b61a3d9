"""The notation, defined once: SymPy symbols with assumptions, and their meaning.

Every formula in memledger is built from these symbols, and the book's notation
page is rendered from :data:`NOTATION`, so the two cannot drift apart.
Our letters map to Korthikanti et al. (2022) as B,S,d,H,L,V = b,s,h,a,L,v and to
ZeRO (Rajbhandari et al. 2020) as P = Psi, N_d = N_d.
"""
import sympy as sp

__all__ = ["B", "E", "F", "H", "L", "MODEL_NOTATION", "NOTATION", "O", "P", "S", "V", "H_kv", "N_d", "N_pos", "N_tt", "d",
           "d_h", "k", "m", "p", "t", "v"]

_INT = dict(positive=True, integer=True)

B = sp.Symbol("B", **_INT)        # micro-batch size (sequences per GPU per step)
S = sp.Symbol("S", **_INT)        # sequence length (tokens)
d = sp.Symbol("d", **_INT)        # hidden size (d_model)
H = sp.Symbol("H", **_INT)        # attention heads
L = sp.Symbol("L", **_INT)        # transformer layers
F = sp.Symbol("F", **_INT)        # MLP intermediate size (d_ff)
V = sp.Symbol("V", **_INT)        # vocabulary size
P = sp.Symbol("P", **_INT)        # parameter count
N_d = sp.Symbol("N_d", **_INT)    # data-parallel degree (ZeRO shards over it)
t = sp.Symbol("t", **_INT)        # tensor-parallel degree
O = sp.Symbol("O", nonnegative=True, integer=True)  # runtime overhead, bytes

#: (symbol, config field, meaning) -- the notation page of the book.
NOTATION = [
    (B, "batch_size", "micro-batch size: sequences per GPU per step"),
    (S, "seq_len", "sequence length in tokens"),
    (d, "d_model", "hidden size"),
    (H, "n_heads", "attention heads; head size d/H"),
    (L, "n_layers", "transformer blocks"),
    (F, "d_ff", "MLP intermediate size (4d in GPT, 11008 in LLaMA-2 7B)"),
    (V, "vocab_size", "vocabulary size"),
    (P, "n_params", "parameter count"),
    (N_d, "dp", "data-parallel degree: GPUs that ZeRO shards model states over"),
    (t, "tp", "tensor-parallel degree (Megatron-LM)"),
    (O, "overhead_bytes", "runtime overhead: CUDA context, cuBLAS/NCCL workspace"),
]

# Shapes of real checkpoints (memledger.models.architecture, from their config.json) and
# pipeline schedules (memledger.answers.pipeline). Not in NOTATION's ledger fields: the
# ledger binds them only where a structure uses them.
H_kv = sp.Symbol("H_kv", **_INT)  # key/value heads (grouped-query attention; = H for multi-head)
d_h = sp.Symbol("d_h", **_INT)    # head size where a config gives it (Gemma-7B: 256 != d/H)
E = sp.Symbol("E", **_INT)        # experts per MoE layer (Mixtral: 8)
k = sp.Symbol("k", **_INT)        # experts each token is routed to (top-k; Mixtral: 2)
p = sp.Symbol("p", **_INT)        # pipeline stages
m = sp.Symbol("m", **_INT)        # micro-batches per step (per pipeline)
v = sp.Symbol("v", **_INT)        # model chunks per device (interleaved schedule)
N_pos = sp.Symbol("n_positions", nonnegative=True, integer=True)    # learned position embeddings
N_tt = sp.Symbol("n_token_types", nonnegative=True, integer=True)   # token-type (segment) embeddings

#: (symbol, field, meaning) for the symbols above, for the notation page.
MODEL_NOTATION = [
    (H_kv, "n_kv_heads", "key/value heads (grouped-query attention); H for multi-head, 1 for multi-query"),
    (d_h, "head_dim", "head size, where it is not d/H (Gemma-7B)"),
    (E, "n_experts", "experts per mixture-of-experts layer"),
    (k, "top_k", "experts each token is routed to"),
    (p, "pp", "pipeline-parallel stages"),
    (m, "microbatches", "micro-batches per step"),
    (v, "interleave", "model chunks per device in the interleaved pipeline schedule"),
    (N_pos, "n_positions", "rows of a learned position embedding (GPT-2 1024, BERT 512)"),
    (N_tt, "n_token_types", "rows of BERT's token-type embedding (2)"),
]
