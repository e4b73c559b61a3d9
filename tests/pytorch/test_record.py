"""The record of PyTorch's measurements (memledger/pytorch/record.py, tests/pytorch_record.jsonl.gz).

Fast (no PyTorch): the committed record is current (measured with the pinned PyTorch, from this harness), and the
recording layer keys, stores, replays and refuses as its docstring says. Slow: the rotating live sample, a few
recorded calls run live each run (``--live-sample N``, ``--live-sample-seed``; the seed is in pytest's header) that
must give the record's result.
"""
import gzip
import hashlib
import json
import re

import pytest

from memledger.pytorch import record
from memledger.pytorch.record import RecordError, call_key, recorded

from conftest import RECORD, ROOT, live_sample_seed


def pinned_torch() -> str:
    return re.search(r"^torch==(\S+)$", (ROOT / "requirements.txt").read_text(), re.M).group(1)


def test_the_record_is_current():
    """Fails when the record is stale: measured with another PyTorch than requirements.txt pins or the one
    installed, or before the harness (memledger/pytorch/ and what it imports) last changed."""
    if record.mode() == "record":
        pytest.skip("--pytorch=record: this run writes the record")
    stored = record.head(RECORD)
    assert stored, f"no PyTorch record at {RECORD}: write it with `{record.COMMAND}`"
    assert stored["torch"] == pinned_torch(), (f"the record was measured with PyTorch {stored['torch']}, "
                                               f"requirements.txt pins {pinned_torch()}: `{record.COMMAND}`")
    assert record.record_status(stored) is None, f"{record.record_status(stored)}: `{record.COMMAND}`"


def test_the_harness_hash_covers_what_runs_pytorch():
    """Every module that defines a recorded function and what it imports (memledger's NF4 fallback rule
    included), not the recording layer nor memledger's side of the comparison."""
    names = {p.relative_to(ROOT).as_posix() for p in record.harness_files()}
    assert {f"memledger/pytorch/{m}.py" for m in record.HARNESS} <= names
    assert {"memledger/pytorch/reference.py", "memledger/pytorch/optimizers.py", "memledger/states/bnb.py"} <= names
    assert not {"memledger/pytorch/record.py", "memledger/pytorch/compare.py", "memledger/ledger/ledger.py"} & names


@pytest.fixture
def layer(tmp_path):
    """The recording layer on a record in ``tmp_path``; the session's mode restored afterwards."""
    saved, measured = dict(record._state), dict(record._measured)
    yield tmp_path / "record.jsonl.gz"
    record._state.clear()
    record._state.update(saved)
    record._measured.clear()
    record._measured.update(measured)


CALLS = []


@recorded
def measuring(shape: tuple, loop: str = "fp32-adamw", *, scale: int = 1, fail: bool = False) -> dict:
    CALLS.append(shape)
    if fail:
        raise ValueError(f"bad shape {shape}")
    return {"peak": sum(shape) * scale, ("forward", 0): [1, (2, "x")]}


def test_a_call_is_known_by_its_arguments_that_differ_from_the_defaults():
    assert call_key(measuring, ((1, 2),), {"loop": "fp32-adamw", "scale": 3}) == \
        "test_record.measuring(shape=(1, 2), scale=3)"
    assert call_key(measuring, ((7,), "bf16-pure-adamw")) == "test_record.measuring(shape=(7,), loop='bf16-pure-adamw')"
    with pytest.raises(TypeError, match="cannot record an argument of type object"):
        call_key(measuring, (object(),))


def test_recorded_calls_replay_without_running(layer):
    record.configure("record", layer)
    first = measuring((1, 2), scale=2)
    with pytest.raises(ValueError, match=r"bad shape \(3,\)"):
        measuring((3,), fail=True)
    record.save(record.measured(), layer)
    CALLS.clear()
    record.configure("recorded", layer)
    assert measuring((1, 2), scale=2) == first == {"peak": 6, ("forward", 0): [1, (2, "x")]}
    with pytest.raises(ValueError, match=r"bad shape \(3,\)"):
        measuring((3,), fail=True)
    assert CALLS == []
    with pytest.raises(RecordError, match=r"lacks test_record.measuring\(shape=\(1, 2\)\)"):
        measuring((1, 2))


