"""The figures issue 31 added to chapters 2 to 18: each checked against arithmetic written out here (the article's
spec, published configs, the allocator's constants as PyTorch's source prints them), not against the plot's code."""
from fractions import Fraction

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import memledger as ml  # noqa: E402
from memledger.views import plots  # noqa: E402

pytestmark = pytest.mark.slow

GB, MiB = 10**9, 2**20
L, S, d, H, V = 32, 2048, 4096, 32, 32000          # the article's spec (B = 1)
LLAMA2 = 6_738_415_616                              # the released Llama-2-7b checkpoint's parameters


def stacks(ax):
    """x position (rounded) -> [(bottom, height)] of the bars drawn there."""
    out = {}
    for p in ax.patches:
        key = round(p.get_x() + p.get_width() / 2, 3)
        out.setdefault(key, []).append((p.get_y(), p.get_height()))
    return out


def test_parameter_shares_are_percentages_of_the_counted_parameters():
    ax = plots.parameter_shares(["gpt2", "llama2-7b"]).axes[0]
    bars = stacks(ax)
    for segments in bars.values():
        assert sum(h for _, h in segments) == pytest.approx(100)
    embeddings = {c.get_label(): c for c in ax.containers}["embeddings"]
    # LLaMA-2 7B: an input embedding and an untied head, V x d each (config.json: V 32000, d 4096)
    assert embeddings.patches[1].get_height() == pytest.approx(100 * 2 * 32000 * 4096 / LLAMA2)
    # GPT-2 small: one tied V x d matrix plus the position table (n_ctx x d); 124,439,808 parameters
    assert embeddings.patches[0].get_height() == pytest.approx(100 * (50257 + 1024) * 768 / 124_439_808)


def test_bf16_alone_loses_every_update_the_master_keeps():
    steps = 100
    ax = plots.bf16_master_drift(steps=steps).axes[0]
    lines = {line.get_label(): line.get_ydata() for line in ax.lines}
    alone = lines["BF16 weights alone (updates lost)"]
    master = np.asarray(lines["FP32 master copy"], dtype=float)
    derived = np.asarray(lines["BF16 weights re-derived from the master"], dtype=float)
    assert set(alone) == {1.25}                                  # 0.001 < half of BF16's 2^-7 spacing in [1, 2)
    assert np.allclose(master, 1.25 - np.arange(steps + 1) / 1000, atol=1e-5)     # FP32: 24 bits, ~1e-7 relative
    assert np.all(np.abs(derived - master) <= 2.0**-8 + 1e-9)     # the nearest BF16 value
    assert np.all(derived * 2**7 == np.round(derived * 2**7))    # multiples of 2^-7
    assert derived[-1] < 1.25


def test_variant_bars_split_eq_1_into_its_two_terms():
    variants = {"GPT": ml.inventory(), "FlashAttention": ml.inventory(flash_attention=True)}
    ax = plots.variant_bars(variants, ml.Ledger("article-7b", scope="layers")).axes[0]
    linear, quadratic = ax.containers
    # Korthikanti et al. 2022, Eq. 1 at B = 1: SBd x 34 and 5 A S^2 B
    assert linear.patches[0].get_height() == pytest.approx(34 * S * d / MiB)
    assert quadratic.patches[0].get_height() == pytest.approx(5 * H * S * S / MiB)
    assert quadratic.patches[1].get_height() == 0                 # FlashAttention keeps no S x S tensor


def test_same_tokens_keep_the_linear_part_and_grow_the_quadratic_one():
    tokens, seqs = 8192, (1024, 2048, 4096, 8192)
    ax = plots.same_tokens_bars("article-7b", tokens, seqs).axes[0]
    linear, quadratic = ax.containers
    assert [p.get_height() for p in linear.patches] == pytest.approx([L * 34 * tokens * d / GB] * 4)
    # 5 A S^2 B per layer with B = tokens / S: 5 A S tokens
    assert [p.get_height() for p in quadratic.patches] == pytest.approx([L * 5 * H * s * tokens / GB for s in seqs])


def test_waterfall_steps_row_by_row_to_the_total():
    ax = plots.ledger_waterfall(ml.Ledger("article-7b", scope="layers")).axes[0]
    bars = ax.patches
    # 2 + 2 + 4 + 4 + 4 bytes per parameter (7e9), the activations L SBd (34 + 5AS/d), 2 GB overhead
    want = [14, 14, 28, 28, 28, L * S * d * 114 / GB, 2]
    assert [b.get_height() for b in bars[:-1]] == pytest.approx(want)
    assert [b.get_y() for b in bars[:-1]] == pytest.approx(list(np.cumsum([0] + want[:-1])))
    assert bars[-1].get_height() == pytest.approx(sum(want)) and bars[-1].get_y() == 0


