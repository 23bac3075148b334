from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import numpy as np
import orjson
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.protocol.checkpoint import Checkpoint, CheckpointPart
from roles.protocol.datapath import (
    AckTaking,
    BatchKeys,
    DataIndex,
    DataStats,
    Deliver,
    Embeddings,
    FeederProgress,
    GradsLookup,
    Lookup,
    PartMap,
    PartStats,
    SampleBatch,
    Taking,
)
from roles.protocol.dense_sync import (
    Aggregate,
    Contribution,
    Partial,
    RoundDone,
    StepGrad,
    Weights,
)
from roles.protocol.lifecycle import EpochTrained, EvalReport
from roles.protocol.model_parallel import MemberCall, MemberReply, MemberTensors
from roles.protocol.placement import Handover, KeyCounts, Placement, WindowWork
from roles.protocol.serving import DenseDelta, RowDelta, RowsCaughtUp
from roles.protocol.stream import StreamScores
from zbus import sockets
from zbus.codec import (
    MAX_HEADER_BYTES,
    PROTOCOL_VERSION,
    Message,
    ProtocolError,
    decode,
    message_types,
)
from zbus.messages import Failure, Finish, Hello, Ready


def sample(cls: type) -> Message:
    """A valid instance of any message type."""
    values = {}
    for f in dataclasses.fields(cls):
        if "dtype" in f.metadata:
            dtype, ndim = f.metadata["dtype"], f.metadata["ndim"]
            values[f.name] = np.zeros((3,) * ndim, dtype=dtype)
            continue
        t = {s: k for s, k in cls._scalars}[f.name]
        values[f.name] = {int: 3, float: 0.5, str: "x", bool: True, dict[str, Any]: {"a": 1},
                          dict[str, int]: {"a": 1}, list[str]: ["worker-0"], list[int]: [7],
                          list[float]: [0.5], list[list[int]]: [[3]],
                          list[dict[str, Any]]: [{"window": 0, "auc": 0.5}],
                          list[list[dict[str, Any]]]: []}[t]
    if cls is BatchKeys:
        values.update(samples=2, bounds=[0, 2, 4], positions=np.array([0, 3], np.int32),
                      keys=np.array([-5, 2**62], np.int64))
    if cls is Embeddings:
        values.update(grid=10, mask=np.array([0b11000000, 0], np.uint8),
                      inverse=np.array([0, 0], np.int32), rows=np.ones((1, 4), np.float32))
    if cls is Placement:
        values.update(phase="move", keys=np.array([-5, 9], np.int64),
                      owners=np.array([1, 0], np.int64))
    if cls is StreamScores:   # (and two labels' histograms)
        values.update(bins=np.array([1, 70_000], np.int64), counts=np.array([2, 1], np.int64),
                      task_loss_sums=[0.5, 0.25], task_prob_sums=[3.0, 1.0],
                      task_windows=[[{"window": 0, "auc": 0.75}], []],
                      task_bins=np.array([5, 200_000], np.int64),
                      task_counts=np.array([1, 4], np.int64))
    if cls is KeyCounts:
        values.update(counts=np.array([4, 2, 1], np.int64), errors=np.array([1, 0, 0], np.int64))
    if cls is WindowWork:
        values.update(windows=np.array([0, 4, 5], np.int64), figures=np.ones((3, 4)))
    if cls in (RowDelta, DenseDelta):
        values.update(cut=9, previous=3)
    if cls in (RowDelta, RowsCaughtUp):   # float32 rows, not int8 ones too
        values.update(qrows=np.zeros((0, 3), np.int8), scales=np.zeros(0, np.float32))
    if cls is MemberTensors:
        values.update(phase="forward", names=["mlp_0"], values=np.zeros(3, np.float32))
    parts = np.array([[0, 0, 0, 5, 0, 90, 0], [1, 0, 5, 2, 90, 130, 1]], np.int64)
    if cls is PartMap:
        values.update(body=PartMap.body_of([{"path": "/d.csv", "size": 130}]), parts=parts,
                      owners=np.array([0, 1], np.int32),
                      resume={"1": {"epoch": 0, "phase": "training", "reported": False,
                                    "low": 3, "above": [5], "samples": 768, "loss_sum": 1.5,
                                    "weight_sum": 768.0}})
    if cls is DataIndex:
        values.update(body=PartMap.body_of([{"path": "/d.csv", "size": 130}]), parts=parts)
    if cls is PartStats:
        values.update(parts=np.array([0], np.int64), counts=np.array([[10, 9, 1, 1, -1]]),
                      moments=np.ones((1, 3, 2)))
    if cls is DataStats:
        values.update(mean=np.zeros(2), std=np.ones(2))
    if cls is EvalReport:
        values.update(counts=np.ones((4, 8), np.int64), loss_sums=np.ones(2),
                      prob_sums=np.ones(2), groups=np.arange(3, dtype=np.int64),
                      group_labels=np.ones(6, np.float32),
                      group_probs=np.ones(6, np.float32))
    if cls in (MemberCall, MemberReply):
        values.update(call="flat")
    if cls is FeederProgress:
        values.update(above=[[9]])  # batch numbers at or above low
    if cls is Checkpoint:
        values.update(phase="write")
    if cls in (AckTaking, Taking):
        values.update(takes=np.array([4, 5], np.int64))  # distinct batch ids
    if cls is GradsLookup:
        values.update(lookup=4)  # the next batch, not this one
    if cls is CheckpointPart:
        values.update(files=["000003/ps-0.npz"])
    return cls(**values)


