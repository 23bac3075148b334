"""A stream job's place in its stream at a checkpoint (``StreamSide.position``) and the
reading again from it after the whole job went back to that checkpoint (``rewind``): without
a broker, messages decoded by the real decoder."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import orjson
import pytest

from roles.events import Delivery
from roles.events.positions import GroupAcks
from roles.feeder.stream_side import StreamSide


def side(stream_job, broker: str = "nats") -> StreamSide:
    job, rejected = stream_job()
    if broker == "kafka":
        job = dataclasses.replace(job, stream=dataclasses.replace(
            job.stream, url="kafka://127.0.0.1:9092"))
    s = StreamSide(job, 0, rejected)
    if broker == "nats":   # as ``open`` makes them for a shared consumer (JetStream's)
        s.group_acks = GroupAcks()
    return s


class Reader:
    """The reader a feeder acknowledges through, its consumer's group floor as a JetStream
    server would say it (``acked_below``)."""

    def __init__(self) -> None:
        self.consumer = SimpleNamespace(acked_below=None)

    def done(self, deliveries: list[Delivery]) -> None:
        pass


def messages(*positions: int, events: int = 10) -> list[Delivery]:
    return [Delivery(0, p, b"\n".join(orjson.dumps({"click": i % 2, "x": i, "c": f"v{i}"})
                                      for i in range(events)), 100.0) for p in positions]


def taken(s: StreamSide, deliveries: list[Delivery]) -> None:
    from roles.data.readers import Schema
    from roles.events.decode import EventDecoder
    decoder = EventDecoder(Schema(label="click", dense=["x"], sparse=["c"]), "json",
                           "impressions")
    s.take(deliveries, decoder.decode(deliveries), now=0.0)


def trained(s: StreamSide, position: int, events: int) -> None:
    s.tracker.trained([(0, position)], [events])
    s.events_trained += events
    s.acknowledge(s.tracker.done())


@pytest.mark.parametrize("broker", ["kafka", "nats"])
def test_the_position_says_what_was_trained_and_a_rewind_leaves_it_out(stream_job, broker):
    """Kafka: the partition's done prefix, from this feeder's own deliveries; NATS: the
    group's floor as the server says it, and what this feeder acknowledged above it."""
    s = side(stream_job, broker)
    s.reader = reader = Reader()   # (NATS: the server's floor, 7 until 7 is acknowledged)
    reader.consumer.acked_below = 7 if broker == "nats" else None
    taken(s, messages(7, 8, 9, 10))
    trained(s, 7, 10)    # done: the floor moves past it
    reader.consumer.acked_below = 8 if broker == "nats" else None
    trained(s, 9, 10)    # done above an open message
    trained(s, 8, 4)     # partly: its first 4 events
    at = s.position()
    assert at is not None
    assert at["partitions"] == {"0": {"floor": 8, "done": [9], "partial": [[8, 4]]}}
    assert at["events_trained"] == 24 and at["messages_acked"] == 2
    # the job went back there: read again from 8, 9 left out whole, 8's first 4 events too
    again = side(stream_job, broker)
    again.reader = Reader()
    again.reader.consumer.acked_below = 8 if broker == "nats" else None
    assert again.rewind(orjson.loads(orjson.dumps(at))) == {0: 8}
    taken(again, messages(8, 9, 10))
    assert sum(len(h.block) for h in again.held) == 6 + 10   # 8's last 6, all of 10
    assert again.messages_acked == 2 + 1     # 9 acknowledged at once: trained before
    assert again.events_trained == 24 and not again.skip
    assert again.position()["partitions"]["0"]["floor"] == 8


def test_a_shared_consumers_record_is_the_groups_floor_not_the_feeders_own_prefix(stream_job):
    """NATS: another feeder of the group holds positions 5 and 6 (the server's floor stays
    at 5); this one's record starts there, with what it did above, not at its own first
    position not done (8), which would say 5 and 6 were trained."""
    s = side(stream_job, "nats")
    s.reader = reader = Reader()
    reader.consumer.acked_below = 5
    taken(s, messages(7, 8, 9, 10))
    trained(s, 7, 10)
    trained(s, 9, 10)
    trained(s, 8, 4)
    assert s.position()["partitions"] == {"0": {"floor": 5, "done": [7, 9],
                                                "partial": [[8, 4]]}}


def test_a_job_joining_labels_records_no_position(stream_job):
    s = side(stream_job)
    s.labels = object()   # (the join trains out of order: not recorded)
    assert s.position() is None
