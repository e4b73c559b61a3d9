"""Each source erratum recomputed by the library, against the sources' published figures and arithmetic
written out here, and tied to the erratum it recomputes."""
from fractions import Fraction

import pytest

from memledger.calculators import ERRATA
from memledger.calculators.examples import (
    T5_3B,
    T5_EMBEDDING,
    T5_LARGE,
    bert_base_cased,
    bert_base_cased_fp32_bytes,
)
from memledger.calculators.recheck import get_recheck, rechecks

T5_3B_PARAMS = 2_851_598_336       # google-t5/t5-3b, T5Model: the count DeepSpeed's docs print as "2851M"


def figures(key):
    return {name: f.value for name, f in get_recheck(key).figures.items()}


@pytest.mark.slow
def test_every_erratum_has_one_recheck_in_order():
    assert [r.erratum for r in rechecks()] == list(ERRATA)
    assert len({r.key for r in rechecks()}) == len(ERRATA)


def test_examples_are_the_sources_models():
    assert T5_3B == T5_3B_PARAMS and int(T5_3B / 1e6) == 2851          # memory.rst line 27
    assert f"{T5_LARGE / 1e6:.2f}M" == "737.67M" and int(T5_EMBEDDING / 1e6) == 32   # lines 70, 178
    assert bert_base_cased().params == 108_310_272                    # bert-base-cased on the hub
    assert bert_base_cased_fp32_bytes() == 4 * 108_310_272 + 2 * 512 * 8


@pytest.mark.slow
def test_deepspeed_docs():
    f = figures("deepspeed-docs-table")
    assert round(float(f["docs"]), 2) == 15.93                        # memory.rst line 30, "15.93GB"
    assert f["code"] == Fraction(2 * T5_3B_PARAMS + 18 * T5_3B_PARAMS // 8, 2**30)
    f = figures("deepspeed-docs-formula")
    assert f == {"one": 2 + 18, "docs": 4 + Fraction(16, 8), "code": 2 + Fraction(18, 8)}
    assert figures("deepspeed-docs-cpu") == {"code": max(4 * 16, 16), "docs": max(4 * 8, 16)}


@pytest.mark.slow
def test_accelerate_docs():
    f = figures("accelerate-typo")
    assert f == {"fp32": Fraction("413.18"), "fp16": Fraction("206.59")}     # lines 127 and 73
    assert figures("accelerate-int") == {"int8": Fraction("413.18"), "int4": Fraction("206.59")}   # lines 76-77


@pytest.mark.slow
def test_eleuther_cookbook():
    assert figures("eleuther-8bit") == {"master": 4, "moments": 1 + 1, "total": 6}
    assert figures("eleuther-checkpoint") == {"cookbook": 16 * 2 + 2, "full": 2}
    assert figures("eleuther-positions") == {"extra": 4096 * 4096}
    # 7x10^9 parameters, 2 bytes, 64 GPUs with tp = 8, ZeRO-3: the blog's Model Memory / No. GPUs
    assert figures("eleuther-zero3-model") == {"cookbook": 2 * 7 * 10**9 // 8 // 64, "blog": 2 * 7 * 10**9 // 64,
                                               "ledger": 2 * 7 * 10**9 // 64}


def test_transformer_math_blog():
    # '3D Parallelism': Gradient Memory / Pipe-Parallel-Size at pp = 1 against a tensor-parallel rank's shard (tp = 8)
    assert figures("transformer-math-gradients") == {"post": Fraction(2 * 7 * 10**9, 10**9),
                                                     "held": Fraction(2 * 7 * 10**9 // 8, 10**9)}
    # ZeRO-R: the article's 7B under full recomputation keeps one 2-byte B x S x d input per layer
    assert figures("transformer-math-zero-r") == {"kept": 2 * 2048 * 4096 * 32, "over_dp": 2 * 2048 * 4096 * 32 // 8}


def test_megatron():
    assert figures("megatron-no-s2") == {"megatron": 10 + 24, "kept": 34 + Fraction(5 * 32 * 2048, 4096)}
    assert figures("megatron-swiglu") == {"megatron": 18 + Fraction(4 * 11008, 4096),
                                          "kept": 18 + Fraction(8 * 11008, 4096)}


def test_zero_paper():
    f = figures("zero-paper-8gb")
    total = 2 * 12 * 1600 * 32 * 1024 * 48
    assert round(f["total"]) == 60                                    # Sec. 3.2: "about 60 GB"
    assert f["checkpoints"] == Fraction(2 * 32 * 1024 * 1600 * 48, 10**9)
    assert f["with"] == f["checkpoints"] + Fraction(total, 48 * 10**9) < 8


#: key -> figures whose printed number the erratum's record (stated, computed, arithmetic) must contain
IN_RECORD = {"deepspeed-docs-table": ("docs", "code"), "deepspeed-docs-cpu": ("code", "docs"),
             "accelerate-typo": ("fp32", "fp16"), "accelerate-int": ("int8", "int4"),
             "eleuther-8bit": ("total",), "eleuther-checkpoint": ("cookbook", "full"),
             "eleuther-positions": ("extra",), "eleuther-zero3-model": ("cookbook", "blog"),
             "transformer-math-gradients": ("post", "held"), "transformer-math-zero-r": ("kept", "over_dp"),
             "zero-paper-8gb": ("checkpoints", "layer")}


@pytest.mark.parametrize("key", sorted(IN_RECORD))
def test_the_record_says_what_the_library_computes(key):
    recheck = get_recheck(key)
    e = recheck.erratum
    record = " ".join((e.stated, e.computed, e.arithmetic))
    for name in IN_RECORD[key]:
        number = recheck.figures[name].text.split()[0]
        assert number in record, (key, name, number)


def test_shows_is_built_from_the_figures():
    r = get_recheck("deepspeed-docs-table")
    assert r.figures["docs"].text in r.shows and r.figures["code"].text in r.shows


def test_unknown_recheck():
    with pytest.raises(ValueError, match="erratum"):
        get_recheck("nothing")


def test_recheck_table_renders_the_record_and_the_recomputation():
    from memledger.calculators.recheck import recheck_table
    r = get_recheck("zero-paper-8gb")
    rows = dict(recheck_table(r).rows)
    assert rows["the source says"] == "about 8 GB with activation checkpointing"
    assert rows["memledger recomputes"] == r.shows and rows["kind"] == "unstated"
