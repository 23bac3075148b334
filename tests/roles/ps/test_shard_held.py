"""A shard's held batches (a real shard, turned in the test's process by the in-process cluster,
the test playing control, feeder and worker over its sockets): the keys of a straggler's second
copy that come after the first copy's update, which no gradients follow, are dropped once their
epoch is over, so that no checkpoint snapshot waits for them."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import zmq
from harness import FakeControl, dealer, recv_within

from roles.algorithms.shard.embedding_table import initial_rows
from roles.checkpoint.files import checkpoint_dir
from roles.protocol.checkpoint import Checkpoint, Snapshotted
from roles.protocol.datapath import (
    BatchKeys,
    EmbeddingGrads,
    Embeddings,
    GradsLookup,
    Lookup,
    make_batch_id,
)
from zbus.codec import Message, decode
from zbus.messages import Heartbeat


@contextmanager
def one_shard(cluster, **settings) -> Iterator[tuple[Any, FakeControl, zmq.Socket, int]]:
    """A real shard of a one-shard job (in this process), admitted by a fake control: the
    cluster, the fake control, a DEALER to the shard as worker-0, the rows' dimension."""
    c = cluster(cluster__shards=1, cluster__workers=1, **settings)
    fake = FakeControl(c)
    ctx = zmq.Context()
    try:
        c.start_role("ps", 0)
        fake.admit({"ps-0"})
        yield c, fake, dealer(ctx, c.job.cluster.endpoint("ps-0"), "worker-0"), \
            c.job.model.embedding_dim
    finally:
        ctx.destroy(linger=0)
        fake.close()


def send_keys(shard: zmq.Socket, batch_id: int, keys: np.ndarray, train: bool = True) -> None:
    """A batch of two samples' keys (two fields): a feeder's BatchKeys."""
    shard.send_multipart(BatchKeys(batch_id=batch_id, window=0, samples=2, bounds=[0, 2, 4],
                                   positions=np.arange(4, dtype=np.int32), keys=keys,
                                   train=train).to_frames())


def look_up(shard: zmq.Socket, batch_id: int, keys: np.ndarray, train: bool = True) -> Embeddings:
    """The batch's keys, then a worker's look-up: the shard's answer."""
    send_keys(shard, batch_id, keys, train)
    shard.send_multipart(Lookup(batch_id=batch_id, train=train).to_frames())
    return Embeddings.from_frames(recv_within(shard))


def train_once(shard: zmq.Socket, batch_id: int, dim: int) -> None:
    """Keys, a look-up and the gradients of one training batch of two samples."""
    emb = look_up(shard, batch_id, np.array([3, 5, 3, 9], dtype=np.int64) + batch_id % 1000)
    grads = np.full((len(emb.rows), dim), 0.1, dtype=np.float32)
    shard.send_multipart(EmbeddingGrads(batch_id=batch_id, grads=grads).to_frames())


