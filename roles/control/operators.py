"""Control's side of operators: the actions ``zbus-ctl`` and the console may ask on control's
request endpoint (``roles.protocol.operator.ACTIONS``), and the status they watch.

Actions: ``settings`` (read), ``set`` (live settings, all or none), ``export``, ``backup``,
``aggregate`` (a round now: sync modes every and lazy, while training), ``pause`` / ``resume``
(the feeders send no new batch while paused; the stall timer does not run), ``stop`` (the job
ends as ``stopped``: nodes send their final counters, control writes the summary and exits 0).
"""

from __future__ import annotations

import dataclasses
import logging
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import cast

from roles.algorithms.control.membership import ALIVE
from roles.algorithms.control.status import StatusBuilder
from roles.algorithms.control.stream_status import StreamStatus
from roles.algorithms.control.summary import field_figures
from roles.algorithms.shared import live
from roles.control.commands import ProgressClock
from roles.control.health import Health
from roles.control.recovery import recovery_counts
from roles.control.servers import Servers
from roles.control.state import ControlComponents
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.protocol.operator import ACTIONS, FeedingPaused
from roles.protocol.status import (
    STATUS_LAYOUT,
    Final,
    StatusSnapshot,
    Task,
    TaskFigures,
    TrainingView,
    Wait,
)

log = logging.getLogger(__name__)


class Operators:
    """The actions, each on the components it concerns."""

    def __init__(self, parts: ControlComponents, metrics: MetricsLog, progress: ProgressClock,
                 checkpoint_blocker: Callable[[], str | None]):
        """``checkpoint_blocker``: why a checkpoint cannot be cut now (None: it can)."""
        self.checkpoints = parts.checkpoints
        self.checkpoint_blocker = checkpoint_blocker
        self.course = parts.course
        self.rounds = parts.rounds
        self.recovery = parts.recovery
        self.settings = parts.settings
        self.commands = parts.commands
        self.metrics = metrics
        self.progress = progress

    def handle(self, action: str, changes: dict, sender: str, now: float) -> tuple[bool, str]:
        course = self.course
        match action:
            case "settings":
                return True, f"settings version {self.settings.version}"
            case "set":
                return self.settings.change(changes, sender)
            case "export" if not course.job.checkpoint.export:
                return False, "this job does not export ([checkpoint] export = false)"
            case "export" if course.running and course.exports.current is None:
                return True, f"exporting to {course.exports.start(final=False, now=now)}"
            case "export":
                return False, f"cannot export now (phase {course.phase}, " + \
                    ("an export is in progress)" if course.exports.current else "not training)")
            case "backup" if course.running:
                self.recovery.backup_now()
                return True, "the aggregator backs up now"
            case "backup":
                return False, f"cannot back up now (phase {course.phase})"
            case "checkpoint":
                return self.checkpoints.request(sender, self.checkpoint_blocker())
            case "aggregate" if course.phase != "training" and self.rounds.mode.operator_rounds:
                return False, f"not training (phase {course.phase})"
            case "aggregate":
                return self.rounds.call_now(sender, self.recovery.aggregator_lost_at is not None)
            case "pause" | "resume":
                return self.set_paused(action == "pause", sender, now)
            case "stop" if course.phase not in ("finishing", "done"):
                log.warning("stop requested by %s", sender)
                self.metrics.write("stop", by=sender)
                course.finish(now, status=("stopped", f"stopped by {sender}"))
                return True, "the job stops: nodes send their final counters"
            case "stop":
                return False, f"the job is already ending (phase {course.phase})"
            case _:
                return False, f"unknown action {action!r}; actions: {', '.join(ACTIONS)}"

    def set_paused(self, paused: bool, sender: str, now: float) -> tuple[bool, str]:
        course = self.course
        if course.phase in ("finishing", "done"):
            return False, f"the job is ending (phase {course.phase})"
        if paused == course.paused:
            return True, "feeding is already " + ("paused" if paused else "running")
        course.paused = paused
        self.progress.touch(now)
        self.commands.publish(FeedingPaused(paused=paused), "feeding")
        self.metrics.write("pause" if paused else "resume", by=sender)
        return True, "feeding " + ("paused" if paused else "resumed")


