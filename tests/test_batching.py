from __future__ import annotations

import numpy as np
import pytest

from roles.batching import Ledger, Plan, make_batch_id, split_batch_id


def test_batch_ids_round_trip_and_reject_overflow():
    assert split_batch_id(make_batch_id(3, 1, 12345)) == (3, 1, 12345)
    assert make_batch_id(4095, 255, 2**32 - 1) < 2**53  # exact in any JSON reader
    with pytest.raises(ValueError):
        make_batch_id(1, 256, 0)


def test_training_plan_covers_every_row_once_shuffled_per_epoch():
    orders = []
    for epoch in range(2):
        plan = Plan.training(epoch, 0, 1000, 64, shuffle=True, seed=7)
        ids, rows = zip(*(plan.take() for _ in range(plan.batches)), strict=True)
        assert plan.exhausted() and len(set(ids)) == plan.batches == 16
        everything = np.concatenate(rows)
        assert sorted(everything.tolist()) == list(range(1000))
        orders.append(everything)
    assert not np.array_equal(orders[0], orders[1])


def test_eval_plan_is_in_order_after_the_training_ids():
    train = Plan.training(0, 0, 100, 30, shuffle=False, seed=0)
    last_train = [train.take()[0] for _ in range(train.batches)][-1]
    ev = Plan.evaluation(0, 0, 100, 150, 30)
    first_id, rows = ev.take()
    assert first_id == last_train + 1
    assert rows.tolist() == list(range(100, 130))


def test_ledger_window_and_duplicate_acks():
    ledger = Ledger(window=2)
    ledger.sent(1, np.arange(3), False)
    ledger.sent(2, np.arange(3), False)
    assert not ledger.has_room()
    assert ledger.take(1, "w0")
    assert ledger.acked(1, "w0") is not None and ledger.has_room()
    assert ledger.acked(1, "w0") is None and ledger.duplicate_acks == 1


def test_each_batch_is_granted_to_one_worker_and_only_its_ack_counts():
    ledger = Ledger(window=8)
    ledger.sent(1, np.arange(3), False)
    assert ledger.acked(1, "w0") is None          # not taken yet
    assert ledger.take(1, "w0") and not ledger.take(1, "w1")
    assert ledger.acked(1, "w1") is None          # not the holder
    assert ledger.acked(1, "w0") is not None
    assert not ledger.take(1, "w1")               # done
    assert (ledger.refused_takes, ledger.duplicate_acks) == (2, 2)


def test_lost_workers_batches_and_untaken_ones_go_out_again_once():
    ledger = Ledger(window=8)
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
    ledger = Ledger(window=8)
    ledger.sent(1, np.arange(2), False)
    ledger.take(1, "slow")
    ledger.requeue({"slow"})                     # declared lost, but its ack was on the way
    assert ledger.acked(1, "slow") is not None
    assert ledger.next_resend() is None          # nothing left to send again


def test_straggler_copies_are_of_untaken_batches_once_each_oldest_first():
    ledger = Ledger(window=8)
    for b in (1, 2, 3):
        ledger.sent(b, np.arange(2), False)
    ledger.take(2, "fast")
    assert ledger.straggler()[0] == 1
    assert ledger.straggler()[0] == 3
    assert ledger.straggler() is None                # each gets one copy at most
    assert ledger.straggler_copies == 2
    assert ledger.take(3, "fast") and not ledger.take(3, "slow")   # the first copy taken wins
