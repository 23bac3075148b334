"""The aggregator's side of each sync mode (``roles.algorithms.sync``): in mode ``step`` it
applies every worker's step gradient at once with its own Adam (an asynchronous dense
parameter server); in the other modes a step gradient is a protocol error. Rounds (Aggregate,
Contribution) are the same in every mode: the aggregator's own. Pure."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from roles.algorithms.shared.aggregation import Adam
from roles.job.settings import TrainConfig
from zbus.codec import ProtocolError


class AggregatorSync(Protocol):
    def apply_step(self, params: np.ndarray, grads: np.ndarray) -> np.ndarray:
        """The weights after a worker's StepGrad (ProtocolError where the mode has none)."""

    def state(self) -> dict[str, np.ndarray]:
        """The optimiser's state, for a checkpoint (copies)."""

    def load(self, state: dict[str, np.ndarray]) -> None:
        """Take back what ``state`` gave (a restored checkpoint)."""


class StepApplying:
    """``step``: the aggregator's Adam takes each step gradient as it comes."""

    def __init__(self, size: int, lr: float):
        self.size = size
        self.adam = Adam(size, lr)

    def apply_step(self, params: np.ndarray, grads: np.ndarray) -> np.ndarray:
        if grads.shape != (self.size,):
            raise ProtocolError("bad_shape", f"step gradient of {grads.shape}")
        return self.adam.step(params, grads)

    def state(self) -> dict[str, np.ndarray]:
        a = self.adam
        return {"adam_m": a.m.copy(), "adam_v": a.v.copy(), "adam_t": np.array([a.t])}

    def load(self, state: dict[str, np.ndarray]) -> None:
        if "adam_t" in state and state["adam_m"].shape == (self.size,):
            self.adam.m, self.adam.v = state["adam_m"].copy(), state["adam_v"].copy()
            self.adam.t = int(state["adam_t"][0])


class RoundsOnly:
    """``every``, ``round`` and ``lazy``: the weights change by rounds only (the workers'
    optimisers are their own)."""

    def apply_step(self, params: np.ndarray, grads: np.ndarray) -> np.ndarray:
        raise ProtocolError("wrong_mode", "StepGrad while sync is not 'step'")

    def state(self) -> dict[str, np.ndarray]:
        return {}

    def load(self, state: dict[str, np.ndarray]) -> None:
        pass


def for_mode(train: TrainConfig, size: int) -> AggregatorSync:
    """The aggregator's strategy for ``train.sync`` over ``size`` dense weights."""
    match train.sync:
        case "step":
            return StepApplying(size, train.dense_lr)
        case "every" | "round" | "lazy":
            return RoundsOnly()
    raise ValueError(f"unknown sync mode {train.sync!r}")
