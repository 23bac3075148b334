"""The aggregator: owner of the global dense weights.

- sync ``step``: each StepGrad is applied at once with the aggregator's Adam and answered with
  the new weights (an asynchronous dense parameter server: no worker waits for another);
- rounds (modes every and round, and the epoch-end round of step): control publishes
  Aggregate(r) with its participants; when each of them that is still a member (control's
  Membership: a worker that died or left is not waited for) has sent its Contribution for r,
  the new weights are the old ones plus the coefficient-weighted mean of the deltas received
  (``roles.aggregation``); they go out on PUB as Weights(r) and control hears RoundDone(r) with
  the samples each contributor trained. Rounds complete in order.
- WeightsRequest is answered with the current weights (start-up, or a worker that missed some).
"""

from __future__ import annotations

import logging

import numpy as np
import torch
import zmq

from roles.aggregation import Adam, combine
from roles.cli import role_main
from roles.job import Job
from roles.model import build_model
from zbus.node import Node
from zbus.wire import (
    Aggregate,
    Contribution,
    Membership,
    ProtocolError,
    Ready,
    RoundDone,
    StepGrad,
    Weights,
    WeightsRequest,
)

log = logging.getLogger(__name__)


class Aggregator(Node):
    role = "aggregator"

    def __init__(self, job: Job, index: int = 0):
        super().__init__(job.cluster, index, job.fingerprint())
        self.job = job
        c = job.cluster
        self.router = self.bind(zmq.ROUTER, c.endpoint("aggregator"), self.on_worker)
        self.pub = self.bind(zmq.PUB, c.endpoint("aggregator_pub"), sndhwm=64)
        with torch.no_grad():
            self.params = torch.cat([p.reshape(-1) for p in build_model(job).parameters()]) \
                .numpy().astype(np.float32)
        self.size = len(self.params)
        self.step_mode = job.train.sync == "step"
        self.adam = Adam(self.size, job.train.dense_lr) if self.step_mode else None
        self.round = 0
        self.steps = 0
        self.expected: dict[int, list[str]] = {}
        self.members: set[str] | None = None
        self.received: dict[int, dict[str, Contribution]] = {}
        self.stale_contributions = 0

    def on_welcome(self) -> None:
        self.state = "ready"
        self.to_control(Ready(info={"parameters": self.size}))

    def weights(self) -> Weights:
        return Weights(round=self.round, step=self.steps, params=self.params.copy())

    def on_worker(self, identity: bytes | None, env) -> None:
        worker = identity.decode(errors="replace")
        match env.msg:
            case WeightsRequest():
                self.send(self.router, self.weights(), identity=identity)
            case StepGrad() as g:
                if not self.step_mode:
                    raise ProtocolError("wrong_mode", "StepGrad while sync is not 'step'")
                if g.grads.shape != (self.size,):
                    raise ProtocolError("bad_shape", f"step gradient of {g.grads.shape}")
                self.params = self.adam.step(self.params, g.grads)
                self.steps += 1
                self.send(self.router, self.weights(), identity=identity)
            case Contribution() as c:
                self.handle_contribution(worker, c)
            case _:
                self.unexpected(env, "aggregator socket")

    def handle_contribution(self, worker: str, c: Contribution) -> None:
        if c.round <= self.round:
            self.stale_contributions += 1
            return
        if c.delta.size not in (0, self.size):
            raise ProtocolError("bad_shape", f"delta of {c.delta.size} values, model has "
                                             f"{self.size}")
        self.received.setdefault(c.round, {})[worker] = c
        self.complete_rounds()

    def handle_command(self, env) -> None:
        match env.msg:
            case Aggregate(round=r, participants=who) if r > self.round:
                self.expected[r] = list(who)
                self.complete_rounds()
            case Membership(workers=workers):
                self.members = set(workers)
                self.complete_rounds()
            case _:
                pass

    def complete_rounds(self) -> None:
        while True:
            r = self.round + 1
            who = self.expected.get(r)
            got = self.received.get(r, {})
            if who is None or any(w not in got and (self.members is None or w in self.members)
                                  for w in who):
                return
            contributors = [w for w in who if w in got]
            parts = [got[w] for w in contributors]
            self.params = self.params + combine([p.delta for p in parts],
                                                [p.coefficient for p in parts], self.size)
            self.round = r
            self.send(self.pub, self.weights())
            self.to_control(RoundDone(round=r, contributors=contributors,
                                      samples_by=[p.samples for p in parts],
                                      coefficient=sum(p.coefficient for p in parts),
                                      samples=sum(p.samples for p in parts)))
            del self.expected[r]
            self.received.pop(r, None)

    def counters(self) -> dict:
        return {"round": self.round, "steps": self.steps, "parameters": self.size,
                "stale_contributions": self.stale_contributions}


def main() -> None:
    role_main(Aggregator)


if __name__ == "__main__":
    main()
