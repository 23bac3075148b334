"""Hypothesis-generated malformed messages sent to every bound socket that receives, of every
role, while a real job runs: no role crashes, every malformed message is counted by the role
that got it, the job completes (every socket went on serving) and a valid request afterwards
is answered. An oversized message is refused by the configured maximum size."""

from __future__ import annotations

import dataclasses
import typing

import msgspec
import numpy as np
import pytest
import zmq
from harness import FakeControl, recv_within
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roles.protocol.datapath import BatchKeys, Embeddings, Lookup
from roles.protocol.operator import ControlReply, ControlRequest
from zbus.codec import MAX_HEADER_BYTES, PROTOCOL_VERSION, ProtocolError, decode, message_types

TYPES = sorted(message_types().values(), key=lambda c: c.__name__)
PER_SOCKET = 60


def valid(cls: type) -> list[bytes]:
    """The frames of a valid message of any type (fields filled by type)."""
    values = {}
    hints = dict(cls._scalars)
    for f in dataclasses.fields(cls):
        if "dtype" in f.metadata:
            values[f.name] = np.zeros((0,) * f.metadata["ndim"], dtype=f.metadata["dtype"])
        else:
            t = hints[f.name]
            values[f.name] = {int: 0, float: 0.0, str: "", bool: False, dict: {}}.get(
                typing.get_origin(t) or t, [])
    try:
        return [bytes(x) for x in cls(**values).to_frames("fuzz", 1)]
    except (ProtocolError, TypeError, ValueError):
        return [cls.__name__.encode(), b"{}"]


def header_of(frames: list[bytes]) -> dict:
    try:
        header = msgspec.msgpack.decode(frames[1])
    except (msgspec.MsgspecError, ValueError, IndexError):
        return {}
    return header if isinstance(header, dict) else {}


@st.composite
def malformed(draw) -> list[bytes]:
    """A message that breaks the wire format one way or another."""
    frames = valid(draw(st.sampled_from(TYPES)))
    how = draw(st.sampled_from(["random", "frame", "count", "version", "field", "retype",
                                "array", "huge_header", "truncate", "tag"]))
    if how == "random":
        return draw(st.lists(st.binary(max_size=300), min_size=1, max_size=8))
    if how == "frame":
        i = draw(st.integers(0, len(frames) - 1))
        frames[i] = draw(st.binary(max_size=64))
    elif how == "count":
        if draw(st.booleans()) or len(frames) < 2:
            frames.append(draw(st.binary(max_size=16)))
        else:
            frames.pop()
    elif how == "truncate" and len(frames) > 1:  # a msgpack header cut short
        frames[1] = frames[1][:draw(st.integers(0, max(0, len(frames[1]) - 1)))]
    elif how in ("version", "field", "retype", "array"):
        h = header_of(frames) or {"v": PROTOCOL_VERSION, "from": "", "seq": 0, "f": {},
                                  "a": []}
        junk = draw(st.one_of(st.integers(-2**63, 2**64 - 1), st.text(max_size=8), st.none(),
                              st.lists(st.integers(-2**63, 2**64 - 1), max_size=3),
                              st.floats(), st.booleans(), st.binary(max_size=8),
                              st.dictionaries(st.integers(), st.floats(), max_size=2)))
        if how == "version":
            h["v"] = junk if junk != PROTOCOL_VERSION else -1
        elif how == "field":
            h["f"] = {**h.get("f", {}), draw(st.text(max_size=6)): junk}
        elif how == "retype" and isinstance(h.get("f"), dict) and h["f"]:
            # a field of the message with a value of another type (a bool for an int, ...)
            h["f"][draw(st.sampled_from(sorted(h["f"])))] = junk
        else:
            h["a"] = [[draw(st.sampled_from(["float32", "int64", "float16", "x"])),
                       draw(st.lists(st.integers(-2, 2**41), max_size=3))]]
        frames[1:2] = [msgspec.msgpack.encode(h)]
    elif how == "huge_header":
        frames[1:2] = [b'{"v":' + b" " * (MAX_HEADER_BYTES + 1) + b"1}"]
    else:
        frames[0] = draw(st.binary(min_size=1, max_size=80))
    return frames


def strangers(ctx: zmq.Context, endpoints: dict[str, str]) -> dict[str, zmq.Socket]:
    socks = {}
    for name, endpoint in endpoints.items():
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.IDENTITY, f"fuzz-{name}".encode())
        s.connect(endpoint)
        socks[name] = s
    return socks


