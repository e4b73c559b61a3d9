"""A GPT-style family under a library's own code (issue 28): pythia (GPT-NeoX) as LitGPT and transformers run it,
beside memledger's ``implementation="litgpt"`` and ``"hf"`` steps (memledger/step/gpt_style.py), to the byte.

* transformers' ``GPTNeoXForCausalLM`` from a ``GPTNeoXConfig`` as pythia's config.json sets it
  (:func:`memledger.pytorch.libraries.make_library_model`, ``family="gpt_neox"``; the packed-sequence trap patched as
  for LLaMA), its own loss (``labels=``), sdpa or eager.
* LitGPT's ``GPT(Config.from_name("pythia-160m", ...))`` at other widths (LayerNorm, GeLU, biases, a parallel
  residual, rotary on a quarter of each head, an untied head; :func:`memledger.pytorch.torchtune_litgpt.build`), run
  as ``litgpt/finetune/full.py`` runs it (:func:`~memledger.pytorch.torchtune_litgpt.library_step`).

Both without weights under ``FakeTensorMode``, in BF16, AdamW's for-loop, MemTracker's totals of a steady-state step.
The independent side is PyTorch's measurement of each library's model; memledger's is its step under the cpu backend
for an :class:`~memledger.models.architecture.Architecture` of model_type gpt_neox with the same sizes.
"""
import re
from pathlib import Path

import pytest

pytest.importorskip("torch")

from memledger.ledger.ledger import Ledger  # noqa: E402
from memledger.models.architecture import Architecture  # noqa: E402
from memledger.pytorch import libraries  # noqa: E402
from memledger.pytorch.torchtune_litgpt import layer_saved, library_step, missing  # noqa: E402
from memledger.step.timeline import LANDMARKS, Step  # noqa: E402

pytestmark = pytest.mark.slow
needs_litgpt = pytest.mark.skipif(missing("litgpt") is not None, reason=missing("litgpt") or "")

LOOP = "bf16-pure-adamw"        # finetune/full.py's bf16-true: BF16 parameters, AdamW on them
SMALL = dict(d=256, H=4, F=1024, V=1000)
#: pythia-1b's width (litgpt/config.py "pythia-1b": n_embd 2048, n_head 8, intermediate_size 8192, padded_vocab_size
#: 50304; rotary_percentage 0.25: rope_n_elem 64 of head_size 256)
PYTHIA_1B = dict(d=2048, H=8, F=8192, V=50304)


def pythia_step(shape, L, B, S, implementation="litgpt", attn="sdpa") -> Step:
    arch = Architecture(shape["d"], L, shape["H"], shape["F"], shape["V"], "gpt", tied_embeddings=False,
                        model_type="gpt_neox", parallel=True, rotary_fraction=0.25, no_dropout=True)
    return Step(Ledger(arch, batch_size=B, seq_len=S, recipe=LOOP, overhead_bytes=0, implementation=implementation,
                       attn_implementation=attn), "cpu")


def differences(got, step) -> dict:
    """{landmark, phase peak, "peak", each layer's forward and backward peak: the library's measured bytes minus
    memledger's}."""
    out = {name: got[name] - step.landmarks[name]["gpu"] for name in LANDMARKS}
    peaks = step.phase_peaks()
    out.update({f"{phase} peak": got["phase peaks"][phase] - peaks[phase] for phase in got["phase peaks"]})
    out["peak"] = got["peak"] - step.peak.bytes
    out.update({key: got["block peaks"][key] - value for key, value in step.block_peaks().items()})
    return out


def layer_bytes(step) -> int:
    return sum(r["bytes"] for r in step.rows if r["name"].startswith("L x ")) // step.values["L"]


@needs_litgpt
@pytest.mark.parametrize("B, S", [(1, 256), (2, 200)])
def test_pythia_layer(B, S):
    """What one LitGPT pythia layer saves (saved-tensor hooks, 2 layers minus 1) is memledger's step's layer: LayerNorm
    inputs and BF16 statistics, the fused QKV output kept whole by v's view, the new q and k, SDPA's output and its
    reshaped copy, the GeLU's input and the down projection's."""
    got = layer_saved("litgpt", "pythia-160m", **SMALL, batch=B, seq=S)["layer"]
    assert got == layer_bytes(pythia_step(SMALL, 2, B, S))


@needs_litgpt
@pytest.mark.parametrize("L, B, S", [(2, 2, 200), (3, 1, 200), (2, 1, 256), (2, 2, 1024)])
def test_pythia_step(L, B, S):
    """Every landmark, every phase's peak, each layer's forward and backward peak and the step's peak of LitGPT's
    pythia step, as finetune/full.py runs it, equal memledger's ``implementation="litgpt"`` step (its parallel
    Block's order, ``x = attention_output + x`` before the MLP, is read from the source: no total here tells it from
    the reference's; the cos/sin buffers a quarter of a head wide)."""
    diff = differences(library_step("litgpt", "pythia-160m", **SMALL, L=L, batch=B, seq=S, loss="full"),
                       pythia_step(SMALL, L, B, S))
    assert diff == {k: 0 for k in diff}


