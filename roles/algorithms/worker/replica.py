"""A worker's replica of the dense network and its synchronisation state (no sockets).

Rounds (sync modes every, round and lazy): the worker contributes its *delta* — its weights now
minus ``base``, its weights at its previous contribution or adoption — with the sample weight
and the samples behind it, and keeps training. When the combined weights W(r) arrive it adopts
``W(r) + (its weights now - its weights when it contributed)``: the progress it made while the
round was in flight is kept, and contributed next time. One round is in flight at a time
(``WorkerRounds`` defers a call for the next).

The replica's weights are a ``FlatWeights``: its own network's (``NetworkWeights``), or, leading a
model-parallel group, the network's spread over the group (``roles.model.group.GroupWeights``).
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from roles.algorithms.shared.dense_optimizer import dense_adam
from roles.protocol.dense_sync import Weights
from zbus.codec import ProtocolError


class FlatWeights(Protocol):
    """A network's weights as one flat float32 array, in its ``parameters()`` order (what the
    aggregator and every replica use)."""

    params: list[torch.nn.Parameter]   # those this process steps (its local Adam's)
    size: int                          # the whole network's weights

    def flat(self) -> np.ndarray: ...

    def load(self, flat: np.ndarray) -> None: ...


class NetworkWeights:
    """The weights of a network this process holds whole."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.model, self.device = model, device
        self.params = list(model.parameters())
        self.size = sum(p.numel() for p in self.params)

    def flat(self) -> np.ndarray:
        with torch.no_grad():
            return torch.cat([p.detach().reshape(-1) for p in self.params]).cpu().numpy()

    def load(self, flat: np.ndarray) -> None:
        source = torch.from_numpy(np.array(flat, dtype=np.float32)).to(self.device)
        offset = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                p.copy_(source[offset:offset + n].view_as(p))
                offset += n


class Replica:
    def __init__(self, weights: FlatWeights, local_lr: float | None):
        self.weights = weights
        self.params = weights.params
        self.size = weights.size
        self.optimizer = (dense_adam(self.params, local_lr)
                          if local_lr is not None and self.params else None)
        self.version = -1                       # round of the global weights adopted last
        self.base: np.ndarray | None = None     # weights at the last contribution or adoption
        self.sent: np.ndarray | None = None     # weights when the in-flight contribution left
        self.sent_round = -1
        self.steps_since = 0
        self.coef_since = 0.0
        self.samples_since = 0

    def flat(self) -> np.ndarray:
        return self.weights.flat()

    def load(self, flat: np.ndarray) -> None:
        self.weights.load(flat)

    def dense_grads(self) -> np.ndarray:
        """The gradients of the last backward pass, flat (every parameter must have one)."""
        grads = []
        for p in self.params:
            if p.grad is None:
                raise RuntimeError("dense_grads: a parameter has no gradient (no backward pass "
                                   "reached it)")
            grads.append(p.grad.reshape(-1))
        return torch.cat(grads).cpu().numpy()

    @property
    def in_flight(self) -> bool:
        return self.sent is not None

    @property
    def settled_round(self) -> int:
        """The last round this replica contributed to or adopted."""
        return max(self.version, self.sent_round)

    def adopt(self, round_: int, params: np.ndarray) -> bool:
        """Take the global weights of a newer round, keeping local progress not yet in them."""
        if round_ <= self.version:
            return False
        new = np.array(params, dtype=np.float32)
        if self.base is not None:
            reference = self.sent if self.sent is not None else self.base
            new = new + (self.flat() - reference)
        self.load(new)
        self.base = np.array(params, dtype=np.float32)
        self.version, self.sent, self.sent_round = round_, None, -1
        return True

    def reset(self, round_: int, params: np.ndarray) -> None:
        """Recovery: the weights restored from a backup replace this replica's outright; the
        progress since (and any contribution in flight) is dropped."""
        self.load(params)
        self.base = np.array(params, dtype=np.float32)
        self.version, self.sent, self.sent_round = round_, None, -1
        self.steps_since, self.coef_since, self.samples_since = 0, 0.0, 0

    def replace(self, params: np.ndarray) -> None:
        """Sync mode step: the aggregator's answer is the new local model."""
        self.load(params)
        self.base = np.array(params, dtype=np.float32)

    def contribute(self, round_: int, with_delta: bool) -> tuple[np.ndarray, float, int]:
        """(delta, coefficient, samples) for ``round_``; the replica then counts it in flight."""
        flat = self.flat()
        delta = flat - self.base if with_delta else np.zeros(0, dtype=np.float32)
        result = (delta, self.coef_since, self.samples_since)
        self.sent, self.sent_round = flat, round_
        self.steps_since, self.coef_since, self.samples_since = 0, 0.0, 0
        return result

    def trained(self, samples: int, weight_sum: float) -> None:
        self.steps_since += 1
        self.coef_since += weight_sum
        self.samples_since += samples


