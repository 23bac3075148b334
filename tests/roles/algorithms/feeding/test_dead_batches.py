"""A restarted stream feeder's account of its dead processes' batches
(``roles.algorithms.feeding.dead_batches``) from the log of sent batches
(``roles.algorithms.feeding.sent_log``): each event of a message delivered again is left out
(trained), parked (a worker may still train it) or trained anew, never twice."""

from __future__ import annotations

import os

import numpy as np

from roles.algorithms.feeding.dead_batches import FREE, HELD, OPEN, TRAINED, DeadBatches
from roles.algorithms.feeding.sent_log import RECORD, SentLog


def log_of(tmp_path, batches: dict[int, list[tuple[int, int, int, int]]]) -> np.ndarray:
    sent = SentLog(tmp_path, "feeder-0")
    for seq, runs in batches.items():
        sent.append(seq, runs)
    sent.close()
    return SentLog(tmp_path, "feeder-0").read()


def test_acked_batches_are_left_out_held_ones_parked_the_rest_trained_anew(tmp_path):
    # message (0, 7): lines 0-49 in batch 3 (acked), 50-89 in batch 4 (a worker holds it),
    # 90-99 in batch 5 (sent, held by nobody); lines past 99 were never batched
    records = log_of(tmp_path, {3: [(0, 7, 0, 49)], 4: [(0, 7, 50, 89)],
                                5: [(0, 7, 90, 99), (0, 8, 0, 9)]})
    dead = DeadBatches(records, low=4, above=set())
    assert dead.status == {3: TRAINED, 4: OPEN, 5: OPEN}
    dead.hold("worker-1", [4, 99])   # (99: not a dead batch)
    lines = np.arange(0, 120, 10)
    trained, parked = dead.fates(dead.owners(0, 7, lines))
    assert lines[trained].tolist() == [0, 10, 20, 30, 40]
    assert {s: lines[m].tolist() for s, m in parked.items()} == {4: [50, 60, 70, 80],
                                                                 5: [90]}
    dead.park(4, "held events")
    dead.park(5, "open events")
    assert dead.recovered() == ["open events"]   # nobody holds batch 5: trained anew
    assert dead.status[5] == FREE and dead.status[4] == HELD
    trained, parked = dead.fates(dead.owners(0, 8, np.arange(10)))
    assert not trained.any() and not parked   # batch 5's other message: trained anew
    assert dead.acked(4) == ["held events"] and dead.status[4] == TRAINED
    assert dead.acked(4) is None and dead.acked(3) is None   # counted once, acked already
    assert dead.unsettled() == []


def test_a_lost_holder_s_batches_are_trained_anew(tmp_path):
    dead = DeadBatches(log_of(tmp_path, {0: [(1, 5, 0, 9)], 1: [(1, 5, 10, 19)]}), 0, set())
    dead.hold("worker-0", [0])
    dead.hold("worker-1", [1])
    dead.park(0, "a")
    assert dead.lost({"worker-0"}) == ["a"] and dead.status == {0: FREE, 1: HELD}
    assert dead.acked(0) is None   # an ack too late to count: its events go out again


def test_the_newest_batch_holding_a_line_decides_and_marks_survive_a_second_restart(tmp_path):
    """A second process died too: it had found batch 2 of the first not acknowledged (its
    mark in the log) and batched its lines again as 40; the ack log's numbers below 40 are all
    done but for those marked not acknowledged, and 3, acknowledged to the second process by
    a worker after it started, is marked so."""
    sent = SentLog(tmp_path, "feeder-0")
    sent.append(1, [(0, 3, 0, 49)])
    sent.append(2, [(0, 3, 50, 99)])
    sent.append(3, [(0, 4, 0, 99)])
    sent.close()
    second = SentLog(tmp_path, "feeder-0")   # the second process
    second.mark_unacked([2, 3])
    second.append(40, [(0, 3, 50, 99)])
    second.mark_acked(3)   # a worker's late ack of batch 3 to the second process
    second.close()
    records = SentLog(tmp_path, "feeder-0").read()
    assert len(records) == 7 and records.dtype == RECORD
    dead = DeadBatches(records, low=40, above=set())
    assert dead.status == {1: TRAINED, 2: OPEN, 3: TRAINED, 40: OPEN}
    trained, parked = dead.fates(dead.owners(0, 3, np.array([10, 60])))
    assert trained.tolist() == [True, False] and list(parked) == [40]


def test_the_log_keeps_two_segments_and_a_torn_record_is_cut_off(tmp_path):
    sent = SentLog(tmp_path, "feeder-0", per_segment=2)
    for seq in range(7):   # segments of 2 batches: 0 1 | 2 3 | 4 5 | 6
        sent.append(seq, [(0, seq, 0, 1)])
    assert sent.segments() == [2, 3]   # (at each new segment, all but it and the one before)
    os.write(sent.fd, RECORD.itemsize // 2 * b"x")   # a crash mid-write
    sent.close()
    assert SentLog(tmp_path, "feeder-0").read()["seq"].tolist() == [4, 5, 6]
    restarted = SentLog(tmp_path, "feeder-0", per_segment=2)
    restarted.append(7, [(0, 7, 0, 1)])   # its own segment; the dead one's kept
    assert restarted.segments() == [2, 3, 4]
    restarted.clear()
    assert restarted.segments() == [] and not len(restarted.read())


def test_the_messages_awaited_are_those_not_acknowledged_to_the_broker(tmp_path):
    """The log records the messages acknowledged to the broker: those of the dead batches it
    does not name come again, and are awaited until they do (a stream that ends reads on for
    them); a message acknowledged is not, whatever its batches."""
    sent = SentLog(tmp_path, "feeder-0")
    sent.append(0, [(0, 7, 0, 99)])
    sent.append(1, [(0, 8, 0, 49)])
    sent.mark_messages_acked([(0, 7)])   # every event of 7 trained, acknowledged to the broker
    sent.append(2, [(0, 8, 50, 99), (1, 3, 0, 9)])
    sent.close()
    dead = DeadBatches(SentLog(tmp_path, "feeder-0").read(), low=2, above=set())
    assert dead.status == {0: TRAINED, 1: TRAINED, 2: OPEN}   # (the mark is not a batch)
    assert dead.awaited == {(0, 8), (1, 3)}
    dead.came(0, 8)
    dead.came(0, 9)   # (not theirs)
    assert dead.awaited == {(1, 3)}
