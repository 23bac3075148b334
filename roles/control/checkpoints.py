"""Control's part in whole-job checkpoints: the consistent cut (the messages are
``roles.protocol.checkpoint``, the files ``roles.checkpoint``).

A cut is a moment at which nothing is in flight and every worker's dense progress is in the
aggregator, so that the parts the roles write agree: every batch acknowledged before it is in
the feeders' ack logs, in the shards' rows (its embedding gradients applied: its id in their
applied sets) and in the aggregator's weights; no batch after it is anywhere. It is made the
way a placement migration drains the data path, in four steps:

1. **drain**: feeders stop sending new batches and report once every batch of theirs is
   acknowledged (a lost worker's batches go out again meanwhile, as always);
2. **flush**: one aggregation round brings every live worker's progress into the aggregator
   (sync mode round: the round the feeder reports drained does);
3. **write** of round r: the aggregator, the shards and the feeders each copy their state (a
   shard first waits for the gradients of the batches it holds, which are on their way) and
   report Snapshotted; control captures its own records;
4. **resume**: feeding goes on as soon as every snapshot is taken; the files are written off
   the loops meanwhile (a shard forks: its pause is the fork), and control writes the
   manifest once every part is on disk. Only then is the checkpoint complete.

Training pauses from 1 to 4 (measured: ``pause_s`` in each record). A cut that cannot finish
within ``timeout_s`` (a node died, a write failed, the epoch ended first) is abandoned, and
training goes on. A cut begins every ``every_s`` after the previous one ended, and when an
operator asks (``zbus-ctl checkpoint``), while the job trains an epoch with every shard and
the aggregator up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from roles.algorithms.control.membership import ALIVE, Members
from roles.checkpoint.files import (
    location_of,
    number_name,
    numbers_on_disk,
    prune,
    read_manifest,
    write_manifest,
)
from roles.control.commands import Commands, ProgressClock
from roles.control.rounds import Rounds
from roles.data.hashing import KEY_HASH
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.job.summary import CheckpointFigures
from roles.protocol.checkpoint import Checkpoint, CheckpointDrained, CheckpointPart, Snapshotted
from roles.protocol.status import CheckpointView, LatestCheckpoint, TaskFigures
from roles.storage.fs import StorageError
from roles.storage.store import Store

log = logging.getLogger(__name__)
RECORDS_KEPT = 50  # the newest checkpoints' records in the history (the totals cover all)
# what a cut is doing in each phase, for the status's tasks and the log
PHASE_TASKS = {"drain": ("draining the feeders", "feeders"),
               "flush": ("a round brings the workers' progress in", "rounds"),
               "write": ("snapshots", "parts"), "resume": ("writing the files", "parts")}


@dataclass
class CheckpointsState:
    number: int = 0      # the newest cut begun
    complete: int = 0    # the newest complete checkpoint


@dataclass
class Cut:
    number: int
    reason: str
    began: float
    dir: str          # where its files go: a directory, or an object store's URI
    feeders: set[str]
    writers: set[str]
    phase: str = "drain"
    drained: set[str] = field(default_factory=set)
    round: int | None = None        # the flush round, once called or known
    flushed_at: float = 0.0
    snapshots: dict[str, Snapshotted] = field(default_factory=dict)
    resumed_at: float = 0.0
    parts: dict[str, CheckpointPart] = field(default_factory=dict)
    control_files: dict[str, bytes] = field(default_factory=dict)


class Checkpoints:
    def __init__(self, job: Job, store: Store, members: Members, commands: Commands,
                 rounds: Rounds, metrics: MetricsLog, progress: ProgressClock,
                 capture: Callable[[int], dict[str, bytes]]):
        """``store``: where the checkpoints go (``roles.checkpoint.files.checkpoint_store``);
        ``capture(n)``: control's own files for checkpoint n (its records at the cut)."""
        self.config = job.checkpoint
        self.job = job
        self.store = store
        self.members = members
        self.commands = commands
        self.rounds = rounds
        self.metrics = metrics
        self.progress = progress
        self.capture = capture
        self.number = 0
        self.complete = 0
        self.cut: Cut | None = None
        self.next_due = float("inf")   # set when training starts
        self.asked: str | None = None  # an operator asked for one
        self.records: list[dict] = []
        self.rollbacks: list[dict] = []  # the job went back to a checkpoint (--resume)
        self.totals = {"complete": 0, "aborted": 0, "bytes": 0, "max_pause_s": 0.0,
                       "max_shard_pause_s": 0.0}
        # the newest complete checkpoint, for the status: number, at (wall clock), bytes,
        # pause_s, shard_pause_s, dir (from its record, or from its manifest on disk)
        self.newest: dict | None = None

    @property
    def latest_dir(self) -> str:
        """The newest complete checkpoint's directory ("" before the first)."""
        return str(location_of(self.store, self.complete)) if self.complete else ""

    # -- when ---------------------------------------------------------------------------------
    def training_started(self, now: float) -> None:
        if self.next_due == float("inf") and self.config.every_s > 0:
            self.next_due = now + self.config.every_s

    def request(self, sender: str, blocker: str | None) -> tuple[bool, str]:
        """An operator asks for a checkpoint now."""
        if self.cut is not None:
            return False, f"checkpoint {self.cut.number} is being taken"
        if blocker:
            return False, f"not now: {blocker}"
        self.asked = sender
        return True, f"checkpoint {self.number + 1} begins"

    def tick(self, now: float, blocker: str | None) -> None:
        """Begin a cut when one is due and nothing stands in the way (``blocker``); abandon
        the one under way when it cannot finish."""
        cut = self.cut
        if cut is None:
            if blocker is None and (self.asked or now >= self.next_due):
                self.begin(now, f"asked by {self.asked}" if self.asked else "every_s")
                self.asked = None
            return
        lost = sorted(n for n in cut.writers - set(cut.parts)
                      if n not in self.members.nodes or self.members.nodes[n].status != ALIVE)
        if lost:
            self.abort(now, f"{', '.join(lost)} lost")
        elif blocker is not None and cut.phase in ("drain", "flush"):
            self.abort(now, blocker, again_soon=True)
        elif now - cut.began > self.config.timeout_s:
            self.abort(now, f"not complete after timeout_s = {self.config.timeout_s:.0f} s")
        elif cut.phase == "flush":
            self.flush(now)

    def begin(self, now: float, reason: str) -> None:
        m = self.members
        # a number of its own: a run gone back to an earlier checkpoint (or a control resumed
        # from older records) has the directories of cuts it abandoned on disk, whose files
        # must not mix with a new cut's (they are pruned with the other older checkpoints)
        self.number = max([self.number, *numbers_on_disk(self.store)]) + 1
        feeders = {n for n, s in m.nodes.items() if s.role == "feeder" and s.status == ALIVE}
        writers = feeders | {n for n, s in m.nodes.items() if s.status == ALIVE and (
            s.role == "ps" or (s.role == "aggregator" and s.index == 0))}
        where = str(location_of(self.store, self.number))
        if not self.store.remote:
            Path(where).mkdir(parents=True, exist_ok=True)
        self.cut = Cut(self.number, reason, now, where, feeders, writers)
        log.info("checkpoint %d begins (%s): draining the feeders", self.number, reason)
        self.metrics.write("checkpoint_begin", number=self.number, reason=reason)
        self.publish("drain")

    def publish(self, phase: str) -> None:
        c = self.cut
        assert c is not None
        c.phase = phase
        self.commands.publish(Checkpoint(number=c.number, phase=phase,
                                         round=c.round or 0, dir=str(c.dir)), "checkpoint")

    # -- the cut ------------------------------------------------------------------------------
    def drained(self, node_id: str, m: CheckpointDrained, now: float) -> None:
        c = self.cut
        if c is None or c.phase != "drain" or m.number != c.number:
            return
        c.drained.add(node_id)
        if c.drained >= c.feeders:
            c.phase = "flush"
            self.flush(now)

    def flush(self, now: float) -> None:
        """Every feeder drained: one round brings the workers' progress in (once the rounds
        already called are over)."""
        c = self.cut
        assert c is not None
        if c.round is not None or self.rounds.in_flight or self.rounds.mode.rounds_waiting():
            return
        if not self.rounds.mode.checkpoint_round:  # the drained round was the flush
            self.flushed(self.rounds.round, now)
            return
        self.rounds.call(f"checkpoint {c.number}")
        c.round = self.rounds.round

    def round_finished(self, round_: int, now: float) -> None:
        c = self.cut
        if c is not None and c.phase == "flush" and c.round == round_:
            self.flushed(round_, now)

    def flushed(self, round_: int, now: float) -> None:
        c = self.cut
        assert c is not None
        c.round, c.flushed_at = round_, now
        c.control_files = self.capture(c.number)  # control's records at the cut
        self.publish("write")

    def snapshotted(self, node_id: str, m: Snapshotted, now: float) -> None:
        c = self.cut
        if c is None or c.phase != "write" or m.number != c.number or node_id not in c.writers:
            return
        c.snapshots[node_id] = m
        if set(c.snapshots) >= c.writers:
            c.resumed_at = now
            self.progress.touch(now)
            self.publish("resume")
            self.maybe_complete(now)

    def part(self, node_id: str, m: CheckpointPart, now: float) -> None:
        c = self.cut
        if c is None or m.number != c.number or node_id not in c.writers:
            return
        if not m.ok:
            self.abort(now, f"{node_id} could not write its part: {m.error}")
            return
        c.parts[node_id] = m
        self.maybe_complete(now)

    def maybe_complete(self, now: float) -> None:
        c = self.cut
        assert c is not None
        if c.phase != "resume" or set(c.parts) < c.writers:
            return
        control = []
        try:
            for name, data in c.control_files.items():
                control.append(f"{number_name(c.number)}/{name}")
                self.store.put_bytes(control[-1], data)
            parts = {n: p.files for n, p in c.parts.items()}
            write_manifest(self.store, c.number, {"parts": {**parts, "control": control},
                                                  "round": c.round, "job": self.job.name,
                                                  "key_hash": KEY_HASH,
                                                  "shards": self.job.cluster.shards})
        except (OSError, StorageError) as exc:
            self.abort(now, f"control could not write its files or the manifest: {exc}")
            return
        self.complete = c.number
        try:
            removed = prune(self.store, self.config.keep)
        except (OSError, StorageError) as exc:
            log.warning("older checkpoints not pruned: %s", exc)
            removed = []
        self.record(now, "complete", "", removed)
        rec = self.records[-1]
        self.newest = {"number": c.number, "at": time.time(), "bytes": rec["bytes"],
                       "pause_s": rec["pause_s"], "shard_pause_s": rec["shard_pause_s"],
                       "dir": str(c.dir)}
        self.cut = None
        self.next_due = now + self.config.every_s if self.config.every_s > 0 else float("inf")

    def abort(self, now: float, why: str, again_soon: bool = False) -> None:
        """Abandon the cut under way. The next is due ``every_s`` from now, or, when the job
        only left training under it (``again_soon``: an epoch ended during the drain), as soon
        as it trains again: with epochs about as long as ``every_s``, every cut would
        otherwise fall at an epoch's end, and none would ever complete."""
        c = self.cut
        assert c is not None
        log.warning("checkpoint %d abandoned: %s", c.number, why)
        self.publish("abort")
        self.record(now, "aborted", why, [])
        self.cut = None
        self.progress.touch(now)
        if again_soon and c.reason == "every_s":
            self.next_due = now
        else:
            self.next_due = now + self.config.every_s if self.config.every_s > 0 \
                else float("inf")

    def record(self, now: float, status: str, why: str, removed: list[int]) -> None:
        c = self.cut
        assert c is not None
        shard_pauses = [s.pause_s for n, s in c.snapshots.items() if n.startswith("ps-")]
        kinds: dict[str, int] = {}
        for p in c.parts.values():
            kind = str(p.info.get("kind", "other"))
            kinds[kind] = kinds.get(kind, 0) + p.bytes
        pause_s = round((c.resumed_at or now) - c.began, 3)
        shard_pause_s = max(shard_pauses, default=None)
        written = sum(p.bytes for p in c.parts.values())
        rec = {"number": c.number, "status": status, "reason": c.reason, "why": why,
               "round": c.round, "drain_s": round((c.flushed_at or now) - c.began, 3)
               if c.flushed_at else None,
               "pause_s": pause_s, "shard_pause_s": shard_pause_s,
               "write_s": max((p.write_s for p in c.parts.values()), default=None),
               "bytes": written, "bytes_by_kind": kinds,
               "total_s": round(now - c.began, 3), "removed": removed}
        self.records = [*self.records, rec][-RECORDS_KEPT:]
        t = self.totals
        t[status] += 1
        if status == "complete":
            t["bytes"] += written
            t["max_pause_s"] = max(t["max_pause_s"], pause_s)
            t["max_shard_pause_s"] = max(t["max_shard_pause_s"], shard_pause_s or 0.0)
            log.info("checkpoint %d complete: training paused %.3f s (a shard %.4f s), %d "
                     "bytes written in %.2f s", c.number, rec["pause_s"],
                     rec["shard_pause_s"] or 0.0, rec["bytes"], rec["total_s"])
        self.metrics.write("checkpoint", **rec)

    def summary(self) -> CheckpointFigures:
        """The summary's ``checkpoints``: totals, the newest records, the rollbacks."""
        t = self.totals
        return {"every_s": self.config.every_s, "complete": int(t["complete"]),
                "aborted": int(t["aborted"]), "bytes": int(t["bytes"]),
                "max_pause_s": t["max_pause_s"], "max_shard_pause_s": t["max_shard_pause_s"],
                "latest": self.complete or None, "latest_dir": self.latest_dir or None,
                "rollbacks": self.rollbacks,
                "retrained_samples": sum(r["retrained_samples"] for r in self.rollbacks),
                "records": self.records[-10:]}

    def latest(self) -> dict | None:
        """The newest complete checkpoint (``newest``); after a resume, read from its manifest
        once (its age from the manifest's time, its pause not known)."""
        if not self.complete:
            return None
        if self.newest is None or self.newest["number"] != self.complete:
            where = location_of(self.store, self.complete)
            manifest = read_manifest(where)
            at = manifest.get("created") if manifest else None
            sizes = manifest.get("sizes", {}) if manifest else {}
            self.newest = {"number": self.complete, "at": at,
                           "bytes": sum(v for v in sizes.values() if isinstance(v, int)),
                           "pause_s": None, "shard_pause_s": None, "dir": str(where)}
        return self.newest

    def task(self, now: float) -> TaskFigures | None:
        """The cut under way as a long task (``roles.algorithms.shared.progress`` figures): its
        phase, and how many of the feeders, the round or the parts it waits for are done."""
        c = self.cut
        if c is None:
            return None
        what, unit = PHASE_TASKS.get(c.phase, (c.phase, "parts"))
        done, total = {"drain": (len(c.drained), len(c.feeders)),
                       "flush": (0, 1),
                       "write": (len(c.snapshots), len(c.writers)),
                       "resume": (len(c.parts), len(c.writers))}.get(c.phase, (0, 0))
        if c.phase == "flush":
            what += self.round_waits()
        return {"task": f"checkpoint {c.number}: {what}", "unit": unit, "done": done,
                "total": total or None, "rate": None, "eta_s": None,
                "elapsed_s": round(now - c.began, 1)}

    def round_waits(self) -> str:
        """What the flush round waits for, as the root aggregator's last heartbeat said."""
        agg = self.members.nodes.get("aggregator-0")
        waiting = agg.counters.get("waiting_for") if agg is not None else None
        if not isinstance(waiting, dict):
            return ""
        missing = [*waiting.get("workers", []), *waiting.get("aggregators", [])]
        return f" (round {waiting.get('round')} waits for {', '.join(map(str, missing))})" \
            if missing else ""

    def status(self, now: float, training: bool) -> CheckpointView:
        """The status's ``checkpoint`` (``roles.protocol.status.CheckpointView``): the newest
        complete
        checkpoint, the cut under way, the counts, when the next is due (while ``training``:
        none is cut otherwise), the rollbacks."""
        newest = self.latest()
        latest: LatestCheckpoint | None = None
        if newest is not None:
            at = newest["at"]
            latest = {"number": newest["number"], "bytes": newest["bytes"],
                      "pause_s": newest["pause_s"], "shard_pause_s": newest["shard_pause_s"],
                      "dir": newest["dir"],
                      "age_s": None if at is None else round(max(0.0, time.time() - at), 1)}
        c = self.cut
        aborted = next((r for r in reversed(self.records) if r["status"] == "aborted"), None)
        return {
            "every_s": self.config.every_s, "complete": int(self.totals["complete"]),
            "aborted": int(self.totals["aborted"]), "latest": latest,
            "under_way": None if c is None else {"number": c.number, "phase": c.phase,
                                                 "elapsed_s": round(now - c.began, 1)},
            "last_aborted": None if aborted is None else {"number": aborted["number"],
                                                           "why": aborted["why"]},
            "next_in_s": round(max(0.0, self.next_due - now), 1)
            if training and c is None and self.next_due != float("inf") else None,
            "rollbacks": self.rollbacks[-5:]}

    # -- state ----------------------------------------------------------------------------------
    def to_state(self) -> CheckpointsState:
        return CheckpointsState(self.number, self.complete)

    def from_state(self, s: CheckpointsState, now: float) -> None:
        """A resumed control: a cut its predecessor left under way is abandoned (feeders go
        on); the next is due ``every_s`` from now."""
        self.number, self.complete = s.number, s.complete
        standing = self.commands.get("checkpoint")
        if isinstance(standing, Checkpoint) and standing.phase in ("drain", "write"):
            self.commands.publish(Checkpoint(number=standing.number, phase="abort",
                                             round=standing.round, dir=standing.dir),
                                  "checkpoint")
        if self.config.every_s > 0:
            self.next_due = now + self.config.every_s