# the bound sockets that receive, and the node that counts what arrives there
TARGETS = {"control": "control-0", "control_req": "control-0", "ledger": "feeder-0",
           "ps-0": "ps-0", "ps-1": "ps-1", "aggregator": "aggregator-0"}
# with model parallelism, the group's leader (worker-0) and member (member-0) bind too
GROUP_TARGETS = {"group-0-0": "worker-0", "group-0-1": "member-0"}
JOBS = {"plain": ({}, TARGETS),
        "model-parallel": ({"cluster__workers": 1, "cluster__parts": 2,
                            "data__synthetic__rows": 10_000, "train__epochs": 1},
                           {**TARGETS, **GROUP_TARGETS})}


@pytest.mark.inprocess
@pytest.mark.parametrize("kind", JOBS)
@settings(max_examples=1, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                 HealthCheck.data_too_large, HealthCheck.too_slow])
@given(data=st.data())
def test_malformed_messages_to_every_bound_socket_are_counted_and_the_job_completes(
        cluster, kind, data):
    settings_, targets = JOBS[kind]
    c = cluster(**{"data__synthetic__rows": 40_000, "train__epochs": 2, **settings_})
    sent: dict[str, int] = dict.fromkeys(set(targets.values()), 0)
    junk = {}
    for name in targets:  # drawn first: every one checked malformed by the decoder itself
        junk[name] = []
        while len(junk[name]) < PER_SOCKET:
            frames = data.draw(malformed())
            try:
                decode(frames)
            except ProtocolError:
                junk[name].append(frames)
    ctx = zmq.Context()
    try:
        c.start_all()
        c.wait_for_event(lambda e: e["event"] == "epoch_start")
        socks = strangers(ctx, {n: c.job.cluster.endpoint(n) for n in targets})
        for name, messages in junk.items():
            for frames in messages:
                socks[name].send_multipart(frames)
            sent[targets[name]] += len(messages)
        # a valid request after all that is still answered
        socks["control_req"].send_multipart(
            ControlRequest(action="settings", changes={}).to_frames("fuzz", 1))
        answer = decode(recv_within(socks["control_req"], 30)).msg
        assert isinstance(answer, ControlReply) and answer.ok
        assert c.wait() == 0, c.logs()
    finally:
        ctx.destroy(linger=0)
    s = c.summary()
    assert s["ok"], s["reason"]
    counted = {node: sum(kinds.values()) for node, kinds in s["rejected_messages"].items()}
    assert counted == {n: k for n, k in sent.items() if k}, (counted, s["rejected_messages"])
    for name in sent:
        assert "Traceback" not in c.log(name), c.log(name)


@pytest.mark.inprocess
def test_an_oversized_message_is_refused_and_the_shard_serves_on(cluster):
    c = cluster(cluster__shards=1, cluster__workers=1, cluster__max_message_mb=0.05)
    fake = FakeControl(c)
    ctx = zmq.Context()
    try:
        c.start_role("ps", 0)
        fake.admit({"ps-0"})
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IDENTITY, b"worker-0")
        sock.connect(c.job.cluster.endpoint("ps-0"))
        big = 20_000  # 160 KB of keys: over the 52 KB maximum
        keys = np.arange(big, dtype=np.int64)
        sock.send_multipart(BatchKeys(batch_id=1, window=0, samples=big, bounds=[0, big],
                                           positions=np.arange(big, dtype=np.int32),
                                           keys=keys).to_frames("x", 1))
        sock.send_multipart(Lookup(batch_id=1, train=True).to_frames("x", 2))
        small = np.array([5, 9], dtype=np.int64)
        sock.send_multipart(BatchKeys(batch_id=2, window=0, samples=2, bounds=[0, 2],
                                           positions=np.arange(2, dtype=np.int32),
                                           keys=small).to_frames("x", 3))
        sock.send_multipart(Lookup(batch_id=2, train=True).to_frames("x", 4))
        got = decode(recv_within(sock, 30)).msg
        # the oversized message never reached the shard (ZeroMQ dropped the connection that
        # carried it, and the DEALER connected again): the first answer is batch 2's
        while got.batch_id == 1:
            got = decode(recv_within(sock, 30)).msg
        assert isinstance(got, Embeddings) and got.batch_id == 2 and len(got.rows) == 2
        beat = fake.heartbeat("ps-0", lambda k: k.get("key_messages", 0) >= 1)
        assert beat.counters["keys_received"] == 2  # not 20,000
        assert c.procs["ps-0"].poll() is None
    finally:
        ctx.destroy(linger=0)
        fake.close()