ALL = sorted(message_types().values(), key=lambda c: c.__name__)


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_every_message_round_trips(cls):
    msg = sample(cls)
    env = decode(msg.to_frames("worker-1", 42))
    assert env.sender == "worker-1" and env.seq == 42
    assert type(env.msg) is cls
    for f in dataclasses.fields(cls):
        a, b = getattr(msg, f.name), getattr(env.msg, f.name)
        if isinstance(a, np.ndarray):
            assert a.dtype == b.dtype and np.array_equal(a, b)
        else:
            assert a == b
    assert type(cls.from_frames(msg.to_frames())) is cls


def test_large_arrays_are_not_copied_on_decode():
    params = np.arange(1 << 20, dtype=np.float32)
    frames = Weights(round=1, step=0, generation=0, params=params).to_frames()
    payload = bytearray(frames[2])
    frames[2] = payload
    decoded = decode(frames).msg.params
    assert np.shares_memory(decoded, np.frombuffer(payload, dtype=np.float32))
    assert not decoded.flags.writeable
    assert np.array_equal(decoded, params)


def test_from_frames_rejects_another_type():
    with pytest.raises(ProtocolError) as err:
        Hello.from_frames(Finish().to_frames())
    assert err.value.kind == "unexpected_type"


def deep(levels):
    value = [1]
    for _ in range(levels):
        value = [value]
    return value


def frames_with_header(cls=Lookup, **changes):
    frames = sample(cls).to_frames("w", 1)
    header = msgspec.msgpack.decode(frames[1])
    for key, value in changes.items():
        if key in ("v", "from", "seq", "f", "a"):
            header[key] = value
        else:
            header["f"][key] = value
    frames[1] = msgspec.msgpack.encode(header)
    return frames


