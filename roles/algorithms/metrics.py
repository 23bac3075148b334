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
