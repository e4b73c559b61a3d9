"""--recipe fp16-amp-adamw on the command line: the step under cpu and cuda, refused in one line under the article
backend; the ledger books autocast's weight copies."""
import json

import pytest

from memledger.ledger.ledger import Ledger
from clicheck import run

MODEL = ("--preset", "llama2-7b", "--seq", "4096", "--overhead", "0", "--recipe", "fp16-amp-adamw")


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_step_runs_amp(capsys, backend):
    code, out, err = run(capsys, "step", *MODEL, "--backend", backend, "--json")
    assert code == 0 and err == ""
    ledger = Ledger("llama2-7b", seq_len=4096, overhead_bytes=0, recipe="fp16-amp-adamw")
    assert json.loads(out)["peak"]["gpu"] == ledger.step(backend).peak.bytes


def test_article_backend_refuses_in_one_line(capsys):
    code, out, err = run(capsys, "step", *MODEL)
    assert code == 2 and out == "" and "fp16-amp-adamw" in err and err.count("\n") == 1


def test_ledger_books_the_weight_copies(capsys):
    code, out, err = run(capsys, "ledger", *MODEL, "--json")
    assert code == 0
    rows = {r["name"]: r["bytes"] for r in json.loads(out)["rows"]}
    assert rows["autocast FP16 weight copies (saved by autograd)"] > 0


def test_step_runs_amp_with_gqa_and_selective_recomputation(capsys):
    """Llama 3 8B (grouped-query attention) under autocast with selective and full recomputation: the CLI prints
    the Python step's peak, also with a chunked loss; LitGPT's loss stays refused in one line."""
    args = ("step", "--preset", "llama3-8b", "--seq", "4096", "--overhead", "0", "--recipe", "fp16-amp-adamw",
            "--backend", "cpu")
    for recompute in ("selective", "full"):
        code, out, err = run(capsys, *args, "--recompute", recompute, "--json")
        assert code == 0 and err == ""
        ledger = Ledger("llama3-8b", seq_len=4096, overhead_bytes=0, recipe="fp16-amp-adamw", recompute=recompute)
        assert json.loads(out)["peak"]["gpu"] == ledger.step("cpu").peak.bytes
    code, out, err = run(capsys, *args, "--loss-chunks", "8", "--json")
    assert code == 0 and err == ""
    ledger = Ledger("llama3-8b", seq_len=4096, overhead_bytes=0, recipe="fp16-amp-adamw", loss_chunks=8)
    assert json.loads(out)["peak"]["gpu"] == ledger.step("cpu").peak.bytes
    code, out, err = run(capsys, *args, "--loss-chunks", "8", "--loss-impl", "litgpt")
    assert code == 2 and out == "" and "LitGPT's loss" in err and err.count("\n") == 1


def test_step_runs_amp_for_gpt_blocks_with_flash_attention(capsys):
    """The article's GPT 7B under autocast: with --flash-attention --no-dropout the CLI prints the Python step's
    peak; the eager kernel with dropout is refused in one line naming both."""
    args = ("step", "--preset", "article-7b", "--seq", "4096", "--overhead", "0", "--recipe", "fp16-amp-adamw",
            "--backend", "cpu", "--recompute", "full")
    code, out, err = run(capsys, *args, "--flash-attention", "--no-dropout", "--json")
    assert code == 0 and err == ""
    ledger = Ledger("article-7b", seq_len=4096, overhead_bytes=0, recipe="fp16-amp-adamw", recompute="full",
                    flash_attention=True, dropout=False)
    assert json.loads(out)["peak"]["gpu"] == ledger.step("cpu").peak.bytes
    code, out, err = run(capsys, *args)
    assert code == 2 and out == "" and "eager attention kernel, dropout" in err and err.count("\n") == 1
