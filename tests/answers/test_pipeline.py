"""Pipeline parallelism against Korthikanti et al. 2022 (Sec. 4.2.3, 4.3), Megatron-LM's
schedules and theoretical_memory_usage.py, and Narayanan et al. 2021 (the bubble)."""
import pytest
import sympy as sp

from memledger.activations.inventory import inventory, per_layer_bytes
from memledger.models.presets import get_preset
from memledger.answers.pipeline import (bubble_fraction, in_flight_chunks, layers_in_flight, output_rows,
                                schedule_summary, stage_activation_specs, stage_ledgers, stage_param_parts,
                                stage_params)
from memledger.ledger.ledger import Ledger
from memledger.core.symbols import B, F, H, L, S, V, d, m, p, v

EQ1 = S * B * d * (34 + 5 * H * S / d)          # Korthikanti Eq. 1, per layer


def first_stage_layers(specs):
    return specs[0][1]


def test_1f1b_first_stage_holds_L_layers_whatever_p():
    # Korthikanti Sec. 4.2.3: the first stage stores p micro-batches of L/p layers = L layers' worth
    specs = stage_activation_specs(EQ1, L, p, m, 1, 0)
    assert sp.simplify(first_stage_layers(specs) - L * EQ1) == 0


@pytest.mark.slow
def test_interleaved_first_stage_factor():
    # Korthikanti Sec. 4.2.3: interleaving with v chunks multiplies it by 1 + (p - 1)/(p v)
    specs = stage_activation_specs(EQ1, L, p, m, v, 0)
    assert sp.simplify(first_stage_layers(specs) - L * EQ1 * (1 + (p - 1) / (p * v))) == 0


def test_embedding_dropout_is_sbhp():
    # Korthikanti Sec. 4.3: embedding dropout sbhp (1-byte mask, p micro-batches in flight)
    specs = dict(stage_activation_specs(EQ1, L, p, m, 1, 0))
    mask = next(expr for name, expr in specs.items() if name.startswith("embedding dropout mask"))
    assert sp.simplify(mask - S * B * d * p) == 0
    ids = next(expr for name, expr in specs.items() if name.startswith("input token ids"))
    assert sp.simplify(ids - 8 * S * B * p) == 0       # Megatron-LM: 8 * seq * micro_batch * pp


@pytest.mark.slow
def test_output_layer_terms():
    # Korthikanti Sec. 4.3 / Megatron-LM: final norm, output-layer input and fp32 logits = 4sbh(1 + v/h)
    total = sum(r.bytes for r in output_rows("llama"))
    assert sp.simplify(total - 4 * S * B * d * (1 + V / d)) == 0


def test_megatron_discount_when_fewer_microbatches_than_stages():
    # theoretical_memory_usage.py: activation_memory *= min(1, num_microbatches / pp)
    for p_, m_ in ((4, 2), (4, 4), (4, 9), (8, 3)):
        assert layers_in_flight(32, p_, m_) == 32 * min(1, sp.Rational(m_, p_))


def test_interleaved_numbers_match_the_penalty():
    # Megatron-LM: interleaved_schedule_memory_penalty = 1 + (pp - 1)/(pp * vpp)
    for p_, m_, v_ in ((4, 8, 2), (8, 16, 4), (2, 4, 3)):
        assert layers_in_flight(48, p_, m_, v_) == 48 * (1 + sp.Rational(p_ - 1, p_ * v_))
    assert in_flight_chunks(4, 4, 2) == 8          # m == p: every chunk-forward runs before a backward


def test_last_stage_holds_one_microbatch():
    assert in_flight_chunks(4, 8, 1, rank=3) == 1
    assert layers_in_flight(32, 4, 8, 1, rank=3) == 8


def test_bubble():
    # Narayanan et al. 2021, Sec. 2.2.1 and 2.2.2
    assert bubble_fraction(4, 8) == sp.Rational(3, 8)
    assert bubble_fraction(4, 8, 2) == sp.Rational(3, 16)
    assert sp.simplify(bubble_fraction(p, m, v) - (p - 1) / (v * m)) == 0
    assert schedule_summary(1, 1)["bubble_fraction"] == 0


def test_stage_params_add_up():
    llama = get_preset("llama2-7b")                 # untied: the stages partition the model
    for p_ in (1, 2, 4, 8):
        assert sum(stage_params(llama, p_, s) for s in range(p_)) == llama.computed_params
    gpt2 = get_preset("gpt2")                       # tied: the last stage keeps its own copy of V x d
    assert sum(stage_params(gpt2, 4, s) for s in range(4)) == gpt2.computed_params + 50257 * 768
    assert stage_params(gpt2, 1, 0) == gpt2.computed_params
    first, last = stage_param_parts(llama, 4, 0), stage_param_parts(llama, 4, 3)
    assert first["embeddings"] == last["embeddings"] == 32000 * 4096


