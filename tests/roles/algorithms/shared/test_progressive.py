"""Progressive validation (``roles.algorithms.shared.progressive``): windows of exactly
``window_events`` events however the batches fall, their figures those of the exact AUC and log
loss on the same scores, the lifetime figures over every event, a bounded number kept."""

from __future__ import annotations

import numpy as np
import pytest

from roles.algorithms.shared.metrics import TaskScores, auc, logloss
from roles.algorithms.shared.progressive import Progressive, StreamProgress


def stream(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    signal = rng.normal(size=n)
    labels = (rng.random(n) < 1 / (1 + np.exp(-2 * signal))).astype(np.float64)
    probs = 1 / (1 + np.exp(-(signal + rng.normal(scale=0.5, size=n))))
    return labels, probs, np.arange(n, dtype=np.float64) + 1000.0


def test_windows_hold_exactly_their_events_and_agree_with_the_exact_figures():
    labels, probs, times = stream(10_500)
    p = Progressive(window_events=1000)
    closed = []
    at = 0
    rng = np.random.default_rng(1)
    while at < len(labels):   # batches of uneven sizes, crossing the boundaries
        n = int(rng.integers(1, 700))
        closed += p.add(labels[at:at + n], probs[at:at + n], times[at:at + n])
        at += n
    assert [w.index for w in closed] == list(range(10))
    for w in closed:
        part = slice(1000 * w.index, 1000 * (w.index + 1))
        assert w.events == 1000 and w.positives == int(labels[part].sum())
        assert w.auc == pytest.approx(auc(labels[part], probs[part]), abs=2e-4)
        assert w.logloss == pytest.approx(logloss(labels[part], probs[part]), abs=1e-6)
        assert (w.first_time_s, w.last_time_s) == (times[part][0], times[part][-1])
    s = p.summary()
    assert s["events_scored"] == 10_500 and s["windows_closed"] == 10
    assert s["progressive_auc"] == pytest.approx(auc(labels, probs), abs=2e-4)
    assert s["progressive_logloss"] == pytest.approx(logloss(labels, probs), abs=1e-6)


def test_only_the_newest_windows_are_kept():
    labels, probs, times = stream(5000)
    p = Progressive(window_events=100, keep=7)
    p.add(labels, probs, times)
    s = p.summary()
    assert s["windows_closed"] == 50
    assert [w["window"] for w in s["windows"]] == list(range(43, 50))
    with pytest.raises(ValueError, match="window_events must be at least 1"):
        Progressive(window_events=0)


def test_several_labels_each_one_over_the_events_that_have_it():
    """``StreamProgress``: the first label's windows and lifetime over the events that have
    it (a NaN masks it), each label's lifetime as a ``TaskScores`` of the same scores, and
    each label's windows over the events that have it."""
    rng = np.random.default_rng(8)
    n = 3000
    labels = (rng.random((n, 2)) < [0.3, 0.1]).astype(np.float32)
    labels[rng.random(n) < 0.1, 0] = np.nan
    labels[rng.random(n) < 0.2, 1] = np.nan
    probs = rng.random((n, 2)).astype(np.float32)
    p = StreamProgress(2, window_events=500)
    for lo in range(0, n, 256):   # as batches come, flattened as acks carry them
        p.add(labels[lo:lo + 256].reshape(-1), probs[lo:lo + 256].reshape(-1),
              np.arange(lo, min(n, lo + 256), dtype=np.float64))
    present = ~np.isnan(labels[:, 0])
    assert p.first.events == present.sum() and p.first.closed == present.sum() // 500
    direct = TaskScores(2)
    direct.add(labels, probs)
    got = p.tasks(["a", "b"])
    assert got == direct.figures(["a", "b"])
    assert got["a"]["auc"] == p.first.lifetime.auc()
    # each label's windows: those of one Progressive over the events that have that label
    for t, windows in enumerate(p.task_windows()):
        has = ~np.isnan(labels[:, t])
        alone = Progressive(500)
        alone.add(labels[has, t], probs[has, t], np.arange(n, dtype=np.float64)[has])
        assert len(windows) == len(alone.windows) == has.sum() // 500
        for got, want in zip(windows, alone.windows, strict=True):   # (summed batch by batch)
            assert got == pytest.approx(want.as_dict(), rel=1e-12)
    assert p.task_windows()[0] == [w.as_dict() for w in p.first.windows]
    one = StreamProgress(1, window_events=500)   # one label: the first's figures, no copy
    one.add(labels[present, 0], probs[present, 0], np.zeros(present.sum()))
    assert one.each is None and one.tasks(["a"])["a"] == one.first.lifetime.figures()
    assert one.task_windows() == []
