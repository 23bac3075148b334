from __future__ import annotations

import numpy as np
import torch

from roles.algorithms.shared.aggregation import combine
from roles.algorithms.worker.replica import NetworkWeights, Replica


def replica(start: np.ndarray) -> Replica:
    model = torch.nn.Linear(len(start) - 1, 1)
    r = Replica(NetworkWeights(model, torch.device("cpu")), local_lr=None)
    r.load(start)
    r.adopt(0, start)
    return r


def nudge(r: Replica, by: float) -> None:
    r.load(r.flat() + by)
    r.trained(samples=10, weight_sum=10.0)


def test_a_round_is_the_weighted_average_and_later_progress_is_kept():
    start = np.zeros(4, dtype=np.float32)
    a, b = replica(start), replica(start)
    nudge(a, 1.0)                                   # a trains once, b three times
    for _ in range(3):
        nudge(b, 1.0)
    da, ca, ma = a.contribute(1, with_delta=True)
    db, cb, mb = b.contribute(1, with_delta=True)
    assert (ca, ma, cb, mb) == (10.0, 10, 30.0, 30)
    nudge(a, 0.5)                                   # a keeps training while round 1 flies
    assert a.settled_round == 1 and a.in_flight
    w1 = start + combine([da, db], [ca, cb], 4)
    assert np.allclose(w1, 2.5)                     # (1 * 10 + 3 * 30) / 40
    assert a.adopt(1, w1) and b.adopt(1, w1)
    assert np.allclose(a.flat(), 3.0)               # W(1) + the 0.5 made after contributing
    assert np.allclose(b.flat(), 2.5)
    delta, coef, samples = a.contribute(2, with_delta=True)
    assert np.allclose(delta, 0.5) and (coef, samples) == (10.0, 10)


def test_old_rounds_are_not_adopted_and_step_contributions_carry_no_delta():
    r = replica(np.ones(3, dtype=np.float32))
    assert not r.adopt(0, np.zeros(3, dtype=np.float32))
    delta, coef, samples = r.contribute(1, with_delta=False)
    assert delta.size == 0 and coef == 0.0 and samples == 0
