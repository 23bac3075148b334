"""The feeder's label join (``roles.feeder.joining``) without a broker: impressions prepared
into the join, labels decoded by the real decoder from messages of their own, and which label
messages each batch and each expiry releases to be acknowledged."""

from __future__ import annotations

import numpy as np
import orjson
import pytest

from roles.algorithms.feeding.event_batches import EventBatcher
from roles.algorithms.feeding.label_join import Joined
from roles.data.readers import Schema
from roles.data.stream import Samples
from roles.events import Delivery
from roles.events.decode import EventDecoder, event_id
from roles.feeder.joining import LabelSide, PendingImpressions


def samples(n: int, first: int = 0) -> Samples:
    rows = np.arange(first, first + n)
    return Samples(rows.reshape(-1, 1).astype(np.int64), rows.reshape(-1, 1).astype(np.float32),
                   np.full(n, np.nan, np.float32), np.ones(n, np.float32))


def test_pending_impressions_are_taken_by_handle_in_any_order_and_blocks_let_go():
    p = PendingImpressions()
    for first in (0, 3, 5):
        n = 3 if first == 0 else 2
        origin = np.stack([np.zeros(n), np.arange(first, first + n) + 100], axis=1)
        h = p.add(samples(n, first), origin.astype(np.int64), np.arange(first, first + n) * 1.0,
                  np.arange(first, first + n) + 1000, np.arange(n) + 10 * first)
        assert h.tolist() == list(range(first, first + n))
    got, origin, times, ids, order, lines = p.take(Joined(np.array([6, 1, 3]),
                                                          np.array([1, 0, 1], np.float32)))
    assert got.keys[:, 0].tolist() == [1, 3, 6] and ids.tolist() == [1001, 1003, 1006]
    assert lines.tolist() == [1, 30, 51]   # (each impression's line in its message)
    assert got.labels.tolist() == [0.0, 1.0, 1.0] and order.tolist() == [1, 2, 0]
    assert origin[:, 1].tolist() == [101, 103, 106] and times.tolist() == [1.0, 3.0, 6.0]
    assert len(p) == 4 and len(p.blocks) == 3
    p.take(Joined(np.array([0, 2, 4]), np.zeros(3, np.float32)))
    assert len(p) == 1 and len(p.blocks) == 1   # the two first blocks are let go
    p.add(samples(1, 7), np.array([[0, 107]]), np.array([7.0]), np.array([1007]))
    assert p.take(Joined(np.array([5, 7]), np.ones(2, np.float32)))[5] is None   # (not known)
    with pytest.raises(ValueError, match="not given"):
        p.take(Joined(np.array([99]), np.zeros(1, np.float32)))


def label_messages(decoder: EventDecoder, *messages: list[dict], first: int = 1,
                   time_s: float = 100.0):
    deliveries = [Delivery(0, first + k, b"\n".join(orjson.dumps(e) for e in m), time_s)
                  for k, m in enumerate(messages)]
    return deliveries, decoder.decode(deliveries)


@pytest.fixture
def side(stream_job):
    s = LabelSide(*stream_job('[stream.labels]\ntopic = "clicks"\nwindow_s = 10\n'))
    decoder = EventDecoder(Schema(label="click", dense=[], sparse=[], timestamp=""), "json",
                           "clicks", id_field="event_id")
    return s, decoder


def test_a_label_s_message_is_acknowledged_once_its_impression_trained_or_it_is_done_with(side):
    s, decoder = side
    # message 1: labels of ids 1 and 2 (early: their impressions not yet in), message 2: a
    # label of an id never shown, and a second label of id 1
    d, dec = label_messages(decoder, [{"event_id": 1, "click": 1}, {"event_id": 2, "click": 0}],
                            [{"event_id": 77, "click": 1}, {"event_id": 1, "click": 0}])
    assert s._labels(d, dec, now=0.0) is None
    assert s.join.counts.duplicate_labels == 1 and s.messages_acked == 0
    # impressions 1, 2, 3 (one message): 1 and 2 join their labels, 3 waits
    origin = np.array([[0, 50]] * 3, np.int64)
    ready, dups = s.impressions(samples(3, 1), origin, np.array([101.0, 101.0, 101.0]),
                                np.array([1, 2, 3]), now=1.0)
    assert len(dups) == 0 and ready is not None
    assert ready.samples.labels.tolist() == [1.0, 0.0]
    assert ready.label_origin.tolist() == [[0, 1], [0, 1]]
    batcher = EventBatcher(2, 0.0)
    batcher.add(ready.samples, ready.origin, ready.times, 0.0, ready.label_origin)
    batch = batcher.take(0.0)
    assert batch.label_messages == [(0, 1)] and batch.label_counts == [2]
    s.trained(batch)
    assert s.messages_acked == 1   # message 1 (both labels trained); 2 waits for id 77
    # the window passes: 3 leaves as a negative, 77's label unmatched, message 2 done
    assert s.poll(now=20.0, running=False) is None   # (waiting for its statistics)
    expired = s.poll(now=20.0, running=True)
    assert expired is not None and expired.samples.labels.tolist() == [0.0]
    assert expired.label_origin.tolist() == [[-1, -1]]
    assert s.join.counts.labels_unmatched == 1 and s.messages_acked == 2
    assert s.counts()["impressions_waiting"] == 0 and s.counts()["labels_waiting"] == 0


def test_an_event_id_is_its_integer_or_a_stable_hash():
    assert event_id("42") == 42 and event_id(" -7 ") == -7
    assert event_id("abc") == event_id("abc") != event_id("abd")
    assert event_id(str(1 << 70)) == event_id(str(1 << 70))   # too big: hashed


def test_malformed_labels_are_set_aside_with_their_message_and_line_and_counted(side, tmp_path):
    s, decoder = side
    d = [Delivery(0, 5, b'{"event_id": 1, "click": 1}\nnot json\n{"click": 1}\n'
                        b'{"event_id": 2, "click": "maybe"}', 100.0)]
    assert s._labels(d, decoder.decode(d), now=0.0) is None
    assert s.labels_rejected == 3 and s.join.counts.duplicate_labels == 0
    lines = (tmp_path / "rejected.tsv").read_text().splitlines()
    assert [line.split("\t")[:2] for line in lines[1:]] == [
        ["clicks[0]@5", "2"], ["clicks[0]@5", "3"], ["clicks[0]@5", "4"]], lines
    assert "no 'event_id'" in lines[2]
    # the good label waits for its impression: its message is not done before
    assert s.messages_acked == 0 and s.counts()["labels_waiting"] == 1
