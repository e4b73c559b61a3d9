"""memledger infer: the op-by-op prefill's peak and op (text and JSON), --logits-to-keep, one-line refusals."""
import json

import pytest

from memledger.ledger.inference import Inference
from clicheck import run


def test_text_names_the_peak_op(capsys):
    code, out, err = run(capsys, "infer", "--preset", "llama2-7b", "--seq", "4096", "--attention", "eager")
    assert code == 0 and err == ""
    assert "Prefill peak, op by op:" in out and "'block 31: softmax'" in out


def test_json_equals_the_api(capsys):
    code, out, err = run(capsys, "infer", "--preset", "llama2-7b", "--seq", "4096", "--logits-to-keep", "0", "--json")
    data = json.loads(out)["prefill"]
    api = Inference("llama2-7b", seq_len=4096, logits_to_keep=0).prefill
    assert data["modelled"] and data["peak"] == api.peak.bytes and data["op"] == api.peak.op


def test_unmodelled_says_why(capsys):
    code, out, err = run(capsys, "infer", "--preset", "llama2-7b", "--weights", "int8")
    assert code == 0 and "Prefill op by op: not modelled" in out


@pytest.mark.parametrize("args, words", [
    (["--logits-to-keep", "-1"], "logits_to_keep"), (["--logits-to-keep", "x"], "logits_to_keep"),
    (["--weights", "int8", "--logits-to-keep", "0"], "logits_to_keep")])
def test_bad_input_one_line_exit_2(capsys, args, words):
    code, out, err = run(capsys, "infer", "--preset", "llama2-7b", *args)
    assert code == 2 and out == "" and err.count("\n") == 1 and words in err