MALFORMED = {
    "no frames": ([], "truncated"),
    "tag only": ([b"Lookup"], "truncated"),
    "unknown type": ([b"Nope", b"{}"], "unknown_type"),
    "binary tag": ([b"\xff\xfe", b"{}"], "unknown_type"),
    "huge tag": ([b"A" * 1000, b"{}"], "unknown_type"),
    "header not json": ([b"Lookup", b"{not json"], "bad_header"),
    "header a list": ([b"Lookup", b"[1, 2]"], "bad_header"),
    "header a msgpack list": ([b"Lookup", msgspec.msgpack.encode([1, 2])], "bad_header"),
    "header huge": ([b"Lookup", b" " * (MAX_HEADER_BYTES + 1)], "header_too_large"),
    "missing envelope key": ([b"Lookup", msgspec.msgpack.encode(
        {"v": 1, "from": "x", "seq": 1, "f": {}})], "bad_header"),
    "extra envelope key": ([b"Lookup", msgspec.msgpack.encode(
        {"v": PROTOCOL_VERSION, "from": "x", "seq": 1, "f": {"batch_id": 1, "train": True},
         "a": [], "x": 1})], "bad_header"),
    "an older peer's JSON header": ([b"Lookup", orjson.dumps(
        {"v": 7, "from": "x", "seq": 1, "f": {"batch_id": 1, "train": True}, "a": []})],
        "bad_version"),
    "this version in JSON": ([b"Lookup", orjson.dumps(
        {"v": PROTOCOL_VERSION, "from": "x", "seq": 1, "f": {"batch_id": 1, "train": True},
         "a": []})], "bad_header"),
    "truncated msgpack": ([b"Lookup", frames_with_header()[1][:-3]], "bad_header"),
    "trailing bytes": ([b"Lookup", frames_with_header()[1] + b"\x00"], "bad_header"),
    "huge declared length": ([b"Lookup", b"\xdf\xff\xff\xff\xff"], "bad_header"),
    "huge string length": ([b"Lookup", b"\x81\xdb\xff\xff\xff\xff"], "bad_header"),
    "seq as float": (frames_with_header(seq=1.0), "bad_header"),
    "version as bool": (frames_with_header(v=True), "bad_version"),
    "from as bytes": (frames_with_header(**{"from": b"w"}), "bad_header"),
    "field as bytes": (frames_with_header(Failure, reason=b"x"), "bad_field"),
    "float field NaN": (frames_with_header(EpochTrained, loss_sum=float("nan")), "bad_field"),
    "float field inf": (frames_with_header(EpochTrained, loss_sum=float("-inf")), "bad_field"),
    "float field as bool": (frames_with_header(EpochTrained, loss_sum=True), "bad_field"),
    "list item as bool": (frames_with_header(Aggregate, participants=[True]), "bad_field"),
    "any value bytes": (frames_with_header(Ready, info={"x": b"raw"}), "bad_field"),
    "any value NaN": (frames_with_header(Ready, info={"x": [1.0, float("nan")]}), "bad_field"),
    "any value non-text key": (frames_with_header(Ready, info={"x": {1: 2}}), "bad_field"),
    "any value ext": (frames_with_header(Ready, info={"x": msgspec.msgpack.Ext(1, b"")}),
                      "bad_field"),
    "any value too deep": (frames_with_header(Ready, info={"x": deep(20)}), "bad_field"),
    "dict key not text": (frames_with_header(Ready, info={3: 1}), "bad_field"),
    "fields not a map": (frames_with_header(f=[1, True]), "bad_field"),
    "arrays not a list": (frames_with_header(a=5), "bad_arrays"),
    "wrong version": (frames_with_header(v=99), "bad_version"),
    "version as text": (frames_with_header(v="1"), "bad_version"),
    "sender not text": (frames_with_header(**{"from": 5}), "bad_header"),
    "seq is bool": (frames_with_header(seq=True), "bad_header"),
    "missing field": (frames_with_header(f={"batch_id": 1}), "bad_field"),
    "extra field": (frames_with_header(f={"batch_id": 1, "train": True, "x": 1}), "bad_field"),
    "int field as text": (frames_with_header(batch_id="7"), "bad_field"),
    "int field as bool": (frames_with_header(batch_id=False), "bad_field"),
    "bool field as int": (frames_with_header(train=1), "bad_field"),
    "float field as text": (frames_with_header(EpochTrained, loss_sum="high"), "bad_field"),
    "list of wrong items": (frames_with_header(Aggregate, participants=[1, 2]),
                            "bad_field"),
    "arrays declared for none": (frames_with_header(a=[["float32", [1]]]), "bad_arrays"),
}


@pytest.mark.parametrize("frames,kind", MALFORMED.values(), ids=MALFORMED.keys())
def test_malformed_messages_are_rejected(frames, kind):
    with pytest.raises(ProtocolError) as err:
        decode(frames)
    assert err.value.kind == kind


def batch_frames():
    return sample(SampleBatch).to_frames()


def edit_arrays(frames, index, entry=None, frame=None):
    header = msgspec.msgpack.decode(frames[1])
    if entry is not None:
        header["a"][index] = entry
    frames[1] = msgspec.msgpack.encode(header)
    if frame is not None:
        frames[2 + index] = frame
    return frames


