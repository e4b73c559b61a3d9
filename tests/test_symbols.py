from memledger.symbols import ARGS, FIELDS, NOTATION


def test_notation_is_complete_and_ordered():
    assert len(ARGS) == len(FIELDS) == len(NOTATION)
    assert [str(s) for s in ARGS] == ["B", "S", "d", "H", "L", "F", "V", "P", "N_d", "t", "O"]
    assert all(s.is_integer for s in ARGS)
    assert all(s.is_positive for s in ARGS[:-1]) and ARGS[-1].is_nonnegative
