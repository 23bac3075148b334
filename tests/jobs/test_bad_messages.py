"""Live roles on real sockets take malformed and hostile messages without crashing, count them,
and still serve the next valid message."""

from __future__ import annotations

import os
import signal
import socket
import time

import msgspec
import numpy as np
import pytest
import zmq
from harness import FakeControl, dealer, recv_within, reply

from roles.algorithms.shard.embedding_table import initial_rows
from roles.protocol.datapath import (
    Ack,
    BatchKeys,
    DataIndex,
    DataStats,
    EmbeddingGrads,
    Lookup,
    PartMap,
    PartStats,
    SampleBatch,
    Taken,
)
from roles.protocol.dense_sync import Contribution, WeightsRequest
from roles.protocol.lifecycle import EpochStart
from roles.tools.ctl import request
from zbus.codec import PROTOCOL_VERSION, decode
from zbus.messages import Failure, Heartbeat, Hello, Ready, Rejoin, Stop

GARBAGE = [
    [b"\x00\xff garbage"],
    [b"Lookup", b"{not json"],
    [b"Nope", b"{}"],
    [b"Lookup", msgspec.msgpack.encode({"v": PROTOCOL_VERSION + 1, "from": "x", "seq": 1,
                                        "f": {"batch_id": 1, "train": True}, "a": []})],
    [b"Lookup", b'{"v":7,"from":"x","seq":1,"f":{"batch_id":1,"train":true},"a":[]}'],
                                                                 # a peer of protocol 7 (JSON)
    [b"BatchKeys", msgspec.msgpack.encode(
        {"v": PROTOCOL_VERSION, "from": "x", "seq": 1,
         "f": {"batch_id": 1, "window": 0, "samples": 1, "bounds": [0, 5]},
         "a": [["int32", [5]], ["int64", [5]]]}),
     b"\0" * 20, b"\0" * 8],                                         # 5 keys in 8 bytes
    [b"Lookup", msgspec.msgpack.encode({"v": PROTOCOL_VERSION, "from": "x", "seq": 1,
                                        "f": {"batch_id": True, "train": True}, "a": []})],
                                                                 # a bool for an int
]


@pytest.mark.inprocess
def test_control_rejects_garbage_and_strangers_then_admits_a_node(cluster):
    c = cluster()
    control = c.start_role("control")
    ctx = zmq.Context()
    try:
        endpoint = c.job.cluster.endpoint("control")
        node = dealer(ctx, endpoint, "worker-0")
        for frames in GARBAGE:
            node.send_multipart(frames)
        hello = dict(role="worker", index=0, host="h", pid=os.getpid(),
                     fingerprint=c.job.fingerprint())
        node.send_multipart(Hello(**{**hello, "fingerprint": "0" * 16}).to_frames())
        refused = reply(node)
        assert not refused.accepted and "runs a different job" in refused.reason
        stranger = dealer(ctx, endpoint, "intruder-0")
        stranger.send_multipart(Hello(**{**hello, "role": "intruder"}).to_frames())
        refused = reply(stranger)
        assert not refused.accepted and "is not a node of this job" in refused.reason
        node.send_multipart(Heartbeat(role="worker", index=0, state="x", load={},
                                           counters={}, final=False).to_frames())
        rejoin = reply(node)  # an unknown node is asked to say who it is
        assert isinstance(rejoin, Rejoin) and rejoin.run_id == c.run_dir.name
        node.send_multipart(Hello(**hello).to_frames())
        welcome = reply(node)
        assert welcome.accepted and welcome.run_dir == str(c.run_dir)
    finally:
        ctx.destroy(linger=0)
    control.send_signal(signal.SIGTERM)
    assert c.wait(timeout=30) == 128 + signal.SIGTERM  # as a shell reports it
    s = c.summary()
    assert s["status"] == "interrupted"
    counted = s["rejected_messages"]["control-0"]
    assert counted["unregistered"] == 1  # the heartbeat before Hello
    assert sum(counted.values()) == len(GARBAGE) + 1


