"""Evaluation figures: AUC (ties counted half) and log loss."""

from __future__ import annotations

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; NaN when only one class is present."""
    y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
    s = np.asarray(scores, dtype=np.float64).ravel()
    n_pos = int(y.sum())
    n_neg = y.size - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    uniq, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    # average rank (1-based) of each distinct score, so tied scores share their ranks
    upper = np.cumsum(counts)
    avg_rank = upper - (counts - 1) / 2.0
    rank_sum = avg_rank[inverse][y].sum()
    return float((rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg))


def logloss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    if y.size == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


class ScoreHistogram:
    """Scores of an evaluation pass in bounded memory: positives and negatives counted per bin
    of the score's logit (``BINS`` bins over [-LOGIT_MAX, LOGIT_MAX], the rest in the end bins),
    and the log loss summed exactly. Histograms of several feeders add up. Its AUC counts two
    scores in the same bin as a tie (half), so it differs from the exact AUC by at most the
    share of positive-negative pairs that share a bin: about 1e-4 for scores spread over a few
    logits (tested against the exact AUC)."""

    BINS = 1 << 16
    LOGIT_MAX = 16.0

    def __init__(self, counts: np.ndarray | None = None, loss_sum: float = 0.0):
        self.counts = np.zeros((2, self.BINS), dtype=np.int64) if counts is None \
            else np.ascontiguousarray(np.asarray(counts, dtype=np.int64).reshape(2, self.BINS))
        self.loss_sum = loss_sum

    def add(self, labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> None:
        y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
        p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
        logit = np.log(p) - np.log1p(-p)
        at = np.clip(((logit + self.LOGIT_MAX) / (2 * self.LOGIT_MAX) * self.BINS)
                     .astype(np.int64), 0, self.BINS - 1)
        # one unbuffered add at each score's bin (a bincount of each label would make and add
        # two arrays of every bin: 330 against 90 us an evaluation batch of 4,096)
        np.add.at(self.counts.reshape(-1), at + y * self.BINS, 1)
        self.loss_sum += float(-np.sum(np.where(y, np.log(p), np.log1p(-p))))

    def merge(self, other: ScoreHistogram) -> None:
        self.counts += other.counts
        self.loss_sum += other.loss_sum

    @property
    def samples(self) -> int:
        return int(self.counts.sum())

    def auc(self) -> float:
        neg, pos = self.counts[0].astype(np.float64), self.counts[1].astype(np.float64)
        n_pos, n_neg = pos.sum(), neg.sum()
        if n_pos == 0 or n_neg == 0:
            return float("nan")
        below = np.cumsum(neg) - neg  # negatives in lower bins
        return float((pos * (below + neg / 2.0)).sum() / (n_pos * n_neg))

    def logloss(self) -> float:
        n = self.samples
        return self.loss_sum / n if n else float("nan")
