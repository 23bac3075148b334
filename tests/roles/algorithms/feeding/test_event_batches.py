"""A stream's events cut into batches (``roles.algorithms.feeding.event_batches``): full
batches at once, a partial one once its oldest event has waited the linger, events in arrival
order, each batch naming its messages and their counts; with the tracker, a message released
once the batches holding its events are trained."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from roles.algorithms.feeding.event_batches import EventBatcher, _tally
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


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 5), st.integers(0, 6)),
                max_size=40),
       st.booleans(), st.booleans())
@settings(max_examples=300, deadline=None)
def test_the_messages_counts_and_runs_are_what_a_sort_and_unique_give(rows, ordered, lined):
    """The one-pass tally (events already in order) and its sorted fallback against the
    definition: the distinct messages with their events (``np.unique``), and the runs of
    consecutive lines of one message after a sort by message and line."""
    rows = sorted(rows) if ordered else rows
    got = np.array([r[:2] for r in rows], np.int64).reshape(-1, 2)
    lines = np.array([r[2] for r in rows], np.int64) if lined else None
    where, counts, runs = _tally(got, lines)
    if rows:
        want, n = np.unique(got, axis=0, return_counts=True)
        assert where == [tuple(w) for w in want.tolist()] and counts == n.tolist()
    else:
        assert where == [] and counts == []
    expected = []
    for p, q, ln in sorted(rows) if lined else []:
        last = expected[-1] if expected else None
        if last is not None and last[:2] == (p, q) and last[3] + 1 == ln:
            expected[-1] = (p, q, last[2], ln)
        else:
            expected.append((p, q, ln, ln))
    assert runs == expected


def test_a_revoked_partition_s_messages_not_begun_are_set_aside_and_a_begun_one_stays():
    """``drop``: the waiting events of a partition's messages none of whose events is in a
    batch leave the batcher (their rows returned); a message a batch has begun stays whole
    (it is trained here), as do the other partitions' events, in their order."""
    b = EventBatcher(batch_size=4, linger_s=0.0)
    b.add(events(0, 6), np.vstack([origin(10, 3, 1), origin(11, 3, 1)]), np.zeros(6),
          now=0.0)
    b.add(events(6, 4), np.vstack([origin(5, 2, 0), origin(12, 2, 1)]), np.zeros(4), now=0.0)
    first = b.take(now=0.0)   # message 11 begun: one of its events in this batch
    assert first.messages == [(1, 10), (1, 11)]
    gone = b.drop({1})
    assert gone.tolist() == [[1, 12], [1, 12]] and len(b) == 4
    rest = b.take(now=0.0, flush=True)
    assert rest.samples.keys[:, 0].tolist() == [4, 5, 6, 7]
    assert (rest.messages, rest.counts) == ([(0, 5), (1, 11)], [2, 2])
    assert b.drop({0, 1}).tolist() == [] and b.take(now=0.0, flush=True) is None
    b.add(events(0, 2), origin(20, 2, 2), np.zeros(2), now=0.0)
    assert b.drop({2}).tolist() == [[2, 20], [2, 20]] and len(b) == 0 and b.due() is None


def test_a_begun_message_stays_begun_across_two_drops():
    """After a drop rebuilt the head chunk, the message a batch has begun is still known as
    begun: a second revoke leaves its rest to be trained too."""
    b = EventBatcher(batch_size=2, linger_s=0.0)
    b.add(events(0, 6), np.vstack([origin(10, 3, 1), origin(11, 3, 2)]), np.zeros(6),
          now=0.0)
    assert b.take(now=0.0).messages == [(1, 10)]   # message 10 begun
    assert b.drop({2}).tolist() == [[2, 11]] * 3 and len(b) == 1
    assert b.drop({1}).tolist() == [] and len(b) == 1
    last = b.take(now=0.0, flush=True)
    assert (last.messages, last.counts) == ([(1, 10)], [1])
