"""Pipeline parallelism: what each stage holds, how many micro-batches are in flight, the bubble.

p stages each hold L/p blocks; the first also holds the embeddings, the last
the final norm and the output layer (Megatron-LM keeps a copy of a tied word
embedding on the last stage for the output layer, so a tied V x d matrix sits
on both). Activations are held per micro-batch in flight. The schedules are
Megatron-LM's (``megatron/core/pipeline_parallel/schedules.py``):

* 1F1B (``forward_backward_pipelining_without_interleaving``): stage r runs
  min(p - r - 1, m) warm-up forwards and one more before its first
  backward, so min(p - r, m) micro-batches of L/p blocks are in flight. The
  first stage holds min(p, m)*L/p layers' worth: L layers' worth whatever p
  once m >= p (Korthikanti et al. 2022, Sec. 4.2.3).
* interleaved, v model chunks of L/(pv) blocks per device
  (``forward_backward_pipelining_with_interleaving``): rank r runs
  2(p - r - 1) + (v - 1)p warm-up chunk-forwards (all m*v if m == p) and one
  more, capped at m*v. For the first stage that is vp + p - 1 chunks of
  L/(pv) blocks = L(1 + (p - 1)/(pv)) layers' worth: Korthikanti's factor.

Outside the blocks (Korthikanti Sec. 4.3; Megatron-LM's
``theoretical_memory_usage.compute_activation_memory``): the token ids (int64)
and the embedding dropout mask per micro-batch in flight on the first stage
(p of them: "sbhp"); on the last stage the final norm's input, the output
layer's input and the fp32 logits, 4sbh(1 + v/h) (BERT: the pooler instead).
Bubble: (p - 1)/m of the ideal step time, (p - 1)/(vm) interleaved
(Narayanan et al. 2021, Sec. 2.2).

:func:`rank_order` writes out the order in which a rank runs its chunk-forwards
and chunk-backwards (warm-up, one forward one backward, cool-down), and
:func:`run_schedule` runs those orders against each other with their
dependencies, which is what the schedules' figure draws; the in-flight counts
and the bubble above follow from it (``tests/answers/test_pipeline.py``).
"""
import sympy as sp

from ..activations.inventory import Saved
from ..models.parameters import Features, block_parts, norm_params
from ..core.rows import Row, Rows
from ..core.symbols import B, S, V, d, t

__all__ = ["bubble_fraction", "embedding_rows", "in_flight_chunks", "layers_in_flight", "microbatches_in_flight",
           "output_rows", "schedule_summary", "stage_activation_specs", "stage_ledgers", "stage_param_parts",
           "stage_params"]

