"""The built-in data generator: click data with a known answer, generated block by block so that
any range of rows is produced on its own, in bounded memory, the same on every host.

Each categorical field draws its values from a Zipf law over ``vocab`` values (rank k has
probability about proportional to k^-zipf; drawn by inverting the law's continuous CDF, so a
vocabulary of millions costs no table), each value has a planted weight ~ N(0, signal) that is
a pure function of the field and the value (no table either), each dense column is a log-normal
count whose standardised log1p has a planted weight ~ N(0, signal), and the label is
Bernoulli(sigmoid(bias + sum of weights)), with the bias set for about 25 % positives. The true
probabilities give ``oracle_auc``: the best AUC any model can reach. Timestamps (unix seconds)
rise through the rows over ``days`` days ending 2026-01-01.

Rows come in blocks of ``BLOCK_ROWS``; block b is drawn from its own random stream (seed, b),
so rows [a, b) are the same whichever process generates them and however the rows are cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from roles.data.hashing import splitmix64

END_TIME = 1_767_225_600  # 2026-01-01T00:00:00Z
POSITIVE_RATE = 0.25
BLOCK_ROWS = 1 << 16
CALIBRATION_ROWS = 1 << 17   # rows whose logits set the bias (and the dense standardisation)
# Criteo's categorical cardinalities (the Kaggle set), for files of the Criteo layout
CRITEO_VOCAB = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593,
                3194, 27, 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105,
                142572]
_TWO53 = float(2 ** 53)


@dataclass(frozen=True)
class SyntheticBlock:
    values: np.ndarray      # int64 [rows, fields]: value ids (0 .. vocab-1)
    dense: np.ndarray       # float64 [rows, dense]: raw counts (NaN: missing)
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


class ZipfLaw:
    """Ranks 1..size with P(k) proportional to k^-s: the head (the first ``HEAD`` ranks) from
    its exact cumulative table, the tail by inverting the continuous law over it, so that a
    vocabulary of millions costs a table of ``HEAD`` entries."""

    HEAD = 4096

    def __init__(self, size: int, s: float):
        self.size, self.s = size, s
        head = np.arange(1, min(size, self.HEAD) + 1, dtype=np.float64) ** -s
        self.cum = np.cumsum(head)
        self.h = len(head)
        self.tail = self._tail_mass(self.h + 0.5, size + 0.5) if size > self.h else 0.0
        self.total = self.cum[-1] + self.tail

    def _tail_mass(self, a: float, b: float) -> float:
        if abs(self.s - 1.0) < 1e-9:
            return float(np.log(b / a))
        return float((b ** (1 - self.s) - a ** (1 - self.s)) / (1 - self.s))

    def ranks(self, u: np.ndarray) -> np.ndarray:
        x = u * self.total
        out = np.searchsorted(self.cum, x, side="right").astype(np.int64) + 1
        tail = x >= self.cum[-1]
        if tail.any():
            rest = x[tail] - self.cum[-1]
            a = self.h + 0.5
            if abs(self.s - 1.0) < 1e-9:
                t = a * np.exp(rest)
            else:
                t = (a ** (1 - self.s) + rest * (1 - self.s)) ** (1 / (1 - self.s))
            out[tail] = np.floor(t + 0.5).astype(np.int64)
        return np.clip(out, 1, self.size)


def hashed_normal(seed: np.uint64, ids: np.ndarray) -> np.ndarray:
    """A standard normal draw that is a pure function of (seed, id) (Box-Muller on two hashed
    uniforms)."""
    h1 = splitmix64(np.asarray(ids, dtype=np.uint64) ^ seed)
    h2 = splitmix64(h1)
    u1 = ((h1 >> np.uint64(11)).astype(np.float64) + 0.5) / _TWO53
    u2 = (h2 >> np.uint64(11)).astype(np.float64) / _TWO53
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


class Generator:
    """Rows of one synthetic data set; ``missing``: the share of values left out (empty
    categorical values and missing counts), as real logs have."""

    def __init__(self, rows: int, vocab: list[int], dense: int, zipf: float, signal: float,
                 days: int, seed: int, missing: float = 0.0):
        self.rows, self.vocab, self.n_dense = rows, list(vocab), dense
        self.zipf, self.signal, self.days, self.seed = zipf, signal, days, seed
        self.missing = missing
        base = splitmix64(np.array([seed], dtype=np.uint64))[0]
        self.field_seeds = splitmix64(base ^ np.arange(1, len(vocab) + 1, dtype=np.uint64))
        # a value's id is a fixed bijection of its popularity rank (rank and id unrelated)
        self.strides = [self._stride(size, f) for f, size in enumerate(vocab)]
        self.laws = [ZipfLaw(size, zipf) for size in vocab]
        self.dense_weights = signal * hashed_normal(base ^ np.uint64(0xDE45E),
                                                    np.arange(dense, dtype=np.uint64))
        rng = np.random.default_rng([seed, 1 << 40])
        sample = np.log1p(np.floor(np.exp(rng.normal(1.5, 1.0, size=(CALIBRATION_ROWS,
                                                                    dense)))))
        self.z_mean = sample.mean(axis=0) if dense else np.zeros(0)
        std = sample.std(axis=0) if dense else np.zeros(0)
        self.z_std = np.where(std > 0, std, 1.0)
        self.bias = 0.0
        calibration = [self._logits(b)[0] for b in range(self._blocks(CALIBRATION_ROWS))]
        self.bias = _bias_for_rate(np.concatenate(calibration)[:CALIBRATION_ROWS],
                                   POSITIVE_RATE)

    @staticmethod
    def _stride(size: int, field: int) -> int:
        """A step coprime with ``size``: id = (rank - 1) * stride + field mod size is then a
        bijection of ranks onto ids."""
        step = 0x9E3779B1 + 2 * field
        while np.gcd(step, size) != 1:
            step += 1
        return step % size if size > 1 else 0

    def _blocks(self, rows: int) -> int:
        return -(-rows // BLOCK_ROWS)

    def _logits(self, b: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.random.Generator]:
        n = BLOCK_ROWS
        rng = np.random.default_rng([self.seed, b])
        values = np.empty((n, len(self.vocab)), dtype=np.int64)
        logit = np.zeros(n)
        for f, size in enumerate(self.vocab):
            rank = self.laws[f].ranks(rng.random(n))
            ids = ((rank - 1) * self.strides[f] + f) % size
            values[:, f] = ids
            logit += self.signal * hashed_normal(self.field_seeds[f], ids)
        counts = np.floor(np.exp(rng.normal(1.5, 1.0, size=(n, self.n_dense))))
        if self.n_dense:
            logit += ((np.log1p(counts) - self.z_mean) / self.z_std) @ self.dense_weights
        return logit, values, counts, rng

    def block(self, b: int) -> SyntheticBlock:
        """Block ``b``: rows [b * BLOCK_ROWS, ...) of the data (the last one is short)."""
        logit, values, counts, rng = self._logits(b)
        probs = _sigmoid(logit + self.bias)
        labels = (rng.random(len(probs)) < probs).astype(np.float32)
        start = b * BLOCK_ROWS
        n = max(0, min(BLOCK_ROWS, self.rows - start))
        position = (start + np.arange(BLOCK_ROWS) + rng.random(BLOCK_ROWS)) / max(self.rows, 1)
        stamps = (END_TIME - self.days * 86400 * (1.0 - position)).astype(np.int64)
        if self.missing > 0:
            gone = rng.random(counts.shape) < self.missing
            counts = np.where(gone, np.nan, counts)
            values = np.where(rng.random(values.shape) < self.missing, -1, values)
        return SyntheticBlock(values=values[:n], dense=counts[:n], labels=labels[:n],
                              probs=probs[:n], timestamps=stamps[:n])

    def rows_between(self, start: int, stop: int) -> SyntheticBlock:
        """Rows [start, stop), from the blocks that hold them."""
        stop = min(stop, self.rows)
        parts = []
        for b in range(start // BLOCK_ROWS, self._blocks(stop)):
            block = self.block(b)
            lo = max(start - b * BLOCK_ROWS, 0)
            hi = min(stop - b * BLOCK_ROWS, len(block.labels))
            parts.append(SyntheticBlock(*(a[lo:hi] for a in (block.values, block.dense,
                                                             block.labels, block.probs,
                                                             block.timestamps))))
        if not parts:
            return SyntheticBlock(np.zeros((0, len(self.vocab)), np.int64),
                                  np.zeros((0, self.n_dense)), np.zeros(0, np.float32),
                                  np.zeros(0), np.zeros(0, np.int64))
        return SyntheticBlock(*(np.concatenate([getattr(p, k) for p in parts])
                                for k in ("values", "dense", "labels", "probs", "timestamps")))
