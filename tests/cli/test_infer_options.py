"""memledger infer --weights/--no-double-quant/--attention/--backend: rows, JSON, one-line refusals."""
import json

import pytest

from memledger.ledger.inference import Inference
from clicheck import run


def test_nf4_json_equals_the_api(capsys):
    code, out, err = run(capsys, "infer", "--preset", "llama2-7b", "--weights", "nf4", "--attention", "eager",
                         "--seq", "4096", "--json")
    assert code == 0 and err == ""
    data = json.loads(out)
    api = Inference("llama2-7b", seq_len=4096, quantization="nf4", attention="eager")
    assert data["totals"]["gpu"] == api.total and data["inputs"]["quantization"] == "nf4"
    assert [r["name"] for r in data["rows"]][1] == "NF4 linear weights: packed 4-bit codes"


def test_int8_text_names_the_outliers(capsys):
    code, out, err = run(capsys, "infer", "--preset", "llama2-7b", "--weights", "int8", "--dtype", "fp16")
    assert code == 0 and "LLM.int8 row scales" in out and "llm_int8_threshold" in out
    assert "get_memory_footprint()" in out


@pytest.mark.parametrize("args, words", [
    (["--weights", "nf4", "--dtype", "int8"], "weight_dtype"),
    (["--weights", "nf2"], "quantization"),
    (["--no-double-quant"], "double_quant"),
    (["--weights", "int8", "--no-double-quant"], "double_quant"),
    (["--weights", "nf4", "--tp", "2"], "tp"),
    (["--attention", "paged"], "attention"),
    (["--backend", "cpu"], "--backend"),
    (["--attention", "eager", "--backend", "tpu"], "backend"),
])
def test_bad_input_one_line_exit_2(capsys, args, words):
    code, out, err = run(capsys, "infer", "--preset", "llama2-7b", *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err
