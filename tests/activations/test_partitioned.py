"""``compile`` (the blocks under torch.compile) in the ledger and on the command line: what it refuses, in one
line. What the partitioner saves is measured in tests/pytorch/test_compiled.py."""
import json

import pytest

from memledger.cli.main import main
from memledger.ledger.ledger import Ledger

LLAMA = ["--hidden", "64", "--layers", "2", "--heads", "4", "--style", "llama", "--vocab", "128"]


def run(capsys, *args):
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("changes, words", [
    (dict(recompute="full"), "recompute full"), (dict(recompute="selective"), "recompute selective"),
    (dict(tp=2), "tensor parallelism"), (dict(arch="mixtral-8x7b"), "mixture of experts"),
    (dict(arch="gemma-7b"), "head size"), (dict(n_params=7_000_000_000, arch=None), "architecture")])
def test_ledger_refuses_what_was_not_measured(changes, words):
    fields = dict(arch="llama2-7b", compile=True) | changes
    with pytest.raises(ValueError, match="compile") as e:
        Ledger(**fields)
    assert words in str(e.value)


def test_compile_must_be_a_flag():
    with pytest.raises(TypeError, match="compile"):
        Ledger("llama2-7b", compile="yes")


def test_the_step_refuses_compile_and_the_ledger_judges_by_the_sum():
    ledger = Ledger("llama2-7b", compile=True)
    assert ledger.peak is None
    with pytest.raises(ValueError, match="compile: the step timeline does not model"):
        ledger.step()


def test_cli(capsys):
    code, out, err = run(capsys, "ledger", *LLAMA, "--compile", "--json")
    assert code == 0 and json.loads(out)["inputs"]["compile"] is True
    for args in (["step", *LLAMA, "--compile"], ["ledger", "--params", "7e9", "--compile"],
                 ["ledger", *LLAMA, "--compile", "--recompute", "full"]):
        code, out, err = run(capsys, *args)
        assert code == 2 and not out and len(err.strip().splitlines()) == 1 and "compile" in err, args
