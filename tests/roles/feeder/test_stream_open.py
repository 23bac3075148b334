"""A stream job's feeder connects to its broker off its loop (``StreamSide.open`` then
``opened``): against a real nats-server, a feeder that is not feeder 0, gone back to a
checkpoint, waits for feeder 0 to make the group's consumer anew without holding its loop (in
the test cluster, which turns every role on one thread, that wait inside the loop never ended:
feeder 0 could not turn); what the client refuses fails the opening in one line."""

from __future__ import annotations

import dataclasses
import time

import pytest

from roles.events import open_consumer
from roles.feeder.stream_side import StreamSide


def feeder(stream_job, index: int, url: str) -> StreamSide:
    job, rejected = stream_job()
    job = dataclasses.replace(job, stream=dataclasses.replace(job.stream, url=url))
    return StreamSide(job, index, rejected)


def opened(s: StreamSide, within_s: float = 30.0) -> str | None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        done, failed = s.opened()
        if done:
            return failed
        time.sleep(0.02)
    raise AssertionError(f"not opened within {within_s} s")


@pytest.mark.integration
def test_a_follower_waits_for_feeder_0_without_holding_its_loop(nats, stream_job):
    seqs = nats.publish("events", "impressions", [b'{"click": 1, "x": 1, "c": "a"}'] * 4)
    before = open_consumer(nats.url, "impressions", "clicks")   # the group as it was
    before.close()
    rewind = {"partitions": {"0": {"floor": seqs[1], "done": [], "partial": []}}}
    follower = feeder(stream_job, 1, nats.url)
    leader = feeder(stream_job, 0, nats.url)
    try:
        started = time.monotonic()
        assert follower.open(rewind, "r1") is None
        assert time.monotonic() - started < 5.0   # (it returned: the wait is not in it)
        time.sleep(0.5)
        assert follower.opened() == (False, None) and follower.reader is None
        assert leader.open(rewind, "r1") is None
        assert opened(leader) is None and opened(follower) is None
        assert leader.reader is not None and follower.reader is not None
        assert leader.reader.consumer.acked_below == seqs[1]
    finally:
        leader.close()
        follower.close()


def test_what_the_client_refuses_fails_the_opening_in_one_line(stream_job):
    job, rejected = stream_job('[stream.options]\nno_such_setting = "x"\n')
    s = StreamSide(job, 0, rejected)
    try:
        assert s.open() is None
        failed = opened(s)
        assert failed is not None and failed.startswith(
            "cannot read the stream nats://127.0.0.1:4222 impressions: [stream.options] "
            "no_such_setting: not options of the NATS client"), failed
        assert "\n" not in failed and s.reader is None
    finally:
        s.close()