@pytest.mark.inprocess
def test_shard_and_aggregator_serve_after_garbage(cluster):
    c = cluster(cluster__shards=1, cluster__workers=1)
    fake = FakeControl(c)
    ctx = zmq.Context()
    try:
        c.start_role("ps", 0)
        c.start_role("aggregator", 0)
        fake.admit({"ps-0", "aggregator-0"})
        shard = dealer(ctx, c.job.cluster.endpoint("ps-0"), "worker-0")
        for frames in GARBAGE:
            shard.send_multipart(frames)
        fields = len(c.job.layout().fields)   # a batch of more fields than the job's
        shard.send_multipart(BatchKeys(batch_id=6, window=0, samples=1,
                                       bounds=list(range(fields + 2)),
                                       positions=np.array([fields], np.int32),
                                       keys=np.array([5], np.int64)).to_frames())
        keys = np.array([11, -4, 11, 2**60], dtype=np.int64)
        shard.send_multipart(BatchKeys(batch_id=7, window=0, samples=2, bounds=[0, 2, 4],
                                            positions=np.arange(4, dtype=np.int32),
                                            keys=keys).to_frames())
        shard.send_multipart(Lookup(batch_id=7, train=True).to_frames())
        emb = reply(shard)
        t = c.job.train
        dim = c.job.model.embedding_dim
        assert np.array_equal(emb.rows[emb.inverse],
                              initial_rows(keys, dim, t.embedding_init, t.seed))
        grads = np.ones((len(emb.rows), dim), dtype=np.float32)
        bad_grads = EmbeddingGrads(batch_id=7, grads=np.ones((1, 3), np.float32))
        shard.send_multipart(bad_grads.to_frames())                      # wrong shape
        shard.send_multipart(EmbeddingGrads(batch_id=7, grads=grads).to_frames())
        shard.send_multipart(EmbeddingGrads(batch_id=7, grads=grads).to_frames())
        beat = fake.heartbeat("ps-0", lambda k: k.get("updates") == 1
                              and k.get("duplicates_refused") == 1)
        rejected = beat.counters["rejected_messages"]
        assert rejected["bad_shape"] == 1 and rejected["bad_fields"] == 1
        assert sum(rejected.values()) == len(GARBAGE) + 2

        agg = dealer(ctx, c.job.cluster.endpoint("aggregator"), "worker-0")
        for frames in GARBAGE:
            agg.send_multipart(frames)
        agg.send_multipart(Contribution(round=1, coefficient=1.0, samples=1, done=False,
                                             delta=np.ones(3, np.float32)).to_frames())
        agg.send_multipart(WeightsRequest().to_frames())
        weights = reply(agg)
        assert weights.round == 0 and weights.params.size > 1000
        beat = fake.heartbeat("aggregator-0", lambda k: k["rejected_messages"].get("bad_shape"))
        assert sum(beat.counters["rejected_messages"].values()) == len(GARBAGE) + 1
        for name in ("ps-0", "aggregator-0"):
            assert c.procs[name].poll() is None, c.log(name)
    finally:
        ctx.destroy(linger=0)
        fake.close()


@pytest.mark.inprocess
def test_feeder_keeps_a_batch_whose_ack_is_malformed(cluster):
    c = cluster(cluster__shards=1, cluster__workers=1, data__synthetic__rows=2000)
    fake = FakeControl(c)
    ctx = zmq.Context()
    try:
        c.start_role("feeder")
        fake.admit({"feeder-0"})
        queue = ctx.socket(zmq.PULL)
        queue.setsockopt(zmq.LINGER, 0)
        queue.connect(c.job.cluster.endpoint("samples"))
        acks = dealer(ctx, c.job.cluster.endpoint("ledger"), "worker-0")
        index = ready = None  # feeder 0 indexes the data: every part is its
        deadline = time.monotonic() + 60
        while index is None or ready is None:
            assert time.monotonic() < deadline, (index, ready)
            _, *frames = recv_within(fake.router, 60)
            msg = decode(frames).msg
            index = msg if isinstance(msg, DataIndex) else index
            ready = msg if isinstance(msg, Ready) else ready
        parts = PartMap(version=0, n_train=index.n_train, resume={}, body=index.body,
                        parts=index.parts, owners=np.zeros(len(index.parts), np.int32))
        deadline = time.monotonic() + 60
        while True:  # its statistics of the training parts
            assert time.monotonic() < deadline, "the feeder sent no PartStats within 60 s"
            fake.pub.send_multipart(parts.to_frames("control-0"))
            _, *frames = recv_within(fake.router, 60)
            if isinstance(stats := decode(frames).msg, PartStats):
                break
        dense = stats.moments.shape[2]
        data = DataStats(log1p=True, newest=-1, rows_read=0, rejected=0, mean=np.zeros(dense),
                         std=np.ones(dense))
        for _ in range(3):  # repeated, as control does
            for msg in (parts, data, EpochStart(epoch=0)):
                fake.pub.send_multipart(msg.to_frames("control-0"))
            if queue.poll(2000):
                break
        batch = SampleBatch.from_frames(recv_within(queue))
        n = len(batch.labels)
        acks.send_multipart(Taken(batch_id=batch.batch_id).to_frames())
        assert reply(acks).granted
        other = dealer(ctx, c.job.cluster.endpoint("ledger"), "worker-1")
        other.send_multipart(Taken(batch_id=batch.batch_id).to_frames())
        assert not reply(other).granted           # one batch, one worker
        for frames in GARBAGE:
            acks.send_multipart(frames)
        wrong = Ack(batch_id=batch.batch_id, samples=n + 1, loss_sum=0.0, weight_sum=0.0,
                         preds=np.zeros(0, np.float32))
        acks.send_multipart(wrong.to_frames())
        beat = fake.heartbeat("feeder-0", lambda k: k["rejected_messages"].get("inconsistent"))
        assert beat.counters["batches_acked"] == 0  # the batch is still in flight
        right = Ack(batch_id=batch.batch_id, samples=n, loss_sum=1.0, weight_sum=float(n),
                         preds=np.zeros(0, np.float32))
        acks.send_multipart(right.to_frames())
        acks.send_multipart(right.to_frames())  # a duplicate is counted, not applied twice
        other.send_multipart(right.to_frames())   # nor is the ack of a worker not holding it
        beat = fake.heartbeat("feeder-0", lambda k: k["duplicate_acks"] == 2)
        assert beat.counters["batches_acked"] == 1 and beat.counters["samples_acked"] == n
        assert beat.counters["refused_takes"] == 1
        assert sum(beat.counters["rejected_messages"].values()) == len(GARBAGE) + 1
    finally:
        ctx.destroy(linger=0)
        fake.close()