@needs_litgpt
@pytest.mark.parametrize("B, S", [(1, 1024)])
def test_pythia_1b_width_step(B, S):
    """pythia-1b's width (two layers, V 50304): every landmark and peak equal memledger's step to the byte. Here the
    layers' backward peak is at SDPA's backward, where the parallel block's ``dX_out`` is already gone (its last user
    is the output projection's backward)."""
    diff = differences(library_step("litgpt", "pythia-160m", **PYTHIA_1B, L=2, batch=B, seq=S, loss="full"),
                       pythia_step(PYTHIA_1B, 2, B, S))
    assert diff == {k: 0 for k in diff}
    assert layer_saved("litgpt", "pythia-160m", **PYTHIA_1B, batch=B, seq=S)["layer"] == layer_bytes(
        pythia_step(PYTHIA_1B, 2, B, S))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("B, S", [(1, 256), (2, 200)])
def test_hf_gpt_neox_layer(attn, B, S):
    """transformers' GPTNeoXLayer saves, under SDPA, what LitGPT's pythia layer does (the fused output kept whole by
    v's view, new q and k from ``torch.cat([q_embed, q_pass])``, SDPA's output and its ``transpose(1, 2)
    .contiguous()`` copy); under eager the FP32 softmax output, the BF16 probabilities and v (a copy at B > 1; at
    B = 1 the view, keeping the fused output whole): memledger's ``implementation="hf"`` layer."""
    got = libraries.saved_per_layer("hf", **SMALL, batch=B, seq=S, attn=attn, family="gpt_neox")["layer"]
    assert got == layer_bytes(pythia_step(SMALL, 2, B, S, "hf", attn))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("L, B, S", [(2, 2, 200), (3, 1, 200), (2, 1, 256), (2, 2, 1024), (2, 4, 64)])
def test_hf_gpt_neox_step(attn, L, B, S):
    """Every landmark, phase peak, layer peak and the peak of transformers' GPTNeoXForCausalLM step equal memledger's
    ``implementation="hf"`` step: cos and sin rotary_ndims wide, made once per forward, released by block 0's q
    backward; the sum ``mlp_output + attn_output + hidden_states``; eager's (B, 1, S, S) mask."""
    got = libraries.library_step("hf", **SMALL, L=L, batch=B, seq=S, attn=attn, family="gpt_neox")
    diff = differences(got, pythia_step(SMALL, L, B, S, "hf", attn))
    assert diff == {k: 0 for k in diff}


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_hf_gpt_neox_1b_width_step(attn):
    """pythia-1b's width, B 1, S 1024 (two layers): every landmark and peak, and the layer, to the byte."""
    got = libraries.library_step("hf", **PYTHIA_1B, L=2, batch=1, seq=1024, attn=attn, family="gpt_neox")
    diff = differences(got, pythia_step(PYTHIA_1B, 2, 1, 1024, "hf", attn))
    assert diff == {k: 0 for k in diff}
    layer = libraries.saved_per_layer("hf", **PYTHIA_1B, batch=1, seq=1024, attn=attn, family="gpt_neox")["layer"]
    assert layer == layer_bytes(pythia_step(PYTHIA_1B, 2, 1, 1024, "hf", attn))


MEASURED_MD = (Path(__file__).resolve().parents[2] / "docs" / "measured.md").read_text()
PYTHIA_6_9B = dict(d=4096, H=32, F=16384, V=50432)


def table() -> dict:
    """{first cell: (bytes at B 1 S 1024, bytes at B 2 S 1304)} of docs/measured.md's pythia table."""
    section = MEASURED_MD.split("## One pythia layer by implementation", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| ([^|]+?) \| ([\d,]+) \| ([\d,]+) \|$", section, re.M)
    assert len(rows) == 4, rows
    return {name: (int(a.replace(",", "")), int(b.replace(",", ""))) for name, a, b in rows}


@pytest.mark.parametrize("row, library, attn", [
    ("transformers 5.25 `GPTNeoXForCausalLM`, sdpa", "hf", "sdpa"), ("transformers, eager", "hf", "eager"),
    pytest.param("LitGPT 0.5.13 `GPT`, `pythia-*` config", "litgpt", "sdpa", marks=needs_litgpt)])
def test_measured_md_pythia_rows(row, library, attn):
    """Each library row of docs/measured.md's pythia table is PyTorch's measurement of that library's layer and
    memledger's ``implementation`` layer (cpu backend); the reference row is memledger's default cuda layer."""
    from memledger import Ledger as Plain
    for (batch, seq), figure in zip(((1, 1024), (2, 1304)), table()[row]):
        if library == "hf":
            got = libraries.saved_per_layer("hf", **PYTHIA_6_9B, batch=batch, seq=seq, attn=attn, family="gpt_neox")
        else:
            got = layer_saved("litgpt", "pythia-160m", **PYTHIA_6_9B, batch=batch, seq=seq)
        assert got["layer"] == figure
        ledger = Plain("pythia-6.9b", batch_size=batch, seq_len=seq, recipe=LOOP, implementation=library,
                       attn_implementation=attn)
        assert layer_bytes(ledger.step("cpu")) == figure
    for (batch, seq), figure in zip(((1, 1024), (2, 1304)), table()["reference decoder, `--backend cuda` (its eager "
                                                                      "core, no rotary)"]):
        assert layer_bytes(Plain("pythia-6.9b", batch_size=batch, seq_len=seq, recipe=LOOP).step("cuda")) == figure