class StatusView:
    """The status consoles watch (``roles.protocol.status.StatusSnapshot``), from the
    components."""

    def __init__(self, job: Job, parts: ControlComponents, builder: StatusBuilder,
                 health: Health, model_plan: dict | None, servers: Servers,
                 supervised: bool = False):
        """``builder``: the rates and rows of the heartbeats; ``health``: the network's
        utilisation and the failure rate; ``model_plan``: the network's partition (None:
        none); ``servers``: the serving processes that follow the job; ``supervised``: a
        supervisor starts every role (``started_by_supervisor``)."""
        self.job = job
        self.servers = servers
        self.layout = job.layout()
        self.supervised = supervised
        self.run_id = parts.exports.run_id
        self.run_dir = str(parts.exports.run_dir)
        self.members = parts.members
        self.builder = builder
        self.stream = StreamStatus() if parts.course.job.streaming else None
        self.course = parts.course
        self.rounds = parts.rounds
        self.feeding = parts.feeding
        self.recovery = parts.recovery
        self.settings = parts.settings
        self.health = health
        self.placement = parts.placement
        self.model_plan = model_plan
        self.checkpoints = parts.checkpoints
        self.final: Final | None = None   # the job has ended: how (set by control)

    def tasks(self, now: float) -> list[Task]:
        """Long tasks under way: what each node reports (indexing, the statistics pass), an
        export's parts and a checkpoint's phase (``roles.algorithms.shared.progress``)."""
        found: list[Task] = []
        for node_id, node in self.members.nodes.items():
            p = node.counters.get("progress")
            if isinstance(p, dict) and node.status == ALIVE:  # Progress.figures
                found.append({"node": node_id, **cast(TaskFigures, p)})
        e = self.course.exports.current
        if e is not None:
            found.append({"node": "control", "task": f"export {e.request}", "unit": "parts",
                          "done": len(e.files), "total": len(e.wanted), "rate": None,
                          "eta_s": None, "elapsed_s": round(now - e.started, 1)})
        cut = self.checkpoints.task(now)
        if cut is not None:
            found.append({"node": "control", **cut})
        return found

    def waits(self, now: float, uptime_s: float) -> list[Wait]:
        """What the job waits for, with what to do and the deadline: nodes to join at the
        start, a failed shard, aggregator or feeder to be started again."""
        found = []
        c, limit = self.job.cluster, self.job.train.recovery_timeout_s
        if self.course.phase == "starting":
            for node_id in self.members.missing():
                node = self.members.nodes.get(node_id)
                what, command = start_wait(None if node is None else node.state,
                                           self.supervised, uptime_s,
                                           START_GRACE * c.node_timeout_s)
                found.append(wait_record(node_id, what, uptime_s, c.start_timeout_s - uptime_s,
                                         start_command(node_id, self.run_dir) if command else ""))
        lost = {**self.recovery.shards_lost, **self.feeding.down}
        if self.recovery.aggregator_lost_at is not None:
            for node_id, node in self.members.nodes.items():
                if node.role == "aggregator" and node.status != ALIVE:
                    lost[node_id] = self.recovery.aggregator_lost_at
        for node_id, since in sorted(lost.items()):
            back = node_id in self.recovery.shards_back   # started again: it runs
            found.append(wait_record(node_id, "to restore its checkpoint" if back
                                     else "to be restarted", now - since,
                                     limit - (now - since),
                                     "" if back else start_command(node_id, self.run_dir)))
        return found

    def training(self, feeding: dict) -> TrainingView:
        """The training part of the status (``StatusBuilder.training``)."""
        course = self.course
        return self.builder.training(
            feeding=feeding, samples_per_epoch=self.feeding.data.get("samples_in_data", 0),
            epoch=course.epoch, epochs=self.job.train.epochs, epochs_done=course.epochs,
            running=course.running)

    def snapshot(self, now: float, uptime_s: float, feeding: dict) -> StatusSnapshot:
        nodes, s, course = self.members.nodes, self.settings.values, self.course
        mode = self.rounds.mode
        d = mode.last
        net_util, failures = self.health.figures(now, s["probe_timeout_s"])
        recovered = recovery_counts(
            aggregator=self.recovery.recoveries, shard=self.recovery.shard_recoveries,
            feeder=self.feeding.recoveries, feeder_handover=self.feeding.lost,
            rollback=self.checkpoints.rollbacks)
        return {
            "layout": STATUS_LAYOUT, "job": self.job.name, "run_id": self.run_id,
            "run_dir": self.run_dir, "phase": course.phase, "sync": mode.name,
            "paused": course.paused, "uptime_s": round(uptime_s, 1),
            "status_s": self.job.cluster.status_s, "heartbeat_s": self.job.cluster.heartbeat_s,
            "epoch": course.epoch, "epochs": self.job.train.epochs, "round": self.rounds.round,
            "round_in_flight": self.rounds.in_flight,
            "nodes": self.builder.node_rows(nodes, now, s["probe_timeout_s"]),
            "cluster": {
                "net_util": round(net_util, 6), "net_util_max": s["net_util_max"],
                "failure_rate": round(failures, 6), "failure_rate_max": s["failure_rate_max"],
                "live_workers": len(self.members.live_workers()),
                "decision": None if d is None else {
                    "round": d.round, "aggregate": d.aggregate, "reason": d.reason,
                    "age_s": round(now - mode.last_at, 1)},
                "decisions": mode.decision_counts(), "rounds_done": self.rounds.done_count,
                "backups": self.recovery.backups_written,
                "latest_backup": self.recovery.newest_backup(),
                "recoveries": sum(recovered.values()), "recovered": recovered},
            "training": self.training(feeding),
            "settings": {"version": self.settings.version, "values": dict(s),
                         "ranges": live.describe()},
            "partition": {"embeddings": {**self.builder.embeddings(
                nodes, self.placement.status(), dataclasses.asdict(self.job.embeddings)),
                "fields": field_figures(self.layout, feeding)}, "model": self.model_plan},
            "tasks": self.tasks(now),
            "checkpoint": self.checkpoints.status(now, course.phase == "training"),
            "waiting": [] if self.final else self.waits(now, uptime_s),
            "final": self.final,
            "stream": None if self.stream is None else self.stream.view(
                uptime_s, {n: st.counters for n, st in nodes.items() if st.role == "feeder"}),
            "serving": self.servers.rows(now),
        }


