"""A group member process: member p >= 1 of a model-parallel group (``[cluster] parts`` > 1:
each group is a worker, its leader, and ``parts - 1`` members).

Node ``member-i`` is member ``i % (parts - 1) + 1`` of group ``i // (parts - 1)``, whose
leader is worker ``group``. It waits for control's ModelPlan, traces the same network, keeps the
parameters of the nodes the plan gives it (on CUDA when present), and then serves its group:
the stages it owns run as their input tensors arrive (``roles.model.group``), their outputs
go straight to the member that needs them, gradients come back the same way, and once its
backward of a step is done it steps its own Adam and tells the leader. The leader loads and
reads its weights (MemberCall) when rounds are combined: the aggregator sees one contribution
per group. Bad messages are counted and dropped like everywhere else.
"""

from __future__ import annotations

import logging

import zmq

from roles.job.cli import role_main
from roles.job.settings import Job
from roles.model.group import MemberServer
from roles.model.network import pick_device, use_threads
from roles.model.parallel import member_program
from roles.protocol.model_parallel import MemberCall, MemberTensors, ModelPlan
from zbus.codec import ProtocolError
from zbus.messages import Ready
from zbus.node import Node

log = logging.getLogger(__name__)


class GroupMember(Node):
    role = "member"

    def __init__(self, job: Job, index: int):
        super().__init__(job.cluster, index, job.fingerprint())
        c = job.cluster
        if c.parts < 2:
            raise RuntimeError("this job has no model-parallel groups ([cluster] parts = 1)")
        self.job = job
        self.group, self.member = c.member_position(index)
        self.threads = use_threads(job)
        self.device = pick_device(job.train.device)
        self.inbox = self.bind(zmq.ROUTER, c.endpoint(c.group_endpoint_name(self.group,
                                                                            self.member)),
                               self.on_group)
        self.peers = {m: self.connect(zmq.DEALER, c.endpoint(c.group_endpoint_name(
            self.group, m))) for m in range(c.parts) if m != self.member}
        self.server: MemberServer | None = None
        self.counts = {"steps": 0, "scored": 0, "calls": 0}

    def handle_command(self, env) -> None:
        match env.msg:
            case ModelPlan() as plan if self.server is None:
                _, program = member_program(self.job, plan, self.member, self.device)
                self.server = MemberServer(program, self.job.train.dense_lr)
                mine = [n for s in program.mine for n in (x.name for x in s.nodes)]
                log.info("%s: member %d of group %d, %d node(s): %s", self.node_id,
                         self.member, self.group, len(mine), ", ".join(mine) or "none")
                self.state = "ready"
                self.to_control(Ready(info={"device": str(self.device), "group": self.group,
                                            "member": self.member, "nodes": mine,
                                            "parameters": sum(p.numel() for p in
                                                              program.params.values()),
                                            "plan_cut_critical":
                                                plan.summary.get("cut_critical", -1)}))
            case _:
                pass

    def on_group(self, _identity: bytes | None, env) -> None:
        if self.server is None:
            return  # before the plan: the leader asks again
        msg = env.msg
        if not isinstance(msg, (MemberTensors, MemberCall)):
            self.unexpected(env, "group link")
            return
        for member, reply in self.server.handle(msg):
            sock = self.peers.get(member)
            if sock is None:
                raise ProtocolError("bad_field", f"no member {member} in this group")
            self.send(sock, reply)
        self.counts["steps"] = self.server.steps
        if isinstance(msg, MemberCall):
            self.counts["calls"] += 1
        elif not msg.train:
            self.counts["scored"] += 1
        self.state = "training"

    def counters(self) -> dict:
        return {**self.counts, "group": self.group, "member": self.member,
                "device": str(self.device)}


def main() -> None:
    role_main(GroupMember)


if __name__ == "__main__":
    main()
