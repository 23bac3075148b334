"""What a node's role means to control, one small class per role: the node silent for
``node_timeout_s`` (``lost``), a new process under the id of a node that had been ready
(``restarted``), its Ready (``ready``), its heartbeats (``heartbeat``), and the node speaking
after it was declared failed (``spoke_when_failed``). ``Control`` builds them once from its
components (``by_role``) and asks the one of the node's role. ``Role`` is what a role does not
change: a lost node fails the job; nothing else needs more than membership.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from roles.algorithms.control.membership import Members, NodeState
from roles.control.commands import ProgressClock
from roles.control.course import Course
from roles.control.feeding import Feeding
from roles.control.recovery import Recovery
from roles.control.rounds import Rounds
from roles.job.settings import Job
from zbus.messages import Heartbeat, Hello

log = logging.getLogger(__name__)


class Role:
    """The defaults: a node the job cannot do without."""

    def lost(self, node_id: str, reason: str, now: float) -> str | None:
        """The node missed heartbeats (``reason``): why the job fails, or None: it goes on."""
        return reason

    def restarted(self, node_id: str, before: NodeState, hello: Hello,
                  now: float) -> str | None:
        """A new process under the id of a node that had been ready: why the job fails (it
        cannot take the new process), or None."""
        return None

    def ready(self, node_id: str, info: dict, now: float) -> None:
        """The node said Ready (membership has counted it)."""

    def heartbeat(self, node: NodeState, beat: Heartbeat, now: float) -> None:
        """A heartbeat, before the node's record takes its figures."""

    def spoke_when_failed(self, node_id: str, node: NodeState) -> None:
        """The node was declared failed, yet it speaks (it is refused unless this revives
        it)."""


class WorkerRole(Role):
    def __init__(self, members: Members, membership_changed: Callable[[], None]):
        self.members = members
        self.membership_changed = membership_changed

    def lost(self, node_id: str, reason: str, now: float) -> str | None:
        log.warning("%s; its batches go to the other workers", reason)
        if self.members.fail(node_id, now, reason):
            self.membership_changed()
        return None


class MemberRole(Role):
    def __init__(self, members: Members):
        self.members = members

    def lost(self, node_id: str, reason: str, now: float) -> str | None:
        log.warning("%s; its group stops when its leader finds it gone", reason)
        self.members.fail(node_id, now, reason)
        return None


class AggregatorRole(Role):
    """Restarted from a backup, in the sync modes that allow it."""

    def __init__(self, job: Job, members: Members, course: Course, rounds: Rounds,
                 recovery: Recovery):
        self.job, self.members, self.course = job, members, course
        self.rounds, self.recovery = rounds, recovery

    def lost(self, node_id: str, reason: str, now: float) -> str | None:
        if not self.rounds.mode.rules.aggregator_recovers:
            return reason
        log.warning("%s; waiting up to %.0f s for it to restart", reason,
                    self.job.train.recovery_timeout_s)
        self.members.fail(node_id, now, reason)
        self.recovery.aggregator_down(now)
        return None

    def restarted(self, node_id: str, before: NodeState, hello: Hello,
                  now: float) -> str | None:
        log.warning("%s restarted (pid %d, was %d): it will restore the latest backup",
                    node_id, hello.pid, before.pid)
        self.recovery.aggregator_down(now)
        return None

    def ready(self, node_id: str, info: dict, now: float) -> None:
        if self.course.phase not in ("starting", "done") \
                and "checkpoint" not in info:  # else it went back to the checkpoint's weights
            self.recovery.restore(self.rounds.round)


class ShardRole(Role):
    """Restarted from its checkpoint (``roles.control.recovery``)."""

    def __init__(self, recovery: Recovery):
        self.recovery = recovery

    def lost(self, node_id: str, reason: str, now: float) -> str | None:
        self.recovery.shard_silent(node_id, reason, now)
        return None

    def restarted(self, node_id: str, before: NodeState, hello: Hello,
                  now: float) -> str | None:
        self.recovery.shard_restarting(node_id, before, now)
        return None

    def ready(self, node_id: str, info: dict, now: float) -> None:
        if node_id in self.recovery.shards_back:
            self.recovery.shard_back(node_id, info, now)

    def spoke_when_failed(self, node_id: str, node: NodeState) -> None:
        self.recovery.shard_speaks(node_id, node)


class FeederRole(Role):
    """Its parts go to another feeder, or it is restarted from its ack log
    (``roles.control.feeding``), in the sync modes that allow it."""

    def __init__(self, course: Course, rounds: Rounds, feeding: Feeding,
                 progress: ProgressClock):
        self.course, self.rounds, self.feeding, self.progress = course, rounds, feeding, progress

    def lost(self, node_id: str, reason: str, now: float) -> str | None:
        c = self.course
        if self.feeding.feeder_lost(node_id, reason, now, epoch=c.epoch, phase=c.phase,
                                    restarts=self.rounds.mode.rules.feeder_restarts):
            return None
        return reason

    def restarted(self, node_id: str, before: NodeState, hello: Hello,
                  now: float) -> str | None:
        mode, c = self.rounds.mode, self.course
        if not mode.rules.feeder_restarts and c.phase != "starting":
            return (f"{node_id} restarted: a feeder cannot resume in sync mode "
                    f"{mode.name} (its rounds count one process's batches)")
        log.warning("%s restarted (pid %d, was %d): it resumes from its ack log",
                    node_id, hello.pid, before.pid)
        self.feeding.feeder_down(node_id, now, epoch=c.epoch, phase=c.phase)
        return None

    def ready(self, node_id: str, info: dict, now: float) -> None:
        c = self.course
        if node_id in self.feeding.down:
            self.feeding.feeder_back(node_id, now, epoch=c.epoch, phase=c.phase)

    def heartbeat(self, node: NodeState, beat: Heartbeat, now: float) -> None:
        if beat.counters.get("batches_acked") != node.counters.get("batches_acked"):
            self.progress.touch(now)  # training or evaluation moves on
