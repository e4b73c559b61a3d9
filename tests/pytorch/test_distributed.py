"""PyTorch's own distributed engine on a fake process group (memledger/pytorch/distributed.py).

The independent values: the issue's published FSDP2 figures (LLaMA-2 7B, world 8), FSDP2's buffers as its
source allocates them (torch/distributed/fsdp/_fully_shard/, PyTorch 2.13: cited at each rule below) against
FSDPMemTracker's categories at every FSDP hook, DDP's bucket rules (torch/nn/parallel/distributed.py)
against a storage census of real tensors, and the per-rank shapes of tensor parallelism against MemTracker.
"""
import dataclasses
import math

import pytest

torch = pytest.importorskip("torch")

from memledger.models.architecture import Architecture  # noqa: E402
from memledger.pytorch.distributed import ddp_buckets, fsdp_step, tp_step  # noqa: E402
from memledger.pytorch.measure import memtracker_step  # noqa: E402
from memledger.pytorch.reference import RefConfig  # noqa: E402

pytestmark = pytest.mark.slow

LLAMA2_7B = RefConfig(4096, 32, 32, 11008, 32000, "llama")
#: Small, with every dim-0 size not a multiple of 8 ranks (FSDP2 pads each parameter's dim 0).
ODD = RefConfig(60, 3, 4, 170, 1001, "llama")
GB = 10 ** 9


def test_llama2_7b_fsdp2_is_the_issues_measurement():
    """Issue 15: LLaMA-2 7B shape, world 8, B 1, S 4096, fully_shard per block and the root,
    MixedPrecisionPolicy(bf16, fp32): before forward 10.11 GB, after forward 37.39 GB, peak 39.37 GB.
    Those are every unit resharded after forward, the root included, and the loss computed in the root's
    forward (the root's pre-backward all-gather, and the prefetch of the last block, land before the loss's
    backward)."""
    got = fsdp_step(LLAMA2_7B, batch=1, seq=4096, world=8, loss_in_root=True, track_first=False)
    assert round(got["before forward"] / GB, 2) == 10.11
    assert round(got["after forward"] / GB, 2) == 37.39
    assert round(got["peak"] / GB, 2) == 39.37
    P = Architecture(4096, 32, 32, 11008, 32000, "llama").computed_params
    tensors = 32 * 7 + 3
    # FP32 shards (the masters) and AdamW's two FP32 moments on them, one FP32 step per tensor, int64 ids
    assert got["before forward"] == 12 * P // 8 + 4 * tensors + 2 * 8 * 4096


# ---- FSDP2's own buffers, from its source, at every FSDP hook ------------------------------------------------

def unit_params(c: RefConfig) -> dict:
    """{unit: [(dim 0, numel), ...]} in registration order (Block.__init__, Decoder.__init__); units "root" and
    the block indices. FSDP2 groups a unit's parameters in this order (_fsdp_param_group.py: FSDPParamGroup)."""
    d, hd, H, kv = c.d, c.hd, c.H, c.kv_heads

    def lin(o, i):
        return [(o, o * i)]
    block = [(d, d), (d, d)] + lin((H + 2 * kv) * hd, d) + lin(d, H * hd) + lin(c.F, d) * 2 + lin(d, c.F)
    units = {"root": [(c.V, c.V * d), (d, d), (c.V, c.V * d)]}
    units.update({i: block for i in range(c.L)})
    return units


