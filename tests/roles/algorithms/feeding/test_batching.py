"""The feeder's batching (pure): batch ids, the ledger of batches in flight, a pass over parts
that replays and reclaims, the ack log, and which feeder reads which part."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.feeding.ack_log import AckLog
from roles.algorithms.feeding.ledger import Ledger, PartProgress
from roles.algorithms.feeding.parts import assign_parts
from roles.algorithms.feeding.passes import FeedingPass, PartStream
from roles.data.stream import Samples
from roles.protocol.datapath import (
    MAX_EPOCHS,
    MAX_LONG_SEQ,
    MAX_PARTS,
    MAX_SEQ,
    make_batch_id,
    make_batch_ids,
    split_batch_id,
    split_batch_ids,
)


def batch(n: int, first: int = 0) -> Samples:
    keys = np.arange(first, first + n, dtype=np.int64).reshape(n, 1)
    return Samples(keys, np.zeros((n, 1), np.float32), np.zeros(n, np.float32),
                   np.ones(n, np.float32))


def test_batch_ids_round_trip_and_reject_overflow():
    assert split_batch_id(make_batch_id(3, 70000, 12345)) == (3, 70000, 12345)
    assert 0 < make_batch_id(4095, MAX_PARTS - 1, MAX_SEQ - 1) < 2**63  # a signed int64
    with pytest.raises(ValueError):
        make_batch_id(1, MAX_PARTS, 0)
    with pytest.raises(ValueError):   # past 2^27 only a stream's part (a feeder's index)
        make_batch_id(1, 16, MAX_SEQ)
    with pytest.raises(ValueError):
        make_batch_id(1, 0, MAX_LONG_SEQ)


def test_a_stream_s_batch_numbers_go_on_past_2_27_as_ids_that_round_trip_in_order():
    """A stream's pass never ends: its feeder's batch numbers go on past 2^27 (the ids
    then carry the number's high bits in the part field), every id round trips, in order
    within a part, a signed int64, and the ids below 2^27 are as they always were (a
    checkpoint or an ack log written before reads the same)."""
    assert make_batch_id(2, 5, MAX_SEQ - 1) == 2 << 51 | 5 << 27 | MAX_SEQ - 1
    seqs = [0, 1, MAX_SEQ - 1, MAX_SEQ, MAX_SEQ + 1, 3 * MAX_SEQ + 7, 1 << 40,
            MAX_LONG_SEQ - 1]
    for epoch in (0, 1, MAX_EPOCHS - 1):
        for part in (0, 3, 15):
            ids = [make_batch_id(epoch, part, q) for q in seqs]
            assert [split_batch_id(b) for b in ids] == [(epoch, part, q) for q in seqs]
            assert ids == sorted(ids) and all(0 <= b < 2**63 for b in ids)
            many = make_batch_ids(epoch, part, np.array(seqs))
            assert many.tolist() == ids
            e, p, q = split_batch_ids(many)
            assert (e.tolist(), p.tolist(), q.tolist()) == ([epoch] * 8, [part] * 8, seqs)
    files = np.array([make_batch_id(1, part, 9) for part in (16, 70000, MAX_PARTS - 1)])
    assert [x.tolist() for x in split_batch_ids(files)] == \
        [[1, 1, 1], [16, 70000, MAX_PARTS - 1], [9, 9, 9]]


def test_parts_go_to_feeders_in_runs_of_about_as_many_rows():
    assert assign_parts([10, 10, 10, 10], 2) == [0, 0, 1, 1]
    assert assign_parts([100], 2) == [0]                  # a feeder may get none
    assert assign_parts([5, 100, 5], 3) == [0, 1, 2]      # each gets one when it can
    owners = assign_parts([1] * 100, 3)
    assert owners == sorted(owners) and np.bincount(owners).tolist() == [34, 33, 33]


def stream(part: int, sizes: list[int], done: PartProgress | None = None, log=None):
    made = log if log is not None else []
    firsts = np.cumsum([0, *sizes])
    return PartStream(part, lambda: iter([batch(n, int(f)) for n, f in zip(sizes, firsts,
                                                                           strict=False)]),
                      done, lambda *args: made.append(args))


def test_a_pass_takes_its_parts_in_turn_and_skips_what_was_acknowledged():
    made: list = []
    done = PartProgress(2, low=1, above={3})
    p = FeedingPass(2, False, [stream(7, [4, 4, 4, 4, 2], done, made), stream(9, [3], None,
                                                                              made)])
    taken = []
    while (got := p.take()) is not None:
        taken.append((split_batch_id(got[0]), int(got[1].keys[0, 0])))
    assert taken == [((2, 7, 1), 4), ((2, 7, 2), 8), ((2, 7, 4), 16), ((2, 9, 0), 0)]
    assert p.exhausted() and p.parts == [7, 9]
    # every batch is made, those acknowledged before marked so (their size counts)
    assert made == [(7, 0, 4, True), (7, 1, 4, False), (7, 2, 4, False), (7, 3, 4, True),
                    (7, 4, 2, False), (9, 0, 3, False)]


def test_a_restarted_pass_reclaims_a_batch_its_dead_process_sent():
    p = FeedingPass(0, False, [stream(1, [2, 2, 2, 2, 2])])
    first = p.take()
    assert split_batch_id(first[0])[2] == 0
    assert p.peek(first[0]) is None                      # sent by this process: not its
    held = make_batch_id(0, 1, 3)
    got = p.peek(held)                                   # made now, batches 1 and 2 wait
    assert got is not None and int(got.keys[0, 0]) == 6
    p.claim(held)                                        # a worker holds it: not sent again
    assert p.peek(make_batch_id(1, 1, 4)) is None        # another epoch
    rest = []
    while (got := p.take()) is not None:
        rest.append(split_batch_id(got[0])[2])
    assert rest == [1, 2, 4]


def test_part_progress_keeps_a_low_water_mark():
    p = PartProgress(0)
    for n in (1, 0, 3, 2, 5):
        p.acked(n, 10, 1.0, 10.0)
    assert (p.low, p.above, p.samples) == (4, {5}, 50)
    assert p.done(3) and p.done(5) and not p.done(4)
    again = PartProgress.of({"epoch": 0, "low": 4, "above": [5], "samples": 50,
                             "loss_sum": 5.0, "weight_sum": 50.0})
    assert again == p


def test_ledger_max_in_flight_and_duplicate_acks():
    ledger = Ledger(max_in_flight=2)
    ledger.sent(1, batch(3), False)
    ledger.sent(2, batch(3), False)
    assert not ledger.has_room()
    assert ledger.take(1, "w0")
    assert ledger.acked(1, "w0") is not None and ledger.has_room()
    assert ledger.acked(1, "w0") is None and ledger.duplicate_acks == 1


def test_each_batch_is_granted_to_one_worker_and_only_its_ack_counts():
    ledger = Ledger(max_in_flight=8)
    ledger.sent(1, batch(3), False)
    assert ledger.acked(1, "w0") is None          # not taken yet
    assert ledger.holder(1) is None
    assert ledger.take(1, "w0") and not ledger.take(1, "w1")
    assert ledger.holder(1) == "w0"               # the feeder does not answer w0's Taken again
    assert ledger.acked(1, "w1") is None          # not the holder
    assert ledger.acked(1, "w0") is not None
    assert not ledger.take(1, "w1")               # done
    assert (ledger.refused_takes, ledger.duplicate_acks) == (2, 2)


def test_lost_workers_batches_and_untaken_ones_go_out_again_once():
    ledger = Ledger(max_in_flight=8)
    for b in (1, 2, 3, 4):
        ledger.sent(b, batch(2), False)
    ledger.take(1, "dead")
    ledger.take(2, "alive")                      # 3 and 4: sent, not taken yet
    assert ledger.requeue({"dead"}) == 3
    assert ledger.requeued == 3
    assert ledger.take(3, "alive")               # the first copy of 3 turned up after all
    again = []
    while (entry := ledger.next_resend()) is not None:
        again.append(entry[0])
    assert again == [1, 4]                       # 3 is taken: no second copy goes out
    assert ledger.take(1, "other") and not ledger.take(3, "other")
    assert ledger.in_flight[4].sends == 2


def test_a_batch_the_queue_did_not_take_goes_again_first_as_if_never_sent():
    """The feeder's non-blocking send to the sample queue was refused (EAGAIN): the batch is
    in flight, queued to go before any other resend, and still counts as sent once (its
    straggler copy is still to come)."""
    ledger = Ledger(max_in_flight=8)
    for b in (1, 2, 3):
        ledger.sent(b, batch(2), False)
    ledger.take(1, "w")
    ledger.requeue({"w"})                        # 1 (the lost worker's), 2, 3 to go again
    ledger.sent(4, batch(2), False)
    ledger.unsent(4)
    assert [ledger.next_resend()[0] for _ in range(4)] == [4, 1, 2, 3]
    assert ledger.in_flight[4].sends == 1 and len(ledger.in_flight) == 4
    ledger.unsent(4)                             # refused again: first again
    assert ledger.next_resend()[0] == 4 and ledger.next_resend() is None
    ledger.take(4, "w2")
    ledger.unsent(4)                             # (a taken batch stays its holder's)
    assert ledger.next_resend() is None and ledger.holder(4) == "w2"


def test_an_ack_from_a_lost_worker_still_counts_until_the_batch_is_retaken():
    ledger = Ledger(max_in_flight=8)
    ledger.sent(1, batch(2), False)
    ledger.take(1, "slow")
    ledger.requeue({"slow"})                     # declared lost, but its ack was on the way
    assert ledger.acked(1, "slow") is not None
    assert ledger.next_resend() is None          # nothing left to send again


def test_straggler_copies_are_of_untaken_batches_once_each_oldest_first():
    ledger = Ledger(max_in_flight=8)
    for b in (1, 2, 3):
        ledger.sent(b, batch(2), False)
    ledger.take(2, "fast")
    assert ledger.straggler()[0] == 1
    assert ledger.straggler()[0] == 3
    assert ledger.straggler() is None                # each gets one copy at most
    assert ledger.straggler_copies == 2
    assert ledger.take(3, "fast") and not ledger.take(3, "slow")   # the first copy taken wins


def test_the_ack_log_folds_old_epochs_survives_a_torn_record_and_gives_the_progress_back(
        tmp_path):
    log = AckLog(tmp_path, "feeder-0")
    for seq in (0, 1, 3):
        log.append(make_batch_id(0, 5, seq), 10, 1.5, 10.0, 1)
    log.append(make_batch_id(1, 5, 0), 7, 0.5, 7.0, 0)
    log.close()
    with open(tmp_path / "feeder-0.e1.acks", "ab") as f:
        f.write(b"\x01\x02\x03")  # a record cut short
    again = AckLog(tmp_path, "feeder-0")
    done = again.restart()
    assert done is not None and (done["batches"], done["samples"], done["last_epoch"]) == (
        4, 37, 1)
    assert done["acked_by"] == {"worker-0": 7, "worker-1": 30}
    (progress,) = again.progress(0).values()
    assert (progress.low, progress.above, progress.samples) == (2, {3}, 30)
    again.fold(before=1)                   # epoch 0 reported: only its totals are kept
    assert [p.name for p in sorted(tmp_path.iterdir())] == ["feeder-0.e1.acks",
                                                           "feeder-0.totals.json"]
    again.append(make_batch_id(1, 5, 1), 7, 0.5, 7.0, 0)  # appended after the cut
    again.close()
    last = AckLog(tmp_path, "feeder-0")
    assert len(last.records(1)) == 2 and last.progress(0) == {}
    assert last.restart()["batches"] == 5 and last.restart()["samples"] == 44


def test_the_ack_log_counts_a_stream_s_batches_past_2_27(tmp_path):
    log = AckLog(tmp_path, "feeder-0")
    for seq in (MAX_SEQ - 2, MAX_SEQ - 1, MAX_SEQ, MAX_SEQ + 2):
        log.append(make_batch_id(0, 1, seq), 10, 1.0, 10.0, 0)
    log.close()
    again = AckLog(tmp_path, "feeder-0")
    assert again.restart()["batches"] == 4
    (part, progress), = again.progress(0).items()
    assert part == 1 and progress.samples == 40
    assert progress.done(MAX_SEQ) and progress.done(MAX_SEQ + 2)
    assert not progress.done(MAX_SEQ + 1) and not progress.done(3)


def test_open_parts_are_taken_in_turn_and_the_next_joins_when_one_is_done():
    p = FeedingPass(0, False, [stream(1, [2, 2, 2]), stream(2, [2]), stream(3, [2, 2])],
                    open=2)
    order = []
    while (got := p.take()) is not None:
        order.append(split_batch_id(got[0])[1:])
    assert order == [(1, 0), (2, 0), (1, 1), (1, 2), (3, 0), (3, 1)]
    assert p.exhausted()


def test_the_next_open_parts_are_warmed_before_their_turn_and_only_they():
    """Parts of one size read in turn end together: the ``open // 2`` parts after the window
    begin making their batches (their makers are opened) before any of theirs is taken."""
    opened = []

    def tracked(part: int, sizes: list[int]) -> PartStream:
        s = stream(part, sizes)
        make = s._open
        s._open = lambda: (opened.append(part), make())[1]
        return s

    p = FeedingPass(0, False, [tracked(n, [2, 2]) for n in range(1, 8)], open=4)
    first = p.take()
    assert first is not None and split_batch_id(first[0])[1] == 1
    assert sorted(opened) == [1, 5, 6]      # 1 taken from; 5 and 6 warmed; 2-4, 7 not yet
    order = [split_batch_id(first[0])[1:]]
    while (got := p.take()) is not None:
        order.append(split_batch_id(got[0])[1:])
    assert sorted(opened) == [1, 2, 3, 4, 5, 6, 7]   # each opened once
    cold = FeedingPass(0, False, [stream(n, [2, 2]) for n in range(1, 8)], open=4)
    for s in cold.streams:
        s.warm = lambda: None                        # the same pass, never warmed
    unwarmed = []
    while (got := cold.take()) is not None:
        unwarmed.append(split_batch_id(got[0])[1:])
    assert order == unwarmed and len(order) == 14    # warming changes no batch's turn