def test_a_stale_record_is_refused(layer):
    record.configure("record", layer)
    measuring((1, 2))
    record.save(record.measured(), layer)
    lines = gzip.decompress(layer.read_bytes()).decode().splitlines()
    for field, value in (("harness", hashlib.sha256(b"another harness").hexdigest()), ("torch", "0.1.0")):
        layer.write_bytes(gzip.compress("\n".join([json.dumps({**json.loads(lines[0]), field: value}),
                                                   *lines[1:]]).encode()))
        record.configure("recorded", layer)
        with pytest.raises(RecordError, match="is stale: .*regenerate it with"):
            measuring((1, 2))
        assert record.record_status(record.head(layer))


def test_live_results_must_equal_the_record(layer):
    record.configure("record", layer)
    measuring((1, 2))
    stored = record.save(record.measured(), layer)
    record.configure("live", layer)
    assert measuring((1, 2)) == {"peak": 3, ("forward", 0): [1, (2, "x")]}
    reordered = {("forward", 0): [1, (2, "x")], "peak": 3}
    stored["cases"]["test_record.measuring(shape=(1, 2))"] = repr(reordered)
    record.save(stored["cases"], layer)
    record.configure("live", layer)
    assert measuring((1, 2)) == reordered                         # the same values: a dict's order is not compared
    stored["cases"]["test_record.measuring(shape=(1, 2))"] = repr({"peak": 4})
    record.save(stored["cases"], layer)
    record.configure("live", layer)
    with pytest.raises(RecordError, match=r"differs from the record's for test_record.measuring\(shape=\(1, 2\)\)"):
        measuring((1, 2))


def test_the_record_is_written_the_same_way_twice(layer):
    record.configure("record", layer)
    measuring((2, 1))
    measuring((1, 2))
    record.save(record.measured(), layer, keep=False)
    once = layer.read_bytes()
    record.save(dict(reversed(record.measured().items())), layer, keep=False)
    assert layer.read_bytes() == once


# --- the rotating live sample ---------------------------------------------------------------------------------

#: The sample draws from the light calls: a decoder of at most 8 blocks (a call's time grows with its blocks:
#: ~0.5 s a block under MemTracker, ~0.8 s under FSDPMemTracker), not ``torch.compile`` (~13 s of compiling a
#: call) nor DDP's buckets (~10 s of setting up gloo a call). The rest run live in the live tier (--pytorch=live).
HEAVY = ("compiled.compiled_saved(", "distributed.ddp_buckets(")


def light(key: str) -> bool:
    layers = re.search(r"\bL=(\d+)", key)
    return not key.startswith(HEAVY) and layers is not None and int(layers.group(1)) <= 8


def sample(cases: dict, seed: str, n: int) -> list:
    """n of the record's light calls, in an order the seed shuffles."""
    return sorted(filter(light, cases), key=lambda key: hashlib.sha256(f"{seed}\0{key}".encode()).hexdigest())[:n]


def test_the_live_sample_rotates_with_its_seed_among_light_calls():
    small = {f"measure.memtracker_step(c=RefConfig(d=64, L=2, H=4, F=160, V=1000), seq={s})": "" for s in range(40)}
    heavy = {"measure.memtracker_step(c=RefConfig(d=4096, L=32, H=32, F=11008, V=32000), seq=4096)": "",
             "compiled.compiled_saved(c=RefConfig(d=64, L=1, H=4, F=176, V=128), backend='inductor')": "",
             "distributed.ddp_buckets(c=RefConfig(d=64, L=2, H=4, F=160, V=1000), seq=16)": ""}
    assert all(map(light, small)) and not any(map(light, heavy))
    today, tomorrow = sample({**small, **heavy}, "20261207", 6), sample({**small, **heavy}, "20261208", 6)
    assert len(today) == len(tomorrow) == 6 and set(today) <= set(small) and set(tomorrow) <= set(small)
    assert today == sample({**heavy, **small}, "20261207", 6) and today != tomorrow


def pytest_generate_tests(metafunc):
    if "sampled" in metafunc.fixturenames:
        metafunc.parametrize("sampled", range(metafunc.config.getoption("live_sample")))


@pytest.mark.slow
def test_live_sample_equals_the_record(request, sampled):
    """One of today's sample: the recorded call run live gives the record's result (every byte count, shape and
    order of a list; not the order of a dict's keys)."""
    if record.mode() != "recorded":
        pytest.skip(f"--pytorch={record.mode()}: every measurement runs live")
    pytest.importorskip("torch")
    cases = record.load(RECORD).get("cases", {})
    keys = sample(cases, live_sample_seed(request.config), request.config.getoption("live_sample"))
    if sampled >= len(keys):
        pytest.skip("the record holds fewer calls")
    assert record.same(record.call(keys[sampled]), cases[keys[sampled]]), keys[sampled]
