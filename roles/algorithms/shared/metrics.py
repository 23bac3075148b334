"""Evaluation figures: AUC (ties counted half), log loss, normalized entropy (NE: the log loss
over the entropy of the base rate of the same rows, He et al. 2014), calibration (the mean
predicted probability over the observed rate) and group AUC (GAUC: the AUC of each group, say
each user, weighted by the group's rows, groups with one class skipped; Zhu et al. 2017)."""

from __future__ import annotations

from typing import Any

import numpy as np


def auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Area under the ROC curve; NaN when only one class is present (``group_auc`` of one
    group)."""
    y = np.asarray(labels).ravel()
    return group_auc(y, scores, np.zeros(y.size, dtype=np.int8))[0]


def logloss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    if y.size == 0:
        return float("nan")
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log1p(-p)))


def entropy(rate: float) -> float:
    """The log loss of always predicting ``rate`` on rows whose positive share is ``rate``."""
    if not 0.0 < rate < 1.0:
        return float("nan")
    return float(-(rate * np.log(rate) + (1 - rate) * np.log1p(-rate)))


def ne(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    """Normalized entropy: the log loss over the entropy of the rows' own base rate (below 1:
    better than knowing the rate alone). NaN with one class only."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    return logloss(y, probs, eps) / entropy(float(y.mean())) if y.size else float("nan")


def calibration(labels: np.ndarray, probs: np.ndarray) -> float:
    """Mean predicted probability over the observed positive rate (1: calibrated). NaN
    without a positive."""
    y = np.asarray(labels, dtype=np.float64).ravel()
    p = np.asarray(probs, dtype=np.float64).ravel()
    positives = float(y.sum())
    return float(p.sum() / positives) if positives > 0 else float("nan")


def group_auc(labels: np.ndarray, scores: np.ndarray, groups: np.ndarray) -> tuple[float, int]:
    """GAUC and the number of groups it averages: each group's AUC (ties half) weighted by the
    group's rows; a group with one class only has no AUC and is left out (its rows too). NaN
    and 0 when no group has both classes. One sort, no loop over groups."""
    y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
    s = np.asarray(scores, dtype=np.float64).ravel()
    g = np.asarray(groups).ravel()
    if y.size == 0:
        return float("nan"), 0
    order = np.lexsort((s, g))
    y, s, g = y[order], s[order], g[order]
    new_group = np.r_[True, g[1:] != g[:-1]]
    group_of = np.cumsum(new_group) - 1
    starts = np.flatnonzero(new_group)
    # ranks within the group, ties (same group, same score) sharing their average rank
    new_tie = new_group | np.r_[True, s[1:] != s[:-1]]
    tie_of = np.cumsum(new_tie) - 1
    tie_start = np.flatnonzero(new_tie)
    tie_len = np.diff(np.r_[tie_start, y.size])
    first_rank = tie_start - starts[group_of[tie_start]] + 1
    avg_rank = (first_rank + (tie_len - 1) / 2.0)[tie_of]
    n = np.bincount(group_of).astype(np.float64)
    n_pos = np.bincount(group_of, weights=y.astype(np.float64))
    n_neg = n - n_pos
    rank_sum = np.bincount(group_of, weights=np.where(y, avg_rank, 0.0))
    both = (n_pos > 0) & (n_neg > 0)
    if not both.any():
        return float("nan"), 0
    each = (rank_sum[both] - n_pos[both] * (n_pos[both] + 1) / 2.0) / (n_pos[both] * n_neg[both])
    return float((each * n[both]).sum() / n[both].sum()), int(both.sum())


def oracle_aucs(labels: np.ndarray, probs: np.ndarray) -> list[float]:
    """Each label's AUC of the true probabilities (``[n]`` for one label, ``[n, T]``)."""
    y, p = np.asarray(labels), np.asarray(probs)
    if y.ndim == 1:
        return [auc(y, p)]
    return [auc(y[:, t], p[:, t]) for t in range(y.shape[1])]


