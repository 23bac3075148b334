"""Dense feature transforms, fitted on the training split only.

Each dense value x becomes ``sign(x) * log1p(|x|)`` (when ``log1p`` is on; for counts this is
log1p, and it stays defined for negative values), then is standardised with the training
split's mean and standard deviation. A missing value becomes the training mean, i.e. 0 after
standardising. A column that is constant (or all missing) in the training split becomes 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

FLOAT32_MAX = float(np.finfo(np.float32).max)


def signed_log1p(x: np.ndarray) -> np.ndarray:
    return np.sign(x) * np.log1p(np.abs(x))


@dataclass(frozen=True)
class DenseTransform:
    log1p: bool
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, train: np.ndarray, log1p: bool = True) -> DenseTransform:
        t = signed_log1p(train) if log1p else np.asarray(train, dtype=np.float64)
        present = ~np.isnan(t)
        count = present.sum(axis=0)
        filled = np.where(present, t, 0.0)
        mean = np.divide(filled.sum(axis=0), count, out=np.zeros(t.shape[1]), where=count > 0)
        var = np.divide((np.where(present, t - mean, 0.0) ** 2).sum(axis=0), count,
                        out=np.zeros(t.shape[1]), where=count > 0)
        std = np.sqrt(var)
        return cls(log1p=log1p, mean=mean, std=np.where(std > 1e-9, std, 1.0))

    def apply(self, raw: np.ndarray) -> np.ndarray:
        t = signed_log1p(raw) if self.log1p else np.asarray(raw, dtype=np.float64)
        t = np.where(np.isnan(t), self.mean, t)
        z = (t - self.mean) / self.std
        # a row outside the training split (eval, or scoring) may lie beyond float32's range
        # once standardised; it saturates rather than becoming infinite
        return np.clip(z, -FLOAT32_MAX, FLOAT32_MAX).astype(np.float32)