def test_checkpoint_trade_places_each_mode_at_its_memory_and_flops():
    flops = ml.activations.flops
    modes = ("none", "full")
    ax = plots.checkpoint_trade({m: ml.Ledger("article-7b", recompute=m, scope="layers") for m in modes},
                                {m: flops.recompute_overhead(m) for m in modes}).axes[0]
    (x0, y0), (x1, y1) = [(line.get_xdata()[0], line.get_ydata()[0]) for line in ax.lines]
    assert (x0, y0) == pytest.approx((0, L * S * d * 114 / GB))
    # full recomputation: one more forward of the blocks, 2L(S + 6d) / 3(2LS + 12Ld + V) of the step (Korthikanti)
    assert x1 == pytest.approx(100 * 2 * L * (S + 6 * d) / (3 * (2 * L * S + 12 * L * d + V)))
    assert y1 == pytest.approx(L * 2 * S * d / GB)                  # the layer inputs: 2 SBd per layer


def test_per_rank_lines_divide_the_host_states_and_the_traffic():
    dps = (1, 2, 4, 8)
    setup = dict(arch="article-7b", recompute="full", zero_stage=2, offload_optimizer="cpu",
                 offload_placement="zero-offload", scope="layers")
    ax = plots.per_rank_lines(setup, dps).axes[0]
    lines = {line.get_label(): list(line.get_ydata()) for line in ax.lines}
    P = 7 * 10**9
    # ZeRO-Offload: the host holds the FP32 master, m, v and the BF16 gradients (14 B/param) of the rank's slice;
    # PCIe carries the slice's BF16 gradients down and BF16 weights up (2 + 2 B/param)
    assert lines["host memory per rank"] == pytest.approx([14 * P / n / GB for n in dps])
    assert lines["PCIe traffic per rank per step"] == pytest.approx([4 * P / n / GB for n in dps])
    assert len(set(lines["GPU memory per rank"])) == 1            # the BF16 weights stay on every GPU


def test_sum_and_peak_bars_draw_the_ledger_and_its_step():
    plain = ml.Ledger("article-7b", scope="layers")
    ax = plots.sum_and_peak_bars({"plain": plain}).axes[0]
    sums, peaks = ax.containers
    assert sums.patches[0].get_height() == pytest.approx(112 + L * S * d * 114 / GB + 2)
    assert peaks.patches[0].get_height() == pytest.approx(plain.step().peak.bytes / GB)


def test_landmark_bars_start_from_the_states_before_forward():
    llama = ml.Ledger("llama2-7b", recipe="bf16-pure-adamw", overhead_bytes=0)
    steps = {"CPU": llama.step("cpu"), "CUDA": llama.step("cuda")}
    ax = plots.landmark_bars(steps).axes[0]
    cpu, cuda = ax.containers
    before = [c.patches[0].get_height() for c in (cpu, cuda)]
    # before forward: BF16 weights, m and v (2 + 2 + 2 B/param) and little else
    assert before == pytest.approx([6 * LLAMA2 / GB] * 2, rel=2e-3)
    assert cuda.patches[-1].get_height() == pytest.approx(steps["CUDA"].peak.bytes / GB)
    assert [t.get_text() for t in ax.get_xticklabels()][-1] == "peak"


def test_states_per_param_bars_show_each_conventions_bytes():
    ours = ml.Ledger("article-7b", overhead_bytes=0)
    names = ("hf-anatomy", "deepspeed-zero2", "accelerate")
    views = {"memledger": ours, **{n: ml.CONVENTIONS[n].estimate(ours) for n in names}}
    ax = plots.states_per_param_bars(views, ours.params).axes[0]
    tops = {round(x): sum(h for _, h in s) for x, s in stacks(ax).items()}
    # 16 (the article), 18 (HF's model_memory_anatomy), 2+2+4+4+8 = 20 (DeepSpeed's estimator), 8 (accelerate's
    # largest phase, in bytes of its float16 model: 2 B/param x 4)
    assert [tops[i] for i in range(4)] == pytest.approx([16, 18, 20, 8])


def test_paired_bars_draw_each_series_in_its_colour():
    from memledger.article.survey import layer_activation_bytes, logits_bytes
    models = ("llama3-8b", "llama2-7b")
    values = {m: {"one layer": layer_activation_bytes(m, 1, 4096), "FP32 logits": logits_bytes(m, 1, 4096)}
              for m in models}
    ax = plots.paired_bars(values, "saved").axes[0]
    layer, logits = ax.containers
    # 4 S V bytes: LLaMA 3's vocabulary of 128,256, LLaMA 2's of 32,000 (their config.json)
    assert [p.get_height() for p in logits.patches] == pytest.approx([4 * 4096 * 128256 / GB, 4 * 4096 * 32000 / GB])
    assert layer.patches[0].get_facecolor() != logits.patches[0].get_facecolor()


