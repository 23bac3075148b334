"""A worker that leads a model-parallel group (``[cluster] parts`` > 1, ``roles.model.parallel``):
control's ModelPlan makes its replica a GroupReplica, whose steps and weights the GroupLeader
drives over the group's sockets; until every member has answered, the worker pings each one
that has not, once a heartbeat (it asks for its first weights only when all are there). Group
messages outside a step are those answers; any other is late (of a step given up on) and
dropped."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch
import zmq

from roles.job.settings import Job
from roles.model.parallel import GroupLeader, GroupReplica, Send, member_program
from roles.protocol.model_parallel import MemberCall, MemberReply, MemberTensors, ModelPlan
from zbus import sockets
from zbus.codec import Envelope, ProtocolError
from zbus.endpoints import node_index

log = logging.getLogger(__name__)


class GroupLead:
    def __init__(self, job: Job, name: str, index: int, device: torch.device, inbox: zmq.Socket,
                 peers: dict[int, zmq.Socket], send: Send, traffic: sockets.Traffic,
                 reject: Callable[[ProtocolError], None], timeout_s: float, ping_every_s: float,
                 all_there: Callable[[], None], unexpected: Callable[[Envelope, str], None]):
        self.job, self.name, self.index, self.device = job, name, index, device
        self.inbox, self.peers = inbox, peers
        self.send, self.traffic, self.reject = send, traffic, reject
        self.timeout_s, self.ping_every_s = timeout_s, ping_every_s
        self.all_there, self.unexpected = all_there, unexpected  # every member answered; else
        self.leader: GroupLeader | None = None  # once the plan is here
        self.answered: set[int] = set()         # members that answered a ping
        self.next_ping = 0.0
        self.late_messages = 0

    def take_plan(self, plan: ModelPlan, now: float) -> GroupReplica:
        """The plan: the leader's share of the network, as the worker's new replica."""
        gm, program = member_program(self.job, plan, 0, self.device)
        self.leader = GroupLeader(program, self.inbox, self.peers, self.send, self.traffic,
                                  self.reject, self.timeout_s)
        replica = GroupReplica(gm, program, self.leader, self.device, self.job.train.dense_lr)
        log.info("%s leads group %d: %d members, nodes here: %s", self.name, self.index,
                 plan.parts, ", ".join(n.name for st in program.mine for n in st.nodes))
        self.ping(now)
        return replica

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

    def heard(self, env: Envelope) -> None:
        """A message on the group's inbox outside a step."""
        match env.msg:
            case MemberReply(call="ping") if node_index(env.sender) >= 0:
                _, member = self.job.cluster.member_position(node_index(env.sender))
                if member not in self.answered:
                    self.answered.add(member)
                    if not self.waiting():
                        log.info("%s: every member of its group is there", self.name)
                        self.all_there()
            case MemberReply() | MemberTensors():
                self.late_messages += 1
            case _:
                self.unexpected(env, "group link")

    def counters(self) -> dict:
        late = {"late_group_messages": self.late_messages}
        if self.leader is None:
            return late
        return {**late, "group_wait_s": round(self.leader.wait_s, 3),
                "group_steps": self.leader.step}
