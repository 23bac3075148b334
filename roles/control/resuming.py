"""A resumed control: its first decision (``Resuming``), and its part in the run
(``Resumption``: its records read back, the nodes awaited, the roll back).

The first decision: go on with the nodes that live, or take the whole job back to its newest
complete checkpoint.

A node that lived through control's death answers control's first word with Hello naming the
run (it rejoins); a process started anew says Hello with no run. So: the first rejoin means
the nodes live on, and control goes on from its own latest records (a new process among them
is a restarted node, recovered as usual). If instead every node that holds state (every
feeder, shard and aggregator of the job) says Hello anew and none rejoins, the whole job was
killed: control goes back to the checkpoint, and so does every node (Welcome ``rollback``).
Until it has decided, control leaves the new nodes' Hellos unanswered (they say it again),
and publishes none of its records' commands, only ``Deciding`` (``roles.control.commands``).

A control whose run directory is gone (a new machine, a rescheduled pod) takes the records its
predecessor handed over when its pod was stopped (``roles.control.handover``: as new as the
nodes', so it goes on with them); without those, it takes its records from the newest
complete checkpoint in the checkpoint store (``records_from``): they are older than what live
nodes hold, so it cannot go on with them. It refuses a node that rejoins (the node
exits; started again, it says Hello anew) and goes back to the checkpoint once every stateful
node has.

A control that started its run anew (not resumed) does not know a node that says Hello naming
the run unless it welcomed it itself (the node looked control's name up anew and says Hello
again, in case control moved): an unknown one belongs to an earlier control of the same name
whose records are gone (a pod's run directory is always ``run``: control's pod stopped without a
``[checkpoint] dir`` to hand its records over to, then made again with an empty disk). It is
refused too, and joins the new run as a new process once started again.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from roles.algorithms.control.membership import ALIVE
from roles.checkpoint.files import latest_complete
from roles.control.commands import ProgressClock
from roles.control.handover import handed_over, remove_handover
from roles.control.state import (
    STATE_FILE,
    ControlComponents,
    ResumeError,
    read_state,
    restore,
    write_records,
)
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.protocol.lifecycle import Membership
from roles.protocol.operator import FeedingPaused

log = logging.getLogger(__name__)
STATEFUL_ROLES = ("feeder", "ps", "aggregator")


class Resuming:
    def __init__(self, expected: list[str], resumed: bool):
        self.stateful = {n for n in expected if n.rsplit("-", 1)[0] in STATEFUL_ROLES}
        self.resumed = resumed       # started on a run's records (--resume), not anew
        self.pending = resumed       # a resumed control that has not decided yet
        self.rolled_back = False     # decided: the whole job went back to a checkpoint
        self.rollback_id = ""        # that roll back's name (Welcome), once decided
        self.fresh: set[str] = set()
        self.checkpoint = 0          # the records came from this checkpoint: no rejoin

    def records_from(self, checkpoint: int) -> None:
        self.checkpoint = checkpoint

    def hello(self, node_id: str, role: str, rejoin: bool, known: bool = True) -> str:
        """``go``: handle the Hello as usual; ``wait``: leave it unanswered for now;
        ``roll back``: every stateful node is new, go back to the checkpoint (then ``go``);
        ``refuse``: a node of the run rejoins a control whose records came from a checkpoint,
        or one (not ``known``) a control that started the run anew."""
        if not self.pending:
            return "refuse" if rejoin and not known and not self.resumed else "go"
        if rejoin and self.checkpoint:
            return "refuse"
        if rejoin:
            self.pending = False
            return "go"
        if role in STATEFUL_ROLES:
            self.fresh.add(node_id)
        if self.fresh >= self.stateful:
            self.pending = False
            self.rolled_back = True
            return "roll back"
        return "wait"


class Resumption:
    """A resumed control's part of the run, given control's components: where its records come
    from (``from_disk``), the whole job's roll back to its newest complete checkpoint
    (``roll_back``), the nodes it waits for to say Hello again, and the run's start on the wall
    clock (which the records keep, so that a run's wall time spans its resumes). ``decision``
    is the first decision above (``Resuming``)."""

    def __init__(self, job: Job, run_dir: Path, run_id: str, parts: ControlComponents,
                 metrics: MetricsLog, progress: ProgressClock, resumed: bool):
        self.job = job
        self.run_dir = run_dir
        self.run_id = run_id
        self.parts = parts
        self.metrics = metrics
        self.progress = progress
        self.decision = Resuming(parts.members.expected, resumed)
        self.started_at = time.time()  # the run's start, for its wall time across a resume
        self.run_before_s = 0.0        # resumed: how long the run had been going
        self.awaiting_rejoin: set[str] = set()  # resumed: nodes that have not said Hello
        self.restarting = False  # back at a checkpoint: no worker has joined since
        self.rejoining = False   # back at a checkpoint: a node holding state is not back yet
        if resumed:   # its records' commands go out once it has decided (``decided``)
            parts.commands.hold()

    def from_disk(self, now: float) -> dict | None:
        """Control's records from its run directory; a run directory without them (a new
        machine or pod: its disk is gone) takes the records the control before it handed over
        (``roles.control.handover``), else those of the newest complete checkpoint in the
        job's checkpoint store, and the whole job goes back to that checkpoint. Handed-over
        records are copied into the run directory and removed from the store. Returns the
        run's model plan (None: the network is not partitioned); ResumeError when the records
        cannot be used (StorageError: the store cannot be reached)."""
        source: Path | str = self.run_dir
        store = self.parts.checkpoints.store
        handed = handed_over(store) if self.job.checkpoint.dir else None
        if not (self.run_dir / STATE_FILE).exists():
            if handed is not None:
                source = handed
                log.warning("%s holds no control state: control takes the records the control "
                            "before it handed over when its pod was stopped (%s); the nodes "
                            "join it again", self.run_dir, handed)
            elif (found := latest_complete(store)) is not None:
                source = found[1]
                self.decision.records_from(found[0])
                log.warning("%s holds no control state: control takes its records from "
                            "checkpoint %d (%s), and the whole job goes back to it",
                            self.run_dir, found[0], found[1])
        state, history = read_state(source, self.job)
        if handed is not None:   # into the run directory, then out of the store
            if source == handed:
                write_records(self.run_dir, state, history)
            remove_handover(store)
        self.started_at = state.started_at
        self.run_before_s = max(0.0, time.time() - self.started_at)
        restore(self.parts, state, history, now)
        m = self.parts.members
        self.awaiting_rejoin = {n for n, s in m.nodes.items() if s.status == ALIVE}
        self.progress.touch(now)
        s = state.course
        self.metrics.write("resume", phase=s.phase, epoch=s.epoch, round=state.rounds.round,
                           nodes=sorted(n for n, s in m.nodes.items() if s.ready))
        log.warning("resumed run %s: phase %s, epoch %d, round %d; waiting for the nodes to "
                    "join again", self.run_id, s.phase, s.epoch + 1, state.rounds.round)
        self.parts.course.from_state(state.course, now)
        return history.model_plan

    def roll_back(self, now: float) -> str:
        """Every node of the run is a new process: the whole job goes back to its newest
        complete checkpoint. Why it cannot ("": it went back); the job then fails for good."""
        p = self.parts
        found = latest_complete(p.checkpoints.store)
        if found is None:
            return (f"every node of run {self.run_id} was started again and the run has no "
                    "complete checkpoint to go back to (the first is taken "
                    f"[checkpoint] every_s = {self.job.checkpoint.every_s:g} s into "
                    "training): start the job again")
        number, where, manifest = found
        try:
            state, history = read_state(where, self.job)
        except ResumeError as exc:
            return f"cannot go back to checkpoint {number}: {exc}"
        paused = p.course.paused   # the operator's latest word (this control's records)
        restore(p, state, history, now)
        m = p.members
        m.restart_all()   # every node joins anew, from the checkpoint
        self.awaiting_rejoin = set()
        self.restarting = True
        self.rejoining = True   # no checkpoint until every node holding state is back
        p.commands.withdraw("checkpoint")
        p.commands.publish(Membership(version=m.version, workers=[]), "members")
        self.decision.rollback_id = f"{self.run_id}:{number}:{time.time_ns()}"
        p.checkpoints.rollbacks.append({"checkpoint": number, "round": manifest["round"],
                                        "epoch": state.course.epoch,
                                        "at_s": round(time.time() - self.started_at, 1),
                                        "retrained_samples": 0})
        p.course.from_state(state.course, now)
        # feeding paused or not as the operator last said, not as when the checkpoint was cut
        # (a cut asked while paused would pause the job again after a crash, a "resume" sent
        # before the nodes joined again answered "already running")
        p.course.paused = paused
        p.commands.publish(FeedingPaused(paused=paused), "feeding")
        self.progress.touch(now)
        self.metrics.write("rollback", checkpoint=number, round=manifest["round"],
                           epoch=state.course.epoch)
        log.warning("every node was started again: the whole job goes back to checkpoint %d "
                    "(epoch %d, round %d); what was trained after it is trained again", number,
                    state.course.epoch + 1, manifest["round"])
        return ""

    def decided(self) -> None:
        """Once the first decision is taken (go on with the nodes, or back to the checkpoint,
        whose records then stand): control's commands go out, before any Welcome does
        (``roles.control.commands``)."""
        if not self.decision.pending:
            self.parts.commands.release()

    def cannot_go_on(self) -> str:
        """Why this control cannot go on with the nodes that lived through its predecessor's
        death ("": it can): a key migration was under way."""
        return self.parts.placement.cannot_go_on()

    def waiting(self) -> bool:
        """Not every node of the run is known to be back yet (no checkpoint is cut)."""
        return self.decision.pending or bool(self.awaiting_rejoin)

    def not_restored(self, missing: list[str]) -> list[str]:
        """Back at a checkpoint: the nodes holding state (all but workers) of ``missing``
        (the expected nodes not ready) that have not restored it yet, no checkpoint being cut
        before them, as it would write what they hold; [] once every one is back, from then
        on."""
        if self.rejoining:
            away = [n for n in missing if not n.startswith("worker-")]
            if away:
                return away
            self.rejoining = False
        return []

    def owes_hello(self, node_id: str) -> bool:
        """A node of the run that lived on and has not said Hello to this control yet."""
        return node_id in self.awaiting_rejoin

    def said_hello(self, node_id: str) -> None:
        self.awaiting_rejoin.discard(node_id)

    def ready(self, info: dict) -> None:
        """A node's Ready after the job went back: the samples it trains again."""
        if self.decision.rolled_back and isinstance(info.get("retrained_samples"), int):
            self.parts.checkpoints.rollbacks[-1]["retrained_samples"] += \
                info["retrained_samples"]

    def workers_restarting(self, live: bool) -> bool:
        """Back at a checkpoint and no worker live since (``live``: one is now): every worker
        starts anew (images pulled, pods scheduled, torch imported), so they have
        ``start_timeout_s`` to join, as at the job's start."""
        if live:
            self.restarting = False
        return self.restarting

    def not_back(self, uptime_s: float) -> str | None:
        """A resumed control that has heard from no node of its run: why the job fails once
        ``start_timeout_s`` has passed, or None."""
        limit = self.job.cluster.start_timeout_s
        if uptime_s <= limit:
            return None
        missing = sorted(self.decision.stateful - self.decision.fresh)
        return (f"resumed, but no node of run {self.run_id} came back within "
                f"start_timeout_s = {limit:.0f} s (still missing: {', '.join(missing)})")
