"""Control: membership and health of the cluster, the job's lifecycle, the aggregation rounds,
and the summary.

Lifecycle: every expected node says Hello (same job fingerprint) and Ready -> EpochStart(e) ->
the feeder reports EpochTrained(e) -> an epoch-end Aggregate round so that every worker holds
the same weights -> Evaluate(e, round) -> EvalReport(e) -> the next epoch, or Export (the model
into runs/<run>/export/) -> Finish (every node sends its final counters) -> summary.json ->
Stop -> exit (0 when the job completed).

Sync mode lazy, probes and network metering are in ``roles.control.lazy``; backups, the
recovery of a restarted aggregator and exports in ``roles.control.model``; operators' requests
(actions, live settings) and the status published for consoles in ``roles.control.operators``.

The job fails, with the reason in the summary and a non-zero exit, when a node reports a
Failure, a ready node other than a worker, a part, one of several feeders (its slices go to
another, ``roles.control.feeding``), an aggregator or a shard (which may be started again
within ``recovery_timeout_s``, ``roles.control.model``) misses heartbeats for
``node_timeout_s``, the nodes are not all ready
within ``start_timeout_s``, or nothing progresses for ``stall_timeout_s``.

Commands that stand (the current epoch or evaluation, the round in flight, Finish) are
re-published every heartbeat interval, so a subscriber that joined late or lost a message
still acts on them; every role handles repeats idempotently.

Control itself may be killed: its state is on disk (``roles.control.state``), and
``zbus-control --resume`` starts it again on the run, where the nodes join it again (they wait
``orphan_timeout_s`` for it).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import zmq

from roles.algorithms import live
from roles.algorithms.decision import HostMeter
from roles.algorithms.membership import ALIVE, Members, NodeState
from roles.algorithms.status import StatusBuilder
from roles.algorithms.summary import build_summary, feeder_totals
from roles.control.feeding import FeedingKeeping
from roles.control.lazy import LazyControl
from roles.control.model import ExportInProgress, ModelKeeping
from roles.control.operators import Operators
from roles.control.placement import PlacementKeeping
from roles.control.state import ResumeError, StateKeeping, resumable_run
from roles.job.cli import MAX_WORKERS, load_job_or_exit, parse_role_args
from roles.job.rundir import MetricsLog, atomic_write, make_run_dir
from roles.job.settings import Job, job_to_toml
from roles.protocol.dense_sync import (
    Aggregate,
    BackupWritten,
    Decision,
    Restored,
    RoundDone,
    RoundDrained,
    RoundReady,
)
from roles.protocol.lifecycle import (
    EpochStart,
    EpochTrained,
    EvalReport,
    Evaluate,
    Exported,
    Membership,
)
from roles.protocol.model_parallel import ModelPlan
from roles.protocol.operator import Settings
from roles.protocol.placement import Drained, KeyCounts, Moved
from zbus import security
from zbus.codec import Message, ProtocolError
from zbus.logs import setup_logging
from zbus.messages import (
    Failure,
    Finish,
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
THROUGHPUT_EVERY_S = 5.0


class Control(Operators, LazyControl, ModelKeeping, PlacementKeeping, FeedingKeeping,
              StateKeeping, Loop):
    def __init__(self, job: Job, environ: dict | None = None, resume: Path | None = None):
        """``resume``: the run directory of a run whose control died, to go on with."""
        c = job.cluster
        super().__init__("control-0", c.heartbeat_s, c.max_message_bytes)
        self.curve = security.for_process(self.ctx, c, "control-0")  # CURVE, when on
        self.job = job
        self.sync = job.train.sync
        self.router = self.bind(zmq.ROUTER, c.endpoint("control"), self.on_node)
        self.pub = self.bind(zmq.PUB, c.endpoint("control_pub"), sndhwm=100_000)
        self.requests = self.bind(zmq.ROUTER, c.endpoint("control_req"), self.on_request)
        self.status_pub = self.bind(zmq.PUB, c.endpoint("status"), sndhwm=16)
        self.run_dir = resume or make_run_dir(job.name, environ)
        self.run_id = self.run_dir.name
        if resume is None:
            atomic_write(self.run_dir / "config.toml", job_to_toml(job).encode())
        self.metrics = MetricsLog(self.run_dir / "metrics.jsonl")
        self.members = Members(c.expected_nodes(), MAX_WORKERS, self.started)
        self.phase = "starting"
        self.epoch = -1
        self.round = 0
        self.round_in_flight = False
        self.epoch_end_round: int | None = None
        self.drained: list[int] = []          # sync mode round: drained rounds not yet issued
        self.ready_workers: set[str] = set()
        self.standing: dict[str, Message] = {}
        self.data: dict[str, Any] = {}
        self.epochs: list[dict] = []
        self.rounds_done = 0
        self.round_samples: dict[str, list[int]] = {}
        self.no_workers_since: float | None = None
        self.last_progress = self.started
        self.finish_deadline = 0.0
        self.next_publish = 0.0
        self.next_throughput = self.started + THROUGHPUT_EVERY_S
        self.last_acked = (self.started, 0)
        self.termination: str | None = None
        self.finish_status = ("completed", "")
        # operators: the status consoles watch, and feeding paused on request
        self.status = StatusBuilder(c.heartbeat_s, self.started)
        self.next_status = 0.0
        self.paused = False
        # sync mode lazy: the decision and what it rests on
        self.settings = live.initial(job.aggregation)
        self.settings_version = 0
        self.settings_changes: list[dict] = []
        self.hosts: dict[str, HostMeter] = {}
        self.local_rounds: dict[str, int] = {}
        self.idle_workers: set[str] = set()
        self.probe_nonce = 0
        self.next_probe = 0.0
        self.next_decision = 0.0
        self.last_decision: Decision | None = None
        self.last_decision_at = 0.0
        self.last_decision_kind = ""
        self.decisions = {"aggregate": 0, "wait": 0}
        # backups, recovery, export
        self.backups: list[dict] = []
        self.generation = 0
        self.recoveries: list[dict] = []
        self.shards_lost: dict[str, float] = {}   # shard -> when declared failed
        self.shards_back: dict[str, tuple[float, int]] = {}  # restarting: lost at, updates
        self.shard_recoveries: list[dict] = []
        self.shard_generation = 0
        self.aggregator_lost_at: float | None = None
        self.export: ExportInProgress | None = None
        self.export_request = 0
        self.exports: list[dict] = []
        self.backup_request = 0
        self.init_placement()  # skew-aware key placement (roles.control.placement)
        self.init_feeding()    # the feeders' slices and reports (roles.control.feeding)
        self.init_state()      # the state a restarted control resumes (roles.control.state)
        if resume is not None:
            self.model_plan: dict | None = None
            self.resume_from_disk()
            return
        self.model_plan = self.plan_model()  # model parallelism: the network's partition
        expected = self.members.expected
        self.metrics.write("start", job=job.name, run_id=self.run_id, nodes=expected,
                           fingerprint=job.fingerprint())
        self.publish(Settings(version=self.settings_version, values=self.settings), "settings")
        log.info("run %s: waiting for %d nodes (%s)", self.run_id, len(expected),
                 ", ".join(expected))

    def plan_model(self) -> dict | None:
        """With ``[cluster] parts`` > 1: partition the traced network over each group's
        members, write the plan to the run directory and publish it (standing)."""
        if self.job.cluster.parts < 2:
            return None
        from roles.model.graph import plan_job  # torch: only for model-parallel jobs

        plan = plan_job(self.job)
        summary = plan.summary()
        (self.run_dir / "partition").mkdir(exist_ok=True)
        atomic_write(self.run_dir / "partition" / "plan.json",
                     orjson.dumps({**summary, "owner": plan.owner}, option=orjson.OPT_INDENT_2))
        self.metrics.write("model_plan", **{k: v for k, v in summary.items() if k != "nodes"})
        log.info("model plan: %d parts, loads %s (balance %.2f%s), %d cut edges of which %d "
                 "critical, %d bytes per step", plan.parts, plan.load, plan.balance,
                 "" if plan.balanced else f" > bound {self.job.partition.balance}",
                 plan.cut_edges, plan.cut_critical, plan.bytes_per_step)
        self.publish(ModelPlan(parts=plan.parts, owner=plan.owner, summary=summary),
                     "model_plan")
        return summary

    # -- messages from nodes -----------------------------------------------------------------
    def on_node(self, identity: bytes | None, env) -> None:
        node_id = identity.decode(errors="replace")
        msg = env.msg
        if isinstance(msg, Hello):
            self.handle_hello(identity, node_id, msg)
            return
        node = self.members.nodes.get(node_id)
        if node is None:  # a node of this run that a resumed control does not know yet
            self.send(self.router, Rejoin(run_id=self.run_id), identity=identity)
            raise ProtocolError("unregistered", f"{type(msg).__name__} from {node_id!r}, "
                                                "which has not said Hello")
        if node.status != ALIVE and node.role == "ps" and node_id in self.shards_lost \
                and node_id not in self.shards_back:
            # a shard declared failed that speaks again was only stalled: it still holds
            # every row and batch, so it simply goes on (a restarted one says Hello instead)
            log.warning("%s speaks again: it was stalled, not dead; it goes on", node_id)
            node.status = ALIVE
            del self.shards_lost[node_id]
            self.metrics.write("shard_stalled", node=node_id)
        if node.status != ALIVE:  # declared failed, yet it speaks: it must not go on
            self.send(self.router, Welcome(
                accepted=False, run_id=self.run_id, run_dir="",
                reason=f"{node_id} was declared {node.status}; restart it to rejoin"),
                identity=identity)
            return
        node.last_seen = time.monotonic()
        if node_id in self.awaiting_rejoin:  # a resumed control: the node must say Hello
            self.send(self.router, Rejoin(run_id=self.run_id), identity=identity)
        match msg:
            case Heartbeat():
                self.handle_heartbeat(node_id, node, msg)
            case Ready(info=info):
                self.handle_ready(node_id, node, info)
            case Failure(reason=reason):
                self.fail(f"{node_id}: {reason}")
            case Leaving(reason=reason):
                log.info("%s left: %s", node_id, reason)
                if self.members.leave(node_id, time.monotonic(), reason):
                    self.membership_changed()
            case ProbeReply():
                node.probe_pending_since = None
            case RoundReady() as m:
                self.handle_round_ready(node_id, m)
            case BackupWritten() as m:
                self.handle_backup(node_id, m)
            case Restored() as m:
                self.handle_restored(m)
            case Exported() as m:
                self.handle_exported(m)
            case RoundDrained(round=r):
                self.handle_drained(r)
            case EpochTrained() as m:
                self.handle_epoch_trained(m)
            case RoundDone() as m:
                self.handle_round_done(m)
            case EvalReport() as m:
                self.handle_eval(m)
            case KeyCounts() as m:
                self.handle_key_counts(node_id, m)
            case Drained() as m:
                self.handle_placement_drained(node_id, m)
            case Moved() as m:
                self.handle_moved(node_id, m)
            case _:
                self.unexpected(env, "control socket")

    def handle_hello(self, identity: bytes, node_id: str, hello: Hello) -> None:
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
        if reason:
            log.warning("refused a node: %s", reason)
            self.send(self.router, Welcome(accepted=False, reason=reason, run_id=self.run_id,
                                           run_dir=""), identity=identity)
            return
        before = self.members.nodes.get(node_id)
        if self.members.admit(node_id, hello.role, hello.index, hello.host, hello.pid,
                              time.monotonic()):
            if before is not None and before.ready and hello.role == "ps":
                self.shard_restarting(node_id, before)
            if before is not None and before.ready and hello.role == "feeder":
                if self.sync == "round" and self.phase != "starting":
                    self.fail(f"{node_id} restarted: a feeder cannot resume in sync mode "
                              "round (its rounds count one process's batches)")
                    return
                log.warning("%s restarted (pid %d, was %d): it resumes from its ack log",
                            node_id, hello.pid, before.pid)
                self.feeder_down(node_id)
            if before is not None and before.ready and hello.role == "aggregator":
                log.warning("%s restarted (pid %d, was %d): it will restore the latest "
                            "backup", node_id, hello.pid, before.pid)
                self.aggregator_lost_at = self.aggregator_lost_at or time.monotonic()
            log.info("%s said hello from %s pid %d", node_id, hello.host, hello.pid)
            self.metrics.write("hello", node=node_id, host=hello.host, pid=hello.pid)
        self.send(self.router, Welcome(accepted=True, reason="", run_id=self.run_id,
                                       run_dir=str(self.run_dir)), identity=identity)
        if hello.run_id:
            self.awaiting_rejoin.discard(node_id)
        if hello.run_id and hello.ready:
            self.rejoined(node_id)

    def rejoined(self, node_id: str) -> None:
        """A node that was ready joins a resumed control again."""
        node = self.members.nodes[node_id]
        log.info("%s joined again (pid %d)", node_id, node.pid)
        self.metrics.write("rejoin", node=node_id, pid=node.pid)
        if not node.ready and self.members.mark_ready(node_id, time.monotonic()):
            self.membership_changed()
        self.maybe_start()

    def handle_heartbeat(self, node_id: str, node: NodeState, beat: Heartbeat) -> None:
        if node.role == "feeder" and beat.counters.get("batches_acked") != \
                node.counters.get("batches_acked"):
            self.last_progress = time.monotonic()  # training or evaluation moves on
        node.state, node.load, node.counters = beat.state, beat.load, beat.counters
        node.final = node.final or beat.final
        self.meter_network(node, beat.load)
        if node.role == "ps":
            self.record_work(node.index, beat.counters)
        self.status.heard(node_id, node.role, beat.counters, time.monotonic())

    def handle_ready(self, node_id: str, node: NodeState, info: dict) -> None:
        if node.role == "feeder":
            self.feeder_ready(node_id, info)
            if self.phase == "done":
                return
        log.info("%s ready %s", node_id, orjson.dumps(info).decode())
        if self.members.mark_ready(node_id, time.monotonic()):
            self.membership_changed()
        if node.role == "aggregator" and self.phase not in ("starting", "done"):
            self.restore_aggregators()
        if node.role == "ps" and node_id in self.shards_back:
            self.shard_back(node_id, info)
        if node.role == "feeder" and node_id in self.feeders_down:
            self.feeder_back(node_id)
        self.maybe_start()

    def maybe_start(self) -> None:
        """Every expected node is ready (a feeder's Ready brought the data's counts): go."""
        if self.phase == "starting" and self.members.all_expected_ready() and self.data:
            self.assign_slices()
            self.start_epoch(0)

    def membership_changed(self) -> None:
        workers = self.members.live_workers()
        event = self.members.events[-1]
        self.metrics.write("membership", version=self.members.version, workers=workers,
                           node=event["node"], change=event["event"],
                           reason=event.get("reason", ""))
        log.info("workers now: %s (%s %s)", ", ".join(workers) or "none", event["node"],
                 event["event"])
        self.publish(Membership(version=self.members.version, workers=workers), "members")
        self.ready_workers &= set(workers)
        self.maybe_aggregate()

    # -- the lifecycle -----------------------------------------------------------------------
    def publish(self, msg: Message, standing: str | None = None) -> None:
        if standing:
            self.standing[standing] = msg
            self.save_state()  # before it goes out: a resumed control knows what it said
        self.send(self.pub, msg)

    def start_epoch(self, epoch: int) -> None:
        self.epoch, self.phase = epoch, "training"
        self.epoch_end_round = None
        self.epoch_reports, self.eval_reports = {}, {}
        self.last_progress = time.monotonic()
        self.metrics.write("epoch_start", epoch=epoch)
        log.info("epoch %d of %d starts", epoch + 1, self.job.train.epochs)
        self.publish(EpochStart(epoch=epoch), "data")

    def handle_round_ready(self, node_id: str, m: RoundReady) -> None:
        if m.round != self.round + 1:
            return  # progress towards a round already issued
        if self.sync == "every":
            self.ready_workers.add(node_id)
        elif self.sync == "lazy":
            self.local_rounds[node_id] = m.steps // self.job.train.sync_every
            if m.idle:
                self.idle_workers.add(node_id)
            else:
                self.idle_workers.discard(node_id)
        self.maybe_aggregate()

    def maybe_aggregate(self) -> None:
        live_workers = self.members.live_workers()
        if self.phase != "training" or self.round_in_flight or not live_workers \
                or self.aggregator_lost_at is not None:
            return
        if self.sync == "every" and self.ready_workers.issuperset(live_workers):
            self.issue_round(f"every worker did {self.job.train.sync_every} local steps")
        elif self.sync == "lazy":
            self.decide(live_workers)

    def issue_round(self, reason: str) -> None:
        self.round += 1
        self.round_in_flight = True
        self.ready_workers.clear()
        self.local_rounds.clear()
        self.idle_workers.clear()
        self.metrics.write("aggregate", round=self.round, reason=reason)
        self.publish(Aggregate(round=self.round, participants=self.members.live_workers(),
                               reason=reason), "round")

    def handle_drained(self, round_: int) -> None:
        """Sync mode round: every batch of the round is acknowledged; aggregate it, in order."""
        if self.sync == "round" and round_ > self.round and round_ not in self.drained:
            self.drained.append(round_)
            self.issue_drained()

    def issue_drained(self) -> None:
        if self.drained and not self.round_in_flight and self.drained[0] == self.round + 1:
            round_ = self.drained.pop(0)
            self.issue_round(f"round {round_} queue drained")

    def handle_round_done(self, done: RoundDone) -> None:
        if done.round != self.round or not self.round_in_flight:
            return
        self.rounds_done += 1
        self.last_progress = time.monotonic()
        by_worker = dict(zip(done.contributors, done.samples_by, strict=True))
        for worker in set(self.round_samples) | set(by_worker):
            self.round_samples.setdefault(worker, [0] * (self.rounds_done - 1)).append(
                by_worker.get(worker, 0))
        self.metrics.write("round_done", round=done.round, samples_by=by_worker,
                           coefficient=done.coefficient, samples=done.samples)
        self.round_over()

    def round_over(self) -> None:
        """The round in flight is done (or void: its aggregator was restored): go on."""
        self.round_in_flight = False
        self.standing.pop("round", None)
        self.issue_drained()
        if self.phase == "syncing":
            self.sync_for_eval()
        else:
            self.maybe_aggregate()

    def sync_for_eval(self) -> None:
        """Every worker evaluates the same weights: in mode round those of the epoch's last
        round, otherwise of one more round."""
        if self.round_in_flight or self.drained:
            return  # rounds still to finish first
        if self.epoch_end_round is None:
            if self.sync == "round":
                self.epoch_end_round = self.round
            else:
                self.issue_round("end of epoch")
                self.epoch_end_round = self.round
                return
        self.phase = "evaluating"
        self.publish(Evaluate(epoch=self.epoch, round=self.epoch_end_round), "data")

    def epoch_evaluated(self, epoch: int, auc: float, logloss: float, samples: int) -> None:
        record = self.epochs[-1]
        record.update(auc=auc, logloss=logloss, eval_samples=samples)
        self.metrics.write("epoch", **record)
        log.info("epoch %d: train loss %.4f, eval auc %.4f, logloss %.4f (%d samples in "
                 "%.1f s)", epoch + 1, record["train_loss"] or float("nan"), auc, logloss,
                 record["train_samples"], record["train_s"])
        self.last_progress = time.monotonic()
        if epoch + 1 < self.job.train.epochs:
            self.start_epoch(epoch + 1)
        else:
            self.phase = "exporting"
            self.start_export(final=True)

    def finish(self, status: tuple[str, str] = ("completed", "")) -> None:
        """Every node sends its final counters, then the job ends with ``status``."""
        self.finish_status = status
        self.phase = "finishing"
        self.standing.clear()
        self.finish_deadline = time.monotonic() + max(3 * self.heartbeat_s, 2.0)
        self.publish(Finish(), "finish")

    # -- the clock -----------------------------------------------------------------------------
    def on_tick(self, now: float) -> None:
        if self.termination:
            self.end("terminated", f"control received {self.termination}")
            return
        if now >= self.next_publish:
            self.next_publish = now + self.heartbeat_s
            for msg in list(self.standing.values()):
                self.send(self.pub, msg)
        if now >= self.next_probe:
            self.probe(now)
        if now >= self.next_status:
            self.publish_status(now)
        self.save_now(now)
        if self.paused:
            self.last_progress = now  # an operator paused feeding: nothing is stalled
        if now >= self.next_throughput:
            self.record_throughput(now)
        c = self.job.cluster
        if self.phase == "starting" and now - self.started > c.start_timeout_s:
            self.fail(f"not ready after {c.start_timeout_s:.0f} s: "
                      f"{', '.join(self.members.missing())}")
            return
        for node_id in self.members.silent(now, c.node_timeout_s):
            node = self.members.nodes[node_id]
            reason = (f"{node_id} missed heartbeats for {now - node.last_seen:.1f} s "
                      f"(node_timeout_s = {c.node_timeout_s})")
            if node.role == "aggregator" and self.sync != "step":
                log.warning("%s; waiting up to %.0f s for it to restart", reason,
                            self.job.train.recovery_timeout_s)
                self.members.fail(node_id, now, reason)
                self.aggregator_lost_at = self.aggregator_lost_at or now
                continue
            if node.role == "part":
                log.warning("%s; its group stops when its leader finds it gone", reason)
                self.members.fail(node_id, now, reason)
                continue
            if node.role == "feeder" and self.feeder_lost(node_id, reason):
                continue
            if node.role == "ps":
                log.warning("%s; waiting up to %.0f s for it to restart from its checkpoint",
                            reason, self.job.train.recovery_timeout_s)
                self.members.fail(node_id, now, reason)
                self.shards_lost.setdefault(node_id, now)
                self.metrics.write("shard_lost", node=node_id, reason=reason)
                continue
            if node.role != "worker":
                self.fail(reason)
                return
            log.warning("%s; its batches go to the other workers", reason)
            if self.members.fail(node_id, now, reason):
                self.membership_changed()
        late = [n for n, t in (*self.shards_lost.items(), *self.feeders_down.items())
                if now - t > self.job.train.recovery_timeout_s]
        if late:
            self.fail(f"{late[0]} did not come back within recovery_timeout_s = "
                      f"{self.job.train.recovery_timeout_s:.0f} s")
            return
        if self.aggregator_lost_at is not None and \
                now - self.aggregator_lost_at > self.job.train.recovery_timeout_s:
            self.fail(f"the aggregator did not come back within recovery_timeout_s = "
                      f"{self.job.train.recovery_timeout_s:.0f} s")
            return
        if self.export is not None and now - self.export.started > c.node_timeout_s * 3:
            self.export_failed(now)
        if self.sync == "lazy":
            self.maybe_aggregate()
        active = self.phase in ("training", "syncing", "evaluating", "exporting")
        if active and not self.members.live_workers():
            self.no_workers_since = self.no_workers_since or now
            if now - self.no_workers_since > c.node_timeout_s:
                self.fail(f"no live worker for {c.node_timeout_s:.0f} s")
                return
        else:
            self.no_workers_since = None
        if active and now - self.last_progress > self.job.train.stall_timeout_s:
            last = f"; last aggregation decision: {self.last_decision.reason}" \
                if self.last_decision and self.phase == "training" else ""
            self.fail(f"no progress for {self.job.train.stall_timeout_s:.0f} s in phase "
                      f"{self.phase}{last}")
            return
        if self.phase == "finishing" and (now > self.finish_deadline
                                          or self.members.all_final()):
            self.end(*self.finish_status)

    def feeding_counters(self) -> dict:
        """Every feeder's counters added up."""
        return feeder_totals({n: s.counters for n, s in self.members.nodes.items()})

    def record_throughput(self, now: float) -> None:
        self.next_throughput = now + THROUGHPUT_EVERY_S
        acked = self.feeding_counters().get("samples_acked")
        then, before = self.last_acked
        if isinstance(acked, int) and self.phase != "starting":
            self.metrics.write("throughput", samples=acked,
                               samples_per_s=round((acked - before) / (now - then), 1))
            self.last_acked = (now, acked)

    # -- the end ---------------------------------------------------------------------------------
    def fail(self, reason: str) -> None:
        self.metrics.write("failure", reason=reason)  # the headline prints the reason
        self.end("failed", reason)

    def end(self, status: str, reason: str) -> None:
        if self.phase == "done":
            return
        self.phase = "done"
        summary = build_summary(
            job=self.job, run_id=self.run_id, run_dir=str(self.run_dir), status=status,
            reason=reason, data=self.data, epochs=self.epochs,
            counters={**{n: s.counters for n, s in self.members.nodes.items()},
                      self.node_id: {**self.traffic.as_dict(),
                                     "rejected_messages": dict(self.rejected),
                                     "idle_s": self.idle_s,
                                     "uptime_s": time.monotonic() - self.started}},
            wall_s=time.monotonic() - self.started + self.run_before_s,
            rounds=self.rounds_done, round_samples=self.round_samples,
            membership=self.members.events,
            model={"backups": self.backups, "recoveries": self.recoveries,
                   "shard_recoveries": self.shard_recoveries,
                   "exports": self.exports, "settings_changes": self.settings_changes,
                   "settings": self.settings, "decisions": self.decisions,
                   "last_decision": self.last_decision.reason if self.last_decision else None},
            placement=self.placement_summary(), model_plan=self.model_plan,
            slices=self.slices_summary())
        path = self.run_dir / "summary.json"
        atomic_write(path, orjson.dumps(summary, option=orjson.OPT_INDENT_2))
        self.save_state()  # phase done: the run cannot be resumed
        self.metrics.write("end", status=status, reason=reason)
        self.metrics.close()
        print_headline(summary, path)
        ok = status in ("completed", "stopped")  # stopped: an operator ended it on purpose
        self.send(self.pub, Stop(ok=ok, reason=reason or status))
        self.publish_status(time.monotonic())  # consoles see the end
        self.exit_code = 0 if ok else 1
        self.stopping = True

    def _on_signal(self, signum: int, _frame: Any) -> None:
        self.termination = signal.Signals(signum).name

    def close(self) -> None:
        self.pub.setsockopt(zmq.LINGER, 1000)  # let Stop reach the nodes
        self.pub.close()
        self.status_pub.setsockopt(zmq.LINGER, 500)  # and the last status the consoles
        self.status_pub.close()
        super().close()


