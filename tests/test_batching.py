from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.ack_log import AckLog, read_acks
from roles.algorithms.batching import (
    Ledger,
    Pass,
    Plan,
    SliceProgress,
    interleave_by_label,
    slice_ranges,
)
from roles.protocol.datapath import EVAL_SEQ, make_batch_id, split_batch_id


def test_batch_ids_round_trip_and_reject_overflow():
    assert split_batch_id(make_batch_id(3, 1, 12345)) == (3, 1, 12345)
    assert make_batch_id(4095, 255, 2**32 - 1) < 2**53  # exact in any JSON reader
    with pytest.raises(ValueError):
        make_batch_id(1, 256, 0)


def test_training_plan_covers_every_row_once_shuffled_per_epoch():
    orders = []
    for epoch in range(2):
        plan = Plan.training(epoch, 0, np.arange(1000), 64, shuffle=True, seed=7)
        ids, rows = zip(*(plan.take() for _ in range(plan.batches)), strict=True)
        assert plan.exhausted() and len(set(ids)) == plan.batches == 16
        everything = np.concatenate(rows)
        assert sorted(everything.tolist()) == list(range(1000))
        orders.append(everything)
    assert not np.array_equal(orders[0], orders[1])


def test_eval_plan_is_in_order_with_ids_apart_from_the_training_ids():
    train = Plan.training(0, 1, np.arange(100), 30, shuffle=False, seed=0)
    train_ids = {train.take()[0] for _ in range(train.batches)}
    ev = Plan.evaluation(0, 1, np.arange(100, 150), 30)
    first_id, rows = ev.take()
    assert split_batch_id(first_id) == (0, 1, EVAL_SEQ) and first_id not in train_ids
    assert rows.tolist() == list(range(100, 130))
    assert ev.take()[1].tolist() == list(range(130, 150)) and ev.exhausted()


def test_slices_cover_every_row_once():
    for rows, parts in ((10, 3), (32561, 2), (5, 5), (7, 1)):
        ranges = slice_ranges(rows, parts)
        covered = np.concatenate([np.arange(lo, hi) for lo, hi in ranges])
        assert covered.tolist() == list(range(rows))
        sizes = [hi - lo for lo, hi in ranges]
        assert max(sizes) - min(sizes) <= 1


def test_two_feeders_plans_feed_each_row_once_with_distinct_ids():
    ranges = slice_ranges(1000, 2)
    plans = [Plan.training(3, i, np.arange(*r), 64, shuffle=True, seed=7)
             for i, r in enumerate(ranges)]
    ids, rows = [], []
    for plan in plans:
        while not plan.exhausted():
            batch_id, batch = plan.take()
            ids.append(batch_id)
            rows.append(batch)
    assert len(set(ids)) == len(ids)
    assert sorted(np.concatenate(rows).tolist()) == list(range(1000))


def test_label_grouped_batches_hold_one_label_and_interleave():
    rng = np.random.default_rng(0)
    labels = (rng.random(1000) < 0.25).astype(np.float32)
    plan = Plan.training(0, 0, np.arange(1000), 32, shuffle=True, seed=1, labels=labels)
    batches = [plan.take()[1] for _ in range(plan.batches)]
    assert sorted(np.concatenate(batches).tolist()) == list(range(1000))
    kinds = [float(labels[b][0]) for b in batches]
    assert all(len(set(labels[b].tolist())) == 1 for b in batches)
    assert all(len(b) <= 32 for b in batches)
    # interleaved: the positive batches are spread over the pass, not bunched at one end
    positions = np.flatnonzero(np.array(kinds) == 1.0) / len(batches)
    assert positions.min() < 0.2 and positions.max() > 0.8
    rows, starts = interleave_by_label(np.arange(4), np.array([0, 1, 0, 1.0]), 8)
    assert starts.tolist() == [0, 2, 4] and sorted(rows.tolist()) == [0, 1, 2, 3]


def test_a_resumed_plan_skips_what_was_acknowledged():
    plan = Plan.training(0, 0, np.arange(100), 10, shuffle=True, seed=3)
    fresh = Plan.training(0, 0, np.arange(100), 10, shuffle=True, seed=3)
    everything = [fresh.take() for _ in range(fresh.batches)]
    plan.resume(3, [5, 7])
    left = []
    while not plan.exhausted():
        left.append(plan.take())
    assert [split_batch_id(b)[2] for b, _ in left] == [3, 4, 6, 8, 9]
    assert all(np.array_equal(rows, everything[split_batch_id(b)[2]][1]) for b, rows in left)


def test_slice_progress_keeps_a_low_water_mark():
    p = SliceProgress(epoch=2)
    for number in (0, 2, 3, 1, 6):
        p.acked(number, 10, 1.0, 10.0)
    d = p.as_dict()
    assert (d["low"], d["above"], d["samples"], d["weight_sum"]) == (4, [6], 50, 50.0)


