"""A node's Hello: whether control takes it into the job, and what that means.

A node is refused (Welcome ``accepted=False``, with the reason) when its id, role or index is
not one the job expects or another process holds it (``Members.refusal``), when it belongs to
another run, when it is the very process a dead control had declared failed, or when it runs
another job (its fingerprint differs). A resumed control first decides whether the nodes lived
on (``roles.control.resuming``): until then a new process's Hello is left unanswered, a node
that rejoins a control whose records came from a checkpoint is refused, and once every stateful
node is new the whole job goes back to its checkpoint. A new process under the id of a node
that had been ready is that node restarted: its role says whether the job can take it
(``roles.control.node_roles``). A node of the run that was ready and says Hello again has
rejoined. A node that could not start says why in its Hello (``failed``): the job fails with
that line, or the node is refused (``roles.control.start_failures``); once the job has ended,
control answers its next Hello with Stop.

``Admission.hello`` decides and returns an ``Answer``; control's loop sends it and acts on it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from roles.algorithms.control.membership import ALIVE
from roles.control.node_roles import Role
from roles.control.resuming import Resumption
from roles.control.start_failures import start_failure
from roles.control.state import ControlComponents
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from zbus.messages import Hello, Welcome

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Answer:
    """What a Hello comes to: ``welcome`` to send (None: leave the Hello unanswered for now);
    ``failure``: the job fails (``resumable``: a resume may fix it); ``members_changed``: the
    node counts as ready again; ``rejoined``: a ready node of the run came back (the job may
    start)."""

    welcome: Welcome | None = None
    failure: str = ""
    resumable: bool = True
    members_changed: bool = False
    rejoined: bool = False


class Admission:
    def __init__(self, job: Job, run_id: str, run_dir: Path, parts: ControlComponents,
                 by_role: dict[str, Role], resumption: Resumption, metrics: MetricsLog):
        self.job = job
        self.run_id = run_id
        self.run_dir = run_dir
        self.members = parts.members
        self.checkpoints = parts.checkpoints
        self.course = parts.course
        self.by_role = by_role
        self.resumption = resumption
        self.metrics = metrics

    def hello(self, node_id: str, hello: Hello, now: float) -> Answer:
        if hello.failed:   # it could not start: never admitted (roles.control.start_failures)
            said = start_failure(self.members, self.job.fingerprint(), node_id, hello,
                                 starting=self.course.phase == "starting")
            return self.refused(said.reason) if said.refuse \
                else Answer(failure=said.reason, resumable=said.resumable)
        resuming = self.resumption.decision
        choice = resuming.hello(node_id, hello.role, rejoin=hello.run_id == self.run_id,
                                known=node_id in self.members.nodes)
        if choice == "wait":
            return Answer()   # a resumed control, not yet sure whether the nodes live on
        if choice == "refuse" and not resuming.resumed:
            return self.refused(f"{node_id} ran an earlier start of run {self.run_id}, whose "
                                "control's records are gone: this control started the run "
                                f"anew; start {node_id} again (a new process) to join it")
        if choice == "refuse":
            return self.refused(f"control lost its records and goes back to checkpoint "
                                f"{resuming.checkpoint}: start {node_id} again (a new "
                                "process), as every node of the job, to go back to it")
        if choice == "roll back":
            failure = self.resumption.roll_back(now)
            if failure:
                return Answer(failure=failure, resumable=False)
        if choice == "go" and resuming.resumed and not resuming.rolled_back \
                and (stuck := self.resumption.cannot_go_on()):
            return Answer(failure=stuck, resumable=True)
        self.resumption.decided()
        known = self.members.nodes.get(node_id)
        reason = self.refusal(node_id, hello)
        if reason:
            return self.refused(reason)
        if self.members.admit(node_id, hello.role, hello.index, hello.host, hello.pid, now):
            if known is not None and known.ready:  # a new process under a ready node's id
                cannot = self.by_role[hello.role].restarted(node_id, known, hello, now)
                if cannot:
                    return Answer(failure=cannot)
            log.info("%s said hello from %s pid %d", node_id, hello.host, hello.pid)
            self.metrics.write("hello", node=node_id, host=hello.host, pid=hello.pid)
        welcome = Welcome(accepted=True, reason="", run_id=self.run_id,
                          run_dir=str(self.run_dir), restore=self.checkpoints.latest_dir,
                          rollback=resuming.rolled_back, rollback_id=resuming.rollback_id)
        if hello.run_id:
            self.resumption.said_hello(node_id)
        if not (hello.run_id and hello.ready):
            return Answer(welcome)
        node = self.members.nodes[node_id]   # a node that was ready joins again
        log.info("%s joined again (pid %d)", node_id, node.pid)
        self.metrics.write("rejoin", node=node_id, pid=node.pid)
        changed = not node.ready and self.members.mark_ready(node_id, now)
        return Answer(welcome, members_changed=changed, rejoined=True)

    def refusal(self, node_id: str, hello: Hello) -> str:
        """Why the node cannot join ("": it can)."""
        reason = self.members.refusal(node_id, hello.role, hello.index, hello.pid)
        known = self.members.nodes.get(node_id)
        if not reason and hello.run_id and hello.run_id != self.run_id:
            reason = (f"{node_id} belongs to run {hello.run_id}; control runs {self.run_id} "
                      "(start control with --resume to go on with a run)")
        elif not reason and hello.run_id and known is not None and known.status != ALIVE \
                and known.pid == hello.pid:  # the same process a dead control had given up on
            reason = f"{node_id} was declared {known.status}; restart it to rejoin"
        if not reason and hello.fingerprint != self.job.fingerprint():
            reason = (f"{node_id} runs a different job (fingerprint {hello.fingerprint}, "
                      f"control has {self.job.fingerprint()}): start every node with the same "
                      "job file and ZBUS_* settings")
        return reason

    def refused(self, reason: str) -> Answer:
        log.warning("refused a node: %s", reason)
        return Answer(Welcome(accepted=False, reason=reason, run_id=self.run_id, run_dir=""))
