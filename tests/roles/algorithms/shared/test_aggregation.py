from __future__ import annotations

import numpy as np
import torch

from roles.algorithms.shared.aggregation import Adam, combine, combine_partials, partial_sum


def test_combine_is_the_coefficient_weighted_mean_of_deltas():
    deltas = [np.array([1.0, 0.0], np.float32), np.array([4.0, 3.0], np.float32)]
    assert np.allclose(combine(deltas, [1.0, 2.0], 2), [3.0, 2.0])


def test_weighted_deltas_equal_weighted_average_of_weights():
    rng = np.random.default_rng(0)
    base = rng.normal(size=5).astype(np.float32)
    workers = [base + rng.normal(size=5).astype(np.float32) for _ in range(3)]
    coef = [10.0, 30.0, 60.0]
    average = sum(c * w for c, w in zip(coef, workers, strict=True)) / sum(coef)
    assert np.allclose(base + combine([w - base for w in workers], coef, 5), average,
                       atol=1e-5)


def test_contributions_that_trained_nothing_do_not_count():
    got = combine([np.zeros(0, np.float32), np.array([2.0], np.float32)], [0.0, 5.0], 1)
    assert np.allclose(got, [2.0])
    assert np.allclose(combine([np.zeros(0, np.float32)], [0.0], 3), 0.0)


def test_adam_matches_torch():
    rng = np.random.default_rng(1)
    start = rng.normal(size=6).astype(np.float32)
    param = torch.nn.Parameter(torch.from_numpy(start.copy()))
    reference = torch.optim.Adam([param], lr=0.01)
    ours, flat = Adam(6, lr=0.01), start.copy()
    for _ in range(5):
        g = rng.normal(size=6).astype(np.float32)
        param.grad = torch.from_numpy(g.copy())
        reference.step()
        flat = ours.step(flat, g)
    assert np.allclose(flat, param.detach().numpy(), atol=1e-6)


def test_hierarchical_combination_equals_the_flat_one():
    rng = np.random.default_rng(2)
    deltas = [rng.normal(size=7).astype(np.float32) for _ in range(5)]
    coef = [3.0, 0.5, 0.0, 12.0, 7.25]
    flat = combine(deltas, coef, 7)
    groups = [[0, 3], [1], [2, 4], []]  # an empty group sends an empty partial
    partials = [partial_sum([deltas[i] for i in g], [coef[i] for i in g], 7) for g in groups]
    assert np.array_equal(combine_partials(partials, 7), flat)
    assert sum(c for _, c in partials) == sum(coef)


def test_sample_weights_decide_each_workers_share():
    # a worker that trained on fresher (heavier) samples moves the model more
    fresh, stale = np.ones(3, np.float32), -np.ones(3, np.float32)
    assert np.allclose(combine([fresh, stale], [0.9 * 100, 0.1 * 100], 3), 0.8)