ARRAY_CASES = {
    "frame missing": (batch_frames()[:-1], "frame_count"),
    "frame extra": (batch_frames() + [b"x"], "frame_count"),
    "wrong dtype": (edit_arrays(batch_frames(), 0, ["float64", [3, 3]]), "bad_array"),
    "wrong ndim": (edit_arrays(batch_frames(), 0, ["float32", [9]]), "bad_array"),
    "negative dim": (edit_arrays(batch_frames(), 1, ["float32", [-3]]), "bad_array"),
    "absurd dim": (edit_arrays(batch_frames(), 1, ["float32", [2**50]]), "bad_array"),
    "short frame": (edit_arrays(batch_frames(), 0, frame=b"\0" * 8), "bad_size"),
    "shape/size mismatch": (edit_arrays(batch_frames(), 0, ["float32", [3, 4]]), "bad_size"),
    "dtype as bytes": (edit_arrays(batch_frames(), 0, [b"float32", [3, 3]]), "bad_array"),
    "dim as bool": (edit_arrays(batch_frames(), 1, ["float32", [True]]), "bad_array"),
    "dim as float": (edit_arrays(batch_frames(), 1, ["float32", [3.0]]), "bad_array"),
    "entry too long": (edit_arrays(batch_frames(), 1, ["float32", [3], 1]), "bad_array"),
    "huge dims": (edit_arrays(batch_frames(), 0, ["float32", [2**39, 2**39]]), "bad_size"),
    "long frame": (edit_arrays(batch_frames(), 0, frame=b"\0" * 40), "bad_size"),
    "ragged frame": (edit_arrays(batch_frames(), 0, frame=b"\0" * 37), "bad_size"),
    "frame for an empty array": (edit_arrays(batch_frames(), 3, ["int32", [3, 0]],
                                             frame=b"\0" * 4), "bad_size"),
}


@pytest.mark.parametrize("frames,kind", ARRAY_CASES.values(), ids=ARRAY_CASES.keys())
def test_malformed_arrays_are_rejected(frames, kind):
    with pytest.raises(ProtocolError) as err:
        decode(frames)
    assert err.value.kind == kind


