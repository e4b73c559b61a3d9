"""The ledger under fp16-amp-adamw: 16 B/param of FP32 states, 16-bit activations, autocast's FP16 weight copies
(2 bytes per linear weight element, counted here from the published LLaMA-2 7B shapes)."""
from memledger.ledger.ledger import Ledger


def test_amp_rows():
    amp = Ledger("llama2-7b", seq_len=4096, recipe="fp16-amp-adamw")
    rows = {r.name: r.bytes for r in amp.rows}
    d, L, F, V = 4096, 32, 11008, 32000           # LLaMA-2 7B's config.json
    assert rows["autocast FP16 weight copies (saved by autograd)"] == 2 * (L * (4 * d * d + 3 * F * d) + V * d)
    assert rows["activations"] == {r.name: r.bytes for r in Ledger("llama2-7b", seq_len=4096).rows}["activations"]
    assert amp.by_role()["param"] == 4 * amp.params


def test_other_recipes_unchanged():
    assert not any("autocast" in r.name for r in Ledger("llama2-7b", recipe="fp32-adamw").rows)
