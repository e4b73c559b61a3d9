"""The README's table of one LLaMA-2-7B layer by implementation (issue 28): each library row is what PyTorch
measures of that library's own model (saved-tensor hooks on fake tensors, two layers minus one), and memledger's
``--implementation`` books the same bytes; the reference row is memledger's default ``--backend cuda`` layer."""
import re
from pathlib import Path

import pytest

from memledger import Ledger

pytestmark = pytest.mark.slow
pytest.importorskip("torch")

README = (Path(__file__).resolve().parents[2] / "README.md").read_text()
SHAPES = ((1, 1024), (2, 1304))
LLAMA2 = dict(d=4096, H=32, F=11008, V=32000)


def table() -> dict:
    """{first cell: (bytes at B 1 S 1024, bytes at B 2 S 1304)} of the README's implementation table."""
    rows = re.findall(r"^\| ([^|]+?) \| ([\d,]+) \| ([\d,]+) \| [^|]+\|$", README, re.M)
    assert len(rows) == 6, rows
    return {name: (int(a.replace(",", "")), int(b.replace(",", ""))) for name, a, b in rows}


def layer_bytes(step) -> int:
    """One block's saved bytes: the step's "L x" rows over L."""
    total = sum(r["bytes"] for r in step.rows if r["name"].startswith("L x "))
    return total // step.values["L"]


def memledger_layer(implementation, batch, seq, attn="sdpa", backend="cuda") -> int:
    ledger = Ledger("llama2-7b", batch_size=batch, seq_len=seq, recipe="bf16-pure-adamw",
                    implementation=implementation, **({"attn_implementation": attn} if attn != "sdpa" else {}))
    return layer_bytes(ledger.step(backend))


def measured(library, batch, seq, attn):
    if library == "hf":
        pytest.importorskip("transformers")
        from memledger.pytorch.libraries import saved_per_layer
        return saved_per_layer("hf", **LLAMA2, batch=batch, seq=seq, attn=attn)["layer"]
    pytest.importorskip(library)
    from memledger.pytorch.torchtune_litgpt import layer_saved
    family = "llama2" if library == "torchtune" else "Llama-2-7b-hf"
    return layer_saved(library, family, **LLAMA2, batch=batch, seq=seq)["layer"]


@pytest.mark.parametrize("row, library, attn", [
    ("transformers 5.25 `LlamaForCausalLM`, sdpa", "hf", "sdpa"), ("transformers, eager", "hf", "eager"),
    ("torchtune 0.6.1 `llama2`", "torchtune", "sdpa"), ("LitGPT 0.5.13 `GPT`", "litgpt", "sdpa")])
def test_each_library_row_is_pytorchs_measurement_and_memledgers(row, library, attn):
    shown = table()[row]
    for (batch, seq), figure in zip(SHAPES, shown):
        assert measured(library, batch, seq, attn) == figure
        assert memledger_layer(library, batch, seq, attn) == figure


def test_the_torchtitan_row_is_pytorchs_measurement_and_memledgers_cpu_layer():
    """torchtitan's ``Llama3Model`` at LLaMA-2 7B's sizes (32 KV heads), its own SDPA module: memledger's
    ``--implementation torchtitan`` books the same bytes under ``--backend cpu`` (CUDA's kernels: not measurable here)."""
    pytest.importorskip("torchtitan")
    from memledger.pytorch.torchtitan_step import layer_saved
    shown = table()["torchtitan 0.3.0 `Llama3Model`, sdpa"]
    for (batch, seq), figure in zip(SHAPES, shown):
        assert layer_saved(**LLAMA2, batch=batch, seq=seq)["layer"] == figure
        assert memledger_layer("torchtitan", batch, seq, backend="cpu") == figure


def test_the_reference_row_is_memledgers_default_cuda_layer():
    shown = table()["reference decoder, `--backend cuda` (fused RMSNorm, flash)"]
    assert tuple(memledger_layer("reference", b, s) for b, s in SHAPES) == shown