def test_concrete_first_stage_equals_article_layers():
    # article-7b, 1F1B over 4 stages, 8 micro-batches: the first stage holds all 32 layers' worth
    rows = inventory()
    layer = per_layer_bytes(rows).subs({F: 4 * d})
    specs = stage_activation_specs(layer, 32, 4, 8, 1, 0)
    assert specs[0][1] == 32 * layer


@pytest.mark.parametrize("args, message", [
    ((EQ1, 32, 0, 8), "pp must be a positive integer"),
    ((EQ1, 32, 3, 8), r"pp x interleave \(3 x 1\) must divide"),
    ((EQ1, 32, 4, 2, 2), "microbatches >= pp"),
    ((EQ1, 32, 1, 2, 2), "needs pipeline parallelism"),
])
def test_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        stage_activation_specs(*args)
    with pytest.raises(ValueError, match="stage must be"):
        stage_param_parts(get_preset("gpt2"), 4, 4)


@pytest.mark.parametrize("tp, sp_", [(1, False), (8, False), (8, True), (4, True)])
def test_last_stage_splits_the_output_rows_as_korthikanti(tp, sp_):
    """Korthikanti et al. 2022, Sec. 4.3, per tensor-parallel rank: the final norm's input and the output layer's
    input 2sbh/t under sequence parallelism (2sbh without it), the FP32 logits 4sbv/t under any tensor
    parallelism; the ledger's rows outside the blocks say the same (megatron-22b, b = 4, s = 2048)."""
    s, b, h, v = 2048, 4, 6144, 51200
    ledger = Ledger("megatron-22b", batch_size=b, seq_len=s, tp=tp, sequence_parallel=sp_)
    last = stage_ledgers(ledger, 1, 1)[-1]["rows"]
    assert last.bytes_of("final norm input") == last.bytes_of("output layer input") == 2 * s * b * h // (tp if sp_ else 1)
    assert last.bytes_of("logits (fp32)") == 4 * s * b * v // tp
    assert ledger.rows.bytes_of("final LayerNorm input") == last.bytes_of("final norm input")
    assert ledger.rows.bytes_of("LM head input") == last.bytes_of("output layer input")
    assert ledger.rows.bytes_of("log-softmax output (FP32)") == last.bytes_of("logits (fp32)")


@pytest.mark.parametrize("tp, sp_", [(1, False), (8, False), (8, True), (4, True)])
def test_first_stage_splits_the_embedding_dropout_mask_under_sequence_parallelism(tp, sp_):
    """Megatron-LM scatters the embedding's output to the rank's S/t positions before its dropout under
    sequence parallelism (language_model_embedding.py, ``scatter_to_sequence_parallel_region``): the 1-byte
    mask is sbh/t there, sbh without it; the int64 ids are whole on every rank."""
    specs = dict(stage_activation_specs(0, 4, 1, 1, 1, 0, "gpt", True, tp, sp_))
    assert specs["embedding dropout mask x 1 micro-batches"] == B * S * d / (tp if sp_ else 1)
    assert specs["input token ids x 1 micro-batches"] == 8 * B * S


def _in_flight(ops, rank):
    """The most chunk-forwards stage ``rank`` has run without their backward, at any moment."""
    events = sorted((start, kind == "B", kind) for r, kind, _, _, start, _ in ops if r == rank)
    held = most = 0
    for _, _, kind in events:
        held += 1 if kind == "F" else -1
        most = max(most, held)
    return most


@pytest.mark.parametrize("p, m, v", [(4, 8, 1), (8, 32, 1), (8, 4, 1), (2, 3, 1), (4, 8, 2), (8, 32, 2), (4, 4, 2),
                                     (4, 12, 3)])
def test_running_the_schedules_gives_narayanans_bubble_and_the_in_flight_counts(p, m, v):
    """Megatron-LM's op orders run against each other with their dependencies (forward 1, backward 2 per
    micro-batch): the idle time over the ideal m(f + b) is (p - 1)/(vm) (Narayanan et al. 2021, Sec. 2.2),
    and stage r holds at most p - r (1F1B) or 2(p - r - 1) + (v - 1)p + 1 chunks (Korthikanti Sec. 4.2.3)."""
    from fractions import Fraction
    from memledger.answers.pipeline import rank_order, run_schedule
    ops = run_schedule(p, m, v)
    end = max(e for *_, e in ops)
    assert Fraction(str(end)) / (3 * m) - 1 == Fraction(p - 1, v * m)
    for r in range(p):
        expected = min(p - r, m) if v == 1 else (m * v if m == p else min(2 * (p - r - 1) + (v - 1) * p + 1, m * v))
        assert _in_flight(ops, r) == expected
        order = rank_order(p, m, v, r)
        assert sorted(order) == sorted({(k, mb, c) for k in "FB" for mb in range(m) for c in range(v)})