def start_command(node_id: str, run_dir: str) -> str:
    """The command that starts ``node_id`` on control's host, as printed from any shell: with
    the run's ``config.toml``, the job's effective settings (ZBUS_* included)."""
    role, _, index = node_id.rpartition("-")
    return f"zbus-{role} --index {index} --job {shlex.quote(str(Path(run_dir) / 'config.toml'))}"


START_GRACE = 3   # node_timeout_s a supervisor may take to start a node (importing torch...)


def start_wait(state: str | None, supervised: bool, uptime_s: float,
               grace_s: float) -> tuple[str, bool]:
    """What a node the job waits for at the start is waited for, and whether to give the
    command that starts it: not for a node that has joined (``state``: it is getting ready),
    nor for ``grace_s`` while a supervisor that starts every role may still be starting it."""
    if state is not None:
        return f"to be ready ({state})", False
    if supervised and uptime_s < grace_s:
        return "to start", False
    return "to join", True


def wait_record(node_id: str, what: str, waited_s: float, left_s: float,
                restart: str) -> Wait:
    """One thing the job waits for: the node, what for, the command that starts it ("":
    none to give), how long it has waited and how long it may still."""
    return {"node": node_id, "what": what, "restart": restart,
            "waited_s": round(max(0.0, waited_s), 1), "left_s": round(max(0.0, left_s), 1)}