class ScoreHistogram:
    """Scores of an evaluation pass in bounded memory: positives and negatives counted per bin
    of the score's logit (``BINS`` bins over [-LOGIT_MAX, LOGIT_MAX], the rest in the end bins),
    and the log loss summed exactly. Histograms of several feeders add up. Its AUC counts two
    scores in the same bin as a tie (half), so it differs from the exact AUC by at most the
    share of positive-negative pairs that share a bin: about 1e-4 for scores spread over a few
    logits (tested against the exact AUC)."""

    BINS = 1 << 16
    LOGIT_MAX = 16.0

    def __init__(self, counts: np.ndarray | None = None, loss_sum: float = 0.0,
                 prob_sum: float = 0.0):
        self.counts = np.zeros((2, self.BINS), dtype=np.int64) if counts is None \
            else np.ascontiguousarray(np.asarray(counts, dtype=np.int64).reshape(2, self.BINS))
        self.loss_sum = loss_sum
        self.prob_sum = prob_sum   # the predicted probabilities summed exactly (calibration)
        self.n = int(self.counts.sum()) if counts is not None else 0   # the samples counted

    def add(self, labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> None:
        y = np.asarray(labels, dtype=np.float64).ravel() > 0.5
        p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
        log_p, log_q = np.log(p), np.log1p(-p)
        at = np.clip((((log_p - log_q) + self.LOGIT_MAX) / (2 * self.LOGIT_MAX) * self.BINS)
                     .astype(np.int64), 0, self.BINS - 1)
        # one unbuffered add at each score's bin (a bincount of each label would make and add
        # two arrays of every bin: 330 against 90 us an evaluation batch of 4,096)
        np.add.at(self.counts.reshape(-1), at + y * self.BINS, 1)
        self.loss_sum += float(-np.sum(np.where(y, log_p, log_q)))
        self.prob_sum += float(np.asarray(probs, dtype=np.float64).sum())
        self.n += len(y)

    def merge(self, other: ScoreHistogram) -> None:
        self.counts += other.counts
        self.loss_sum += other.loss_sum
        self.prob_sum += other.prob_sum
        self.n += other.n

    @property
    def positives(self) -> int:
        return int(self.counts[1].sum())

    @property
    def samples(self) -> int:
        """(Counted as they come: a sum of every bin would cost a pass over 131,072.)"""
        return self.n

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

    def ne(self) -> float:
        """Exact (the log loss and the base rate are sums, not binned)."""
        n = self.samples
        return self.logloss() / entropy(self.positives / n) if n else float("nan")

    def calibration(self) -> float:
        """Exact: the probabilities summed over the positives counted."""
        return self.prob_sum / self.positives if self.positives else float("nan")

    def figures(self) -> dict[str, float]:
        """``auc``, ``logloss``, ``ne``, ``calibration``: the summary's figures of a task."""
        return {"auc": self.auc(), "logloss": self.logloss(), "ne": self.ne(),
                "calibration": self.calibration()}


class TaskScores:
    """A ``ScoreHistogram`` per task (``[data] labels``): a row's scores count for the tasks
    whose label it has (a NaN label masks that task for the row). As a report: the counts of
    every task stacked (``[2 × tasks, BINS]``), the summed log losses and probabilities."""

    def __init__(self, tasks: int = 1):
        self.each = [ScoreHistogram() for _ in range(tasks)]
        self.rows = 0   # scored, whichever labels they have

    @classmethod
    def of(cls, counts: np.ndarray, loss_sums: np.ndarray, prob_sums: np.ndarray,
           rows: int = 0) -> TaskScores:
        out = cls(0)
        out.rows = rows
        counts = np.asarray(counts, dtype=np.int64).reshape(-1, 2, ScoreHistogram.BINS)
        out.each = [ScoreHistogram(c, float(lo), float(pr))
                    for c, lo, pr in zip(counts, loss_sums, prob_sums, strict=True)]
        return out

    @property
    def tasks(self) -> int:
        return len(self.each)

    def add(self, labels: np.ndarray, probs: np.ndarray) -> None:
        """``[n]`` of one task, or ``[n, tasks]``."""
        labels, probs = np.asarray(labels), np.asarray(probs)
        self.rows += len(labels)
        if labels.ndim == 1:
            self.each[0].add(labels, probs)
            return
        for t, scores in enumerate(self.each):
            present = ~np.isnan(labels[:, t])
            scores.add(labels[present, t], probs[present, t])

    def merge(self, other: TaskScores) -> None:
        if other.tasks != self.tasks:
            raise ValueError(f"scores of {other.tasks} tasks merged into {self.tasks}")
        for mine, theirs in zip(self.each, other.each, strict=True):
            mine.merge(theirs)
        self.rows += other.rows

    def counts(self) -> np.ndarray:
        return np.concatenate([s.counts for s in self.each])

    def loss_sums(self) -> np.ndarray:
        return np.array([s.loss_sum for s in self.each], dtype=np.float64)

    def prob_sums(self) -> np.ndarray:
        return np.array([s.prob_sum for s in self.each], dtype=np.float64)

    def figures(self, names: list[str]) -> dict[str, dict[str, float]]:
        """Each task's ``figures`` by its label's name."""
        return {name: s.figures() for name, s in zip(names, self.each, strict=True)}

    def record(self, names: list[str], grouped: Any = None) -> dict[str, Any]:
        """An evaluated epoch's figures: ``auc`` and ``logloss`` of the first task and
        ``tasks``, each task's, its ``gauc`` and ``gauc_groups`` (the groups it averages)
        from ``grouped`` (``GroupScores``; None without), and ``gauc_share`` (the share of the
        groups held; None without)."""
        gaucs = [grouped.gauc(t) for t in range(len(names))] if grouped is not None \
            else [(None, None)] * len(names)
        tasks = {name: {**f, "gauc": gaucs[t][0], "gauc_groups": gaucs[t][1]}
                 for t, (name, f) in enumerate(self.figures(names).items())}
        first = tasks[names[0]]
        return {"auc": first["auc"], "logloss": first["logloss"], "tasks": tasks,
                "gauc_share": None if grouped is None else grouped.share}
