from __future__ import annotations

import itertools
import math

import numpy as np

from roles.algorithms.shared.grouped import GroupScores
from roles.algorithms.shared.metrics import (
    ScoreHistogram,
    TaskScores,
    auc,
    calibration,
    group_auc,
    logloss,
    ne,
)


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


# -- several labels, NE, calibration, GAUC: against sklearn on the same scores ------------------
def scored_rows(n: int, seed: int = 3, groups: int = 300):
    rng = np.random.default_rng(seed)
    g = rng.integers(0, groups, n)
    p = np.round(0.01 + 0.98 * rng.random(n), 3)   # ties, none at 0 or 1
    y = (rng.random(n) < 0.3 + 0.4 * p).astype(np.float64)
    return y, p, g


def test_ne_and_calibration_are_their_direct_computations():
    from sklearn.metrics import log_loss
    y, p, _ = scored_rows(5000)
    rate = y.mean()
    base = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
    assert math.isclose(ne(y, p), log_loss(y, p) / base, rel_tol=1e-9)
    assert math.isclose(calibration(y, p), p.mean() / y.mean(), rel_tol=1e-12)
    h = ScoreHistogram()
    h.add(y[:2000], p[:2000])
    h.add(y[2000:], p[2000:])
    assert math.isclose(h.ne(), ne(y, p), rel_tol=1e-9)
    assert math.isclose(h.calibration(), calibration(y, p), rel_tol=1e-9)
    assert math.isnan(ne([1, 1], [0.5, 0.6])) and math.isnan(calibration([0, 0], [0.1, 0.2]))


def test_group_auc_is_each_groups_sklearn_auc_weighted_by_its_rows():
    from sklearn.metrics import roc_auc_score
    y, p, g = scored_rows(20_000)
    y[g == 7] = 1.0   # a group of one class: left out, its rows too
    got, groups = group_auc(y, p, g)
    total = weight = 0.0
    counted = 0
    for value in np.unique(g):
        mine = g == value
        if 0 < y[mine].sum() < mine.sum():
            total += roc_auc_score(y[mine], p[mine]) * mine.sum()
            weight += mine.sum()
            counted += 1
    assert groups == counted == len(np.unique(g)) - 1
    assert abs(got - total / weight) < 1e-12
    assert math.isnan(group_auc([1, 0], [0.2, 0.3], [1, 2])[0])


def test_task_scores_mask_missing_labels_per_task():
    from sklearn.metrics import log_loss, roc_auc_score
    y, p, _ = scored_rows(4000)
    labels = np.stack([y, 1 - y], axis=1)
    probs = np.stack([p, np.clip(1 - p + 0.05, 0.01, 0.99)], axis=1)
    labels[::3, 1] = np.nan   # task 1 unknown on a third of the rows
    scores = TaskScores(2)
    for lo in range(0, 4000, 1000):
        scores.add(labels[lo:lo + 1000], probs[lo:lo + 1000])
    back = TaskScores.of(scores.counts(), scores.loss_sums(), scores.prob_sums(), scores.rows)
    record = back.record(["click", "buy"])
    known = ~np.isnan(labels[:, 1])
    buy = record["tasks"]["buy"]
    assert back.each[1].samples == int(known.sum()) and back.rows == back.each[0].samples == 4000
    assert abs(buy["auc"] - roc_auc_score(labels[known, 1], probs[known, 1])) < 2e-4  # binned
    assert abs(buy["logloss"] - log_loss(labels[known, 1], probs[known, 1])) < 1e-6
    assert abs(buy["calibration"] - calibration(labels[known, 1], probs[known, 1])) < 1e-6
    assert record["auc"] == record["tasks"]["click"]["auc"] and record["gauc_share"] is None


def test_group_scores_thinned_past_their_cap_stay_exact_within_the_groups_kept():
    y, p, g = scored_rows(30_000, groups=2000)
    labels = np.stack([y, y], axis=1)
    labels[::5, 1] = np.nan
    probs = np.stack([p, p], axis=1)
    halves = [GroupScores(2, cap=8000), GroupScores(2, cap=100_000)]   # two feeders
    for lo in range(0, 30_000, 1000):
        halves[(lo // 1000) % 2].add(g[lo:lo + 1000], labels[lo:lo + 1000],
                                     probs[lo:lo + 1000])
    assert halves[0].level >= 1 and halves[1].level == 0
    merged = GroupScores(2, 0)
    for h in halves:
        merged.merge(GroupScores.of(2, 0, h.level, *h.rows()))
    kept = merged.kept(g, merged.level)
    assert merged.share == 0.5 ** halves[0].level
    assert 0 < kept.sum() < len(g)   # a share of the groups, each whole:
    assert merged.gauc(0) == group_auc(y[kept], p[kept], g[kept])
    known = kept & ~np.isnan(labels[:, 1])
    assert merged.gauc(1) == group_auc(y[known], p[known], g[known])


def test_rows_of_a_missing_group_value_are_in_no_group():
    y, p, g = scored_rows(5000, groups=50)
    g[::4] = -7   # the missing value's key
    held = GroupScores(1, cap=100_000, missing=-7)
    held.add(g, y, p)
    known = g != -7
    assert held.gauc(0) == group_auc(y[known], p[known], g[known])
