"""Control: membership and health of the cluster, the job's course, the aggregation rounds,
and the summary. The loop dispatches; its components decide:

- ``admission``: a node's Hello, admitted or refused (``roles.control.admission``);
- ``course``: the lifecycle, epoch by epoch (``roles.control.course``);
- ``rounds`` and the sync mode: when the workers' dense weights are combined;
- ``health``: network utilisation and probes (the failure rate);
- ``by_role``: what a node's loss, restart, Ready and heartbeats mean for its role
  (``roles.control.node_roles``);
- ``feeding``: the feeders' parts of the data, reports, a lost or restarted feeder;
- ``recovery``: backups, a restarted aggregator or shard;
- ``exports``, ``placement`` (skew-aware key placement), ``settings`` (live settings),
  ``operators`` (requests of zbus-ctl and the console, and the status they watch);
- ``checkpoints``: whole-job checkpoints, the consistent cut across the roles;
- ``state``: the records a resumed control starts from (``zbus-control --resume``): when the
  nodes live on, control's own latest records; when every node comes back as a new process
  (the whole job was killed), the newest complete checkpoint, to which every node goes back
  (``resumption``: ``roles.control.resuming``);
- the end: the summary (``roles.control.summary``), then the nodes' exit (``closing``);
  what a signal means (``roles.control.interruption``);
- ``network_files``: the job's network file, for a node whose host lacks it.

The job fails, with the reason in the summary and a non-zero exit, when the job's network
cannot train (checked at a new run's start: ``roles.control.network_check``), a node cannot
start (its Hello says why: ``roles.control.start_failures``), a node reports a
Failure, a ready node other than a worker, a group member, one of several feeders (its parts
go to another), an aggregator or a shard (which may be started again within
``recovery_timeout_s``) misses heartbeats for ``node_timeout_s``, the nodes are not all ready
within ``start_timeout_s``, or nothing progresses for ``stall_timeout_s``. A failure other
than a node's Failure, a network that cannot train and a node that cannot start before
training began, and a SIGINT or SIGTERM (status ``interrupted``), leave the run to be
resumed from its newest complete checkpoint (``end``); a completed, stopped or so failed job
has ended for good. A SIGTERM in a pod that is going away (``zbus.signals``) is not the job's
end but control's restart: it hands its records over to the next control and exits, and the
nodes go on (``hand_over``; ``roles.control.handover``).
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import zmq

from roles.algorithms.control.membership import ALIVE, Members, NodeState, Stalls
from roles.algorithms.control.status import StatusBuilder
from roles.algorithms.control.summary import feeder_totals, table_figures
from roles.algorithms.shared.progress import Every, describe, epoch_line, seconds
from roles.checkpoint.files import ACKS, HANDOVER, checkpoint_store, latest_complete
from roles.control.admission import Admission
from roles.control.checkpoints import Checkpoints
from roles.control.closing import Closing
from roles.control.commands import Commands, ProgressClock
from roles.control.course import Course
from roles.control.exports import Exports
from roles.control.feeding import Feeding
from roles.control.handover import hand_over
from roles.control.health import Health
from roles.control.interruption import Interruption, under_honcho
from roles.control.model_plan import PlanError, plan_model
from roles.control.monitoring import Monitoring, final_figures
from roles.control.network_check import network_refusal
from roles.control.network_files import NetworkFiles
from roles.control.node_roles import (
    AggregatorRole,
    FeederRole,
    MemberRole,
    Role,
    ShardRole,
    WorkerRole,
)
from roles.control.operators import Operators, StatusView
from roles.control.placement import PlacementKeeper
from roles.control.recovery import Recovery
from roles.control.resuming import Resumption
from roles.control.rounds import Rounds
from roles.control.servers import Servers, follow_job
from roles.control.serving_cuts import ServingCuts
from roles.control.settings import LiveSettings
from roles.control.state import (
    STATE_FILE,
    ControlComponents,
    ResumeError,
    capture_history,
    capture_state,
    cut_files,
    write_records,
)
from roles.control.summary import run_summary, write_summary
from roles.control.sync_modes import sync_mode
from roles.job.cli import MAX_WORKERS, started_by_supervisor
from roles.job.module_file import portable
from roles.job.rundir import MetricsLog, make_run_dir
from roles.job.settings import Job, job_to_toml
from roles.job.summary import Summary
from roles.protocol.checkpoint import CheckpointDrained, CheckpointPart, Snapshotted
from roles.protocol.datapath import DataIndex, FeederProgress, PartStats
from roles.protocol.dense_sync import (
    BackupWritten,
    Restored,
    RoundDone,
    RoundDrained,
    RoundReady,
)
from roles.protocol.lifecycle import (
    EpochTrained,
    EvalReport,
    Exported,
    Membership,
    NetworkWanted,
)
from roles.protocol.operator import ControlReply, ControlRequest, Status
from roles.protocol.placement import Drained, KeyCounts, Moved, WindowWork
from roles.protocol.serving import FollowRequest, ServerReport
from roles.protocol.stream import StreamScores
from roles.storage.fs import StorageError
from zbus import security, signals
from zbus.codec import Envelope, ProtocolError
from zbus.endpoints import CONTROL_ID
from zbus.files import atomic_write
from zbus.messages import (
    Failure,
    Heartbeat,
    Hello,
    Leaving,
    ProbeReply,
    Ready,
    Rejoin,
    Stop,
    Welcome,
)
from zbus.node import Loop

log = logging.getLogger(__name__)
THROUGHPUT_EVERY_S = 5.0   # throughput to metrics.jsonl, the epoch's progress to the log
WAITING_LOG_S = 10.0       # what the job waits for, to the log
TASK_LOG_S = 5.0           # an export's or a checkpoint's progress, to the log


class Control(Loop):
    def __init__(self, job: Job, environ: dict | None = None, resume: Path | None = None,
                 headline: Callable[[Summary, Path], None] = lambda summary, path: None):
        """``resume``: the run directory of a run whose control died, to go on with;
        ``headline`` tells the summary when the job ends."""
        c = job.cluster
        super().__init__(CONTROL_ID, c.heartbeat_s, c.max_message_bytes)
        self.curve = security.for_process(self.ctx, c, CONTROL_ID)  # CURVE, when on
        self.job = job
        self.router = self.bind(zmq.ROUTER, c.endpoint("control"), self.on_node)
        self.pub = self.bind(zmq.PUB, c.endpoint("control_pub"), sndhwm=100_000)
        self.requests = self.bind(zmq.ROUTER, c.endpoint("control_req"), self.on_request)
        self.status_pub = self.bind(zmq.PUB, c.endpoint("status"), sndhwm=16)
        self.run_dir = resume or make_run_dir(job.name, environ)
        self.run_id = self.run_dir.name
        if resume is None and (self.run_dir / STATE_FILE).exists():
            raise ResumeError(f"{self.run_dir} holds run {self.run_id} already: go on with it "
                              "(zbus-control --resume), or start the job in another "
                              "directory (ZBUS_RUN_DIR unset gives a new one under runs/)")
        if resume is None or not (self.run_dir / "config.toml").exists():
            self.run_dir.mkdir(parents=True, exist_ok=True)   # resumed: a new pod's, maybe
            atomic_write(self.run_dir / "config.toml", job_to_toml(job).encode())
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.members = Members(c.expected_nodes(), MAX_WORKERS, self.started)
        self.stalls = Stalls(c.node_timeout_s, self.heartbeat_s, self.started)
        self.progress = ProgressClock(self.started)
        self.commands = Commands(lambda msg: self.send(self.pub, msg), self.save_state)
        # the components
        self.health = Health(c, self.members, lambda node_id, probe: self.send(
            self.router, probe, identity=node_id.encode()), job.aggregation.failure_window_s)
        self.settings = LiveSettings(job.aggregation, self.run_dir / "config.toml",
                                     self.commands, self.metrics)
        self.rounds = Rounds(sync_mode(job.train.sync, job.train.sync_every,
                                       health=self.health, settings=lambda: self.settings.values,
                                       send=lambda msg: self.send(self.pub, msg),
                                       metrics=self.metrics, interval=c.heartbeat_s),
                             self.members, self.commands, self.metrics, self.progress)
        self.mode = self.rounds.mode
        self.feeding = Feeding(job, self.members, self.commands, self.metrics, self.progress)
        self.recovery = Recovery(job, self.members, self.commands, self.metrics, self.progress)
        self.exports = Exports(job, self.run_dir, self.run_id, self.commands, self.metrics)
        self.course = Course(job, self.commands, self.metrics, self.rounds, self.feeding,
                             self.exports, self.progress)
        self.by_role: dict[str, Role] = {  # what a node's loss, restart, Ready... mean
            "feeder": FeederRole(self.course, self.rounds, self.feeding, self.progress),
            "aggregator": AggregatorRole(job, self.members, self.course, self.rounds,
                                         self.recovery),
            "ps": ShardRole(self.recovery),
            "worker": WorkerRole(self.members, self.membership_changed),
            "member": MemberRole(self.members)}
        self.placement = PlacementKeeper(job, self.members, self.commands, self.metrics,
                                         self.run_dir, self.progress,
                                         training_feeders=self.feeding.training_feeders)
        self.checkpoints = Checkpoints(job, checkpoint_store(job, self.run_dir), self.members,
                                       self.commands,
                                       self.rounds, self.metrics, self.progress,
                                       self.capture_cut)
        self.components = ControlComponents(self.members, self.commands, self.course,
                                            self.rounds, self.feeding, self.recovery,
                                            self.exports, self.settings, self.placement,
                                            self.checkpoints)
        self.operators = Operators(self.components, self.metrics, self.progress,
                                   self.checkpoint_blocker)
        self.status = StatusBuilder(c.heartbeat_s, self.started)
        self.resumption = Resumption(job, self.run_dir, self.run_id, self.components,
                                     self.metrics, self.progress, resumed=resume is not None)
        self.admission = Admission(job, self.run_id, self.run_dir, self.components,
                                   self.by_role, self.resumption, self.metrics)
        self.headline = headline
        # the clock
        self.next_publish = self.next_status = self.next_save = 0.0
        self.next_throughput = self.started + THROUGHPUT_EVERY_S
        self.last_acked = (self.started, 0)
        self.no_workers_since: float | None = None
        self.termination: str | None = None  # the signal that interrupted the job
        self.interruption: Interruption | None = None   # and what it means
        self.under_honcho = under_honcho(os.environ if environ is None else environ)
        self.handing_over = False  # ... or that restarts control: its pod is going away
        self.resume_from: int | None = None  # ended: the checkpoint a resume goes back to
        self.model_plan: dict | None = None
        cannot_plan = ""  # the network cannot be built or traced: the job fails at once
        if resume is not None:
            self.model_plan = self.resumption.from_disk(time.monotonic())
        else:
            cannot_plan = self.start_run()
        self.servers = Servers()   # the serving processes that follow the job
        self.view = StatusView(job, self.components, self.status, self.health, self.model_plan,
                               self.servers,
                               started_by_supervisor(os.environ if environ is None else environ))
        self.waiting_log = Every(WAITING_LOG_S, self.started)
        self.tasks_log = Every(TASK_LOG_S, self.started)
        self.closing: Closing | None = None
        self.monitoring = Monitoring(job, self.run_dir)  # Prometheus, TensorBoard
        self.serving_cuts = ServingCuts(job.serving.publish_ms,
                                        lambda cut: self.send(self.pub, cut))
        self.network_files = NetworkFiles(job, c.max_message_bytes)  # for nodes that lack it
        if cannot_plan:
            self.fail(cannot_plan, resumable=False)

    def start_run(self) -> str:
        """A new run: the network's partition (model parallelism) or its check, the run's first
        records; why the job cannot start ("": it can). What an earlier run left in
        ``[checkpoint] dir`` for its restarted roles (the feeders' ack logs, a handover) is not
        this run's: removed (StorageError: control cannot start)."""
        if self.job.checkpoint.dir:
            for name in (ACKS, HANDOVER):
                self.checkpoints.store.remove(name)
        cannot_plan = ""
        if self.job.cluster.parts > 1:  # model parallelism: the network's partition
            try:
                self.model_plan, plan = plan_model(self.job, self.run_dir, self.metrics)
                self.commands.publish(plan, "model_plan")
            except PlanError as exc:
                cannot_plan = str(exc)
        else:   # built and run once on a sample batch of the job's fields
            cannot_plan = network_refusal(self.job)
        expected = self.members.expected
        self.metrics.write("start", job=self.job.name, run_id=self.run_id, nodes=expected,
                           fingerprint=self.job.fingerprint())
        self.settings.publish()
        if not cannot_plan:   # else the job fails at once, waiting for nobody
            log.info("run %s: waiting for %d nodes (%s); %s", self.run_id, len(expected),
                     ", ".join(expected), security.describe(self.curve))
        return cannot_plan

    # -- messages from nodes -----------------------------------------------------------------
    def on_node(self, identity: bytes | None, env: Envelope) -> None:
        node_id = (identity or b"").decode(errors="replace")
        msg, now = env.msg, time.monotonic()
        if isinstance(msg, NetworkWanted):  # before its Hello: a node without the network file
            self.send(self.router, self.network_files.answer(node_id, msg), identity=identity)
            return
        if self.closing is not None:  # the job has ended: the nodes only leave
            self.after_the_end(identity or b"", node_id, msg, now)
            return
        if isinstance(msg, Hello):
            self.handle_hello(identity or b"", node_id, msg, now)
            return
        node = self.members.nodes.get(node_id)
        if node is None:  # a node of this run that a resumed control does not know yet
            self.send(self.router, Rejoin(run_id=self.run_id), identity=identity)
            raise ProtocolError("unregistered", f"{type(msg).__name__} from {node_id!r}, "
                                                "which has not said Hello")
        if node.status != ALIVE:  # declared failed: a shard may only have stalled
            self.by_role[node.role].spoke_when_failed(node_id, node)
        if node.status != ALIVE:  # declared failed, yet it speaks: it must not go on
            self.send(self.router, Welcome(
                accepted=False, run_id=self.run_id, run_dir="",
                reason=f"{node_id} was declared {node.status}; restart it to rejoin"),
                identity=identity)
            return
        node.last_seen = now
        if self.resumption.owes_hello(node_id):  # a resumed control: the node must say Hello
            self.send(self.router, Rejoin(run_id=self.run_id), identity=identity)
        match msg:
            case Heartbeat():
                self.handle_heartbeat(node_id, node, msg, now)
            case Ready(info=info):
                self.handle_ready(node_id, node, info, now)
            case Failure(reason=reason):  # bad data, a job it cannot run: again if resumed
                self.fail(f"{node_id}: {reason}", resumable=False)
            case Leaving(reason=reason, signal=signal_name):
                log.info("%s left: %s", node_id, reason)
                node.signalled = signal_name
                # a worker hands its batches back first; any other node a signal stopped is
                # found silent, as a crashed one (a restart, a pod moved: it comes back)
                if (node.role == "worker" or not signal_name) \
                        and self.members.leave(node_id, now, reason):
                    self.membership_changed()
            case ProbeReply():
                node.probe_pending_since = None
            case FeederProgress() as m:
                self.feeding.progressed(node_id, m)
            case DataIndex() as m:
                self.feeding.indexed(m)
                self.maybe_start()
            case PartStats() as m:
                self.stats_in(m, now)
            case RoundReady() as m:
                self.rounds.ready(node_id, m)
                self.maybe_aggregate()
            case RoundDrained(round=r):
                self.rounds.drained(r)
            case RoundDone() as m:
                if self.rounds.finished(m, now):
                    self.checkpoints.round_finished(m.round, now)
                    self.after_round()
            case CheckpointDrained() as m:
                self.checkpoints.drained(node_id, m, now)
            case Snapshotted() as m:
                self.checkpoints.snapshotted(node_id, m, now)
            case CheckpointPart() as m:
                self.checkpoints.part(node_id, m, now)
            case BackupWritten() as m:
                self.recovery.backup_written(node_id, m)
            case Restored() as m:
                if self.recovery.restored(m, now, self.rounds.in_flight):
                    self.rounds.over()  # a round in flight is void: its contributions died
                    self.after_round()
            case StreamScores() as m:
                self.course.stream.scored(node_id, m)
            case EpochTrained() as m:
                self.course.trained(m, now)
            case EvalReport() as m:
                self.course.evaluated(m, now)
            case Exported() as m:
                self.course.exported(m, now, generation=self.recovery.generation)
            case KeyCounts() as m:
                self.placement.handle_key_counts(node_id, m)
            case Drained() as m:
                self.placement.handle_placement_drained(node_id, m)
            case Moved() as m:
                self.placement.handle_moved(node_id, m)
            case WindowWork() as m if node.role == "ps":
                self.send(self.router, self.placement.handle_window_work(node.index, m),
                          identity=identity)
            case _:
                self.unexpected(env, "control socket")

    def after_the_end(self, identity: bytes, node_id: str, msg: Any, now: float) -> None:
        """Messages once the job has ended (summary written, metrics closed): a node saying
        Hello now, one slow to start, is told Stop as the others were, and exits with the job's
        status; a node that leaves is counted gone; anything else is late and dropped."""
        assert self.closing is not None
        match msg:
            case Hello():
                self.send(self.router, self.closing.stop, identity=identity)
            case Leaving(reason=reason) if node_id in self.members.nodes:
                self.members.nodes[node_id].signalled = msg.signal
                self.members.nodes[node_id].last_seen = now
                self.members.leave(node_id, now, reason)
            case _:
                pass

    def handle_hello(self, identity: bytes, node_id: str, hello: Hello, now: float) -> None:
        answer = self.admission.hello(node_id, hello, now)
        if answer.failure:
            self.fail(answer.failure, resumable=answer.resumable)
        if answer.welcome is not None:
            self.send(self.router, answer.welcome, identity=identity)
        if answer.members_changed:
            self.membership_changed()
        if answer.rejoined:
            self.maybe_start()

    def handle_heartbeat(self, node_id: str, node: NodeState, beat: Heartbeat,
                         now: float) -> None:
        self.by_role[node.role].heartbeat(node, beat, now)
        node.state, node.load, node.counters = beat.state, beat.load, beat.counters
        node.final = node.final or beat.final
        self.health.meter(node, beat.load, now)
        self.status.heard(node_id, node.role, beat.counters, now)

    def handle_ready(self, node_id: str, node: NodeState, info: dict, now: float) -> None:
        log.info("%s ready %s", node_id, orjson.dumps(info).decode())
        if self.members.mark_ready(node_id, now):
            self.membership_changed()
        self.resumption.ready(info)
        self.by_role[node.role].ready(node_id, info, now)
        self.maybe_start()

    def maybe_start(self) -> None:
        """Every expected node is ready and the data is indexed: the feeders get their parts
        and gather the data's statistics."""
        if self.course.phase == "starting" and self.members.all_expected_ready() \
                and self.feeding.index is not None:
            self.feeding.assign_parts()
            self.course.phase = "preparing"
            self.progress.touch(time.monotonic())

    def stats_in(self, m: PartStats, now: float) -> None:
        """A feeder's statistics of its training parts: once every part's are in, go."""
        if self.course.phase != "preparing":
            return
        got = self.feeding.stats_in(m, now)
        if isinstance(got, str):  # the data's statistics cannot be used
            self.fail(got, resumable=False)
        elif got is not None:
            self.course.start_epoch(0, now)

    def membership_changed(self) -> None:
        workers = self.members.live_workers()
        event = self.members.events[-1]
        self.metrics.write("membership", version=self.members.version, workers=workers,
                           node=event["node"], change=event["event"],
                           reason=event.get("reason", ""))
        log.info("workers now: %s (%s %s)", ", ".join(workers) or "none", event["node"],
                 event["event"])
        self.commands.publish(Membership(version=self.members.version, workers=workers),
                              "members")
        self.mode.workers_changed(workers)
        self.maybe_aggregate()

    # -- rounds ------------------------------------------------------------------------------
    def maybe_aggregate(self) -> None:
        if self.course.phase == "training" and self.recovery.aggregator_lost_at is None:
            self.rounds.call_if_due(time.monotonic())

    def after_round(self) -> None:
        """The round in flight is over: evaluate, or call the next one when it is due."""
        if self.course.phase == "syncing":
            self.course.sync_for_eval()
        else:
            self.maybe_aggregate()

    # -- operators ---------------------------------------------------------------------------
    def on_request(self, identity: bytes | None, env: Envelope) -> None:
        match env.msg:
            case FollowRequest(server=server):   # a serving process on another host
                log.info("serving process %s follows the job", server)
                self.send(self.requests, follow_job(self.job, self.run_id, self.run_dir),
                          identity=identity)
                return
            case ServerReport() as report:   # unanswered
                if report.run_id == self.run_id:
                    self.servers.report(report, time.monotonic())
                elif self.servers.stranger(report.server):
                    log.warning("serving process %s follows run %s, not this one (%s): not "
                                "listed", report.server, report.run_id, self.run_id)
                return
            case ControlRequest(action=action) if self.closing is not None \
                    and action != "settings":  # the summary is written: nothing changes now
                ok, message = False, f"the job has ended ({self.closing.stop.reason})"
            case ControlRequest(action=action, changes=changes):
                ok, message = self.operators.handle(action, changes, env.sender,
                                                    time.monotonic())
                if ok and action == "set":
                    self.maybe_aggregate()
                log.info("request %s from %s: %s", action, env.sender,
                         message if ok else f"refused: {message}")
            case _:
                ok, message = False, f"{type(env.msg).__name__} is not a request"
                self.unexpected(env, "request endpoint")
        self.send(self.requests, ControlReply(ok=ok, message=message,
                                              settings=dict(self.settings.values)),
                  identity=identity)

    def publish_status(self, now: float) -> None:
        self.next_status = now + self.job.cluster.status_s
        feeding = self.feeding_counters()
        self.status.tick(now, feeding)
        snapshot = self.view.snapshot(now, now - self.started, feeding)
        self.send(self.status_pub, Status.of(self.run_id, snapshot))
        self.monitoring.show(snapshot)

    # -- the clock -----------------------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        if self.closing is not None:
            self.close_down(now, self.closing)
            return
        if self.termination and self.handing_over:  # its pod is going away
            self.hand_over()
            return
        if self.termination:  # Ctrl-C of honcho start (honcho SIGTERMs every role), ...
            assert self.interruption is not None
            if self.interruption.settled(now):   # (a node stopped by it has said so)
                self.end("interrupted", self.interruption.reason(), resumable=True)
            else:
                self.wake_at = now + 0.02
            return
        if now >= self.next_publish:
            self.next_publish = now + self.heartbeat_s
            self.commands.republish()
        if self.resumption.decision.pending:  # nodes of the run, or new processes: which?
            self.wait_for_nodes(now)
            return
        self.health.probe(now, self.heartbeat_s)
        if now >= self.next_status:
            self.publish_status(now)
        self.save_now(now)
        due = self.serving_cuts.tick(now, self.course.running)
        if due is not None:
            self.wake_at = due
        if self.course.phase == "training":
            self.checkpoints.training_started(now)
        self.checkpoints.tick(now, self.checkpoint_blocker())
        if self.course.paused:
            self.progress.touch(now)  # an operator paused feeding: nothing is stalled
        if self.job.streaming:
            self.stream_tick(now)
        if now >= self.next_throughput:
            self.record_throughput(now)
        if self.tasks_log.due(now):  # control's own long tasks (the feeders log theirs)
            for t in self.view.tasks(now):
                if t["node"] == "control" and t["elapsed_s"] >= TASK_LOG_S:
                    log.info("%s, for %s", describe(t), seconds(t["elapsed_s"]))
        if self.waiting_log.due(now):
            for w in self.view.waits(now, now - self.started):
                start = f"start it with {w['restart']}; " if w["restart"] else ""
                log.info("waiting for %s %s (%s%.0f s left)", w["node"], w["what"], start,
                         w["left_s"])
        c = self.job.cluster
        if self.course.phase == "starting" and now - self.started > c.start_timeout_s:
            self.fail(f"not ready after {c.start_timeout_s:.0f} s: "
                      f"{', '.join(self.members.missing())}")
            return
        if not self.check_silent(now):
            return
        overdue = self.recovery.overdue(now, self.feeding.down)
        if overdue:
            self.fail(overdue)
            return
        self.course.export_overdue(now, c.node_timeout_s * 3)
        if self.mode.decides_every_tick:
            self.maybe_aggregate()
        if not self.check_moving(now):
            return
        if self.course.phase == "finishing":
            late = self.members.not_final(alive=True)
            if late and now <= self.course.finish_deadline:
                return
            if late:
                log.warning("no final counters from %s: the summary has their last "
                            "heartbeat's", ", ".join(late))
            self.end(*self.course.finish_status)

    def stream_tick(self, now: float) -> None:
        """A stream job: its pass ends at its limit; a stream with no event waiting is idle,
        not stalled."""
        training = self.course.phase == "training"
        self.course.stream.tick(now, training, self.course.epoch, self.feeding.reported)
        feeders = [s.counters.get("stream") for s in self.members.nodes.values()
                   if s.role == "feeder"]
        if training and feeders and all(
                isinstance(f, dict) and not f.get("messages_held") and
                f.get("events_taken") == f.get("events_trained", 0) + f.get(
                    "events_rejected", 0) for f in feeders):
            self.progress.touch(now)

    def wait_for_nodes(self, now: float) -> None:
        """A resumed control that has heard from no node of its run yet: it neither probes
        nor times them out, but gives up after ``start_timeout_s``."""
        self.progress.touch(now)
        failure = self.resumption.not_back(now - self.started)
        if failure:
            self.fail(failure)
        elif now >= self.next_status:
            self.publish_status(now)

    def check_silent(self, now: float) -> bool:
        """Nodes silent for node_timeout_s: each role as it may be lost; False when the job
        has failed. A silence control could not have heard (``Stalls``) fails no node."""
        c = self.job.cluster
        stalled = self.stalls.check(now, self.members)
        if stalled:
            log.warning("%s: each live node heard from since the last stall has "
                        "node_timeout_s = %s more before it is failed", stalled,
                        c.node_timeout_s)
        for node_id in self.members.silent(now, c.node_timeout_s):
            node = self.members.nodes[node_id]
            reason = (f"{node_id} missed heartbeats for {now - node.last_seen:.1f} s "
                      f"(node_timeout_s = {c.node_timeout_s})")
            failure = self.by_role[node.role].lost(node_id, reason, now)
            if failure:
                self.fail(failure)
                return False
        return True

    def check_moving(self, now: float) -> bool:
        """Workers live and the job moves on; False when it has failed."""
        c = self.job.cluster
        live = self.members.live_workers()
        restarting = self.resumption.workers_restarting(live=bool(live))
        limit = c.start_timeout_s if restarting else c.node_timeout_s
        if self.course.active and not live:
            self.no_workers_since = self.no_workers_since or now
            if now - self.no_workers_since > limit:
                self.fail(f"no live worker for {limit:.0f} s" + (
                    " after the job went back to its checkpoint (start_timeout_s)"
                    if restarting else ""))
                return False
        else:
            self.no_workers_since = None
        stall = self.job.train.stall_timeout_s
        if (self.course.active or self.course.phase == "preparing") \
                and self.progress.stalled_for(now) > stall:
            last = self.mode.last
            said = f"; last aggregation decision: {last.reason}" \
                if last and self.course.phase == "training" else ""
            self.fail(f"no progress for {stall:.0f} s in phase {self.course.phase}{said}")
            return False
        return True

    def checkpoint_blocker(self) -> str | None:
        """Why a checkpoint cannot be cut now (None: it can)."""
        if self.resumption.waiting():
            return "a resumed control waits for the nodes to join again"
        if away := self.resumption.not_restored(self.members.missing()):
            return f"the job went back to a checkpoint: {', '.join(away)} not restored yet"
        if self.course.phase != "training":
            return f"the job is not training an epoch (phase {self.course.phase})"
        r = self.recovery
        if r.aggregator_lost_at is not None or r.shards_lost or r.shards_back:
            return "a shard or the aggregator is being restored"
        if self.feeding.down:
            return "a feeder is being restarted"
        if self.placement.migration is not None:
            return "keys are moving between shards"
        return None

    def capture_cut(self, number: int) -> dict[str, bytes]:
        state = capture_state(self.components, self.run_id, self.resumption.started_at,
                              self.job.fingerprint())
        files = cut_files(self.components, state, capture_history(self.components, self.model_plan),
                          number)
        recorded, extra = portable(self.job)
        return {**files, **extra, "job.toml": job_to_toml(recorded).encode()}

    def feeding_counters(self) -> dict:
        """Every feeder's counters added up."""
        return feeder_totals({n: s.counters for n, s in self.members.nodes.items()})

    def record_throughput(self, now: float) -> None:
        self.next_throughput = now + THROUGHPUT_EVERY_S
        acked = self.feeding_counters().get("samples_acked")
        then, before = self.last_acked
        if isinstance(acked, int) and self.course.phase != "starting":
            rate = round((acked - before) / (now - then), 1)
            self.metrics.write("throughput", samples=acked, samples_per_s=rate)
            self.last_acked = (now, acked)
            if self.course.phase == "training":
                log.info("%s", epoch_line(self.view.training(self.feeding_counters()),
                                          self.course.epoch, self.job.train.epochs, rate))
            self.record_tables()

    def record_tables(self) -> None:
        """The shards' table figures (keys held, admitted, rejected, expired, evicted)."""
        tables = table_figures(self.job, {n: s.counters for n, s in self.members.nodes.items()})
        self.metrics.write("tables", total=tables["total"], shards=tables["shards"])

    # -- state on disk ---------------------------------------------------------------------------
    def save_state(self) -> None:
        if self.course.phase == "done" and self.resume_from is not None:
            return  # ended resumable: the state on disk is the one to resume
        write_records(self.run_dir, capture_state(self.components, self.run_id,
                                                  self.resumption.started_at,
                                                  self.job.fingerprint()),
                      capture_history(self.components, self.model_plan))

    def save_now(self, now: float) -> None:
        """Once per heartbeat interval (called from the clock)."""
        if now >= self.next_save and self.course.phase != "done":
            self.next_save = now + self.heartbeat_s
            self.save_state()

    # -- the end ---------------------------------------------------------------------------------
    def fail(self, reason: str, resumable: bool = True) -> None:
        """The job cannot go on. ``resumable``: a resume may fix what failed (a process that
        died or was not back in time, nothing progressing); not for a node's Failure (bad
        data, a job it cannot run: the same again) or a checkpoint that cannot be used."""
        self.metrics.write("failure", reason=reason)  # the headline prints the reason
        self.end("failed", reason, resumable=resumable)

    def end(self, status: str, reason: str, resumable: bool = False) -> None:
        """The job ends with ``status``. A ``resumable`` end (interrupted, or failed for a
        reason a resume may fix) leaves the run to be resumed (``--resume``) from its newest
        complete checkpoint, as if every process had been killed; without one, or not
        resumable, the run has ended for good (phase ``done`` on disk)."""
        if self.course.phase == "done":
            return
        if self.termination and status == "failed":  # whatever failed as the roles stop
            assert self.interruption is not None
            status, reason, resumable = "interrupted", self.interruption.reason(), True
        found = latest_complete(self.checkpoints.store) if resumable else None
        self.resume_from = found[0] if found else None
        if self.resume_from is not None:
            self.save_state()  # before phase done: a resume goes on with the run
        self.course.phase = "done"   # a signal now (honcho stopping the others) changes nothing
        now = time.monotonic()
        self.placement.seal()
        summary = run_summary(self.components, self.job, status, reason,
                              resume_from=self.resume_from, counters=self.every_counter(now),
                              wall_s=now - self.started + self.resumption.run_before_s,
                              model_plan=self.model_plan, stalls=self.stalls)
        path = write_summary(self.run_dir, summary,   # beside the checkpoints too: a pod
                             self.checkpoints.store if self.job.checkpoint.dir else None)
        self.record_tables()
        if self.resume_from is None:
            self.save_state()  # phase done: the run cannot be resumed
        self.metrics.write("end", status=status, reason=reason, resume_from=self.resume_from)
        self.metrics.close()
        ok = status in ("completed", "stopped")  # stopped: an operator ended it on purpose
        stop = Stop(ok=ok, reason=reason or status, resumable=self.resume_from is not None)
        self.send(self.pub, stop)
        self.view.final = final_figures(summary, path)
        self.publish_status(time.monotonic())  # consoles see the end
        self.monitoring.close()
        self.exit_code = 0 if ok else 1
        if status == "interrupted" and self.termination:  # as a shell reports a process
            self.exit_code = 128 + signal.Signals[self.termination]  # that a signal ended
        self.closing = Closing.begin(summary, path, stop, self.members.nodes.values(), now)

    def every_counter(self, now: float) -> dict[str, dict[str, Any]]:
        """Every node's last counters, and control's own."""
        return {**{n: s.counters for n, s in self.members.nodes.items()},
                self.node_id: {**self.traffic.as_dict(), "rejected_messages": dict(self.rejected),
                               "idle_s": self.idle_s, "longest_turn_s": self.longest_turn_s,
                               "uptime_s": now - self.started}}

    def close_down(self, now: float, closing: Closing) -> None:
        """The job has ended: the nodes leave (consoles keep seeing the final status), and
        the processes that started them on this host (``zbus-spawn``, honcho's own) exit, so
        that honcho has said they stopped; then the headline, the run's last output."""
        self.wake_at = now + 0.02  # look again soon: the nodes exit within moments
        if now >= self.next_status:
            self.publish_status(now)
        if closing.over(now, self.members.nodes.values()):
            self.headline(closing.summary, closing.path)
            self.stopping = True

    def on_signal(self, signum: int) -> None:
        """SIGINT or SIGTERM: the job is interrupted (``check``), unless it has ended; a
        SIGTERM in a pod that is going away (``zbus.signals``): control hands over."""
        if self.course.phase != "done" and not self.termination:
            self.termination = signal.Signals(signum).name
            self.handing_over = signals.meaning(signum) == signals.RESTART
            self.interruption = Interruption.begin(self.termination, self.under_honcho,
                                                   self.members.nodes, time.monotonic())

    def hand_over(self) -> None:
        """A SIGTERM in a pod that is going away: control's restart, not the job's end. Its
        records go where the next control finds them (the run directory, and with
        ``[checkpoint] dir`` the store: ``roles.control.handover``); no Stop is sent, and the
        nodes go on and join the next control. A control still waiting to hear whether its
        nodes live on, with records from a checkpoint, hands nothing over: the next one goes
        back to that checkpoint as it would have."""
        decision = self.resumption.decision
        if not (decision.pending and decision.checkpoint):
            state = capture_state(self.components, self.run_id, self.resumption.started_at,
                                  self.job.fingerprint())
            history = capture_history(self.components, self.model_plan)
            write_records(self.run_dir, state, history)
            if self.job.checkpoint.dir:
                try:
                    hand_over(self.checkpoints.store, state, history)
                except (OSError, StorageError) as exc:
                    log.error("control's records are not in %s (%s): a control made again "
                              "on another host goes back to the newest checkpoint",
                              self.job.checkpoint.dir, exc)
        self.metrics.write("handover", signal=self.termination)
        log.warning("control received %s: its pod is going away; its records are handed over "
                    "to the next control, which the nodes join (the job goes on)",
                    self.termination)
        self.exit_code = 128 + signal.SIGTERM
        self.stopping = True

    def health_state(self) -> str:
        """Ready once it runs the job: asked from its loop, which starts once the run is made
        or resumed and its endpoints are bound (the nodes can join); ended once the job has
        ended for good (it cannot be resumed)."""
        if self.closing is not None and self.resume_from is None:
            return "ended"
        return "ready"

    def release(self) -> None:
        self.monitoring.stop()    # the metrics server's thread
        self.placement.close()    # the capacity trainer's process
        self.metrics.close()
        super().release()

    def close(self) -> None:
        self.pub.setsockopt(zmq.LINGER, 1000)  # let Stop reach the nodes
        self.pub.close()
        self.status_pub.setsockopt(zmq.LINGER, 500)  # and the last status the consoles
        self.status_pub.close()
        super().close()

