"""Dense aggregation math (pure; no sockets).

Workers send *deltas*: the change of their dense weights since their last contribution. The
aggregator adds the coefficient-weighted mean of the deltas to the global weights. When every
worker started the round from the same global weights this is exactly the weighted average of
the workers' weights; sending deltas instead of weights is what lets a worker keep training
while a round is in flight (it keeps the progress made after its contribution, see
``roles.worker``). A contribution with coefficient 0 (nothing trained) does not count.
"""

from __future__ import annotations

import numpy as np


def combine(deltas: list[np.ndarray], coefficients: list[float], size: int) -> np.ndarray:
    """sum_i c_i * delta_i / sum_i c_i over the contributions that trained something."""
    total = np.zeros(size, dtype=np.float64)
    weight = 0.0
    for delta, c in zip(deltas, coefficients, strict=True):
        if c > 0 and delta.size:
            if delta.shape != (size,):
                raise ValueError(f"delta of shape {delta.shape}, expected ({size},)")
            total += c * delta.astype(np.float64)
            weight += c
    if weight == 0:
        return np.zeros(size, dtype=np.float32)
    return (total / weight).astype(np.float32)


class Adam:
    """Adam on one flat parameter vector (sync mode step: the aggregator owns the optimiser)."""

    def __init__(self, size: int, lr: float, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8):
        self.lr, self.b1, self.b2, self.eps = lr, betas[0], betas[1], eps
        self.m = np.zeros(size, dtype=np.float32)
        self.v = np.zeros(size, dtype=np.float32)
        self.t = 0

    def step(self, params: np.ndarray, grads: np.ndarray) -> np.ndarray:
        """The updated parameters (a new array; ``params`` is left as it was)."""
        self.t += 1
        self.m = self.b1 * self.m + (1 - self.b1) * grads
        self.v = self.b2 * self.v + (1 - self.b2) * grads * grads
        m_hat = self.m / (1 - self.b1 ** self.t)
        v_hat = self.v / (1 - self.b2 ** self.t)
        return (params - self.lr * m_hat / (np.sqrt(v_hat) + self.eps)).astype(np.float32)
