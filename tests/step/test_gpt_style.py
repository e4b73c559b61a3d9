"""A GPT-style family under a library's own code (memledger/step/gpt_style.py): pythia (GPT-NeoX) under LitGPT's and
transformers' code is modelled, the rest refused in one line. tests/pytorch/test_gpt_style.py checks the step against
each library's own model (every landmark and peak); here, the layers against PyTorch's measurement and the
refusals."""
import pytest

from memledger import Ledger


def layer_bytes(step) -> int:
    return sum(r["bytes"] for r in step.rows if r["name"].startswith("L x ")) // step.values["L"]


#: One layer of LitGPT 0.5.13's pythia at pythia-6.9b's width (``Config.from_name("pythia-160m", n_embd=4096,
#: n_head=32, intermediate_size=16384, padded_vocab_size=50432)``), BF16, saved-tensor hooks under FakeTensorMode
#: (:func:`memledger.pytorch.torchtune_litgpt.layer_saved`, 2 layers minus 1): PyTorch 2.13's measurement
#: (docs/measured.md).
MEASURED = {(1, 1024): 151_134_208, (2, 1304): 384_919_936}


@pytest.mark.parametrize("batch, seq", list(MEASURED))
def test_litgpt_pythia_layer_is_the_measured_one(batch, seq):
    """What LitGPT's pythia layer saves: two LayerNorms' input (the block's, once) and BF16 statistics, norm 1's
    output, the fused QKV output kept whole by v's view (3 B S d), the new q and k, SDPA's output, its log-sum-exp and
    its reshaped copy, norm 2's output, the GeLU's input and the down projection's (4 d wide each)."""
    ledger = Ledger("pythia-6.9b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw", implementation="litgpt")
    assert layer_bytes(ledger.step("cpu")) == MEASURED[batch, seq]
    t, d, H, F = batch * seq, 4096, 32, 16384
    assert MEASURED[batch, seq] == 2 * t * (d + d + 3 * d + d + d + d + d + d + F + F) + 4 * 2 * t + 4 * H * t


#: One layer of transformers 5.25's GPTNeoXLayer at pythia-6.9b's width (``GPTNeoXConfig`` as its config.json:
#: rotary_pct 0.25, parallel residual, biases), BF16, saved-tensor hooks under FakeTensorMode
#: (:func:`memledger.pytorch.libraries.saved_per_layer`, ``family="gpt_neox"``): PyTorch 2.13's measurement
#: (docs/measured.md).
MEASURED_HF = {("sdpa", 1, 1024): 151_134_208, ("sdpa", 2, 1304): 384_919_936,
               ("eager", 1, 1024): 343_941_120, ("eager", 2, 1304): 973_451_648}


@pytest.mark.parametrize("attn, batch, seq", list(MEASURED_HF))
def test_hf_gpt_neox_layer_is_the_measured_one(attn, batch, seq):
    """transformers' GPT-NeoX layer: under SDPA LitGPT's layer (the same storages); under eager the S x S pair (FP32
    softmax output, BF16 probabilities) in place of SDPA's output and log-sum-exp, and v copied at B > 1 where SDPA
    keeps the fused output whole (at B = 1 v's view keeps it whole)."""
    ledger = Ledger("pythia-6.9b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw", implementation="hf",
                    attn_implementation=attn)
    assert layer_bytes(ledger.step("cpu")) == MEASURED_HF[attn, batch, seq]
    t, d, H, BHSS = batch * seq, 4096, 32, batch * 32 * seq * seq
    sdpa = MEASURED_HF["sdpa", batch, seq]
    if attn == "sdpa":
        assert sdpa == MEASURED[batch, seq]
    else:
        v = 2 * t * d if batch > 1 else 2 * t * 3 * d
        assert MEASURED_HF[attn, batch, seq] == sdpa - 2 * t * d - 4 * H * t - 2 * t * 3 * d + v + 6 * BHSS


@pytest.mark.parametrize("preset, fields, what", [
    ("gpt2", {"implementation": "hf", "dropout": False}, "a GPT-style block other than GPT-NeoX's"),
    ("bloom-7b1", {"implementation": "hf"}, "a GPT-style block other than GPT-NeoX's"),
    ("phi-2", {"implementation": "litgpt", "dropout": False}, "a GPT-style block other than GPT-NeoX's"),
    ("gpt2", {"implementation": "litgpt", "dropout": False}, "a GPT-style block other than GPT-NeoX's"),
    ("pythia-6.9b", {"implementation": "litgpt", "recompute": "full"}, "recompute full"),
    ("pythia-6.9b", {"implementation": "hf", "recompute": "full"}, "recompute full"),
    ("pythia-6.9b", {"implementation": "litgpt", "dropout": True}, "dropout"),
    ("pythia-6.9b", {"implementation": "litgpt", "tp": 2}, "tensor or sequence parallelism"),
])
def test_gpt_style_setups_not_modelled_are_refused(preset, fields, what):
    """(``recompute selective``, which no library has, is refused as such: tests/step/test_implementations.py.)"""
    ledger = Ledger(preset, batch_size=1, seq_len=256, recipe="bf16-pure-adamw", **fields)
    with pytest.raises(ValueError, match=f"model code\\): .*{what}.* not modelled yet"):
        ledger.step("cpu")


def test_litgpt_pythia_cos_sin_are_a_quarter_head_wide():
    """LitGPT's ``rope_cache`` is ``rope_n_elem`` wide (``int(0.25 * head_size)``: 32 of pythia-6.9b's 128): the
    cos and sin buffers are (S, 32) FP32 each, where a LLaMA model's are (S, d/H)."""
    S = 1024
    ledger = Ledger("pythia-6.9b", batch_size=1, seq_len=S, recipe="bf16-pure-adamw", implementation="litgpt")
    rows = {r["name"]: r["bytes"] for r in ledger.step("cpu").rows}
    assert rows["RoPE cos and sin (FP32 buffers)"] == 2 * S * 32 * 4