def padded(params, N: int) -> int:
    """Elements after FSDP2's dim-0 padding: each parameter to ceil(dim0 / N) rows per rank
    (_fsdp_param.py: _init_sharded_param, ``padded_sharded_size = chunks[0].size()``)."""
    return sum(math.ceil(n0 / N) * N * (numel // n0) for n0, numel in params)


def hooks(c: RefConfig, N: int, p=2, r=4, o=4, reshard=True, root_reshard=True) -> dict:
    """{(unit, hook): [{category: bytes}, ...]}: FSDP2's buffers at each hook FSDPMemTracker snapshots, as
    FSDP2's source allocates and frees them. p, r, o: bytes of the param (all-gather), reduce and original
    dtypes; ``reshard``: True, False or the int k of a post-forward reshard to k ranks (the clone of a 1/k
    slice is made in forward and counted as an activation: key "PF")."""
    units = unit_params(c)
    Ph = {u: padded(ps, N) for u, ps in units.items()}
    live, snaps = {}, {}

    def snap(u, hook):
        total = {}
        for cat, b in live.values():
            total[cat] = total.get(cat, 0) + b
        snaps.setdefault((u, hook), []).append(total)

    def post_forward(u, rule):
        if rule is True:                            # _fsdp_param.py: to_sharded -> free_storage
            del live[f"U {u}"]
        elif rule is not False:                     # to_sharded_post_forward: .clone() of a 1/k narrow
            del live[f"U {u}"]
            live[f"PF {u}"] = ("PF", p * Ph[u] // rule)

    def unshard(u):
        # foreach_all_gather: all-gather output p*P^ (the p*P^/N input copy is freed on return);
        # wait_for_unshard -> foreach_all_gather_copy_out: alloc_storage of the unsharded parameters, p*P^
        live[f"AG {u}"] = ("All Gather", p * Ph[u])
        live[f"U {u}"] = ("Unsharded Param", p * Ph[u])

    # forward: root, then each block; the previous all-gather output is kept (comm_ctx.all_gather_state)
    # until the next unit's all-gather has been issued (_fsdp_param_group.py: wait_for_unshard)
    snap("root", "Before Pre-Forward")
    unshard("root")
    snap("root", "After Pre-Forward")
    prev = "root"
    for i in range(c.L):
        snap(i, "Before Pre-Forward")
        unshard(i)
        del live[f"AG {prev}"]
        snap(i, "After Pre-Forward")
        snap(i, "Before Post-Forward")
        post_forward(i, reshard)
        snap(i, "After Post-Forward")
        prev = i
    snap("root", "Before Post-Forward")
    post_forward("root", root_reshard)
    del live[f"AG {prev}"]                          # _fsdp_state.py: _post_forward of the root flushes it
    snap("root", "After Post-Forward")

    def gather_in_backward(u):
        # pre_backward -> unshard (no-op if unsharded): output p*P^; copy-out frees it at once in backward
        if f"U {u}" not in live:
            live.pop(f"PF {u}", None)               # to_unsharded frees the post-forward shard
            live[f"U {u}"] = ("Unsharded Param", p * Ph[u])

    def prefetch(u):                                # _backward_prefetch: the previous unit in forward order
        if f"U {u}" not in live:
            live[f"AG {u}"] = ("All Gather", p * Ph[u])

    def reduce(u, rs_prev):
        # post_backward: reshard, then drop the previous reduce-scatter input (reduce_scatter_states, at most
        # one kept), then foreach_reduce: reduce-scatter input r*P^, output r*P^/N (the sharded gradients are
        # views of it; cast to o if r != o). The tracker's wrapper still holds the last parameter's gradient.
        del live[f"U {u}"]
        if rs_prev:
            del live[rs_prev]
        live[f"RS {u}"] = ("Reduce Scatter", r * Ph[u])
        live[f"G {u}"] = ("Unsharded Grad", p * units[u][-1][1])
        live[f"SG {u}"] = ("Sharded Grad", o * Ph[u] // N)
        return f"RS {u}"

    snap("root", "Before Pre-Backward")
    gather_in_backward("root")
    prefetch(c.L - 1)
    snap("root", "After Pre-Backward")
    rs_prev = None
    for i in reversed(range(c.L)):
        snap(i, "Before Pre-Backward")
        live.pop(f"AG {i}", None)
        gather_in_backward(i)
        if i:
            prefetch(i - 1)
        snap(i, "After Pre-Backward")
        live[f"G {i}"] = ("Unsharded Grad", p * sum(n for _, n in units[i]))
        snap(i, "Before Post-Backward")
        rs_prev = reduce(i, rs_prev)
        snap(i, "After Post-Backward")
        del live[f"G {i}"]
    # the root's inputs (token ids) need no gradient: its post_backward runs in the final callback
    live["G root"] = ("Unsharded Grad", p * sum(n for _, n in units["root"]))
    snap("root", "Before Post-Backward")
    reduce("root", rs_prev)
    snap("root", "After Post-Backward")
    return snaps


FSDP_CATEGORIES = ("Unsharded Param", "Unsharded Grad", "All Gather", "Reduce Scatter", "Sharded Grad")


def fsdp_part(snapshots):
    return [{k: v for k, v in s.items() if k in FSDP_CATEGORIES} for s in snapshots]


def name(u):
    return "FSDPDecoder" if u == "root" else f"FSDPDecoder.blocks.{u}"


@pytest.mark.parametrize("options, rule", [
    (dict(), dict()),
    (dict(root_reshard=False), dict(root_reshard=False)),                       # PyTorch's default for a root
    (dict(reshard=False), dict(reshard=False, root_reshard=False)),
    (dict(reshard=2), dict(reshard=2, root_reshard=2)),
    (dict(param_dtype=None, reduce_dtype=None), dict(p=4, r=4)),                # MixedPrecisionPolicy()
    (dict(param_dtype="bf16", reduce_dtype="bf16"), dict(p=2, r=2)),          # FP32 sharded grads (cast)
])
def test_fsdp2_buffers_at_every_hook(options, rule):
    """All-gather outputs, unsharded parameters, reduce-scatter inputs, sharded and unsharded gradients at each
    of FSDPMemTracker's hook snapshots (before/after pre- and post-forward, pre- and post-backward) are
    FSDP2's source, byte for byte, with dim-0 padding (ODD: no dim divides 8)."""
    got = fsdp_step(ODD, batch=2, seq=16, world=8, track_first=False, **options)["modules"]
    for (u, hook), want in hooks(ODD, 8, **rule).items():
        assert fsdp_part(got[name(u)][hook]) == fsdp_part(want), (u, hook)


def test_hsdp_shards_over_the_shard_dimension():
    """HSDP on a (2, 4) mesh: the same buffers as FSDP2 over 4 ranks (the replicas all-reduce the reduce-scatter
    output in place: with reduce dtype = parameter dtype it is the sharded gradient itself)."""
    got = fsdp_step(ODD, batch=2, seq=16, world=8, replicate=2, track_first=False)
    for (u, hook), want in hooks(ODD, 4).items():
        assert fsdp_part(got["modules"][name(u)][hook]) == fsdp_part(want), (u, hook)
    assert got["before forward"] == fsdp_step(ODD, batch=2, seq=16, world=4, track_first=False)["before forward"]


def test_an_int_reshard_keeps_a_slice_after_forward():
    """reshard_after_forward=k keeps a clone of this rank's 1/k slice of each unit's all-gather output
    (_fsdp_param.py: to_sharded_post_forward); FSDPMemTracker counts it as an activation."""
    resharded = fsdp_step(ODD, batch=2, seq=16, world=8, track_first=False)
    got = fsdp_step(ODD, batch=2, seq=16, world=8, track_first=False, reshard=2)
    for (u, hook), want in hooks(ODD, 8, reshard=2, root_reshard=2).items():
        extra = [a.get("Activation", 0) - b.get("Activation", 0)
                 for a, b in zip(got["modules"][name(u)][hook], resharded["modules"][name(u)][hook])]
        assert extra == [w.get("PF", 0) for w in want], (u, hook)
    units = unit_params(ODD)
    assert got["after forward"] - resharded["after forward"] == sum(2 * padded(ps, 8) // 2 for ps in units.values())


@pytest.mark.parametrize("size, dim", [((4096, 64), 0), ((60, 170), 0), ((1001,), 0), ((5, 7), 1), ((3,), 0)])
@pytest.mark.parametrize("n", [1, 4, 8, 64, 1024])
def test_rank0_chunks_are_pytorchs(size, dim, n):
    """The harness's lazy chunks (fully_shard's init, untracked) are the views FSDP2's own
    ``_chunk_with_empty`` returns: same size, stride, offset and storage, or ``new_empty(0)`` past the last."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty
    from memledger.pytorch.distributed import _Chunks
    tensor = torch.arange(math.prod(size), dtype=torch.float32).reshape(size)
    want, got = _chunk_with_empty(tensor, n, dim), _Chunks(tensor, n, dim)
    assert len(got) == len(want) == n
    for i in range(-n, n):
        w, g = want[i], got[i]
        assert (g.size(), g.stride(), g.storage_offset(), g.dtype) == (w.size(), w.stride(), w.storage_offset(),
                                                                        w.dtype), i
        assert w.numel() == 0 or g.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
    with pytest.raises(IndexError):
        got[n]


@pytest.mark.parametrize("c, options", [
    (dataclasses.replace(ODD, recompute="selective", dropout=0.1), dict(reshard=False, foreach=True)),
    (ODD, dict(reshard=2, loss_in_root=True, replicate=2, reduce_dtype="bf16")),
    (RefConfig(64, 2, 4, 256, 1000, "llama", tp=2), dict(tp=2, sequence_parallel=True))])
def test_two_tracked_steps_are_one(c, options):
    """A first step tracked (reset_mod_stats() between them) or the optimizer's state made without one
    (``track_first=False``: Trainer.init_state, FSDP2's lazy init at the tracked forward) gives the same second
    step: every landmark, phase peak and category, and every FSDP hook's snapshot."""
    one = fsdp_step(c, batch=2, seq=16, world=8, track_first=False, **options)
    two = fsdp_step(c, batch=2, seq=16, world=8, **options)
    assert one == two


@pytest.mark.parametrize("root_reshard", [True, False])
def test_fsdp2_step_is_the_plain_step_plus_its_buffers(root_reshard):
    """The FSDP2 step, landmark and peak, from the plain BF16 step of the same model (MemTracker's run of the
    reference, ``bf16-pure-adamw``: the same compute dtype) and FSDP2's buffers:

    * before forward: FP32 shards o*P^/N, AdamW's moments on them 2*o*P^/N, 4 B per tensor, the ids;
    * after forward: + the plain step's activations (+ the root's unsharded parameters if not resharded);
    * after backward: + the sharded gradients o*P^/N;
    * forward peak: the largest of the plain step's block peaks, less its parameters and states, + the root's
      unsharded parameters, the block's, and the block's all-gather output (still held); or the loss's, + the
      root's unsharded parameters if they were not resharded;
    * backward peak (in block i): the plain step's, less its parameters and states and the BF16 gradients of
      the blocks after i, + the root's and block i's unsharded parameters, block i-1's prefetched all-gather
      output, block i+1's reduce-scatter input and the sharded gradients of the blocks after i.
    """
    plain = memtracker_step(ODD, "bf16-pure-adamw", 2, 16, blocks=True)
    got = fsdp_step(ODD, batch=2, seq=16, world=8, track_first=False, root_reshard=root_reshard)
    units = unit_params(ODD)
    N, L = 8, ODD.L
    Ph = {u: padded(ps, N) for u, ps in units.items()}
    P = {u: sum(n for _, n in ps) for u, ps in units.items()}
    shards = 4 * sum(Ph.values()) // N
    static = 3 * shards + 4 * sum(len(ps) for ps in units.values()) + 2 * 8 * 2 * 16
    assert got["before forward"] == got["after step"] == static
    root = 0 if root_reshard else 2 * Ph["root"]
    assert got["after forward"] == plain["after forward"] - plain["before forward"] + static + root
    assert got["after backward"] == static + shards
    base = plain["before forward"]
    U, AG, RS, SG = 2 * Ph[0], 2 * Ph[0], 4 * Ph[0], 4 * Ph[0] // N
    forward = max(plain["block peaks"]["forward", i] - base + static + 2 * Ph["root"] + U + AG for i in range(L))
    # the loss (outside the root: every all-gather buffer freed, the root's parameters unless resharded)
    forward = max(forward, plain["phase peaks"]["forward"] - base + static + root)
    assert got["phase peaks"]["forward"] == forward
    backward = max(plain["block peaks"]["backward", i] - base - 2 * P[0] * (L - 1 - i) + static + 2 * Ph["root"]
                   + U + (AG if i else 0) + (RS if i < L - 1 else 0) + SG * (L - 1 - i) for i in range(L))
    assert got["phase peaks"]["backward"] == backward


# ---- tensor parallelism ----------------------------------------------------------------------------------------

TP_SHAPE = dict(d=64, L=2, H=4, F=256, V=1000, style="llama")


def tp_params(c: RefConfig, t: int) -> int:
    """Parameters one rank holds (tp_plan): the embedding, LM head, QKV and MLP-in split on their outputs, the
    output projection and MLP-out on their inputs, every norm whole."""
    d, hd = c.d, c.hd
    block = 2 * d + ((c.H + 2 * c.kv_heads) * hd * d + d * c.H * hd + 3 * c.F * d) // t
    return 2 * c.V * d // t + c.L * block + d


@pytest.mark.parametrize("t, kv", [(2, None), (4, None), (2, 2)])
def test_tensor_parallel_states_per_rank(t, kv):
    """BF16 parameters and AdamW moments divided as the plan splits them; the vocabulary-parallel embedding's
    gradient is whole: DTensor's embedding backward returns it Replicate (V x d on every rank)."""
    c = RefConfig(**TP_SHAPE, n_kv_heads=kv, tp=t)
    got = tp_step(c, "bf16-pure-adamw", batch=2, seq=32)
    n = tp_params(c, t)
    tensors = 7 * c.L + 3
    assert got["before forward"] == got["after step"] == 3 * 2 * n + 4 * tensors + 2 * 8 * 2 * 32
    assert got["after backward"] - got["before forward"] == 2 * n + 2 * c.V * c.d * (t - 1) // t


def test_the_loss_phase_is_divided_by_t():
    """Under loss_parallel() each rank's B x S x V tensors are B x S x V/t (FP32): the forward holds two of them
    beyond the log-softmax output it keeps (the FP32 logits and the shifted logits of loss.py's _log_softmax),
    the backward three (zeros_like, exp, add of _nll_loss_and_log_softmax_backward); what is left is per
    token (maxima, sums, masked int64 targets: under 64 bytes a token), the same for every t."""
    B, S = 2, 32
    rest = set()
    for t in (2, 4):
        c = RefConfig(**TP_SHAPE, tp=t)
        got = tp_step(c, "bf16-pure-adamw", batch=B, seq=S)
        u = 4 * B * S * c.V // t
        rest.add((got["phase peaks"]["forward"] - got["after forward"] - 2 * u,
                  got["phase peaks"]["backward"] - got["after forward"] - 3 * u))
    assert len(rest) == 1
    assert all(0 <= r < 64 * B * S for r in rest.pop())


@pytest.mark.parametrize("shape, B, S, dp, t", [(TP_SHAPE, 2, 32, 4, 2), (LLAMA2_7B, 1, 4096, 4, 2),
                                                 (LLAMA2_7B, 1, 4096, 8, 2)])
def test_fsdp2_over_tensor_parallel_shards(shape, B, S, dp, t):
    """FSDP2 on a (dp, t) mesh over the tensor-parallel model: each rank's TP slice padded on dim 0 to a multiple
    of the dp ranks (_fsdp_param.py:541, _init_sharding_spec_tp returns the local tensor; :298-307 chunks and
    pads it): FP32 shards and AdamW's two moments on them, one FP32 step per tensor, the int64 ids and targets;
    after backward the FP32 sharded gradients."""
    c = RefConfig(**shape, tp=t) if isinstance(shape, dict) else dataclasses.replace(shape, tp=t)
    got = fsdp_step(c, batch=B, seq=S, world=dp * t, tp=t, track_first=False)
    d, F, V = c.d, c.F, c.V
    local = [(V // t, d), (d, 1), (V // t, d)] + c.L * [(d, 1), (d, 1), (3 * d // t, d), (d, d // t), (F // t, d),
                                                        (F // t, d), (d, F // t)]
    shards = sum(math.ceil(n0 / dp) * rest for n0, rest in local)
    assert got["before forward"] == 12 * shards + 4 * len(local) + 2 * 8 * B * S
    assert got["after backward"] == got["before forward"] + 4 * shards


# ---- DDP, real tensors -------------------------------------------------------------------------------------

DDP_SHAPE = RefConfig(128, 2, 4, 512, 2000, "llama")


@pytest.mark.parametrize("view", [False, True])
@pytest.mark.parametrize("cap", [None, 0.25])
def test_ddp_buckets(view, cap):
    """DDP allocates one flat bucket of every gradient when wrapping (first iteration: compute_bucket_size_limits
    gives [sys.maxsize]); the rebuilt buckets hold every gradient once, each closed when it reaches its limit,
    the first limit 1 MiB only when bucket_cap_mb is left at its default; the gradients are extra storage
    unless gradient_as_bucket_view."""
    got = ddp_buckets(DDP_SHAPE, batch=2, seq=16, bucket_cap_mb=cap, gradient_as_bucket_view=view)
    grads = got["grads"]
    assert got["wrap"] == sum(got["buckets"]) == grads
    assert got["step"] == (1 if view else 2) * grads
    assert got["grads are bucket views"] is view
    first = 2 ** 20 if cap is None else int(cap * 2 ** 20)
    later = 25 * 2 ** 20 if cap is None else first
    largest = 4 * DDP_SHAPE.V * DDP_SHAPE.d
    assert first <= got["buckets"][0] < first + largest
    assert all(later <= b < later + largest for b in got["buckets"][1:-1])


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="divide world"):
        fsdp_step(ODD, world=8, replicate=3)
    with pytest.raises(ValueError, match="param_dtype"):
        fsdp_step(ODD, param_dtype="int8")
    with pytest.raises(TypeError, match="reshard"):
        fsdp_step(ODD, reshard="yes")
    with pytest.raises(ValueError, match="tp = 2"):
        fsdp_step(ODD, world=8, tp=2)
    with pytest.raises(ValueError, match="tp"):
        RefConfig(**TP_SHAPE, tp=3)
    with pytest.raises(ValueError, match="t >= 2"):
        tp_step(RefConfig(**TP_SHAPE))


def test_cpu_offload_counts_the_host_apart():
    """CPUOffloadPolicy on the fake CPU device: with the host<->device copies made real allocations, the host's
    storages are FSDPMemTracker's sharded parameters and optimizer states (and after backward its sharded
    gradients); at each landmark the device and the host add up to the plain FSDP2 run's total."""
    plain = fsdp_step(ODD, batch=2, seq=16, world=8, track_first=False)
    got = fsdp_step(ODD, batch=2, seq=16, world=8, track_first=False, cpu_offload=True, pin_memory=False)
    before, after = got["categories"]["before forward"], got["categories"]["after backward"]
    assert got["host"]["before forward"] == before["Sharded Param"] + before["OptState"]
    assert got["host"]["after backward"] - got["host"]["before forward"] == after["Sharded Grad"]
    for k in ("before forward", "after forward", "after backward", "after step"):
        assert got["device"][k] + got["host"][k] == got[k] == plain[k]
    assert got["device"]["phase peaks"]["optimizer"] == got["device"]["after backward"]     # AdamW on the host
    with pytest.raises(ValueError, match="track_first=False"):
        fsdp_step(ODD, world=8, cpu_offload=True)
