"""Which messages are wholly trained (``roles.events.tracker``): a message is released for its
broker ack only once every event of it is trained or set aside, a message delivered again
while held is left out, held ones are said to be in progress before their ack wait passes."""

from __future__ import annotations

from roles.events import Delivery
from roles.events.tracker import MessageTracker


def d(position: int, partition: int = 0, time_s: float = 1.0) -> Delivery:
    return Delivery(partition, position, b"", time_s)


def test_a_message_is_released_once_every_event_of_it_is_trained():
    t = MessageTracker()
    batch = [d(1), d(2), d(3)]
    assert t.add(batch, now=0.0) == [0, 1, 2]
    t.events(batch[0], 3)
    t.events(batch[1], 0)   # every event set aside: done at once
    t.events(batch[2], 2)
    assert [m.position for m in t.done()] == [2]
    t.trained([(0, 1), (0, 3)], [2, 1])
    assert t.done() == [] and t.events_held == 2
    t.trained([(0, 1)], [1])
    assert [m.position for m in t.done()] == [1]
    t.trained([(0, 3)], [1])
    assert [m.position for m in t.done()] == [3] and len(t) == 0 and t.events_held == 0


def test_a_message_delivered_again_while_held_is_left_out_and_partitions_are_apart():
    t = MessageTracker()
    assert t.add([d(1), d(1, partition=1), d(1)], now=0.0) == [0, 1]
    assert t.add([d(1)], now=1.0) == []
    assert t.duplicates == 2 and len(t) == 2


def test_held_messages_are_said_in_progress_before_their_ack_wait_passes():
    t = MessageTracker()
    t.add([d(1, time_s=5.0), d(2, time_s=6.0)], now=0.0)
    t.add([d(3)], now=10.0)
    assert [m.position for m in t.overdue(now=16.0, after_s=15.0)] == [1, 2]
    assert t.overdue(now=17.0, after_s=15.0) == []          # their clock started again
    assert [m.position for m in t.overdue(now=26.0, after_s=15.0)] == [3]
    assert t.oldest_time_s() == 1.0


def test_messages_set_aside_are_no_longer_held_and_give_their_deliveries():
    t = MessageTracker()
    batch = [d(1), d(2), d(1, partition=1)]
    t.add(batch, now=0.0)
    for m in batch:
        t.events(m, 2, rejected=1)
    aside, rejected = t.forget([(0, 2), (1, 1), (0, 9)])
    assert [m.position for m in aside] == [2, 1] and rejected == 2
    assert len(t) == 1 and t.events_held == 2 and t.holds(0, 1) and not t.holds(0, 2)
    t.trained([(0, 1), (0, 2)], [2, 2])   # (a set-aside message's events: not counted)
    assert [m.position for m in t.done()] == [1] and t.events_held == 0
