"""The feeder's passes (``Passes``): control's assignment of the parts, the pass under way
(``roles.algorithms.feeding.passes.FeedingPass``) over the streams of its parts, a training pass
begun, an evaluation pass, a lost feeder's parts taken over, a pass finished and reported.

Batch ids are (epoch, part, batch number), the same whichever feeder reads a part. With every
heartbeat the feeder tells control how far each part's pass has got (FeederProgress), so that a
live feeder can take a lost one's part on from there (the PartMap's ``resume``). With
``[train] batch_by_label`` every training batch holds samples of one label.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from roles.algorithms.feeding.ledger import PartProgress
from roles.algorithms.feeding.parts import FeederParts
from roles.algorithms.feeding.passes import FeedingPass, PartStream, Pass
from roles.algorithms.feeding.stream_pass import StreamPass
from roles.algorithms.feeding.tally import FeederTally
from roles.algorithms.sync.feeder import FeederSync
from roles.data.index import Part
from roles.data.stream import Tally
from roles.feeder.ledger_side import LedgerSide
from roles.feeder.loading import Loading
from roles.job.cli import MAX_WORKERS
from roles.job.settings import Job
from roles.protocol.datapath import PartMap, max_in_flight
from zbus.codec import Message

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Warmed:
    """A pass's first parts, begun before the pass (``Passes.warm``): each part's stream, its
    progress (from nothing; None for an evaluation) and the tally its rows are counted in."""

    epoch: int
    eval: bool
    parts: dict[int, tuple[PartStream, PartProgress | None, Tally]]


class Passes:
    """``set_state`` sets the state the heartbeat shows, ``report`` sends control a report,
    ``pump`` sends what can be sent."""

    def __init__(self, job: Job, index: int, loading: Loading, ledger: LedgerSide,
                 tally: FeederTally, sync: FeederSync, set_state: Callable[[str], None],
                 report: Callable[[Message], None], pump: Callable[[], None],
                 trained: Callable[[], None] = lambda: None):
        """``trained`` is called as a training pass ends, before its report."""
        self.trained = trained
        self.job, self.loading, self.ledger, self.tally, self.sync = \
            job, loading, ledger, tally, sync
        self.set_state, self.report, self.pump = set_state, report, pump
        self.parts = FeederParts(index)  # control's assignment of the parts
        self.plan: Pass | None = None
        self.phase = ""           # the last state set here: training, evaluating, waiting, ready
        self.epoch = -1
        self.evaluated = -1
        self.eval_round = 0
        self.epoch_started = 0.0
        self.warmed: list[Warmed] = []   # at most an evaluation's and the next training's
        self.begun_ahead = 0             # streams of a pass that were warmed before it

    def enter(self, phase: str) -> None:
        self.phase = phase
        self.set_state(phase)

    def current(self) -> Pass | None:
        """The pass under way (None between passes)."""
        return self.plan

    # -- the parts ---------------------------------------------------------------------------
    def newer_map(self, version: int) -> bool:
        return self.parts.map is None or version > self.parts.map.version

    def has_map(self) -> bool:
        return self.parts.map is not None

    def take_parts(self, m: PartMap) -> list[int]:
        """Control's new map; the parts it newly gives this feeder (none with the first)."""
        new = self.parts.take(m)
        log.info("part map %d: this feeder reads part(s) %s", m.version,
                 self.parts.describe(self.parts.mine()))
        return new

    def training_parts(self) -> tuple[list[Part], int]:
        """This feeder's training parts, and how many training parts there are in all."""
        training = [p for p in self.parts.parts if not p.eval]
        return [self.part(n) for n in self.parts.mine(eval=False)], len(training)

    def opening(self, epoch: int) -> list[Part]:
        """The training parts this feeder opens first in ``epoch`` (``[data] parts_open``, in
        that epoch's order)."""
        order = self.loading.order(self.parts.mine(eval=False), epoch)
        return [self.part(n) for n in order[:self.job.data.parts_open]]

    def part(self, number: int) -> Part:
        return self.parts.parts[number]

    def fed(self) -> bool:
        """Control has said which parts are this feeder's and how to transform them (a feeder
        given no part has nothing to feed)."""
        return self.loading.prepared() and self.parts.map is not None

    def may_train(self, epoch: int) -> bool:
        return self.fed() and epoch > self.epoch

    def may_evaluate(self, epoch: int) -> bool:
        # greater: restarted after its training pass
        return self.fed() and epoch > self.evaluated and epoch >= self.epoch

    # -- beginning a pass --------------------------------------------------------------------
    def take_over(self, new: list[int]) -> None:
        """Parts of a lost feeder: feed what it had left of the pass under way (or of the
        pass just reported, which control still waits for), from where it had got to."""
        plan = self.plan
        assert plan is None or isinstance(plan, FeedingPass), "a stream's parts stay put"
        training = [i for i in new if self.parts.handed_over(i) and not self.parts.parts[i].eval]
        scoring = [i for i in new if self.parts.scoring(i) and self.evaluated == self.epoch]
        log.warning("took over part(s) %s of a lost feeder", new)
        if plan is not None and not plan.eval and training:
            for i in training:
                plan.add(self.training_stream(i, self.epoch))
        elif plan is None and training and self.phase == "waiting":
            self.begin_pass(FeedingPass(self.epoch, False), training)
        elif plan is not None and plan.eval and scoring:
            for i in scoring:
                plan.add(self.eval_stream(i))
        elif plan is None and scoring:
            self.plan = FeedingPass(self.epoch, True, [self.eval_stream(i) for i in scoring])
            self.enter("evaluating")
            self.tally.new_evaluation()
        self.pump()
        self.maybe_pass_done()

    def training_stream(self, number: int, epoch: int,
                        logged: PartProgress | None = None) -> PartStream:
        """The part's batches for the epoch, resumed where this feeder's previous process had
        got to (``logged``, from its ack log) or a lost feeder had (PartMap); a part warmed
        for the epoch, from the start, is the stream begun then."""
        resumed = logged or self.parts.resumed(number, epoch)
        warmed = self.take_warmed(epoch, False, number)
        if warmed is not None and resumed is None:
            stream, progress, tally = warmed
            assert progress is not None
            self.tally.part_planned(number, progress)
            self.tally.adopt(tally)
            return stream
        progress = resumed or PartProgress(epoch)
        done = self.tally.part_planned(number, progress)
        if done is not None:
            log.info("part %d resumes epoch %d after %d acknowledged batches", number,
                     epoch + 1, done)
        return self.loading.training(self.part(number), epoch, progress, self.tally.data,
                                     self.made)

    def made(self, part: int, seq: int, samples: int, before: bool) -> None:
        """A batch of the training pass was made (of the pass under way when it is made: a
        warmed stream makes its batches in the pass it joins)."""
        self.tally.batches.made(part, seq, samples, before)

    def eval_stream(self, number: int) -> PartStream:
        warmed = self.take_warmed(self.epoch, True, number)
        if warmed is not None:
            self.tally.adopt(warmed[2])
            return warmed[0]
        return self.loading.evaluation(self.part(number), self.tally.data)

    # -- warming the next passes -------------------------------------------------------------
    def take_warmed(self, epoch: int, eval: bool,
                    number: int) -> tuple[PartStream, PartProgress | None, Tally] | None:
        found = next((w.parts.pop(number) for w in self.warmed
                      if (w.epoch, w.eval) == (epoch, eval) and number in w.parts), None)
        self.begun_ahead += found is not None
        return found

    def all_taken(self) -> None:
        """The training pass has given out its last batch (the workers train the last ones):
        begin its evaluation's first part and the next epoch's first parts now."""
        self.warm(self.epoch, eval=True)
        self.warm(self.epoch + 1)

    def warm(self, epoch: int, eval: bool = False) -> None:
        """Begin a pass's first parts before it starts: its evaluation's first part and the
        next training pass's first ``[data] parts_open`` (in that epoch's order) while the
        workers train a pass's last batches, the first training pass's once the statistics
        are in. A part's first batch waits for its block to be read, parsed and prepared and,
        in training, for its share of the shuffle buffer to fill (with a small file, the whole
        part: tens of milliseconds of an epoch of hundreds), which the reader thread then does
        while the workers are busy. What is made ahead is what the pass would hold at its
        start anyway. A part that is not this feeder's by then, or is resumed, is read again
        from its start in the pass (what was read for it is dropped)."""
        if not self.fed() or epoch >= self.job.train.epochs \
                or any((w.epoch, w.eval) == (epoch, eval) for w in self.warmed) \
                or (epoch <= self.epoch if not eval else epoch <= self.evaluated):
            return
        parts: dict[int, tuple[PartStream, PartProgress | None, Tally]] = {}
        if eval:
            for number in self.parts.mine(eval=True)[:1]:   # an evaluation reads one at a time
                tally = Tally()
                stream = self.loading.evaluation(self.part(number), tally)
                stream.warm()
                parts[number] = (stream, None, tally)
        else:
            for number in (p.number for p in self.opening(epoch)):
                if self.parts.resumed(number, epoch) is not None:
                    continue
                progress, tally = PartProgress(epoch), Tally()
                stream = self.loading.training(self.part(number), epoch, progress, tally,
                                               self.made)
                stream.warm()
                parts[number] = (stream, progress, tally)
        self.warmed.append(Warmed(epoch, eval, parts))

    def drop_warmed(self, epoch: int, eval: bool) -> None:
        """A pass has begun: what was warmed for it, or for an earlier one, and not taken is
        dropped."""
        self.warmed = [w for w in self.warmed if (w.epoch, w.eval) > (epoch, eval)]

    def start_training(self, epoch: int) -> None:
        self.epoch = epoch
        self.tally.new_epoch(epoch)
        logged = self.ledger.new_epoch(epoch)
        # a new order of its parts every epoch; a restarted feeder: where its previous process
        # had got to in this pass
        parts = self.loading.order(self.parts.mine(eval=False), epoch)
        self.begin_pass(FeedingPass(epoch, False, open=self.job.data.parts_open), parts, logged)

    def begin_pass(self, pass_: FeedingPass, parts: list[int],
                   logged: dict[int, PartProgress] | None = None) -> None:
        self.enter("training")
        self.tally.new_pass()
        self.epoch_started = time.monotonic()
        self.plan = pass_
        for n in parts:
            pass_.add(self.training_stream(n, pass_.epoch, (logged or {}).get(n)))
        self.drop_warmed(pass_.epoch, False)
        log.info("epoch %d: training on %d part(s)", pass_.epoch + 1, len(pass_.streams))
        self.ledger.pass_rebuilt()
        self.pump()
        self.maybe_pass_done()

    def begin_stream(self, pass_: StreamPass) -> None:
        """A stream job's one training pass (its part this feeder's own: ``pass_.part``)."""
        self.epoch = pass_.epoch
        self.tally.new_epoch(pass_.epoch)
        logged = self.ledger.new_epoch(pass_.epoch).get(pass_.part)
        if logged is None and pass_.sent_before:   # a dead process sent, none acknowledged:
            logged = PartProgress(pass_.epoch)    # a restart all the same
        # a restarted feeder: its batches are numbered above any its dead process sent
        first = pass_.resume(logged, max_in_flight(MAX_WORKERS, self.job.train.prefetch))
        if logged is not None and first is not None:
            log.warning("restarted: the stream's batches go on from number %d (%d acked by "
                        "its previous processes)", first, logged.low + len(logged.above))
            logged.skip_below(first)
            self.ledger.log().skip_below(pass_.epoch, pass_.part, first)
        self.enter("training")
        self.tally.new_pass()
        self.tally.part_planned(pass_.part, logged or PartProgress(pass_.epoch))
        self.epoch_started = time.monotonic()
        self.plan = pass_
        log.info("training on the stream")
        self.ledger.pass_rebuilt()
        self.pump()

    def start_evaluation(self, epoch: int, round_: int) -> None:
        self.epoch = epoch
        self.evaluated, self.eval_round = epoch, round_
        self.enter("evaluating")
        self.tally.new_evaluation()
        self.plan = FeedingPass(epoch, True, [self.eval_stream(n)
                                              for n in self.parts.mine(eval=True)])
        self.drop_warmed(epoch, True)
        self.ledger.pass_rebuilt()
        self.pump()
        self.warm(epoch + 1)   # if the training pass's end did not (a restarted feeder)
        self.maybe_pass_done()

    # -- ending a pass -----------------------------------------------------------------------
    def at_tail(self) -> bool:
        """Every batch of the pass (or, in sync mode round, of the round) has been sent."""
        return self.plan is not None and (self.plan.exhausted() or (
            not self.plan.eval and self.sync.round_full()))

    def maybe_pass_done(self) -> None:
        """A pass with no batch (no part) is over as soon as it starts."""
        if self.plan is not None and not self.ledger.in_flight() and self.plan.exhausted():
            self.all_acked()

    def maybe_drained(self) -> None:
        """A batch was acknowledged: once nothing is in flight, see what is done."""
        if not self.ledger.in_flight() and self.plan is not None:
            self.all_acked()

    def all_acked(self) -> None:
        """Nothing is in flight: a sync round, and maybe the whole pass, is done."""
        assert self.plan is not None
        drained = self.sync.all_acked(self.plan.eval)
        if drained is not None:
            self.report(drained)
        if self.plan.exhausted():
            self.finish_pass()

    def finish_pass(self) -> None:
        plan, self.plan = self.plan, None
        assert plan is not None
        if plan.eval:
            self.enter("ready")
            log.info("epoch %d eval: %d samples scored", plan.epoch + 1,
                     self.tally.scores.rows)
            self.report(self.tally.eval_report(plan))
        else:
            seconds = time.monotonic() - self.epoch_started
            log.info("epoch %d trained: %d samples in %.1f s", plan.epoch + 1,
                     self.tally.epoch_samples, seconds)
            self.enter("waiting")
            self.trained()
            self.report(self.tally.epoch_trained(plan, seconds))
