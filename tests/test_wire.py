from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import orjson
import pytest
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
from roles.protocol.dense_sync import Aggregate, Contribution, RoundDone, StepGrad, Weights
from roles.protocol.lifecycle import EpochTrained, EvalReport
from roles.protocol.model_parallel import MemberCall, MemberReply, MemberTensors
from roles.protocol.placement import Handover, KeyCounts, Placement, WindowWork
from zbus.codec import MAX_HEADER_BYTES, Message, ProtocolError, decode, message_types
from zbus.messages import Finish, Hello


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
                          list[float]: [0.5], list[list[int]]: [[3]]}[t]
    if cls is BatchKeys:
        values.update(samples=2, bounds=[0, 2, 4], positions=np.array([0, 3], np.int32),
                      keys=np.array([-5, 2**62], np.int64))
    if cls is Embeddings:
        values.update(grid=10, mask=np.array([0b11000000, 0], np.uint8),
                      inverse=np.array([0, 0], np.int32), rows=np.ones((1, 4), np.float32))
    if cls is Placement:
        values.update(phase="move", keys=np.array([-5, 9], np.int64),
                      owners=np.array([1, 0], np.int64))
    if cls is KeyCounts:
        values.update(counts=np.array([4, 2, 1], np.int64), errors=np.array([1, 0, 0], np.int64))
    if cls is WindowWork:
        values.update(windows=np.array([0, 4, 5], np.int64), figures=np.ones((3, 4)))
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
        values.update(counts=np.ones((2, 8), np.int64))
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


def frames_with_header(cls=Lookup, **changes):
    frames = sample(cls).to_frames("w", 1)
    header = orjson.loads(frames[1])
    for key, value in changes.items():
        if key in ("v", "from", "seq", "f", "a"):
            header[key] = value
        else:
            header["f"][key] = value
    frames[1] = orjson.dumps(header)
    return frames


MALFORMED = {
    "no frames": ([], "truncated"),
    "tag only": ([b"Lookup"], "truncated"),
    "unknown type": ([b"Nope", b"{}"], "unknown_type"),
    "binary tag": ([b"\xff\xfe", b"{}"], "unknown_type"),
    "huge tag": ([b"A" * 1000, b"{}"], "unknown_type"),
    "header not json": ([b"Lookup", b"{not json"], "bad_header"),
    "header a list": ([b"Lookup", b"[1, 2]"], "bad_header"),
    "header huge": ([b"Lookup", b" " * (MAX_HEADER_BYTES + 1)], "header_too_large"),
    "missing envelope key": ([b"Lookup", b'{"v": 1, "from": "x", "seq": 1, "f": {}}'],
                             "bad_header"),
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
    header = orjson.loads(frames[1])
    if entry is not None:
        header["a"][index] = entry
    frames[1] = orjson.dumps(header)
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
        SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0,
                         dense=np.full((1, 1), np.inf, f32), labels=np.zeros(1, f32),
                         weights=np.zeros(1, f32), lengths=np.zeros((1, 0), i32)),
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
        EvalReport(epoch=0, parts=[0], loss_sum=0.0, rows_read=1, rejected=0,
                   counts=np.full((2, 4), -1, np.int64)),
        Contribution(round=1, coefficient=-1.0, samples=1, done=False, delta=np.zeros(2, f32)),
        Contribution(round=1, coefficient=1.0, samples=1, done=False,
                          delta=np.array([np.nan], f32)),
        Weights(round=1, step=0, generation=0, params=np.array([1.0, np.inf], f32)),
        StepGrad(coefficient=1.0, grads=np.array([np.nan], f32)),
        Deliver(batch_id=1, worker=-1, train=True),
        Deliver(batch_id=-1, worker=0, train=True),
    ]
    for msg in bad:
        with pytest.raises(ProtocolError) as err:
            decode(msg.to_frames())
        assert err.value.kind == "inconsistent", msg


def test_non_finite_scalar_is_rejected():
    frames = frames_with_header(EpochTrained)
    frames[1] = frames[1].replace(b'"loss_sum":0.5', b'"loss_sum":1e999')
    with pytest.raises(ProtocolError):
        decode(frames)


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