@pytest.mark.inprocess
def test_control_sends_away_a_worker_it_declared_failed(cluster):
    c = cluster(cluster__node_timeout_s=1.0)
    c.start_role("control")
    ctx = zmq.Context()
    try:
        node = dealer(ctx, c.job.cluster.endpoint("control"), "worker-0")
        node.send_multipart(Hello(role="worker", index=0, host="h", pid=os.getpid(),
                                       fingerprint=c.job.fingerprint()).to_frames())
        assert reply(node).accepted
        node.send_multipart(Ready(info={}).to_frames())
        c.wait_for_event(lambda e: e["event"] == "membership" and e["change"] == "failed")
        node.send_multipart(Heartbeat(role="worker", index=0, state="back", load={},
                                           counters={}, final=False).to_frames())
        sent_away = reply(node)
        assert not sent_away.accepted and "declared failed" in sent_away.reason
    finally:
        ctx.destroy(linger=0)


@pytest.mark.inprocess
def test_after_the_end_a_late_node_is_told_stop_and_a_request_refused_without_a_crash(cluster):
    """The job has ended (summary written, metrics closed) while control waits for the nodes
    to leave: a node saying Hello only now (one slow to start) is told Stop, a request to change
    anything is refused, and a late Failure is dropped: control exits with the job's status,
    no traceback (a Hello in this window once crashed it writing to its closed metrics)."""
    c = cluster(cluster__start_timeout_s=1.0)  # the job fails: not every node came
    c.start_role("control")
    ctx = zmq.Context()
    try:
        endpoint = c.job.cluster.endpoint("control")
        hello = dict(index=0, host=socket.gethostname(), pid=os.getpid(),  # alive: waited for
                     fingerprint=c.job.fingerprint())
        early = dealer(ctx, endpoint, "worker-0")
        early.send_multipart(Hello(role="worker", **hello).to_frames())
        assert reply(early).accepted
        c.wait_for_event(lambda e: e["event"] == "end")
        late = dealer(ctx, endpoint, "ps-0")
        late.send_multipart(Hello(role="ps", **hello).to_frames())
        stop = reply(late)
        assert isinstance(stop, Stop) and not stop.ok and "not ready after" in stop.reason
        refused = request(c.job.cluster.endpoint("control_req"), "set",
                          {"net_util_max": "0.5"})
        assert not refused.ok and refused.message.startswith("the job has ended"), refused
        early.send_multipart(Failure(reason="late trouble").to_frames())
    finally:
        ctx.destroy(linger=0)
    assert c.wait(timeout=30) == 1
    assert "not ready after" in c.summary()["reason"]
    assert "Traceback" not in c.log("control-0"), c.log("control-0")
    assert "late trouble" not in c.log("control-0")
