from fractions import Fraction

import pytest

from memledger.core.units import format_bytes, in_unit, parse_bytes, parse_count, unit_size


def test_decimal_and_binary_units_are_distinct():
    assert unit_size("GB") == 10**9 and unit_size("GiB") == 2**30
    assert unit_size("MB") == 10**6 and unit_size("MiB") == 2**20


def test_article_tensor_mb_are_mib():
    # the article's "16 MB" for one B x S x d BF16 tensor at S=2048, d=4096
    assert in_unit(2048 * 4096 * 2, "MiB") == 16
    assert in_unit(2048 * 4096 * 2, "MB") != 16


def test_in_unit_is_exact():
    assert in_unit(536_870_912, "GiB") == Fraction(1, 2)


def test_format_always_prints_unit():
    assert format_bytes(30_601_641_984) == "30.60 GB"
    assert format_bytes(2**29, "GiB", 1) == "0.5 GiB"


@pytest.mark.parametrize("text, expected", [("2GB", 2 * 10**9), ("2e9", 2 * 10**9), ("1.5 GiB", 3 * 2**29),
                                            ("0", 0), ("2gb", 2 * 10**9), ("12", 12)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["x", "-1", "1.5", "2 parsecs", "", "nan", "1e99"])
def test_parse_bytes_rejects(text):
    with pytest.raises(ValueError, match="overhead"):
        parse_bytes(text, "overhead")


@pytest.mark.parametrize("text", ["0", "-3", "1.5", "abc", "7B", "1e99999", "inf"])
def test_parse_count_rejects(text):
    with pytest.raises(ValueError, match="n_params must be a positive integer"):
        parse_count(text, "n_params")


def test_parse_count_accepts_scientific():
    assert parse_count("7e9", "n") == 7 * 10**9


def test_unknown_unit():
    with pytest.raises(ValueError, match="unknown unit"):
        unit_size("parsec")
