"""Control's part in skew-aware placement (``[placement] mode = "skew"``), mixed into Control.

Per allocation window: every feeder sends its KeyCounts; control merges them, predicts each
shard's capacity for the window (``roles.algorithms.capacity``: learned from the shards' work
records once ``min_windows`` windows of history exist, equal or from the job file before), and
places the heavy keys and the buckets of light keys (``roles.algorithms.placement.place``). When
the new map is better by more than ``min_gain`` (max of load / capacity), it is migrated:

    Placement(v+1, drain)   feeders send no new batch; each reports Drained when nothing of
                            its is in flight
    Placement(v+1, move)    shards hand over the rows they no longer own; each reports Moved
    Placement(v+1, active)  feeders route by v+1 and go on

The pause (drain to active) and the keys moved are written to metrics.jsonl and the summary.
A window closed while a migration runs is recorded but not placed. What a placement defers
(pairs that fit no room left) is held to the next one (``roles.algorithms.placement``). The
shards' work per window
(heartbeat counter ``windows``) becomes history records two windows later, when it is complete.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from roles.algorithms.capacity import CapacityPredictor, Record, append_records, equal_or_configured
from roles.algorithms.membership import ALIVE, Members
from roles.algorithms.placement import Deferred, HeavyHitters, KeyMap, max_over_mean, place
from roles.control.commands import Commands, ProgressClock
from roles.job.rundir import MetricsLog
from roles.job.settings import Job
from roles.protocol.placement import WORK_SLOTS, Drained, KeyCounts, Moved, Placement
from zbus.codec import ProtocolError

log = logging.getLogger(__name__)
WINDOWS_KEPT = 32   # per-window partition state kept for the status and the summary


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
                 run_dir: Path, progress: ProgressClock):
        self.job = job
        self.members = members
        self.commands = commands
        self.metrics = metrics
        self.run_dir = run_dir
        self.progress = progress
        p, c = job.placement, job.cluster
        self.skew = p.mode == "skew"
        self.keymap = KeyMap.hashed(c.shards, p.buckets_per_shard)
        self.window_counts: dict[int, dict[str, KeyCounts]] = {}
        self.window_pairs: dict[int, int] = {}
        self.records: list[Record] = []
        self.recorded: set[tuple[int, int]] = set()
        self.predictor: CapacityPredictor | None = None
        self.fitted_on = 0                   # records the predictor was last trained on
        self.last_capacities: tuple[np.ndarray, str] | None = None
        if self.skew:   # torch's import takes a second or two: at start, not mid-job
            self.predictor = CapacityPredictor(c.shards)
        self.migration: Migration | None = None
        self.deferred = Deferred.nothing(c.shards, len(self.keymap.buckets))
        self.windows: list[dict] = []        # partition state per closed window (newest last)
        self.migrations: list[dict] = []

    def feeders(self) -> set[str]:
        return {n for n, s in self.members.nodes.items()
                if s.role == "feeder" and s.status == ALIVE}

    def shard_ids(self) -> set[str]:
        return {f"ps-{i}" for i in range(self.job.cluster.shards)}

    # -- counts from feeders -----------------------------------------------------------------
    def handle_key_counts(self, node_id: str, m: KeyCounts) -> None:
        if not self.skew:
            raise ProtocolError("unexpected", "KeyCounts while placement mode is hash")
        if m.bucket_pairs.shape != self.keymap.buckets.shape or \
                m.shard_pairs.shape != (self.keymap.shards,):
            raise ProtocolError("bad_shape", "KeyCounts whose buckets or shards do not fit")
        if m.window in self.window_pairs:
            return  # a window already closed
        got = self.window_counts.setdefault(m.window, {})
        got[node_id] = m
        if set(got) >= self.feeders():
            del self.window_counts[m.window]
            self.close_window(m.window, list(got.values()))

    def close_window(self, window: int, counts: list[KeyCounts]) -> None:
        p = self.job.placement
        heavy = HeavyHitters(p.heavy_keys)
        for m in counts:
            heavy.merge(HeavyHitters.of(m.size, m.keys, m.counts, m.errors, m.pairs))
        buckets = sum(np.asarray(m.bucket_pairs, dtype=np.int64) for m in counts)
        assigned = sum(np.asarray(m.shard_pairs, dtype=np.int64) for m in counts)
        pairs = heavy.total
        self.window_pairs[window] = pairs
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

    def capacities(self, pairs: int) -> tuple[np.ndarray, str]:
        p = self.job.placement
        windows = {r.window for r in self.records}
        if len(windows) >= p.min_windows:
            try:
                if self.fitted_on != len(self.records):   # new history since the last fit
                    self.predictor.fit(self.records, steps=p.predictor_steps)
                    self.predictor.save(self.run_dir / "placement")
                    self.fitted_on = len(self.records)
                return self.predictor.capacities(pairs), "predicted"
            except ValueError as exc:   # nothing usable after filtering
                log.warning("capacity predictor not trained: %s", exc)
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
    def record_work(self, shard: int, counters: dict) -> None:
        """Windows a shard finished (two behind the newest it reports) become records."""
        windows = counters.get("windows")
        if not self.skew or not isinstance(windows, dict):
            return
        try:
            work = {int(w): [float(x) for x in f] for w, f in windows.items() if len(f) == 4}
        except (TypeError, ValueError):
            return
        if not work:
            return
        newest = max(work)
        for w, f in sorted(work.items()):
            if w > newest - 2 or (w, shard) in self.recorded or w not in self.window_pairs:
                continue
            self.recorded.add((w, shard))
            total = self.window_pairs[w]
            new = [Record(w, op, shard, total, int(f[pairs_at]), f[seconds_at])
                   for op, (pairs_at, seconds_at) in WORK_SLOTS.items()]
            self.records += new
            append_records(self.run_dir / "placement", new)

    # -- what consoles and the summary see -----------------------------------------------------
    def status(self) -> dict | None:
        if not self.skew:
            return None
        last = self.windows[-1] if self.windows else {}
        placed = next((w for w in reversed(self.windows) if "overflow_by_shard" in w), {})
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
            "records": len(self.records),
            "outliers_dropped": self.predictor.dropped if self.predictor else None,
            "deferred_pairs": round(self.deferred.pairs, 1),
            "deferred_items": self.deferred.items,
            "deferred_windows_max": self.deferred.windows_max,
            "table_keys": len(self.keymap.keys)}

    def summary(self) -> dict:
        summary = {"mode": self.job.placement.mode}
        if self.skew:
            summary.update(self.status() or {}, windows=self.windows,
                           migration_log=self.migrations)
        return summary

    def from_state(self) -> None:
        """A resumed control: the key map comes back with the standing commands; a migration
        under way cannot be resumed (ValueError)."""
        placement = self.commands.get("placement")
        if isinstance(placement, Placement):
            if placement.phase != "active":
                raise ValueError(f"a key migration (placement {placement.version}) was under "
                                  "way; it cannot be resumed")
            self.keymap = self.keymap.from_message(placement, self.job.cluster.shards,
                                                   self.job.placement.buckets_per_shard)
