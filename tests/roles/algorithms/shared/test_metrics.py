from __future__ import annotations

import itertools
import math

import numpy as np

from roles.algorithms.shared.metrics import auc, logloss


def brute_auc(y, s):
    pos = [b for a, b in zip(y, s, strict=True) if a]
    neg = [b for a, b in zip(y, s, strict=True) if not a]
    pairs = list(itertools.product(pos, neg))
    return sum(1.0 if p > n else 0.5 if p == n else 0.0 for p, n in pairs) / len(pairs)


def test_auc_matches_pair_counting_with_ties():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = rng.integers(0, 2, size=60)
        s = rng.integers(0, 6, size=60).astype(float)  # many ties
        if 0 < y.sum() < len(y):
            assert math.isclose(auc(y, s), brute_auc(y, s))


def test_auc_edge_cases():
    assert auc([0, 0, 1, 1], [0.1, 0.2, 0.3, 0.4]) == 1.0
    assert auc([1, 1, 0, 0], [0.1, 0.2, 0.3, 0.4]) == 0.0
    assert math.isnan(auc([1, 1], [0.2, 0.3]))


def test_logloss():
    assert math.isclose(logloss([1, 0], [0.5, 0.5]), math.log(2))
    assert logloss([1], [1.0]) < 1e-6
