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
    assert ledger.acked(1) is not None and ledger.has_room()
    assert ledger.acked(1) is None and ledger.duplicate_acks == 1