STALE, RESTORED, ADOPTED = "stale", "restored", "adopted"


class WorkerRounds:
    """A worker's place in the rounds around its replica: the restore generation it follows
    (weights restored from a backup, of a newer generation, replace the replica's; those of an
    older one are dropped), a round it was called to while its previous contribution was in
    flight (deferred until those weights are in), and whether to ask for weights it may have
    missed (a broadcast lost while the SUB reconnected to a restarted aggregator)."""

    def __init__(self, ask_every_s: float):
        self.ask_every_s = ask_every_s  # asks for missed weights at most this often
        self.generation = 0
        self.restore_wanted = 0         # a Restore's generation, asked for until it is here
        self.deferred: int | None = None
        self.contributed_at = 0.0
        self.asked_at = 0.0

    def weights(self, replica: Replica, w: Weights) -> str:
        """Weights from the aggregator: STALE (nothing changes), RESTORED (they replaced the
        replica's) or ADOPTED."""
        if w.params.shape != (replica.size,):
            raise ProtocolError("bad_shape", f"weights of {w.params.shape}, model has "
                                             f"{replica.size} parameters")
        if w.generation < self.generation:
            return STALE  # from before a restore
        if w.generation > self.generation:
            self.generation = w.generation
            replica.reset(w.round, w.params)
            if self.deferred is not None and self.deferred <= w.round:
                self.deferred = None
            return RESTORED
        return ADOPTED if replica.adopt(w.round, w.params) else STALE

    def called(self, replica: Replica, round_: int) -> bool:
        """Aggregate(round_) names this worker: True to contribute now (else it is a repeat,
        or deferred while the previous round is in flight)."""
        if round_ <= replica.settled_round:
            return False  # a repeat of a round already done or contributed
        if replica.in_flight:
            self.deferred = round_
            return False
        return True

    def deferred_due(self, replica: Replica) -> int | None:
        """After weights came in: the deferred round to contribute to now, if any."""
        if self.deferred is None or self.deferred <= replica.version:
            return None
        round_, self.deferred = self.deferred, None
        return round_

    def restore(self, generation: int) -> bool:
        """Control's Restore: True when it is news (ask for the restored weights)."""
        if generation <= max(self.generation, self.restore_wanted):
            return False
        self.restore_wanted = generation
        return True

    def missed(self, now: float, replica: Replica, eval_waiting: bool) -> bool:
        """Ask for the current weights now? At most once per ``ask_every_s``, while something
        waits for weights that must exist by now: restored ones, those of the round in flight
        when the next round was called (rounds complete in order), or those an eval batch
        needs (``eval_waiting``)."""
        if now - self.asked_at <= self.ask_every_s:
            return False
        return (self.restore_wanted > self.generation
                or (self.deferred is not None and replica.in_flight
                    and now - self.contributed_at > self.ask_every_s)
                or eval_waiting)
