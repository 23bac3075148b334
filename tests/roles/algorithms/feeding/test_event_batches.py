"""A stream's events cut into batches (``roles.algorithms.feeding.event_batches``): full
batches at once, a partial one once its oldest event has waited the linger, events in arrival
order, each batch naming its messages and their counts; with the tracker, a message released
once the batches holding its events are trained."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.feeding.event_batches import EventBatcher
from roles.data.stream import Samples
from roles.events import Delivery
from roles.events.tracker import MessageTracker


def events(first: int, n: int) -> Samples:
    ids = np.arange(first, first + n)
    return Samples(ids[:, None].astype(np.int64), np.zeros((n, 1), np.float32),
                   (ids % 2).astype(np.float32), np.ones(n, np.float32))


def origin(position: int, n: int, partition: int = 0) -> np.ndarray:
    return np.tile([partition, position], (n, 1))


def test_full_batches_leave_at_once_a_partial_one_after_the_linger_in_arrival_order():
    b = EventBatcher(batch_size=4, linger_s=0.05)
    b.add(events(0, 3), origin(10, 3), np.arange(3.0), now=1.0)
    assert b.take(now=1.01) is None and b.due() == pytest.approx(1.05)
    b.add(events(3, 6), np.vstack([origin(11, 2), origin(12, 4)]), np.arange(3.0, 9.0),
          now=1.02)
    first = b.take(now=1.02)
    assert first.samples.keys[:, 0].tolist() == [0, 1, 2, 3]
    assert (first.messages, first.counts) == ([(0, 10), (0, 11)], [3, 1])
    second = b.take(now=1.02)
    assert second.samples.keys[:, 0].tolist() == [4, 5, 6, 7]
    assert (second.messages, second.counts) == ([(0, 11), (0, 12)], [1, 3])
    assert b.take(now=1.03) is None and len(b) == 1   # the rest waits for its linger
    last = b.take(now=1.08)
    assert last.samples.keys[:, 0].tolist() == [8] and last.event_time_s.tolist() == [8.0]
    assert b.take(now=9.0) is None and b.due() is None


def test_with_the_tracker_a_message_is_released_once_its_batches_are_trained():
    t = MessageTracker()
    deliveries = [Delivery(0, 10, b"", 1.0), Delivery(0, 11, b"", 1.0)]
    t.add(deliveries, now=0.0)
    t.events(deliveries[0], 3)
    t.events(deliveries[1], 3)
    b = EventBatcher(batch_size=4, linger_s=0.0)
    b.add(events(0, 6), np.vstack([origin(10, 3), origin(11, 3)]), np.zeros(6), now=0.0)
    one, two = b.take(now=0.0), b.take(now=0.0)
    t.trained(two.messages, two.counts)
    assert t.done() == []     # message 11 still has an event in the first batch
    t.trained(one.messages, one.counts)
    assert [d.position for d in t.done()] == [10, 11]


def test_flush_takes_what_waits_and_bad_input_is_refused():
    b = EventBatcher(batch_size=100, linger_s=60.0)
    b.add(events(0, 5), origin(1, 5), np.zeros(5), now=0.0)
    assert b.take(now=0.0) is None
    assert len(b.take(now=0.0, flush=True).samples) == 5
    with pytest.raises(ValueError, match="one origin and one time per event"):
        b.add(events(0, 2), origin(1, 3), np.zeros(2), now=0.0)


def test_a_batch_names_its_events_lines_as_runs_of_consecutive_lines_per_message():
    """What the log of sent batches records: a gap in a message's lines (a rejected line, a
    line left out) starts a new run, so that a run holds no line of another batch."""
    b = EventBatcher(batch_size=6, linger_s=1.0)
    b.add(events(0, 4), origin(10, 4), np.zeros(4), now=0.0, lines=np.array([0, 1, 3, 4]))
    b.add(events(4, 3), origin(11, 3, partition=2), np.zeros(3), now=0.0,
          lines=np.array([7, 8, 9]))
    first = b.take(now=0.0)
    assert first.runs == [(0, 10, 0, 1), (0, 10, 3, 4), (2, 11, 7, 8)]
    assert b.take(now=0.0, flush=True).runs == [(2, 11, 9, 9)]
    b.add(events(0, 2), origin(12, 2), np.zeros(2), now=0.0)   # lines not known: no runs
    assert b.take(now=0.0, flush=True).runs == []
