"""Control's part in skew-aware placement (``[placement] mode = "skew"``), mixed into Control.

Per allocation window: every feeder sends its KeyCounts; control merges them, predicts each
shard's capacity for the window (``roles.algorithms.control.capacity``: learned from the shards'
work records once ``min_windows`` windows of history exist, equal or from the job file before), and
places the heavy keys and the buckets of light keys (``roles.algorithms.control.placement.place``).
When
the new map is better by more than ``min_gain`` (max of load / capacity), it is migrated:

    Placement(v+1, drain)   feeders send no new batch; each reports Drained when nothing of
                            its is in flight
    Placement(v+1, move)    shards hand over the rows they no longer own; each reports Moved
    Placement(v+1, active)  feeders route by v+1 and go on

The pause (drain to active) and the keys moved are written to metrics.jsonl and the summary.
A window closed while a migration runs is recorded but not placed. What a placement defers
(pairs that fit no room left) is held to the next one (``roles.algorithms.control.placement``).

History: each shard reports every window's work once it is finished (``WindowWork``, with its
heartbeats; ``roles.algorithms.shard.window_work``) and control answers which windows it recorded
(``WorkRecorded``, with the newest window closed): every window of every shard becomes history
records once, however fast windows close. The history kept for training is the newest
``[placement] history_windows`` windows, and the predictor is trained in a child process, the
previous one serving meanwhile (``roles.control.capacity_training``): control's loop does not
slow down as the job goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from roles.algorithms.control.capacity import Record, append_records, equal_or_configured
from roles.algorithms.control.membership import ALIVE, Members
from roles.algorithms.control.placement import Deferred, max_over_mean, place
from roles.algorithms.shared.key_map import HeavyHitters, KeyMap
from roles.control.capacity_training import BackgroundFit, child_process
from roles.control.commands import Commands, ProgressClock
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.protocol.placement import (
    WORK_SLOTS,
    Drained,
    KeyCounts,
    Moved,
    Placement,
    WindowWork,
    WorkRecorded,
)
from zbus.codec import ProtocolError

log = logging.getLogger(__name__)
WINDOWS_KEPT = 32   # per-window partition state kept for the status and the summary
WINDOWS_KNOWN = 4096  # closed windows whose pairs (and recorded shards) control remembers


@dataclass
class Migration:
    keymap: KeyMap
    started: float
    window: int
    drained: set[str] = field(default_factory=set)
    moved: dict[str, Moved] = field(default_factory=dict)
    moving_since: float | None = None


class PlacementKeeper:
    def __init__(self, job: Job, members: Members, commands: Commands, metrics: MetricsLog,
                 run_dir: Path, progress: ProgressClock,
                 training_feeders: Callable[[], set[str] | None] | None = None,
                 train_in: Callable[[], Executor] = child_process):
        """``train_in``: where the capacity predictor trains (a child process of control's);
        ``training_feeders``: the feeders that feed training parts (their KeyCounts close a
        window)."""
        self.job = job
        self.training_feeders = training_feeders
        self.members = members
        self.commands = commands
        self.metrics = metrics
        self.run_dir = run_dir
        self.progress = progress
        p, c = job.placement, job.cluster
        self.skew = p.mode == "skew"
        self.keymap = KeyMap.hashed(c.shards, p.buckets_per_shard)
        self.window_counts: dict[int, dict[str, KeyCounts]] = {}
        self.window_pairs: dict[int, int] = {}     # closed windows (the newest WINDOWS_KNOWN)
        self.newest_closed = -1
        self.history: dict[int, list[Record]] = {}  # window -> its records (the newest kept)
        self.history_version = 0                    # rises with every record
        self.records_total = 0
        self.sealed = False       # the summary is written: no record after it
        self.recorded: set[tuple[int, int]] = set()  # (window, shard) recorded
        self.unrecordable = 0     # windows a shard reported that this control never closed
        self.late_pairs: dict[int, int] = {}        # shard -> pairs of late work (not recorded)
        self.trainer: BackgroundFit | None = None
        self.last_capacities: tuple[np.ndarray, str] | None = None
        if self.skew:
            self.trainer = BackgroundFit(c.shards, p.predictor_steps, run_dir / "placement",
                                         train_in)
        self.migration: Migration | None = None
        self.interrupted: int | None = None  # resumed mid-migration: that placement's version
        self.deferred = Deferred.nothing(c.shards, len(self.keymap.buckets))
        self.windows: list[dict] = []        # partition state per closed window (newest last)
        self.migrations: list[dict] = []

    def feeders(self) -> set[str]:
        return {n for n, s in self.members.nodes.items()
                if s.role == "feeder" and s.status == ALIVE}

    def counting_feeders(self) -> set[str]:
        """The live feeders whose KeyCounts close a window: those that feed training parts (a
        feeder with none, as when there are fewer parts than feeders, counts nothing)."""
        feeding = self.training_feeders() if self.training_feeders is not None else None
        return self.feeders() if feeding is None else self.feeders() & feeding

    def shard_ids(self) -> set[str]:
        return {f"ps-{i}" for i in range(self.job.cluster.shards)}

    # -- counts from feeders -----------------------------------------------------------------
    def handle_key_counts(self, node_id: str, m: KeyCounts) -> None:
        if not self.skew:
            raise ProtocolError("unexpected", "KeyCounts while placement mode is hash")
        if m.bucket_pairs.shape != self.keymap.buckets.shape or \
                m.shard_pairs.shape != (self.keymap.shards,):
            raise ProtocolError("bad_shape", "KeyCounts whose buckets or shards do not fit")
        if m.window in self.window_pairs or m.window <= self.newest_closed - WINDOWS_KNOWN:
            return  # a window already closed
        got = self.window_counts.setdefault(m.window, {})
        got[node_id] = m
        if set(got) >= self.counting_feeders():
            del self.window_counts[m.window]
            self.close_window(m.window, list(got.values()))

    def close_window(self, window: int, counts: list[KeyCounts]) -> None:
        p = self.job.placement
        heavy = HeavyHitters(p.heavy_keys)
        for m in counts:
            heavy.merge(HeavyHitters.of(m.size, m.keys, m.counts, m.errors, m.pairs))
        buckets = np.sum([np.asarray(m.bucket_pairs, dtype=np.int64) for m in counts], axis=0)
        assigned = np.sum([np.asarray(m.shard_pairs, dtype=np.int64) for m in counts], axis=0)
        pairs = heavy.total
        self.closed(window, pairs)
        if self.migration is None or self.last_capacities is None:
            self.last_capacities = self.capacities(pairs)
        capacities, source = self.last_capacities
        capacities = capacities * (pairs / capacities.sum())
        state = {"window": window, "version": self.keymap.version, "pairs": pairs,
                 "assigned": assigned.tolist(),
                 "capacity": [round(float(c), 1) for c in capacities],
                 "capacity_source": source,
                 "imbalance": round(max_over_mean(assigned), 4),
                 "heavy_keys": len(heavy), "top_key_share": round(
                     float(heavy.counts[0]) / pairs, 5) if len(heavy) and pairs else None}
        if self.migration is not None:
            state["decision"] = "a migration is still running"
        else:
            self.allocate(window, heavy, buckets, assigned, capacities, state)
        self.windows.append(state)
        del self.windows[:-WINDOWS_KEPT]
        self.metrics.write("placement_window", **state)

    def closed(self, window: int, pairs: int) -> None:
        """A window is closed: its pairs are known; the oldest windows are forgotten."""
        self.window_pairs[window] = pairs
        self.newest_closed = max(self.newest_closed, window)
        horizon = self.newest_closed - WINDOWS_KNOWN
        for w in [w for w in self.window_pairs if w <= horizon]:
            del self.window_pairs[w]
        for w in [w for w in self.window_counts if w <= horizon]:
            del self.window_counts[w]
        if len(self.recorded) > 2 * WINDOWS_KNOWN * self.job.cluster.shards:
            self.recorded = {(w, s) for w, s in self.recorded if w > horizon}

    def records(self) -> list[Record]:
        """The history kept: the records of the newest ``history_windows`` windows."""
        return [r for records in self.history.values() for r in records]

    def capacities(self, pairs: int) -> tuple[np.ndarray, str]:
        """The capacities for a window of ``pairs``: the predictor in service once one is
        trained (a new training starts in a child process whenever the history has grown), equal or
        configured before."""
        p = self.job.placement
        trainer = self.trainer
        if trainer is not None:
            trainer.poll()
            if len(self.history) >= p.min_windows:
                trainer.want(self.records(), self.history_version)
            predicted = trainer.capacities(pairs)
            if predicted is not None:
                return predicted, "predicted"
        return equal_or_configured(pairs, self.job.cluster.shards, p.capacities), (
            "configured" if p.capacities else "equal")

    def allocate(self, window: int, heavy: HeavyHitters, buckets: np.ndarray,
               assigned: np.ndarray, capacities: np.ndarray, state: dict) -> None:
        alloc = place(heavy, buckets, capacities, self.keymap, deferred=self.deferred)
        self.deferred = alloc.deferred
        fill_now = float(np.max(assigned / capacities))
        fill_new = float(np.max(alloc.loads / capacities))
        moves = alloc.moved_keys + alloc.moved_buckets
        state.update(predicted=[round(float(x), 1) for x in alloc.loads],
                     fill_now=round(fill_now, 4), fill_new=round(fill_new, 4),
                     overflow=len(alloc.overflow),
                     overflow_by_shard=alloc.overflow_by_shard.tolist(),
                     released_pairs=round(alloc.released_pairs, 1), **alloc.deferred.report(),
                     moved_keys=alloc.moved_keys, moved_buckets=alloc.moved_buckets)
        if not moves or fill_new > fill_now * (1 - self.job.placement.min_gain):
            state["decision"] = "keep"
            return
        state["decision"] = f"migrate to version {alloc.keymap.version}"
        self.migration = Migration(alloc.keymap, time.monotonic(), window)
        log.info("placement: window %d, max load/capacity %.3f -> %.3f predicted; moving %d "
                 "heavy keys and %d buckets (version %d)", window, fill_now, fill_new,
                 alloc.moved_keys, alloc.moved_buckets, alloc.keymap.version)
        self.commands.publish(alloc.keymap.message("drain"), "placement")

    # -- the migration -----------------------------------------------------------------------
    def handle_placement_drained(self, node_id: str, m: Drained) -> None:
        mig = self.migration
        if mig is None or m.version != mig.keymap.version or mig.moving_since is not None:
            return
        mig.drained.add(node_id)
        if mig.drained >= self.feeders():
            mig.moving_since = time.monotonic()
            self.commands.publish(mig.keymap.message("move"), "placement")

    def handle_moved(self, node_id: str, m: Moved) -> None:
        mig = self.migration
        if mig is None or m.version != mig.keymap.version or mig.moving_since is None:
            return
        mig.moved[node_id] = m
        if set(mig.moved) >= self.shard_ids():
            now = time.monotonic()
            self.keymap = mig.keymap
            self.migration = None
            self.progress.touch(now)
            record = {"version": self.keymap.version, "window": mig.window,
                      "moved_keys": sum(x.sent for x in mig.moved.values()),
                      "pause_s": round(now - mig.started, 4),
                      "handover_s": round(now - mig.moving_since, 4),
                      "table_keys": len(self.keymap.keys)}
            self.migrations.append(record)
            self.metrics.write("placement", **record)
            log.info("placement %d active: %d keys moved, feeding paused %.3f s",
                     record["version"], record["moved_keys"], record["pause_s"])
            self.commands.publish(self.keymap.message("active"), "placement")

    # -- the shards' work: history records -----------------------------------------------------
    def handle_window_work(self, shard: int, m: WindowWork) -> WorkRecorded:
        """A shard's finished windows become records, each once; the answer names the windows
        recorded (or never to be: closed before this control knew them, or long forgotten)."""
        if not self.skew:
            raise ProtocolError("unexpected", "WindowWork while placement mode is hash")
        if not 0 <= shard < self.job.cluster.shards:
            raise ProtocolError("unexpected", f"WindowWork from shard {shard}")
        if self.sealed:   # the job has ended and its summary counted the records
            return WorkRecorded(closed=self.newest_closed, windows=m.windows.astype(np.int64))
        self.late_pairs[shard] = m.late_pairs
        answered, new = [], []
        for w, f in zip(m.windows.tolist(), m.figures.tolist(), strict=True):
            if (w, shard) in self.recorded:
                answered.append(w)     # a repeat: the answer was lost
                continue
            if w > self.newest_closed:
                continue               # not closed here yet (a resumed control)
            answered.append(w)
            total = self.window_pairs.get(w)
            if total is None:
                self.unrecordable += 1
                continue
            self.recorded.add((w, shard))
            new += [Record(w, op, shard, total, int(f[pairs_at]), f[seconds_at])
                    for op, (pairs_at, seconds_at) in WORK_SLOTS.items()]
        if new:
            self.remember(new)
        return WorkRecorded(closed=self.newest_closed, windows=np.array(answered, np.int64))

    def remember(self, records: list[Record]) -> None:
        for r in records:
            self.history.setdefault(r.window, []).append(r)
        while len(self.history) > self.job.placement.history_windows:
            del self.history[min(self.history)]
        self.records_total += len(records)
        self.history_version += 1
        append_records(self.run_dir / "placement", records)

    # -- what consoles and the summary see -----------------------------------------------------
    def status(self) -> dict | None:
        if not self.skew:
            return None
        last = self.windows[-1] if self.windows else {}
        placed: dict[str, Any] = next(
            (w for w in reversed(self.windows) if "overflow_by_shard" in w), {})
        return {
            "version": self.keymap.version,
            "phase": "active" if self.migration is None else (
                "move" if self.migration.moving_since is not None else "drain"),
            "window": last.get("window"), "capacity": last.get("capacity"),
            "capacity_source": last.get("capacity_source"), "assigned": last.get("assigned"),
            "overflow_by_shard": placed.get("overflow_by_shard"),
            "imbalance_assigned": last.get("imbalance"),
            "migrations": len(self.migrations),
            "moved_keys": sum(m["moved_keys"] for m in self.migrations),
            "pause_s_last": self.migrations[-1]["pause_s"] if self.migrations else None,
            "pause_s_total": round(sum(m["pause_s"] for m in self.migrations), 4),
            "records": self.records_total,
            "records_kept": sum(len(r) for r in self.history.values()),
            "records_unrecordable": self.unrecordable,
            "late_pairs": sum(self.late_pairs.values()),
            "predictor_fits": self.trainer.fits if self.trainer else 0,
            "predictor_fit_s_last": round(self.trainer.fit_s_last, 4) if self.trainer else None,
            "predictor_pid": self.trainer.trained_by if self.trainer else None,
            "outliers_dropped": self.trainer.serving.dropped
            if self.trainer and self.trainer.serving else None,
            "deferred_pairs": round(self.deferred.pairs, 1),
            "deferred_items": self.deferred.items,
            "deferred_windows_max": self.deferred.windows_max,
            "table_keys": len(self.keymap.keys)}

    def seal(self) -> None:
        """The job has ended: work the shards report from now on (their last windows, as they
        stop) is answered but not recorded, so the records file holds what the summary counts."""
        self.sealed = True

    def summary(self) -> dict:
        summary: dict[str, Any] = {"mode": self.job.placement.mode}
        if self.skew:
            summary.update(self.status() or {})
            summary.update(windows=self.windows, migration_log=self.migrations)
        return summary

    def from_state(self) -> None:
        """A resumed control: the key map comes back with the standing commands. A migration
        under way is not taken up again (``interrupted`` names it): the job can go back to its
        newest checkpoint (cut only between migrations), not on with its live nodes."""
        placement = self.commands.get("placement")
        self.interrupted = None
        if isinstance(placement, Placement):
            if placement.phase != "active":
                self.interrupted = placement.version
                return
            self.keymap = self.keymap.from_message(placement, self.job.cluster.shards,
                                                   self.job.placement.buckets_per_shard)

    def cannot_go_on(self) -> str:
        """Why a resumed control cannot go on with the nodes that lived through its death
        ("": it can)."""
        if self.interrupted is None:
            return ""
        return (f"a key migration (placement {self.interrupted}) was under way when control "
                "died, and the nodes that lived on cannot take it up again: stop every node "
                "and resume the run, to go back to its newest checkpoint")

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
