"""torchtune's and LitGPT's own model code (memledger/pytorch/torchtune_litgpt.py) beside memledger.

The independent values are PyTorch's measurements of each library's model (saved-tensor hooks, MemTracker), the
per-layer figures docs/implementations.md records from PyTorch (shared docs), and arithmetic on the libraries'
sources written out here. Tests skip, saying why, where a library is not installed.
"""
import pytest

torch = pytest.importorskip("torch")

from memledger.ledger.ledger import Ledger  # noqa: E402
from memledger.pytorch.compare import _block_rows, architecture_of, ledger_for, run_options  # noqa: E402
from memledger.pytorch.torchtune_litgpt import checkpointed_layer, layer_saved, library_step, missing  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402
from memledger.step.timeline import LANDMARKS, Step  # noqa: E402

pytestmark = pytest.mark.slow

SMALL = dict(d=256, H=4, F=688, V=1000)
SEVEN_B = dict(d=4096, H=32, F=11008, V=32000)
LOOP = "bf16-pure-adamw"        # both recipes' BF16 parameters, AdamW on them


def needs(library):
    why = missing(library)
    return pytest.mark.skipif(why is not None, reason=why or "")


def memledger_layer(shape, B, S):
    """What memledger books for one LLaMA layer of the reference decoder under the CPU backend's conventions."""
    c = RefConfig(**shape, L=2, style="llama")
    ledger = ledger_for(c, LOOP, B, S)
    return ledger.evaluate(sum(r.bytes for r in _block_rows(c, run_options(c, LOOP))))


def litgpt_extra(d, B, S):
    """LitGPT's layer beside torchtune's, read off ``litgpt/model.py`` (0.5.13): v stays a view of the fused QKV
    output, so the whole (B, S, 3d) BF16 storage is kept where torchtune keeps q and k rotated and v (4*B*S*d more
    bytes, ``CausalSelfAttention.forward`` l. 430-513); its ``torch.cat`` (l. 512-513) of the rotated and pass-through halves
    leaves q in (B, H, S, d_h) order, the CPU flash output follows q's layout, so the output projection's input is
    a copy (2*B*S*d); each of its two RMSNorms keeps an FP32 copy of its BF16 weight (``RMSNorm.forward``
    l. 1315-1322: ``x_normed * weight.float()``, 4*d each)."""
    return 4 * B * S * d + 2 * B * S * d + 2 * 4 * d


@needs("torchtune")
@pytest.mark.parametrize("B, S", [(1, 256), (2, 200)])
def test_torchtune_layer_is_memledgers_to_the_byte(B, S):
    assert layer_saved("torchtune", "llama2", **SMALL, batch=B, seq=S)["layer"] == memledger_layer(SMALL, B, S)


