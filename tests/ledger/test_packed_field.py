"""Ledger(packed=n): a field at the end, 0 by default (today's numbers), checked in one line naming it."""
import pytest

from memledger.ledger.ledger import Ledger


def test_default_keeps_todays_rows():
    assert Ledger("llama2-7b", seq_len=4096).packed == 0
    assert Ledger("llama2-7b", seq_len=4096, packed=4).totals == Ledger("llama2-7b", seq_len=4096).totals


@pytest.mark.parametrize("kwargs,words", [
    ({"packed": -1}, "packed must be a whole number"), ({"packed": 1.5}, "packed must be a whole number"),
    ({"packed": True}, "packed must be a whole number"), ({"packed": 3}, r"seq_len \(4096\) must be a multiple"),
    ({"arch": None, "n_params": 7 * 10**9, "packed": 2}, "give an architecture")])
def test_bad_packed_is_one_value_error(kwargs, words):
    with pytest.raises(ValueError, match=words):
        Ledger(**{"arch": "llama2-7b", "seq_len": 4096, **kwargs})