def test_consistency_rules():
    f32, i32, i64 = np.float32, np.int32, np.int64
    bad = [
        SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0,
                         dense=np.zeros((3, 2), f32), labels=np.zeros(2, f32),
                         weights=np.zeros(3, f32), lengths=np.zeros((3, 0), i32)),
        SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0,
                         dense=np.zeros((2, 2), f32), labels=np.zeros(2, f32),
                         weights=np.zeros(2, f32), lengths=np.zeros((3, 1), i32)),
        SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0,
                         dense=np.zeros((1, 2), f32), labels=np.zeros(1, f32),
                         weights=np.zeros(1, f32), lengths=np.full((1, 1), -1, i32)),
        BatchKeys(batch_id=1, window=0, samples=2, bounds=[0, 2, 1],
                  positions=np.array([0], i32), keys=np.array([1], i64)),
        BatchKeys(batch_id=1, window=0, samples=2, bounds=[1, 2], positions=np.array([1], i32),
                       keys=np.array([1], i64)),
        RoundDone(round=1, contributors=["worker-0"], samples_by=[], coefficient=1.0,
                       samples=1),
        BatchKeys(batch_id=1, window=0, samples=2, bounds=[0, 2, 4],
                  positions=np.array([4], i32), keys=np.array([1], i64)),
        BatchKeys(batch_id=1, window=0, samples=2, bounds=[0, 2, 4],
                  positions=np.array([-1], i32), keys=np.array([1], i64)),
        BatchKeys(batch_id=1, window=0, samples=2, bounds=[0, 2, 4],
                  positions=np.array([0, 1], i32), keys=np.array([1], i64)),
        Placement(version=1, phase="later", buckets=np.zeros(2, i64), keys=np.zeros(0, i64),
                       owners=np.zeros(0, i64)),
        Checkpoint(number=1, phase="later", round=0, dir="/r/checkpoints/000001"),
        Checkpoint(number=0, phase="drain", round=0, dir="/r/checkpoints/000000"),
        CheckpointPart(number=1, ok=True, error="", files=["../../etc/passwd"], bytes=1,
                       write_s=0.1, info={}),
        CheckpointPart(number=1, ok=True, error="", files=["/abs/ps-0.npz"], bytes=1,
                       write_s=0.1, info={}),
        Placement(version=1, phase="move", buckets=np.zeros(2, i64),
                       keys=np.array([3, 1], i64), owners=np.array([0, 1], i64)),
        Placement(version=1, phase="move", buckets=np.array([0, -1], i64),
                       keys=np.zeros(0, i64), owners=np.zeros(0, i64)),
        KeyCounts(window=0, version=0, size=1, pairs=3, keys=np.array([1, 2], i64),
                       counts=np.array([3, 1], i64), errors=np.zeros(2, i64),
                       bucket_pairs=np.zeros(2, i64), shard_pairs=np.zeros(2, i64)),
        KeyCounts(window=0, version=0, size=4, pairs=3, keys=np.array([1], i64),
                       counts=np.array([3], i64), errors=np.array([4], i64),
                       bucket_pairs=np.zeros(2, i64), shard_pairs=np.zeros(2, i64)),
        Handover(version=1, keys=np.array([1], i64), weights=np.full((1, 2), np.nan, f32),
                      accum=np.zeros((1, 2), f32)),
        Handover(version=1, keys=np.array([1, 2], i64), weights=np.zeros((1, 2), f32),
                      accum=np.zeros((1, 2), f32)),
        Embeddings(batch_id=1, grid=8, mask=np.array([128], np.uint8),
                        inverse=np.array([1], i32), rows=np.zeros((1, 4), f32)),
        Embeddings(batch_id=1, grid=8, mask=np.array([192], np.uint8),
                        inverse=np.array([0], i32), rows=np.zeros((1, 4), f32)),
        Embeddings(batch_id=1, grid=4, mask=np.array([1], np.uint8),
                        inverse=np.array([0], i32), rows=np.zeros((1, 4), f32)),
        BatchKeys(batch_id=1, window=0, samples=2, bounds=[0, 2, 4],
                       positions=np.array([3, 1], i32), keys=np.array([1, 2], i64)),
        PartMap(version=1, n_train=5, body=PartMap.body_of([]),
                parts=np.array([[0, 0, 0, 5, 0, 9, 0]], i64), owners=np.array([0], i32),
                resume={"0": {"epoch": 0, "low": "x", "above": [], "samples": 1,
                              "loss_sum": 0.0, "weight_sum": 1.0}}),
        PartMap(version=1, n_train=5, body=PartMap.body_of([]),
                parts=np.array([[0, 0, 0, 5, 0, 9, 0]], i64), owners=np.array([0], i32),
                resume={"3": {"epoch": 0, "low": 1, "above": [], "samples": 1,
                              "loss_sum": 0.0, "weight_sum": 1.0}}),
        PartMap(version=1, n_train=5, body=PartMap.body_of([]), resume={},
                parts=np.array([[1, 0, 0, 5, 0, 9, 0]], i64), owners=np.array([0], i32)),
        PartMap(version=1, n_train=5, body=PartMap.body_of([]), resume={},
                parts=np.array([[0, 0, 0, 5, 0, 9, 0]], i64), owners=np.array([99], i32)),
        DataStats(log1p=True, newest=-1, rows_read=1, rejected=0, mean=np.zeros(1),
                  std=np.zeros(1)),
        EvalReport(epoch=0, parts=[0], rows_read=1, rejected=0, scored=1, group_level=0,
                   counts=np.full((2, 4), -1, np.int64), loss_sums=np.zeros(1),
                   prob_sums=np.zeros(1), groups=np.zeros(0, np.int64),
                   group_labels=np.zeros(0, f32), group_probs=np.zeros(0, f32)),
        EvalReport(epoch=0, parts=[0], rows_read=1, rejected=0, scored=1, group_level=0,   # 2 tasks
                   counts=np.zeros((2, 4), np.int64), loss_sums=np.zeros(2),
                   prob_sums=np.zeros(2), groups=np.zeros(0, np.int64),
                   group_labels=np.zeros(0, f32), group_probs=np.zeros(0, f32)),
        EvalReport(epoch=0, parts=[0], rows_read=1, rejected=0, scored=1, group_level=0,
                   counts=np.zeros((2, 4), np.int64), loss_sums=np.zeros(1),
                   prob_sums=np.zeros(1), groups=np.zeros(2, np.int64),
                   group_labels=np.zeros(1, f32), group_probs=np.zeros(2, f32)),
        Contribution(round=1, coefficient=-1.0, samples=1, done=False, delta=np.zeros(2, f32)),
        Deliver(batch_id=1, worker=-1, train=True),
        Deliver(batch_id=-1, worker=0, train=True),
    ]
    for msg in bad:
        with pytest.raises(ProtocolError) as err:
            decode(msg.to_frames())
        assert err.value.kind == "inconsistent", msg