def print_headline(s: dict, path: Any) -> None:
    out = sys.stdout
    if s["ok"]:
        oracle = f" (oracle {s['oracle_auc']:.4f})" if s.get("oracle_auc") else ""
        print(f"zbus: job {s['job']} completed in {s['wall_s']:.1f} s: auc {s['auc']:.4f}"
              f"{oracle}, logloss {s['logloss']:.4f}", file=out)
        workers = ", ".join(f"{w} {n}" for w, n in s["workers"].items())
        rate = s["samples_per_s"] or 0
        print(f"zbus: {s['samples_trained']} samples trained at {rate:,.0f}/s ({workers}); "
              f"{s['rejected_rows'] or 0} rows rejected", file=out)
    else:
        print(f"zbus: job {s['job']} {s['status']}: {s['reason']}", file=out)
    print(f"zbus: summary in {os.path.relpath(path)}", file=out, flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_role_args("control", argv)
    job = load_job_or_exit(args.job, "control")
    setup_logging("control-0")
    try:
        resume = resumable_run(job.name, args.resume, dict(os.environ)) if args.resume \
            else None
        control = Control(job, resume=resume)
    except (OSError, ResumeError) as exc:
        print(f"zbus control: cannot start: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    sys.exit(control.run())


if __name__ == "__main__":
    main()