def test_lora_lines_grow_by_the_adapters_per_rank():
    ranks = (1, 2, 4)
    ax = plots.lora_vs_rank("llama2-7b", {"Q and V": ("q_proj", "v_proj")}, ranks, full=ml.Ledger("llama2-7b"),
                            gpu_bytes=ml.GPU_MEMORY["a100-80gb"]).axes[0]
    qv = ax.lines[0].get_ydata()
    # one rank more on Q and V in 32 layers: A (d x 1) and B (1 x d) each, 2d x 2 targets x 32 parameters, FP32
    # weight, gradient, m and v (16 B); and x A saved in BF16 per target (2 B x B S)
    per_rank = 16 * 32 * 2 * 2 * 4096 + 32 * 2 * 2 * 2048
    assert np.diff(qv) * GB == pytest.approx([per_rank, 2 * per_rank])
    assert ax.lines[1].get_label() == "full fine-tuning" and ax.lines[1].get_ydata()[0] > qv[-1]


def test_peak_vs_dp_shards_fsdp_and_leaves_ddp_flat():
    base = dict(arch="llama2-7b", batch_size=1, seq_len=4096, flash_attention=True)
    dps = (16, 32, 64)
    ax = plots.peak_vs_dp({"FSDP2": {**base, "framework": "fsdp2", "recipe": "fp32-adamw"},
                           "DDP": {**base, "framework": "ddp"}}, dps).axes[0]
    fsdp, ddp = (np.asarray(line.get_ydata()) * GB for line in ax.lines[:2])
    assert len(set(ddp)) == 1                                      # DDP replicates: the world does not matter
    for n, drop in zip(dps, -np.diff(fsdp)):
        # the FP32 parameters, m and v (12 B/param) are sharded and resident all step; at most all 16 B/param
        assert 12 * LLAMA2 / (2 * n) - 1e6 <= drop <= 16 * LLAMA2 / (2 * n)


def test_reserved_two_lengths_follows_the_allocators_constants():
    per_token = 4 * 32000                                          # one token's FP32 log-softmax row
    seqs = [2040, 2048, 2049]
    ax = plots.reserved_two_lengths(2048 * per_token, [s * per_token for s in seqs],
                                    label_of=lambda n: n // per_token).axes[0]
    default, expandable = (list(line.get_ydata()) for line in ax.lines[:2])
    first = 2048 * per_token / MiB                                 # 250 MiB: a multiple of kRoundLarge (2 MiB)
    # S = 2040 fits the cached segment; S = 2049 needs its own, rounded up to 2 MiB
    assert default == pytest.approx([first, first, first + 252])
    # expandable: pages of kLargeBuffer (20 MiB) mapped for the larger tensor
    assert expandable == pytest.approx([260, 260, 260])
    assert Fraction(2049 * per_token, MiB) > 250


def test_unit_life_follows_fsdp2s_buffers_through_the_step():
    step = ml.Ledger(arch="llama2-7b", batch_size=1, seq_len=4096, dp=8, flash_attention=True, framework="fsdp2",
                     recipe="fp32-adamw").step()
    rows = plots.unit_lifetimes(step, layers=(0, 1))
    ops = step.built.ops

    def lives(layer, kind):
        return [(nbytes, born, freed) for unit, name, nbytes, born, freed in rows if unit == layer and kind in name]

    block = 4 * 4096**2 + 3 * 4096 * 11008 + 2 * 4096          # LLaMA-2 7B's block: Q, K, V, O, gate, up, down, 2 norms
    gathered = lives(1, "all-gather output")
    assert [ops[born].phase.value for _, born, _ in gathered] == ["forward", "backward"]     # gathered twice
    assert {nbytes for nbytes, *_ in gathered} == {2 * block}                            # the whole unit in BF16
    assert {nbytes for nbytes, *_ in lives(1, "all-gather input")} == {2 * block // 8}    # this rank's shard, BF16
    unsharded = lives(1, "unsharded parameters")
    assert ops[unsharded[0][2]].phase.value == "forward"         # resharded after forward
    assert gathered[0][2] > unsharded[0][2]                      # the output is held until the next unit's gather
    (rs_bytes, rs_born, rs_freed), = lives(1, "reduce-scatter input")
    assert rs_bytes == 4 * block and ops[rs_born].phase.value == "backward"            # FP32 gradients of the unit
    assert rs_freed == lives(0, "reduce-scatter input")[0][1]    # held until the next unit's reduce-scatter
    fig = plots.unit_life(step, layers=(0, 1))
    assert len(fig.axes[0].patches) >= len(rows)