NON_FINITE_PAYLOADS = [
    SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0,
                dense=np.full((1, 1), np.inf, np.float32), labels=np.zeros(1, np.float32),
                weights=np.zeros(1, np.float32), lengths=np.zeros((1, 0), np.int32)),
    SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0,
                dense=np.zeros((1, 1), np.float32), labels=np.zeros(1, np.float32),
                weights=np.full(1, np.nan, np.float32), lengths=np.zeros((1, 0), np.int32)),
    Contribution(round=1, coefficient=1.0, samples=1, done=False,
                 delta=np.array([np.nan], np.float32)),
    Weights(round=1, step=0, generation=0, params=np.array([1.0, np.inf], np.float32)),
    StepGrad(coefficient=1.0, grads=np.array([np.nan], np.float32)),
    Partial(round=1, contributors=["worker-0"], samples_by=[1], done=[], coefficient=1.0,
            samples=1, total=np.array([0.0, -np.inf])),
]


@pytest.mark.parametrize("msg", NON_FINITE_PAYLOADS, ids=lambda m: type(m).__name__)
def test_a_large_payload_is_checked_by_its_consumer_not_the_codec(msg):
    """The codec reads no large payload: the message decodes, and its consumer's check (the
    worker's, the aggregator's) refuses it with the kind the codec used to give."""
    got = decode(msg.to_frames()).msg
    with pytest.raises(ProtocolError) as err:
        got.require_finite()
    assert err.value.kind == "inconsistent"
    fine = dataclasses.replace(msg, **{f.name: np.zeros_like(getattr(msg, f.name))
                                       for f in dataclasses.fields(msg)
                                       if "dtype" in f.metadata})
    decode(fine.to_frames()).msg.require_finite()


def test_non_finite_scalar_is_rejected():
    for value in (float("inf"), float("nan"), -float("inf")):
        with pytest.raises(ProtocolError):
            decode(frames_with_header(EpochTrained, loss_sum=value))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=200), max_size=6))
def test_random_frames_only_ever_raise_protocol_error(frames):
    try:
        decode(frames)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(ALL), st.integers(0, 3), st.binary(max_size=64))
def test_one_corrupted_frame_only_ever_raises_protocol_error(cls, which, junk):
    frames = list(sample(cls).to_frames())
    frames[which % len(frames)] = junk
    try:
        decode(frames)
    except ProtocolError:
        pass


@pytest.mark.parametrize("change", [
    {"windows": np.array([4, 3], np.int64)},              # not ascending
    {"windows": np.array([-1, 3], np.int64)},             # negative
    {"figures": np.ones((2, 3))},                         # not n x 4
    {"figures": np.array([[1, 1, 1, -1], [1, 1, 1, 1]], np.float64)},   # negative work
    {"figures": np.array([[1, 1, 1, np.nan], [1, 1, 1, 1]], np.float64)},
])
def test_a_shards_work_report_that_does_not_add_up_is_refused(change):
    good = {"late_pairs": 0, "windows": np.array([3, 4], np.int64), "figures": np.ones((2, 4))}
    decode(WindowWork(**good).to_frames())
    with pytest.raises(ProtocolError):
        decode(WindowWork(**{**good, **change}).to_frames())


