"""A feeder's reading of a stream (``roles.events.reader``) against a real nats-server: every
message read once and decoded, at most ``max_messages`` waiting for the loop, a broker that
goes away retried and said to be down, then read from again when it is back; the loop's calls
on the consumer in their order, each run of acknowledgements one call."""

from __future__ import annotations

import time

import orjson
import pytest

from roles.data.readers import Schema
from roles.events import Delivery, open_consumer
from roles.events.decode import EventDecoder
from roles.events.reader import EventReader, coalesced

SCHEMA = Schema(label="y", dense=["x"], sparse=["c"])


def wait_for(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while not (got := check()):
        assert time.monotonic() < deadline, "waited in vain"
        time.sleep(0.05)
    return got


@pytest.mark.integration
def test_every_message_is_read_once_and_no_more_than_the_room_waits(nats):
    nats.publish("events", "clicks", [b"\n".join(orjson.dumps({"y": i % 2, "x": i, "c": "a"})
                                                 for i in range(5 * m, 5 * m + 5))
                                      for m in range(40)])
    consumer = open_consumer(nats.url, "clicks", "job")
    reader = EventReader(consumer, EventDecoder(SCHEMA, "json", "clicks"), max_messages=15,
                         fetch_messages=7)
    try:
        wait_for(lambda: reader.messages_read >= 15)
        time.sleep(0.5)
        assert reader.messages_read == 15      # the room is full: nothing more is fetched
        taken = []
        while len(taken) < 40:
            for deliveries, decoded in reader.take():
                assert decoded.events == 5 * len(deliveries)
                taken += deliveries
                consumer.done(deliveries)
            time.sleep(0.02)
        assert [d.position for d in taken] == list(range(1, 41))
        assert reader.events_read == 200 and reader.broker_down_since is None
    finally:
        reader.close()
        consumer.close()


@pytest.mark.integration
def test_a_broker_that_goes_away_is_said_to_be_down_and_read_from_again_when_back(nats):
    nats.publish("events", "clicks", [orjson.dumps({"y": 1, "x": 1, "c": "a"})])
    consumer = open_consumer(nats.url, "clicks", "job")
    reader = EventReader(consumer, EventDecoder(SCHEMA, "json", "clicks"), retry_s=0.2)
    try:
        (first,) = wait_for(reader.take)
        consumer.done(first[0])
        nats.close()
        wait_for(lambda: reader.broker_down_since is not None)
        assert "disconnected" in reader.last_error
        nats.start()   # the same port and store
        wait_for(lambda: reader.broker_down_since is None)
        nats.publish("events", "clicks", [orjson.dumps({"y": 0, "x": 2, "c": "b"})])
        (second,) = wait_for(reader.take)
        assert [d.position for d in second[0]] == [2]
    finally:
        reader.close()
        consumer.close()


def test_a_run_of_acknowledgements_is_one_call_and_every_other_call_keeps_its_place():
    d = [Delivery(0, p, b"", 0.0) for p in range(6)]
    calls = [("done", [d[0]], 0), ("done", [d[1], d[2]], 0), ("working", [d[3]], 0),
             ("done", [d[3]], 0), ("forget", [d[4]], 7), ("done", [d[5]], 0),
             ("final", [], 0)]
    assert coalesced(calls) == [("done", d[0:3], 2), ("working", [d[3]], 0),
                                ("done", [d[3]], 1), ("forget", [d[4]], 7),
                                ("done", [d[5]], 1), ("final", [], 0)]
    assert coalesced([]) == []
    assert calls[0] == ("done", [d[0]], 0)   # (the calls themselves unchanged)
