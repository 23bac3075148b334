"""The job's course, as control runs it: every expected node says Hello (same job fingerprint)
and Ready, feeder 0 indexes the data -> the feeders get their parts and summarise them
(``roles.control.feeding``) -> EpochStart(e) -> every part's EpochTrained(e) -> the rounds
bring every worker to the same weights (``roles.control.rounds``) -> Evaluate(e, round) ->
every part's EvalReport(e) -> the next epoch, or Export (the model into runs/<run>/export/) ->
Finish (every node sends its final counters) -> the summary -> Stop.

Phases: starting, preparing, training, syncing, evaluating, exporting, finishing, done.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from roles.control.commands import Commands, ProgressClock
from roles.control.exports import Exports
from roles.control.feeding import Feeding
from roles.control.rounds import Rounds
from roles.control.streaming import StreamCourse
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.protocol.lifecycle import EpochStart, EpochTrained, EvalReport, Evaluate, Exported
from zbus.messages import Finish

log = logging.getLogger(__name__)
RUNNING = ("training", "syncing", "evaluating")           # an operator may export, back up
ACTIVE = ("training", "syncing", "evaluating", "exporting")  # workers are needed


@dataclass
class CourseState:
    phase: str = "starting"
    epoch: int = -1
    paused: bool = False
    finish_status: list[str] = field(default_factory=lambda: ["completed", ""])


class Course:
    def __init__(self, job: Job, commands: Commands, metrics: MetricsLog, rounds: Rounds,
                 feeding: Feeding, exports: Exports, progress: ProgressClock):
        self.job = job
        self.commands = commands
        self.metrics = metrics
        self.rounds = rounds
        self.feeding = feeding
        self.exports = exports
        self.progress = progress
        self.phase = "starting"
        self.epoch = -1
        self.paused = False               # an operator paused feeding
        self.finish_status = ("completed", "")
        self.finish_deadline = 0.0
        self.epochs: list[dict] = []      # one record per epoch: training, then evaluation
        self.stream = StreamCourse(job, commands)   # a stream job's end and figures

    @property
    def running(self) -> bool:
        return self.phase in RUNNING

    @property
    def active(self) -> bool:
        return self.phase in ACTIVE

    def start_epoch(self, epoch: int, now: float) -> None:
        self.epoch, self.phase = epoch, "training"
        self.rounds.new_epoch()
        self.feeding.new_epoch()
        self.progress.touch(now)
        self.metrics.write("epoch_start", epoch=epoch)
        if self.job.streaming:
            log.info("training on the stream starts")
        else:
            log.info("epoch %d of %d starts", epoch + 1, self.job.train.epochs)
        self.commands.publish(EpochStart(epoch=epoch), "data")

    def trained(self, m: EpochTrained, now: float) -> None:
        if self.phase != "training" or m.epoch != self.epoch:
            return
        figures = self.feeding.trained(m, now)
        if figures is None:
            return
        self.epochs.append({"epoch": m.epoch, "train_samples": figures.samples,
                            "train_loss": figures.loss, "train_s": figures.seconds,
                            **figures.rows})
        if self.job.streaming:   # no evaluation pass: the stream's scores are progressive
            self.metrics.write("epoch", **self.epochs[-1])
            log.info("the stream trained %d events in %.1f s, loss %.4f", figures.samples,
                     figures.seconds, figures.loss or float("nan"))
            self.progress.touch(now)
            self.last_pass_done(now)
            return
        self.phase = "syncing"
        self.sync_for_eval()

    def sync_for_eval(self) -> None:
        """Every worker evaluates the same weights: once the rounds say which, evaluate."""
        round_ = self.rounds.round_for_eval()
        if round_ is None:
            return
        self.phase = "evaluating"
        self.commands.publish(Evaluate(epoch=self.epoch, round=round_), "data")

    def evaluated(self, m: EvalReport, now: float) -> None:
        if self.phase != "evaluating" or m.epoch != self.epoch:
            return
        result = self.feeding.evaluated(m, now)
        if result is None:
            return
        scores, grouped = result
        figures = scores.record(self.job.tasks, grouped)
        auc, logloss = figures["auc"], figures["logloss"]
        record = self.epochs[-1]
        record.update(**figures, eval_samples=scores.rows)
        self.metrics.write("epoch", **record)
        log.info("epoch %d: train loss %.4f, eval auc %.4f, logloss %.4f (%d samples in "
                 "%.1f s)", m.epoch + 1, record["train_loss"] or float("nan"), auc, logloss,
                 record["train_samples"], record["train_s"])
        self.progress.touch(now)
        if m.epoch + 1 < self.job.train.epochs:
            self.start_epoch(m.epoch + 1, now)
        else:
            self.last_pass_done(now)

    def last_pass_done(self, now: float) -> None:
        """The job's last pass is done: the export, else the end."""
        if not self.job.checkpoint.export:   # [checkpoint] export = false: nothing to write
            self.finish(now)
        else:
            self.phase = "exporting"
            self.exports.start(final=True, now=now)

    def last_evaluated(self) -> dict:
        return next((r for r in reversed(self.epochs) if "auc" in r), {})

    def exported(self, m: Exported, now: float, *, generation: int) -> None:
        done = self.exports.exported(m, now, round_=self.rounds.round, generation=generation,
                                     last_epoch=self.last_evaluated())
        if done is not None and done.final:
            self.finish(now)

    def export_overdue(self, now: float, timeout_s: float) -> None:
        failed = self.exports.overdue(now, timeout_s)
        if failed is not None and failed.final:
            self.finish(now)

    def finish(self, now: float, status: tuple[str, str] = ("completed", "")) -> None:
        """Every node sends its final counters, then the job ends with ``status``."""
        self.finish_status = status
        self.phase = "finishing"
        self.commands.standing.clear()
        # a live node answers within a heartbeat or two; one that does not within
        # node_timeout_s is failed anyway (its figures stay those of its last heartbeat)
        c = self.job.cluster
        self.finish_deadline = now + max(3 * c.heartbeat_s, c.node_timeout_s)
        self.commands.publish(Finish(), "finish")

    def to_state(self) -> CourseState:
        return CourseState(self.phase, self.epoch, self.paused, list(self.finish_status))

    def from_state(self, s: CourseState, now: float) -> None:
        """A resumed control; an export under way is made again, a finish is finished."""
        self.phase, self.epoch, self.paused = s.phase, s.epoch, s.paused
        self.finish_status = (s.finish_status[0], s.finish_status[1])
        if self.phase == "exporting":
            self.exports.start(final=True, now=now)
        elif self.phase == "finishing":
            self.finish(now, self.finish_status)