@needs("torchtune")
def test_torchtune_llama3_gqa_layer_repeats_k_and_v():
    """llama3's builder with grouped-query attention (2 key/value heads of 4): torchtune expands K and V to H heads
    before SDPA (``torchtune/modules/attention.py`` l. 285-291: ``k.unsqueeze(2).expand(...).flatten(1, 2)``, a
    copy), so SDPA saves K and V at H heads where memledger's GQA layer keeps them at H_kv:
    2 * 2*B*(H - H_kv)*S*d_h bytes more."""
    B, S, H, kv = 2, 64, SMALL["H"], 2
    got = layer_saved("torchtune", "llama3", **SMALL, batch=B, seq=S, n_kv_heads=kv)["layer"]
    c = RefConfig(**SMALL, L=2, style="llama", n_kv_heads=kv)
    booked = ledger_for(c, LOOP, B, S).evaluate(sum(r.bytes for r in _block_rows(c, run_options(c, LOOP))))
    assert got - booked == 2 * 2 * B * (H - kv) * S * (SMALL["d"] // H)


@needs("litgpt")
@needs("torchtune")
@pytest.mark.parametrize("B, S", [(1, 256), (2, 200)])
def test_litgpt_layer_is_torchtunes_plus_its_rotary_copies_and_norm_weights(B, S):
    tune = layer_saved("torchtune", "llama2", **SMALL, batch=B, seq=S)["layer"]
    lit = layer_saved("litgpt", "Llama-2-7b-hf", **SMALL, batch=B, seq=S)["layer"]
    assert lit - tune == litgpt_extra(SMALL["d"], B, S)


@needs("litgpt")
@pytest.mark.xfail(strict=True, reason="memledger's LLaMA layer (--backend cpu) books what torchtune's saves; "
                   "LitGPT's keeps 6*B*S*d + 8*d bytes more (the fused QKV storage through v's view, the output "
                   "projection's input copied after torch.cat, FP32 copies of both norms' weights): "
                   "implementation=litgpt's block must book them")
def test_litgpt_layer_equals_memledgers_reference_layer():
    assert layer_saved("litgpt", "Llama-2-7b-hf", **SMALL, batch=2, seq=200)["layer"] == memledger_layer(SMALL, 2, 200)


# docs/implementations.md, "One LLaMA-2-7B layer": PyTorch's measurements (saved-tensor hooks, fake tensors)
PUBLISHED = {("torchtune", 1, 1024): 207_757_312, ("torchtune", 2, 1304): 529_131_904,
             ("litgpt", 1, 1024): 232_955_904, ("litgpt", 2, 1304): 593_258_880}


@pytest.mark.parametrize("library, B, S", list(PUBLISHED))
def test_llama2_7b_layer(library, B, S):
    if missing(library):
        pytest.skip(missing(library))
    family = "llama2" if library == "torchtune" else "Llama-2-7b-hf"
    got = layer_saved(library, family, **SEVEN_B, batch=B, seq=S)["layer"]
    assert got == PUBLISHED[library, B, S]
    extra = 0 if library == "torchtune" else litgpt_extra(SEVEN_B["d"], B, S)
    assert got == memledger_layer(SEVEN_B, B, S) + extra


def torchtune_step(L, B, S, loss, shape=SMALL):
    """memledger's step of the same setup under ``implementation="torchtune"`` (CPU conventions): the model's RoPE
    buffers, its q/k/v step counters and the recipe's loop tensors booked by :mod:`memledger.step.torchtune`."""
    arch = architecture_of(RefConfig(**shape, L=L, style="llama"))
    return Step(Ledger(arch, batch_size=B, seq_len=S, recipe=LOOP, overhead_bytes=0,
                       loss_chunks=8 if loss == "chunked" else 1, implementation="torchtune"), "cpu")


def differences(got, step) -> dict:
    """{landmark, phase peak, "peak": torchtune's measured bytes minus memledger's}."""
    out = {name: got[name] - step.landmarks[name]["gpu"] for name in LANDMARKS}
    peaks = step.phase_peaks()
    out.update({f"{phase} peak": got["phase peaks"][phase] - peaks[phase] for phase in got["phase peaks"]})
    out["peak"] = got["peak"] - step.peak.bytes
    return out


@needs("torchtune")
@pytest.mark.parametrize("loss, L, B, S", [("ce", 2, 2, 200), ("ce", 3, 1, 200), ("chunked", 2, 2, 200),
                                           ("chunked", 2, 1, 64), ("chunked", 2, 2, 203), ("chunked", 2, 1, 203)])
def test_torchtune_step_equals_memledgers(loss, L, B, S):
    """Every landmark and phase peak of torchtune's step, as its recipe runs it (its model's RoPE buffers, separate
    q/k/v projections, ``ignore_labels_cache``, the shifted labels, the token counts and losses), equals memledger's
    ``implementation="torchtune"`` step to the byte; at S 203 torchtune 0.6.1's ``chunk`` makes 7 chunks of 26 tokens
    and one of 21."""
    diff = differences(library_step("torchtune", "llama2", **SMALL, L=L, batch=B, seq=S, loss=loss),
                       torchtune_step(L, B, S, loss))
    assert diff == {k: 0 for k in diff}


@needs("torchtune")
@pytest.mark.parametrize("B, S", [(2, 200), (2, 203), (1, 203)])
def test_torchtune_chunked_backward_peak(B, S):
    """Under CEWithChunkedOutputLoss torchtune's backward peak (the LM head's first weight-gradient sum; at B 1,
    S 203 the step's) equals memledger's: each chunk's BF16 logits gradient dies with its head's backward. Run as
    the recipe runs it, without MemTracker's module hooks on the loss (their "all"-mode multi-grad hook keeps
    every chunk's gradient until the last: :mod:`memledger.pytorch.torchtune_litgpt`'s docstring)."""
    diff = differences(library_step("torchtune", "llama2", **SMALL, L=2, batch=B, seq=S, loss="chunked"),
                       torchtune_step(2, B, S, "chunked"))
    assert diff["backward peak"] == 0


@needs("litgpt")
def test_litgpt_keeps_its_logits_through_the_step():
    """``litgpt/finetune/full.py`` (0.5.13) l. 282-284 binds ``logits = model(input_ids)`` and never deletes it: the
    B x S x V BF16 logits live through backward and the optimizer step into the next iteration, where they die only
    when the new logits are bound. So after the step, LitGPT holds its parameters' and AdamW's bytes, the batch,
    the previous logits and loss; memledger's reference step (the same optimizer) only the first three."""
    d, H, F, V, L, B, S = 256, 4, 688, 1000, 2, 2, 200
    got = library_step("litgpt", "Llama-2-7b-hf", d=d, H=H, F=F, V=V, L=L, batch=B, seq=S, loss="full")
    params = V * d * 2 + d + L * (2 * d + 3 * d * d + d * d + 3 * d * F)      # wte, ln_f, lm_head, the layers
    tensors = 3 + L * 7           # wte, ln_f, lm_head; norm_1, qkv, proj, norm_2 and LLaMAMLP's fc_1, fc_2, proj
    adamw = 2 * 2 * params + 4 * tensors                 # exp_avg and exp_avg_sq in BF16, a 4-byte step each
    batch = 2 * 8 * B * S                                # input_ids and labels, int64
    rope = 2 * S * (d // H) * 4          # cos and sin, FP32, max_seq_length x d_h (full.py l. 230; model.py l. 43-62)
    kept = 2 * B * S * V + 2                             # the previous logits (BF16) and loss (a BF16 scalar)
    assert got["after step"] == 2 * params + adamw + batch + rope + kept


def litgpt_step(L, B, S, shape=SMALL):
    """memledger's step under ``implementation="litgpt"`` (CPU conventions): LitGPT's head and loss as
    ``finetune/full.py`` runs them, its RoPE buffers, the previous logits and loss (:mod:`memledger.step.litgpt_loss`),
    its parameters in ``GPT``'s order."""
    arch = architecture_of(RefConfig(**shape, L=L, style="llama"))
    return Step(Ledger(arch, batch_size=B, seq_len=S, recipe=LOOP, overhead_bytes=0, implementation="litgpt"), "cpu")


@needs("litgpt")
@pytest.mark.parametrize("L, B, S", [(2, 1, 200), (2, 2, 200), (3, 1, 300), (2, 2, 65), (2, 1, 129)])
def test_litgpt_step_equals_memledgers(L, B, S):
    """Every landmark, the forward and the optimizer step's peaks of LitGPT's step as ``finetune/full.py`` runs it
    (the head unchunked, ``chunked_cross_entropy`` split by 128 of the B (S - 1) shifted tokens in BF16, the logits and
    loss kept into the next iteration, cos/sin for S positions, AdamW over ``GPT``'s parameters: ``lm_head`` first)
    and the backward's (its RMSNorms' ``x * x`` backward: :func:`memledger.step.norms._square_backward`)
    equal memledger's ``implementation="litgpt"`` step to the byte; B (S - 1) is 199 (two chunks, the last short),
    398, 299 (three), 128 (one chunk: S 65 at B 2, S 129 at B 1)."""
    diff = differences(library_step("litgpt", "Llama-2-7b-hf", **SMALL, L=L, batch=B, seq=S, loss="full"),
                       litgpt_step(L, B, S))
    assert diff == {k: 0 for k in diff}


@needs("litgpt")
@pytest.mark.parametrize("B, S", [(1, 200), (2, 200)])
def test_litgpt_backward_peak(B, S):
    """LitGPT's backward peak at a small width (at its final norm's weight sum, B 1; at the loss's slice backward,
    B 2) equals memledger's: its plain-op RMSNorm's backward (``x * x``'s two products, summed into ``x.float()``'s
    gradient one at a time) where the composite's ``pow`` would be 202,464 B (B 1) and 347,488 B (B 2) higher."""
    diff = differences(library_step("litgpt", "Llama-2-7b-hf", **SMALL, L=2, batch=B, seq=S, loss="full"),
                       litgpt_step(2, B, S))
    assert diff["backward peak"] == 0


@needs("litgpt")
@pytest.mark.parametrize("B, S", [(1, 1024), (2, 1304)])
def test_litgpt_7b_width_step(B, S):
    """LLaMA-2 7B's width (two layers, V 32000), as ``finetune/full.py`` runs it: every landmark, every phase's peak
    and the step's (in the optimizer step, at the embedding's, beside the LM head's leftover ``denom``) equal
    memledger's ``implementation="litgpt"`` step to the byte (here the final norm's backward is not the backward's
    highest point)."""
    diff = differences(library_step("litgpt", "Llama-2-7b-hf", **SEVEN_B, L=2, batch=B, seq=S, loss="full"),
                       litgpt_step(2, B, S, SEVEN_B))
    assert diff == {k: 0 for k in diff}


@needs("torchtune")
@pytest.mark.parametrize("loss, B, S", [("ce", 1, 1024), ("chunked", 2, 1304)])
def test_torchtune_7b_width_step(loss, B, S):
    """LLaMA-2 7B's width (two layers, V 32000), as torchtune's recipe runs it: every landmark and phase peak equals
    memledger's ``implementation="torchtune"`` step to the byte (with the chunked loss, its backward peak too)."""
    diff = differences(library_step("torchtune", "llama2", **SEVEN_B, L=2, batch=B, seq=S, loss=loss),
                       torchtune_step(2, B, S, loss, SEVEN_B))
    assert diff == {k: 0 for k in diff}


@needs("litgpt")
@pytest.mark.parametrize("B, S", [(1, 256), (2, 200)])
def test_litgpt_pythia_layer(B, S):
    """A GPT-style family: LitGPT's pythia config (GPT-NeoX: LayerNorm, GeLU, parallel residual, rotary on a quarter
    of each head) at a small width keeps what memledger's parallel GPT-NeoX layer under SDPA keeps plus the same
    6*B*S*d bytes as its LLaMA layer (:func:`litgpt_extra` without the RMSNorms' weight copies: LayerNorm casts
    nothing): the rotated q and k made new by ``torch.cat`` (l. 512-513) while v's view keeps the fused QKV storage,
    and the output projection's input copied."""
    d, H, F = SMALL["d"], SMALL["H"], 1024
    got = layer_saved("litgpt", "pythia-160m", d=d, H=H, F=F, V=SMALL["V"], batch=B, seq=S)["layer"]
    c = RefConfig(d=d, L=2, H=H, F=F, V=SMALL["V"], style="gpt", parallel=True, untied=True, attention="sdpa")
    booked = ledger_for(c, LOOP, B, S).evaluate(sum(r.bytes for r in _block_rows(c, run_options(c, LOOP))))
    assert got - booked == 6 * B * S * d


def checkpointed_step(library, shape, L, B, S):
    ledger = Ledger(architecture_of(RefConfig(**shape, L=L, style="llama")), batch_size=B, seq_len=S, recipe=LOOP,
                    implementation=library, overhead_bytes=0, recompute="full")
    return ledger.step("cpu")


def step_layer_delta(library, shape, B, S):
    """What one more layer adds between the step's "before forward" and "after forward" (memledger's step under
    ``implementation=library``, the cpu backend): the 2-layer step's difference minus the 1-layer step's."""
    delta = {}
    for L in (1, 2):
        marks = checkpointed_step(library, shape, L, B, S).landmarks
        delta[L] = marks["after forward"]["gpu"] - marks["before forward"]["gpu"]
    return delta[2] - delta[1]


def forward_rises(step) -> dict:
    """{block: the largest total after one of its forward ops minus the total as it starts} of a step."""
    from memledger.step.vocab import Phase
    rises, entry, before = {}, {}, 0
    for total, index in zip(step.totals, step.built.compiled.ops):
        op = step.built.ops[index]
        if op.phase is Phase.FORWARD and isinstance(op.layer, int):
            entry.setdefault(op.layer, before)
            rises[op.layer] = max(rises.get(op.layer, 0), int(total) - entry[op.layer])
        before = int(total)
    return rises


@pytest.mark.parametrize("library, family", [pytest.param("torchtune", "llama2", marks=needs("torchtune")),
                                             pytest.param("litgpt", "Llama-2-7b-hf", marks=needs("litgpt"))])
@pytest.mark.parametrize("shape, B, S", [(SMALL, 2, 48), (SMALL, 1, 200), (SEVEN_B, 1, 1024), (SEVEN_B, 2, 1304)])
def test_checkpointed_layer(library, family, shape, B, S):
    """``--recompute full`` under torchtune's and LitGPT's code is each library's own activation checkpointing
    (:func:`memledger.pytorch.torchtune_litgpt.checkpointing`: torchtune's ``set_activation_checkpointing`` with
    ``{TransformerSelfAttentionLayer}``, LitGPT's ``FSDPStrategy(activation_checkpointing_policy={Block})`` as
    Lightning applies it; both PyTorch's non-reentrant ``checkpoint_wrapper``): a layer keeps its BF16 input and
    nothing else (the other arguments are None or, LitGPT's cos and sin, views of its RoPE cache buffers), 2*B*S*d
    bytes. MemTracker's "after forward minus before forward", one layer (two layers minus one), equals the step's."""
    measured = checkpointed_layer(library, family, **shape, batch=B, seq=S)
    assert measured["wrapped"] == 2                         # both layers wrapped, as the library wraps them
    assert measured["layer"] == 2 * B * S * shape["d"] == step_layer_delta(library, shape, B, S)


@pytest.mark.parametrize("library, family", [
    pytest.param("litgpt", "Llama-2-7b-hf", marks=needs("litgpt")),
    pytest.param("torchtune", "llama2", marks=[needs("torchtune"), pytest.mark.xfail(strict=True, reason=(
        "the step runs the reference block's ops for torchtune's (fused QKV, no RoPE): under the checkpoint its "
        "transients are not torchtune's (6*B*S*d bytes over at this shape); only the per-layer bytes are proved"))])])
@pytest.mark.parametrize("shape, B, S", [(SMALL, 2, 48), (SEVEN_B, 1, 1024)])
def test_checkpointed_layer_forward_rise(library, family, shape, B, S):
    """A checkpointed layer's forward transients: the largest total while it runs minus the total as it starts,
    MemTracker on the library's model against the step's. LitGPT's Block under the checkpoint is written from its
    source (memledger.step.litgpt.attention_checkpointed, LLaMAMLP's fc_1, fc_2, SiLU, product; the roped halves and
    attention_output live until their functions return): equal to the byte."""
    measured = checkpointed_layer(library, family, **shape, batch=B, seq=S)["forward rise"]
    assert forward_rises(checkpointed_step(library, shape, 2, B, S)) == measured
