"""--packed N on the command line: read by memledger step (cpu, cuda, article), refused in one line elsewhere."""
import json

import pytest

from memledger.ledger.ledger import Ledger
from clicheck import run

MODEL = ("--preset", "llama2-7b", "--seq", "4096", "--overhead", "0")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "cuda", "article"])
def test_step_reads_packed(capsys, backend):
    code, out, err = run(capsys, "step", *MODEL, "--packed", "4", "--backend", backend, "--json")
    assert code == 0 and err == ""
    ledger = Ledger("llama2-7b", seq_len=4096, overhead_bytes=0, packed=4)
    assert json.loads(out)["peak"]["gpu"] == ledger.step(backend).peak.bytes
    assert json.loads(out)["peak"]["gpu"] != Ledger("llama2-7b", seq_len=4096, overhead_bytes=0).step(backend).peak.bytes


@pytest.mark.parametrize("args,words", [
    (("step", *MODEL, "--packed", "4", "--backend", "cpu", "--tp", "2"), "not for tensor parallelism"),
    (("step", *MODEL, "--packed", "3", "--backend", "cpu"), "must be a multiple of packed"),
    (("step", *MODEL, "--packed", "0", "--backend", "cpu"), "packed"),
    (("ledger", *MODEL, "--packed", "4"), "does not read --packed"),
    (("compare", *MODEL, "--packed", "4"), "does not read --packed"),
    (("fit", *MODEL, "--packed", "4", "--vary", "batch", "--gpu-memory", "80GB"), "does not read --packed"),
    (("step", "--params", "7e9", "--packed", "4"), "need an architecture"),
])
def test_refused_in_one_line(capsys, args, words):
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and words in err and err.count("\n") == 1, err
