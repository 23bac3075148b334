"""Dense aggregation math (pure; no sockets).

Workers send *deltas*: the change of their dense weights since their last contribution. The
aggregator adds the coefficient-weighted mean of the deltas to the global weights. When every
worker started the round from the same global weights this is exactly the weighted average of
the workers' weights; sending deltas instead of weights is what lets a worker keep training
while a round is in flight (it keeps the progress made after its contribution, see
``roles.algorithms.worker.replica``). Deltas rather than gradients: between two rounds a worker
takes many local steps with its own Adam, and the sum of what those steps did is its delta; its
gradients alone would lose the optimiser's work. A contribution with coefficient 0 (nothing
trained) does not count. A worker's coefficient is the sum of the sample weights it trained on
since its last contribution (``roles.data.weighting``: decayed, merged samples weigh more or less).

Hierarchical aggregation: each group aggregator forwards ``partial_sum`` of its contributions
(sum of c_i x delta_i and sum of c_i, in float64) to the root, which adds the partials up and
divides once, so the result equals the flat combination.
"""

from __future__ import annotations

import numpy as np


def partial_sum(deltas: list[np.ndarray], coefficients: list[float],
                size: int) -> tuple[np.ndarray, float]:
    """(sum_i c_i * delta_i, sum_i c_i) over the contributions that trained something."""
    total = np.zeros(size, dtype=np.float64)
    weight = 0.0
    for delta, c in zip(deltas, coefficients, strict=True):
        if c > 0 and delta.size:
            if delta.shape != (size,):
                raise ValueError(f"delta of shape {delta.shape}, expected ({size},)")
            total += c * delta.astype(np.float64)
            weight += c
    return total, weight


def combine_partials(partials: list[tuple[np.ndarray, float]], size: int) -> np.ndarray:
    """The weighted mean delta from partial sums (zero when nothing was trained)."""
    total = np.zeros(size, dtype=np.float64)
    weight = 0.0
    for part, c in partials:
        if c > 0:
            if part.shape != (size,):
                raise ValueError(f"partial sum of shape {part.shape}, expected ({size},)")
            total += part
            weight += c
    if weight == 0:
        return np.zeros(size, dtype=np.float32)
    return (total / weight).astype(np.float32)


def combine(deltas: list[np.ndarray], coefficients: list[float], size: int) -> np.ndarray:
    """sum_i c_i * delta_i / sum_i c_i over the contributions that trained something."""
    return combine_partials([partial_sum(deltas, coefficients, size)], size)


class Adam:
    """Adam on one flat parameter vector (sync mode step: the aggregator owns the optimiser)."""

    def __init__(self, size: int, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, betas[0], betas[1], eps
        self.m: np.ndarray = np.zeros(size, dtype=np.float32)  # float32 (float64 if grads are)
        self.v: np.ndarray = np.zeros(size, dtype=np.float32)
        self.t = 0

    def step(self, params: np.ndarray, grads: np.ndarray) -> np.ndarray:
        """The updated parameters (a new array; ``params`` is left as it was)."""
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grads
        self.v = self.b2 * self.v + (1 - self.b2) * grads * grads
        m_hat = self.m / (1 - self.b1 ** self.t)
        v_hat = self.v / (1 - self.b2 ** self.t)
        updated: np.ndarray = params - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)
        return updated.astype(np.float32)