def reported(fake: FakeControl, kind: type[Message], timeout_s: float) -> Message | None:
    """The first ``kind`` the shard reports to control within ``timeout_s`` (None)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not fake.router.poll(100):
            continue
        identity, *frames = fake.router.recv_multipart()
        msg = decode(frames).msg
        if isinstance(msg, Heartbeat):
            fake.beats[identity.decode()] = msg
        elif isinstance(msg, kind):
            return msg
    return None


@pytest.mark.inprocess
def test_keys_of_a_copy_after_its_update_hold_up_no_checkpoint_two_epochs_on(cluster):
    # the snapshot must not need the drain timeout
    with one_shard(cluster, placement__drain_timeout_s=60.0) as (c, fake, shard, dim):
        first = make_batch_id(0, 0, 1)
        train_once(shard, first, dim)
        # the straggler's second copy: its keys come again after the first copy's update
        send_keys(shard, first, np.array([3, 5, 3, 9], np.int64))
        train_once(shard, make_batch_id(2, 0, 1), dim)   # two epochs on
        beat = fake.heartbeat("ps-0", lambda k: k.get("updates") == 2)
        assert beat.counters["held_dropped"] == 1 and beat.counters["held_batches"] == 0, \
            beat.counters
        fake.pub.send_multipart(Checkpoint(
            number=1, phase="write", round=0,
            dir=str(checkpoint_dir(c.run_dir, 1))).to_frames("control-0"))
        snap = reported(fake, Snapshotted, timeout_s=20.0)
        assert snap is not None and snap.number == 1, "no snapshot: a held batch waits"
        assert c.procs["ps-0"].poll() is None, c.log("ps-0")


@pytest.mark.inprocess
def test_a_look_up_with_the_gradients_is_answered_after_the_update(cluster):
    """Mode pull: GradsLookup applies the batch's gradients, then answers the next batch's
    look-up with rows read after that update (the rows both batches share have moved)."""
    with one_shard(cluster) as (_, fake, shard, dim):
        one, two = make_batch_id(0, 0, 1), make_batch_id(0, 0, 2)
        keys = np.array([3, 5, 3, 9], dtype=np.int64)
        send_keys(shard, two, keys)   # the same keys in both batches
        before = look_up(shard, one, keys)
        assert isinstance(before, Embeddings) and before.batch_id == one
        grads = np.full((len(before.rows), dim), 0.5, dtype=np.float32)
        shard.send_multipart(GradsLookup(batch_id=one, lookup=two, train=True,
                                         grads=grads).to_frames())
        after = decode(recv_within(shard)).msg
        assert isinstance(after, Embeddings) and after.batch_id == two
        # each key occurrence's row (the order of a reply's rows is the shard's to choose)
        assert (after.rows[after.inverse] < before.rows[before.inverse]).all()   # Adagrad
        assert len(after.rows) == len(before.rows) == 3           # moved every row down
        beat = fake.heartbeat("ps-0", lambda k: k.get("updates") == 1)
        assert beat.counters["lookups"] == 2


@pytest.mark.inprocess
def test_an_eval_batch_makes_no_row_and_its_gradients_are_refused(cluster):
    with one_shard(cluster) as (c, fake, shard, dim):
        train_once(shard, make_batch_id(0, 0, 1), dim)   # keys 4, 6, 10 get rows
        trained = fake.heartbeat("ps-0", lambda k: k.get("updates") == 1).counters["keys"]
        assert trained == 3
        batch = make_batch_id(0, 1, 1)
        # 4 has a row; 7 and 8 none
        emb = look_up(shard, batch, np.array([4, 7, 7, 8], dtype=np.int64), train=False)
        got = emb.rows[emb.inverse]
        t = c.job.train
        fresh = initial_rows(np.array([7, 8]), dim, t.embedding_init, t.seed)
        assert np.array_equal(got[[1, 2]], fresh[[0, 0]]) and np.array_equal(got[3], fresh[1])
        assert not np.array_equal(got[0], initial_rows(np.array([4]), dim, t.embedding_init,
                                                       t.seed)[0])   # trained
        grads = np.full((len(emb.rows), dim), 0.1, dtype=np.float32)
        shard.send_multipart(EmbeddingGrads(batch_id=batch, grads=grads).to_frames())
        beat = fake.heartbeat("ps-0", lambda k: k["rejected_messages"].get("eval_batch"))
        assert beat.counters["keys"] == 3 and beat.counters["updates"] == 1, beat.counters
        assert c.procs["ps-0"].poll() is None, c.log("ps-0")


@pytest.mark.inprocess
def test_non_finite_gradients_are_refused_and_leave_the_rows_as_they_were(cluster):
    with one_shard(cluster) as (c, fake, shard, dim):
        keys = np.array([3, 5, 3, 9], dtype=np.int64)
        first = make_batch_id(0, 0, 1)
        looked = look_up(shard, first, keys)
        before = looked.rows[looked.inverse]   # each key occurrence's row
        grads = np.full((len(looked.rows), dim), 0.1, dtype=np.float32)
        grads[1, 2] = np.nan
        shard.send_multipart(EmbeddingGrads(batch_id=first, grads=grads).to_frames())
        beat = fake.heartbeat("ps-0", lambda k: k["rejected_messages"].get("inconsistent"))
        assert beat.counters["updates"] == 0, beat.counters
        later = look_up(shard, make_batch_id(0, 0, 2), keys)   # the same keys, later
        after = later.rows[later.inverse]
        assert np.array_equal(after, before)   # no row changed, none became NaN
        assert c.procs["ps-0"].poll() is None, c.log("ps-0")