def test_a_pass_takes_its_plans_in_turn():
    a = Plan.training(0, 0, np.arange(20), 10, shuffle=False, seed=0)
    b = Plan.training(0, 1, np.arange(20, 50), 10, shuffle=False, seed=0)
    p = Pass(0, False, [a, b])
    slices = [split_batch_id(p.take()[0])[1] for _ in range(p.batches)]
    assert slices == [0, 1, 0, 1, 1] and p.exhausted()
    assert Pass(0, False, []).exhausted() and len(Pass(0, True, []).rows()) == 0


def test_ledger_max_in_flight_and_duplicate_acks():
    ledger = Ledger(max_in_flight=2)
    ledger.sent(1, np.arange(3), False)
    ledger.sent(2, np.arange(3), False)
    assert not ledger.has_room()
    assert ledger.take(1, "w0")
    assert ledger.acked(1, "w0") is not None and ledger.has_room()
    assert ledger.acked(1, "w0") is None and ledger.duplicate_acks == 1


def test_each_batch_is_granted_to_one_worker_and_only_its_ack_counts():
    ledger = Ledger(max_in_flight=8)
    ledger.sent(1, np.arange(3), False)
    assert ledger.acked(1, "w0") is None          # not taken yet
    assert ledger.take(1, "w0") and not ledger.take(1, "w1")
    assert ledger.acked(1, "w1") is None          # not the holder
    assert ledger.acked(1, "w0") is not None
    assert not ledger.take(1, "w1")               # done
    assert (ledger.refused_takes, ledger.duplicate_acks) == (2, 2)


def test_lost_workers_batches_and_untaken_ones_go_out_again_once():
    ledger = Ledger(max_in_flight=8)
    for b in (1, 2, 3, 4):
        ledger.sent(b, np.arange(2), False)
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


def test_an_ack_from_a_lost_worker_still_counts_until_the_batch_is_retaken():
    ledger = Ledger(max_in_flight=8)
    ledger.sent(1, np.arange(2), False)
    ledger.take(1, "slow")
    ledger.requeue({"slow"})                     # declared lost, but its ack was on the way
    assert ledger.acked(1, "slow") is not None
    assert ledger.next_resend() is None          # nothing left to send again


def test_straggler_copies_are_of_untaken_batches_once_each_oldest_first():
    ledger = Ledger(max_in_flight=8)
    for b in (1, 2, 3):
        ledger.sent(b, np.arange(2), False)
    ledger.take(2, "fast")
    assert ledger.straggler()[0] == 1
    assert ledger.straggler()[0] == 3
    assert ledger.straggler() is None                # each gets one copy at most
    assert ledger.straggler_copies == 2
    assert ledger.take(3, "fast") and not ledger.take(3, "slow")   # the first copy taken wins


def test_a_pass_finds_its_batches_and_claims_unsent_ones():
    plan = Plan.training(2, 1, np.arange(100), 10, True, 0)
    p = Pass(2, False, [plan])
    batch_id, _ = p.take()
    assert p.find(batch_id) == (plan, 0)
    assert p.find(make_batch_id(2, 1, 10)) is None  # past the end
    assert p.find(make_batch_id(3, 1, 1)) is None   # another epoch
    assert p.find(make_batch_id(2, 0, 1)) is None   # another slice
    assert not plan.unsent(0)                       # sent here already
    assert plan.unsent(5)
    plan.claim(5)                                   # a worker holds it: not sent again
    assert not plan.unsent(5)
    sent = [split_batch_id(p.take()[0])[2] for _ in range(8)]
    assert sent == [1, 2, 3, 4, 6, 7, 8, 9] and p.exhausted()


def test_the_ack_log_survives_a_torn_record_and_gives_the_progress_back(tmp_path):
    path = tmp_path / "feeders" / "feeder-0.acks"
    log = AckLog(path)
    for seq in (0, 1, 3):
        log.append(make_batch_id(0, 0, seq), 10, 1.5, 10.0, 1)
    log.append(make_batch_id(1, 0, 0), 7, 0.5, 7.0, 0)
    log.close()
    with open(path, "ab") as f:
        f.write(b"\x01\x02\x03")  # a record cut short
    again = AckLog(path)
    assert len(again.records) == 4 and again.last_epoch() == 1
    (progress,) = again.progress(0).values()
    assert (progress.low, progress.above, progress.samples) == (2, {3}, 30)
    assert again.samples_by_worker() == {"worker-0": 7, "worker-1": 30}
    again.append(make_batch_id(1, 0, 1), 7, 0.5, 7.0, 0)  # appended after the cut
    again.close()
    assert len(read_acks(path)) == 5