def test_the_summary_counts_the_bytes_of_every_channel_but_status():
    from roles.algorithms.control.summary import CHANNELS

    channels = {cls.CHANNEL for cls in message_types().values()}
    assert channels - set(CHANNELS) == {"status"}


MSGPACK_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
    | st.text(max_size=8) | st.binary(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=6) | st.integers(-9, 9), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=400, deadline=None)
@given(st.sampled_from(ALL), st.data(), MSGPACK_VALUES)
def test_any_value_anywhere_in_the_header_only_ever_raises_protocol_error(cls, data, value):
    """Wrong types, extra keys, NaN floats, bytes, non-text keys: in the envelope, in a field
    or in an array's entry, a ProtocolError or a valid message, never anything else."""
    frames = sample(cls).to_frames("w", 1)
    header = msgspec.msgpack.decode(frames[1])
    where = data.draw(st.sampled_from(["v", "from", "seq", "f", "a", "extra", "field",
                                       "new field", "array entry"]))
    if where == "field" and header["f"]:
        header["f"][data.draw(st.sampled_from(sorted(header["f"])))] = value
    elif where == "new field":
        header["f"][data.draw(st.text(max_size=6))] = value
    elif where == "array entry" and header["a"]:
        entry = header["a"][data.draw(st.integers(0, len(header["a"]) - 1))]
        entry[data.draw(st.integers(0, 1))] = value
    else:
        header[where] = value
    frames[1] = msgspec.msgpack.encode(header)
    try:
        env = decode(frames)
    except ProtocolError:
        return
    assert type(env.msg) is cls


@pytest.mark.parametrize("raw", [
    b"\x91" * 100_000 + b"\x00",                # arrays nested 100,000 deep
    b"\x81\xa1f" * 30_000 + b"\xc0",            # maps nested 30,000 deep
    b"\xdd\xff\xff\xff\xff",                    # an array of 4 billion items, none there
    b"\xc6\xff\xff\xff\xff",                    # 4 GB of binary, none there
    b"\xa5v\xed\xa0\x80",                       # invalid UTF-8 (a surrogate)
], ids=["deep arrays", "deep maps", "huge array", "huge binary", "bad utf-8"])
def test_hostile_msgpack_headers_are_bad_headers(raw):
    for tag in (b"Lookup", b"Ready", b"SampleBatch"):
        with pytest.raises(ProtocolError) as err:
            decode([tag, raw[:MAX_HEADER_BYTES]])
        assert err.value.kind == "bad_header"


@pytest.mark.parametrize("frames,kind", [*MALFORMED.values(), *ARRAY_CASES.values()],
                         ids=[*MALFORMED.keys(), *ARRAY_CASES.keys()])
def test_malformed_messages_in_zmq_frames_are_rejected_alike(frames, kind):
    """As ``zbus.sockets.recv`` hands them over (zero-copy zmq.Frame objects)."""
    with pytest.raises(ProtocolError) as err:
        decode([zmq.Frame(bytes(f)) for f in frames])
    assert err.value.kind == kind


def test_zmq_frames_decode_as_bytes_do():
    for cls in ALL:
        frames = sample(cls).to_frames("w", 3)
        env = decode([zmq.Frame(bytes(f)) for f in frames])
        assert type(env.msg) is cls and env.nbytes == decode(frames).nbytes
        for f in dataclasses.fields(cls):
            if "dtype" in f.metadata:
                assert not getattr(env.msg, f.name).flags.writeable


@pytest.mark.parametrize("cls", ALL, ids=lambda c: c.__name__)
def test_encode_counts_the_bytes_decode_counts(cls):
    frames, nbytes = sample(cls).encode("w", 5)
    assert nbytes == sum(len(bytes(f)) for f in frames) == decode(frames).nbytes
    assert frames[0] == cls.__name__.encode()


def test_arrays_of_another_layout_or_dtype_go_as_the_declared_contiguous_array():
    dense = np.arange(24, dtype=np.float64).reshape(3, 8)[:, ::2]  # float64, strided
    msg = SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0, dense=dense,
                      labels=np.zeros(3, np.float32), weights=np.ones(3, np.float32),
                      lengths=np.zeros((3, 0), np.int32))
    got = decode(msg.to_frames()).msg.dense
    assert got.dtype == np.float32 and got.shape == (3, 4)
    assert np.array_equal(got, dense.astype(np.float32))
    with pytest.raises(ValueError):
        Weights(round=1, step=0, generation=0, params=np.zeros((2, 2), np.float32)).to_frames()


