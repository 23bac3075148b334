"""A worker's link to the model-parallel group it leads (``[cluster] parts`` > 1): the group's
sockets, and the work on the group waiting through the worker's loop.

Control's ModelPlan makes the worker's replica the group's (``roles.model.group``: the leader's
share of the network, the weights spread over the members); until every member has answered,
the link pings each one that has not, once a heartbeat (the worker asks for its first weights
only when all are there).

Work on the group is a *task*: a generator that sends what the leader (``GroupLeader``) gives it
and yields a ``Wait`` (what it waits for, and a test of whether that is done) until the members'
answers are in: a batch's forward and backward (``forward``, ``backward``, from the worker's
``Runner``), or an operation on the replica's weights between the gathering of the members'
slices and the loading of theirs (``on_weights``). Nothing blocks: the group's inbox is one of
the loop's sockets, each message read is handed to the leader, and the task goes on once what it
waits for is done. Tasks run one at a time, in the order they came (``busy`` while any is
queued: no batch starts meanwhile); a wait not done within ``timeout_s`` fails the group
(``GroupError``: a member is gone). Group messages with no task waiting are late (of a step
given up on) and only counted.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator
from typing import NamedTuple

import numpy as np
import torch
import zmq

from roles.algorithms.worker.replica import Replica
from roles.job.settings import Job
from roles.model.group import GroupLeader, Sends
from roles.model.parallel import member_program
from roles.protocol.model_parallel import MemberCall, MemberReply, MemberTensors, ModelPlan
from zbus.codec import Envelope, Message
from zbus.endpoints import node_index

log = logging.getLogger(__name__)


class GroupError(RuntimeError):
    """A member of the group did not answer in time: the group cannot train."""


class Wait(NamedTuple):
    done: Callable[[], bool]
    what: str   # for the error when it is not done in time


Task = Iterator[Wait]


class GroupLink:
    def __init__(self, job: Job, name: str, index: int, device: torch.device,
                 peers: dict[int, zmq.Socket], send: Callable[[zmq.Socket, Message], object],
                 timeout_s: float, ping_every_s: float, all_there: Callable[[], None],
                 unexpected: Callable[[Envelope, str], None],
                 failed: Callable[[GroupError], None]):
        self.job, self.name, self.index, self.device = job, name, index, device
        self.peers, self.send = peers, send
        self.timeout_s, self.ping_every_s = timeout_s, ping_every_s
        self.all_there, self.unexpected = all_there, unexpected  # every member answered; else
        self.failed = failed
        self.leader: GroupLeader | None = None  # once the plan is here
        self.answered: set[int] = set()         # members that answered a ping
        self.next_ping = 0.0
        self.tasks: deque[Task] = deque()
        self.wait: Wait | None = None           # what the first task waits for
        self.waiting_since = 0.0
        self.advancing = False
        self.wait_s = 0.0
        self.late_messages = 0

    def take_plan(self, plan: ModelPlan, now: float) -> Replica:
        """The plan: the leader's share of the network, its replica the group's weights."""
        gm, program = member_program(self.job, plan, 0, self.device)
        self.leader = GroupLeader(gm, program)
        log.info("%s leads group %d: %d members, nodes here: %s", self.name, self.index,
                 plan.parts, ", ".join(n.name for st in program.mine for n in st.nodes))
        self.ping(now)
        return Replica(self.leader.weights, self.job.train.dense_lr)

    # -- the members there -----------------------------------------------------------------------
    def waiting(self) -> bool:
        """Some member has not answered yet."""
        return len(self.answered) < len(self.peers)

    def ping(self, now: float) -> None:
        """Until every member has the plan: ask them, once per ``ping_every_s``."""
        if self.leader is None or now < self.next_ping:
            return
        self.next_ping = now + self.ping_every_s
        for member, sock in self.peers.items():
            if member not in self.answered:
                self.send(sock, MemberCall(call="ping", seq=0,
                                           values=np.zeros(0, dtype=np.float32)))

    # -- the inbox and the clock -----------------------------------------------------------------
    def heard(self, env: Envelope) -> None:
        """A message on the group's inbox."""
        match env.msg:
            case MemberReply(call="ping") if node_index(env.sender) >= 0:
                _, member = self.job.cluster.member_position(node_index(env.sender))
                if member not in self.answered:
                    self.answered.add(member)
                    if not self.waiting():
                        log.info("%s: every member of its group is there", self.name)
                        self.all_there()
            case MemberReply() | MemberTensors() as msg if self.leader is not None \
                    and self.wait is not None:
                self.ship(self.leader.take(msg))
                self.advance()
            case MemberReply() | MemberTensors():
                self.late_messages += 1
            case _:
                self.unexpected(env, "group link")

    def tick(self, now: float) -> None:
        """Pings while a member has not answered; a wait past its time fails the group."""
        if self.waiting():
            self.ping(now)
        if self.wait is not None and now - self.waiting_since > self.timeout_s:
            what, self.wait = self.wait.what, None
            self.tasks.clear()
            self.failed(GroupError(f"no answer from the group's parts within "
                                   f"{self.timeout_s:.0f} s while {what}"))

    # -- tasks -----------------------------------------------------------------------------------
    def busy(self) -> bool:
        return bool(self.tasks)

    def run(self, task: Task) -> None:
        """Queue a task; it starts at once when no other is queued."""
        self.tasks.append(task)
        self.advance()

    def advance(self) -> None:
        """Go on with the tasks while what they wait for is done."""
        if self.advancing:
            return   # a task queued by a task: the loop below comes to it
        self.advancing = True
        try:
            while self.tasks:
                if self.wait is not None:
                    if not self.wait.done():
                        return
                    self.wait_s += time.monotonic() - self.waiting_since
                    self.wait = None
                try:
                    self.wait = next(self.tasks[0])
                    self.waiting_since = time.monotonic()
                except StopIteration:
                    self.tasks.popleft()
        except BaseException:
            self.wait = None   # a task that failed is over (its error goes on to the loop)
            self.tasks.popleft()
            raise
        finally:
            self.advancing = False

    def ship(self, sends: Sends) -> None:
        for member, msg in sends:
            self.send(self.peers[member], msg)

    def forward(self, inputs: dict[str, torch.Tensor],
                train: bool) -> Generator[Wait, None, torch.Tensor]:
        """(In a task) the network's output over the group."""
        leader = self.lead()
        self.ship(leader.forward(inputs, train))
        yield Wait(lambda: leader.output() is not None,
                   f"running forward of step {leader.step}")
        output = leader.output()
        assert output is not None  # what the wait was for
        return output

    def backward(self, output_grad: torch.Tensor) -> Generator[Wait, None, None]:
        """(In a task) backward over the group, from the gradient of the output."""
        leader = self.lead()
        self.ship(leader.backward(output_grad))
        yield Wait(leader.backward_done, f"running backward of step {leader.step}")

    def on_weights(self, op: Callable[[], None]) -> Task:
        """A task: ``op`` on the replica, with the members' weights gathered before and what
        it loaded sent to them after."""
        leader = self.lead()
        self.ship(leader.gather())
        yield Wait(leader.gathered, "gathering the members' weights")
        op()
        self.ship(leader.scatter())
        yield Wait(leader.scattered, "loading the members' weights")

    def lead(self) -> GroupLeader:
        if self.leader is None:
            raise RuntimeError("the group has no plan yet")
        return self.leader

    def counters(self) -> dict:
        late = {"late_group_messages": self.late_messages}
        if self.leader is None:
            return late
        return {**late, "group_wait_s": round(self.wait_s, 3), "group_steps": self.leader.step}
