from memledger.ledger.ledger import FIELD_OF
from memledger.core.symbols import NOTATION


def test_notation_names_the_ledger_fields():
    # the ledger maps symbol names to its fields without importing SymPy; the notation page must agree
    assert {str(s): field for s, field, _ in NOTATION} == FIELD_OF


def test_symbols_are_integers():
    assert all(s.is_integer for s, _, _ in NOTATION)
    assert all(s.is_positive for s, field, _ in NOTATION if field != "overhead_bytes")