def test_a_large_zmq_frame_is_viewed_read_only_and_its_size_checked():
    """Array frames of 64 KB or more stay zmq.Frame objects (no copy); smaller ones are read
    as bytes."""
    params = np.arange(1 << 16, dtype=np.float32)
    frames = [zmq.Frame(bytes(f)) for f in Weights(round=1, step=0, generation=0,
                                                   params=params).to_frames()]
    got = decode(frames).msg.params
    assert np.array_equal(got, params) and not got.flags.writeable
    assert np.shares_memory(got, np.frombuffer(frames[2], np.float32))
    frames[2] = zmq.Frame(bytes(frames[2])[:-4])
    with pytest.raises(ProtocolError) as err:
        decode(frames)
    assert err.value.kind == "bad_size"


@pytest.fixture
def pair():
    ctx = zmq.Context()
    socks = {}
    for name, kind in (("push", zmq.PUSH), ("pull", zmq.PULL), ("dealer", zmq.DEALER),
                       ("router", zmq.ROUTER)):
        socks[name] = sockets.make_socket(ctx, kind)
    socks["pull"].bind("inproc://pull")
    socks["push"].connect("inproc://pull")
    socks["router"].bind("inproc://router")
    socks["dealer"].setsockopt(zmq.IDENTITY, b"dealer-1")
    socks["dealer"].connect("inproc://router")
    yield socks
    for sock in socks.values():
        sock.close(0)
    ctx.term()


def test_send_and_recv_carry_every_message_and_count_its_bytes(pair):
    out, into = sockets.Traffic(), sockets.Traffic()
    for cls in ALL:
        msg = sample(cls)
        sent = sockets.send(pair["push"], msg, sender="w-1", seq=9, traffic=out)
        _, env = sockets.recv(pair["pull"], router=False, traffic=into, flags=0)
        assert type(env.msg) is cls and (env.sender, env.seq, env.nbytes) == ("w-1", 9, sent)
        sockets.send(pair["dealer"], msg, sender="w-1", seq=10, traffic=out)
        identity, env = sockets.recv(pair["router"], router=True, traffic=into, flags=0)
        assert identity == b"dealer-1" and type(env.msg) is cls
        sockets.send(pair["router"], msg, sender="a-0", seq=11, traffic=out, identity=identity)
        _, env = sockets.recv(pair["dealer"], router=False, traffic=into, flags=0)
        assert type(env.msg) is cls and env.seq == 11
    assert out.bytes_out == into.bytes_in and out.msgs_out == into.msgs_in
    assert sum(into.msgs_in.values()) == 3 * len(ALL)
    with pytest.raises(zmq.Again):
        sockets.recv(pair["pull"], router=False, traffic=into)


def test_recv_consumes_a_malformed_message_whole(pair):
    """Refused, and every frame of it read: the next message decodes."""
    good = Weights(round=1, step=0, generation=0, params=np.ones(4, np.float32))
    traffic = sockets.Traffic()
    bad = [[*good.to_frames(), b"extra"], good.to_frames()[:2], [b"junk"] * 7,
           [b"Weights", b"\xc1", b"x", b"y"]]
    for frames in bad:
        pair["push"].send_multipart(frames)
        pair["push"].send_multipart(good.to_frames())
        with pytest.raises(ProtocolError):
            sockets.recv(pair["pull"], router=False, traffic=traffic, flags=0)
        _, env = sockets.recv(pair["pull"], router=False, traffic=traffic, flags=0)
        assert type(env.msg) is Weights
    pair["dealer"].send(b"")  # the identity frame and an empty one: truncated
    with pytest.raises(ProtocolError) as err:
        sockets.recv(pair["router"], router=True, traffic=traffic, flags=0)
    assert err.value.kind == "truncated"
    assert traffic.msgs_in["dense_sync"] == len(bad)
