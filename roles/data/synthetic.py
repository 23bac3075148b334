"""The built-in data generator: click data with a known answer.

Each categorical field draws its values from a Zipf law (value of popularity rank k has
probability proportional to k^-zipf), each value has a planted weight ~ N(0, signal), each
dense column is a log-normal count whose standardised log1p has a planted weight ~ N(0, signal),
and the label is Bernoulli(sigmoid(bias + sum of weights)), with the bias set for about 25 %
positives. The true probabilities give ``oracle_auc``: the best AUC any model can reach.
Timestamps (unix seconds) rise through the rows over ``days`` days ending 2026-01-01.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

END_TIME = 1_767_225_600  # 2026-01-01T00:00:00Z
POSITIVE_RATE = 0.25


@dataclass(frozen=True)
class SyntheticData:
    values: np.ndarray      # int64 [rows, fields]: value ids
    dense: np.ndarray       # float64 [rows, dense]: raw counts
    labels: np.ndarray      # float32 [rows]
    probs: np.ndarray       # float64 [rows]: the true click probability
    timestamps: np.ndarray  # int64 [rows]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def _bias_for_rate(logit: np.ndarray, rate: float) -> float:
    lo, hi = -20.0, 20.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if _sigmoid(logit + mid).mean() < rate:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def generate(rows: int, vocab: list[int], dense: int, zipf: float, signal: float,
             days: int, seed: int) -> SyntheticData:
    rng = np.random.default_rng(seed)
    values = np.empty((rows, len(vocab)), dtype=np.int64)
    logit = np.zeros(rows)
    for f, size in enumerate(vocab):
        popularity = np.arange(1, size + 1, dtype=np.float64) ** -zipf
        ids = rng.permutation(size)  # popularity rank and value id are unrelated
        drawn = ids[rng.choice(size, size=rows, p=popularity / popularity.sum())]
        weights = rng.normal(0.0, signal, size=size)
        values[:, f] = drawn
        logit += weights[drawn]
    counts = np.floor(np.exp(rng.normal(1.5, 1.0, size=(rows, dense))))
    if dense:
        z = np.log1p(counts)
        z = (z - z.mean(axis=0)) / np.where(z.std(axis=0) > 0, z.std(axis=0), 1.0)
        logit += z @ rng.normal(0.0, signal, size=dense)
    probs = _sigmoid(logit + _bias_for_rate(logit, POSITIVE_RATE))
    labels = (rng.random(rows) < probs).astype(np.float32)
    timestamps = np.sort(END_TIME - rng.uniform(0, days * 86400, size=rows)).astype(np.int64)
    return SyntheticData(values=values, dense=counts, labels=labels, probs=probs,
                         timestamps=timestamps)