def _check(p, m, v, n_layers=None):
    if any(isinstance(x, sp.Basic) for x in (p, m, v, n_layers)):
        return                                    # symbolic: the paper's formulas, m >= p assumed
    for name, value in (("pp", p), ("microbatches", m), ("interleave", v)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if n_layers is not None and n_layers % (p * v):
        raise ValueError(f"pp x interleave ({p} x {v}) must divide the number of layers ({n_layers})")
    if v > 1 and p == 1:
        raise ValueError("interleave > 1 needs pipeline parallelism (pp > 1)")
    if v > 1 and m < p:
        raise ValueError(f"the interleaved schedule needs microbatches >= pp ({m} < {p})")


def in_flight_chunks(p, m, v=1, rank=0):
    """Chunk-forwards whose activations stage ``rank`` holds at once (Megatron-LM's warm-up + 1).

    Works on ints and on SymPy symbols (then assuming m >= p, the case the
    paper treats): 1F1B p - rank, interleaved 2(p - rank - 1) + (v - 1)p + 1.
    """
    symbolic = any(isinstance(x, sp.Basic) for x in (p, m, v, rank))
    if v == 1:
        return p - rank if symbolic else min(p - rank, m)
    if symbolic:
        return 2 * (p - rank - 1) + (v - 1) * p + 1
    if m == p:
        return m * v
    return min(2 * (p - rank - 1) + (v - 1) * p + 1, m * v)


def layers_in_flight(n_layers, p, m, v=1, rank=0):
    """Layers' worth of activations stage ``rank`` holds: in-flight chunks x L/(pv)."""
    return in_flight_chunks(p, m, v, rank) * sp.Integer(1) * n_layers / (p * v)


def microbatches_in_flight(p, m, v=1, rank=0):
    """Whole micro-batches whose embedding (first stage) activations are held: the
    chunk count over v, rounded up (Megatron-LM scales them by the same factor)."""
    chunks = in_flight_chunks(p, m, v, rank)
    return chunks if v == 1 else (sp.ceiling(chunks / v) if isinstance(chunks, sp.Basic) else -(-chunks // v))


def bubble_fraction(p, m, v=1):
    """Pipeline bubble over ideal compute time: (p - 1)/(v m) (Narayanan et al. 2021, Sec. 2.2)."""
    return sp.Rational(p - 1, v * m) if isinstance(p * m * v, int) else (p - 1) / (v * m)


def embedding_rows(features="gpt", dropout=True) -> list:
    """Saved per micro-batch by the input embedding (first stage). The ids are replicated on every
    tensor-parallel rank; under sequence parallelism Megatron-LM scatters the embedding's output to S/t
    before its dropout (``scatter_to_sequence_parallel_region`` in ``LanguageModelEmbedding.forward``,
    megatron/core/models/common/embeddings/language_model_embedding.py), so the mask is split
    (:meth:`~memledger.activations.inventory.Saved.rank_bytes`)."""
    f = Features.of(features)
    rows = [Saved("input token ids", "the embedding's backward scatters into the rows these ids name",
                  (B, S), "int64", block="embedding", replicated=True)]
    if f.embedding_norm:
        rows.append(Saved("embedding LayerNorm input", "LayerNorm backward needs its input", (B, S, d),
                          block="embedding"))
    if dropout:
        rows.append(Saved("embedding dropout mask", "dropout backward needs the mask", (B, S, d), "bool",
                          block="embedding", dropout=True))
    return rows


def output_rows(features="gpt") -> list:
    """Saved per micro-batch by the final norm and output layer (last stage): 4BSd(1 + V/d)
    (Korthikanti Sec. 4.3), or BERT's pooler on the first token."""
    f = Features.of(features)
    if f.pooler:
        return [Saved("pooler input (first token)", "the pooler's weight gradient needs its input", (B, d),
                      block="output"),
                Saved("pooler tanh output", "tanh backward needs its output", (B, d), block="output")]
    return [Saved("final norm input", "the norm's backward needs its input", (B, S, d), block="output"),
            Saved("output layer input", "the output layer's weight gradient needs its input", (B, S, d),
                  block="output"),
            Saved("logits (fp32)", "the cross-entropy backward needs the logits, kept in fp32", (B, S, V), "fp32",
                  block="output", tp_sharded=True)]


def stage_param_parts(arch, p, stage) -> dict:
    """Parameters on pipeline stage ``stage`` (0-based) of ``p``, by part, as exact ints."""
    _check(p, 1, 1, arch.n_layers)
    if not 0 <= stage < p:
        raise ValueError(f"stage must be between 0 and pp - 1 ({p - 1}), got {stage!r}")
    f = arch.features
    share = {name: arch.evaluate(expr) * (arch.n_layers // p) for name, expr in block_parts(f).items()}
    word = arch.vocab_size * arch.d_model
    if stage == 0:
        share["embeddings"] = word + (arch.n_positions + arch.n_token_types) * arch.d_model
        if f.embedding_norm:
            share["norms"] += arch.evaluate(norm_params(f))
    if stage == p - 1:
        if not f.embedding_norm:
            share["norms"] += arch.evaluate(norm_params(f))
        if f.pooler:
            share["pooler"] = arch.d_model**2 + arch.d_model
        elif not f.is_tied or p > 1:         # untied output layer, or the last stage's copy of the tied one
            share["embeddings"] = share.get("embeddings", 0) + word
    return share


def stage_params(arch, p, stage) -> int:
    """Total parameters on one stage; summed over stages this is the model (plus a tied copy)."""
    return sum(stage_param_parts(arch, p, stage).values())


def stage_activation_specs(layer_expr, n_layers, p, m, v=1, stage=0, features="gpt", dropout=True, tp=1,
                           sequence_parallel=False):
    """(name, bytes expression) of the activations stage ``stage`` holds at its peak.

    ``layer_expr``: one layer's saved bytes (:func:`memledger.activations.inventory.per_layer_bytes`).
    The embedding rows ride with the first stage's in-flight micro-batches, the
    output rows with the last stage's one, split over ``tp`` ranks as the ledger splits them
    (:meth:`~memledger.activations.inventory.Saved.rank_bytes`: the FP32 logits are vocabulary-parallel under any
    tensor parallelism, the final norm's and the output layer's inputs only under ``sequence_parallel``;
    Korthikanti et al. 2022, Sec. 4.3).
    """
    _check(p, m, v, n_layers)
    specs = [(f"activations ({layers_in_flight(n_layers, p, m, v, stage)} layers' worth in flight)",
              layers_in_flight(n_layers, p, m, v, stage) * layer_expr)]
    if stage == 0:
        n = microbatches_in_flight(p, m, v, 0)
        specs += [(f"{r.name} x {n} micro-batches", n * r.rank_bytes(tp > 1, sequence_parallel).subs(t, tp))
                  for r in embedding_rows(features, dropout)]
    if stage == p - 1:
        specs += [(r.name, r.rank_bytes(tp > 1, sequence_parallel).subs(t, tp)) for r in output_rows(features)]
    return specs


def schedule_summary(p, m, v=1) -> dict:
    """The schedule's numbers: in-flight chunks on the first and last stage, and the bubble."""
    _check(p, m, v)
    return {"pp": p, "microbatches": m, "interleave": v,
            "first_stage_in_flight_chunks": in_flight_chunks(p, m, v, 0),
            "last_stage_in_flight_chunks": in_flight_chunks(p, m, v, p - 1),
            "bubble_fraction": float(bubble_fraction(p, m, v)),
            "bubble_fraction_exact": str(bubble_fraction(p, m, v))}



def stage_ledgers(ledger, p, m, v=1) -> list:
    """The first and last stage of ``ledger``'s setup split into ``p`` stages: for each,
    {"stage", "n_params", "rows": :class:`~memledger.core.rows.Rows`, "totals"}.

    Model states are the ledger's for the stage's parameters (same recipe,
    ZeRO stage, dp, offload); activations are :func:`stage_activation_specs`
    at the ledger's per-layer inventory (its recompute, tp and sequence-parallel choices).
    """
    from dataclasses import replace
    from ..core.symbols import L
    if ledger.arch is None:
        raise ValueError("pipeline parallelism needs an architecture (layers to split), not --params alone")
    _check(p, m, v, ledger.arch.n_layers)
    arch = ledger.arch
    activations = next(r for r in ledger.rows if r.group == "activations")
    per_layer = activations.expr / L
    stages = []
    for stage in sorted({0, p - 1}):
        n_params = stage_params(arch, p, stage)
        base = replace(ledger, n_params=n_params)
        specs = stage_activation_specs(per_layer, arch.n_layers, p, m, v, stage, arch.features, ledger.dropout,
                                       ledger.tp, ledger.sequence_parallel)
        rows = Rows([r for r in base.rows if r.group != "activations"] +
                    [Row(name, "activations", "gpu", ledger.evaluate(expr), formula=str(expr)) for name, expr in specs])
        stages.append({"stage": stage, "n_params": n_params, "rows": rows, "totals": rows.totals})
    return stages


def rank_order(p: int, m: int, v: int = 1, rank: int = 0) -> list:
    """The ops of stage ``rank`` in the order Megatron-LM runs them: ("F" or "B", micro-batch, chunk).

    Warm-up: :func:`in_flight_chunks` - 1 chunk-forwards; then one forward, one backward; then the
    remaining backwards. The k-th chunk-forward of the interleaved schedule is micro-batch
    (k // pv) p + k % p of chunk (k // p) % v, its k-th backward the same micro-batch of chunk
    v - 1 - (k // p) % v (``get_model_chunk_id`` in ``schedules.py``).
    """
    _check(p, m, v)
    total = m * v
    warmup = in_flight_chunks(p, m, v, rank) - 1

    def op(kind, k):
        chunk = (k // p) % v if v > 1 else 0
        micro = (k // (p * v)) * p + k % p if v > 1 else k
        return (kind, micro, chunk if kind == "F" else v - 1 - chunk)
    order = [op("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [op("F", warmup + i), op("B", i)]
    return order + [op("B", k) for k in range(total - warmup, total)]


def run_schedule(p: int, m: int, v: int = 1, forward=1, backward=2) -> list:
    """Every stage's ops with their times: [(rank, "F"/"B", micro-batch, chunk, start, end)].

    A chunk-forward takes ``forward / v``, a chunk-backward ``backward / v`` (a chunk holds L/(pv) blocks);
    a forward waits for the same micro-batch's forward on the stage before (chunk c - 1 of the last stage
    for stage 0), a backward for the stage after (chunk c + 1 of stage 0 for the last stage), and each
    stage runs its :func:`rank_order` one op at a time.
    """
    orders = [rank_order(p, m, v, r) for r in range(p)]
    f, b = sp.Rational(forward) / v, sp.Rational(backward) / v
    done, clock, nxt, out = {}, [sp.Integer(0)] * p, [0] * p, []

    def needs(rank, kind, micro, chunk):
        if kind == "F":
            return ("F", micro, chunk, rank - 1) if rank else (("F", micro, chunk - 1, p - 1) if chunk else None)
        if rank < p - 1:
            return ("B", micro, chunk, rank + 1)
        return ("B", micro, chunk + 1, 0) if chunk < v - 1 else ("F", micro, chunk, rank)
    while any(n < len(o) for n, o in zip(nxt, orders)):
        moved = False
        for rank in range(p):
            if nxt[rank] == len(orders[rank]):
                continue
            kind, micro, chunk = orders[rank][nxt[rank]]
            need = needs(rank, kind, micro, chunk)
            if need is not None and need not in done:
                continue
            start = max(clock[rank], done[need] if need else 0)
            end = start + (f if kind == "F" else b)
            done[(kind, micro, chunk, rank)] = clock[rank] = end
            out.append((rank, kind, micro, chunk, start, end))
            nxt[rank] += 1
            moved = True
        if not moved:
            raise RuntimeError("the schedule deadlocked")     # cannot happen for Megatron's orders
    return out
