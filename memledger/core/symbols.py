"""The notation, defined once: SymPy symbols with assumptions, and their meaning.

Every formula in memledger is built from these symbols, and the book's notation
page is rendered from :data:`NOTATION`, so the two cannot drift apart.
Our letters map to Korthikanti et al. (2022) as B,S,d,H,L,V = b,s,h,a,L,v and to
ZeRO (Rajbhandari et al. 2020) as P = Psi, N_d = N_d.
"""
import sympy as sp

__all__ = ["B", "E", "F", "H", "L", "MODEL_NOTATION", "NOTATION", "O", "P", "S", "V", "H_kv", "L_dec", "N_d", "N_pos",
           "N_rb", "N_tt", "d", "d_h", "k", "m", "p", "t", "v"]

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
r = sp.Symbol("r", **_INT)        # LoRA rank (memledger.ledger.lora)
L_dec = sp.Symbol("L_dec", nonnegative=True, integer=True)      # decoder blocks of an encoder-decoder (T5)
N_rb = sp.Symbol("n_relative_buckets", nonnegative=True, integer=True)  # T5's relative-position buckets

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
    (r, "rank", "LoRA rank: lora_A is r x d_in, lora_B is d_out x r (LoraConfig.rank)"),
]

#: (name, LaTeX, meaning) of the letters the chapters write in their prose and no ledger field binds; with
#: :data:`NOTATION` and :data:`MODEL_NOTATION` every symbol of the book (tests/book/test_build.py checks it).
PROSE_NOTATION = [
    ("i", "i", "a pipeline stage's index, from 0 to p - 1"),
    ("n", "n", "a training step's index (the delayed parameter update)"),
    ("c", "c", "a mixture-of-experts layer's capacity factor"),
    ("C", "C", "a GPU's capacity in bytes, as nvidia-smi reports it"),
    ("G", "G", "GPUs per node (DeepSpeed's estimators)"),
    ("N", "N", "GPUs in all, G times the nodes (DeepSpeed's estimators)"),
    ("P_max", r"P_\text{max}", "parameters of the largest module (DeepSpeed's largest_layer_params)"),
    ("S_model", r"S_\text{model}", "accelerate's model size, 4P bytes in FP32"),
    ("d_ff", r"d_\text{ff}", "the MLP width as the article writes it (F)"),
    ("d_in", r"d_\text{in}", "a projection's input width"),
    ("d_out", r"d_\text{out}", "a projection's output width"),
    ("W", "W", "a projection's weight matrix, d_out x d_in"),
    ("Q", "Q", "a block's queries, B x S x d"),
    ("K", "K", "a block's keys, B x S x H_kv d_h"),
    ("w", "w", "one weight (BF16 rounding)"),
    ("Delta", r"\Delta", "an update: w + Delta w"),
    ("x", "x", "a norm's input (x times rstd)"),
    ("Psi", r"\Psi", "the ZeRO paper's parameter count, P"),
]
#: Letters with two meanings, and how the book keeps them apart (the notation page).
TWO_MEANINGS = [
    ("m, v", "in formulas, the pipeline's micro-batches per step and chunks per device (Narayanan et al. 2021); "
             "in the optimizer's rows (\"Adam first moment m\", \"Adam second moment v\"), Adam's two moments, "
             "PyTorch's exp_avg and exp_avg_sq, which no formula names"),
    ("B", "the micro-batch everywhere; the LoRA paper's second matrix is written lora_B, as PEFT names it"),
    ("d", "the hidden size; a subscript names a width (d_h, d_in, d_out, d_ff)"),
]
