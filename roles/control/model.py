"""Control's part in keeping the model: backups it is told of, recovery of a restarted
aggregator and of a restarted shard, and exports.

A shard that dies is declared failed when it misses heartbeats, and the job waits up to
``recovery_timeout_s`` for it to be started again. The new process restores its latest
checkpoint (``[train] checkpoint_s``) and says Ready; control then publishes ``ShardBack``, and
feeders send it the keys of their batches in flight again while workers repeat the look-ups
it had not answered. The embedding updates it applied after that checkpoint are lost: at least
the difference between its last heartbeat's update count and the checkpoint's (in the
summary's ``shard_recoveries``, with the checkpoint's age and the time it was down).

An export is complete when every part has answered: the aggregator (``dense``), every shard
(``ps-<i>``) and the feeder (``transform``). Control then writes the job and, last, the
manifest (``roles.model.files`` documents the format). ``ModelKeeping`` is a part of
``roles.control.Control`` (a mixin over its state), kept here to keep each module readable.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from roles.job.rundir import atomic_write
from roles.job.settings import Job, job_to_toml
from roles.model.files import JOB, MANIFEST, newest_backup, write_json
from roles.protocol.dense_sync import BackupWritten, Restore, Restored
from roles.protocol.lifecycle import Export, Exported, ShardBack

log = logging.getLogger(__name__)

EXPORT_FORMAT = 1


def shard_recovery(lost_at: float, back_at: float, updates_before: int, info: dict) -> dict:
    """What a shard's restart cost: how long it was away, how old its checkpoint was, and
    at least how many applied updates were lost with it."""
    checkpointed = info.get("checkpoint_updates")
    counted = checkpointed if isinstance(checkpointed, int) else 0
    return {"down_s": round(back_at - lost_at, 3), "restored": info.get("restored") is True,
            "checkpoint_age_s": info.get("checkpoint_age_s"),
            "updates_lost_at_least": max(0, updates_before - counted)}


def export_parts(job: Job) -> set[str]:
    return {"dense", "transform", *(f"ps-{i}" for i in range(job.cluster.shards))}


@dataclass
class ExportInProgress:
    request: int
    dir: Path
    final: bool
    wanted: set[str]
    started: float
    files: dict[str, list[str]] = field(default_factory=dict)

    def got(self, part: str, files: list[str]) -> bool:
        """Record a part; True when the export is complete."""
        if part in self.wanted:
            self.files[part] = list(files)
        return set(self.files) == self.wanted

    def missing(self) -> list[str]:
        return sorted(self.wanted - set(self.files))


def write_manifest(e: ExportInProgress, job: Job, *, run_id: str, round_: int,
                   generation: int, epoch: int | None, auc: float | None,
                   logloss: float | None) -> None:
    atomic_write(e.dir / JOB, job_to_toml(job).encode())
    write_json(e.dir / MANIFEST, {
        "format": EXPORT_FORMAT, "run_id": run_id, "job": job.name,
        "fingerprint": job.fingerprint(), "round": round_, "generation": generation,
        "epoch": epoch, "auc": auc, "logloss": logloss, "shards": job.cluster.shards,
        "embedding_dim": job.model.embedding_dim, "sparse": job.sparse_fields,
        "dense": job.dense_fields,
        "files": sorted([JOB, *(f for files in e.files.values() for f in files)]),
        "created": time.time()})


class ModelKeeping:
    """Backups, recovery and exports, as control runs them."""

    def handle_backup(self, node_id: str, m: BackupWritten) -> None:
        record = {"round": m.round, "path": m.path, "change": m.change if m.change >= 0
                  else None, "generation": self.generation}
        self.backups.append(record)
        self.metrics.write("backup", node=node_id, **record)

    def latest_backup(self) -> str:
        """The newest backup the aggregator reported ('' when none: it finds its own)."""
        newest = newest_backup(self.backups)
        return newest["path"] if newest else ""

    def restore_aggregators(self) -> None:
        """An aggregator restarted: every aggregator goes back to the latest backup, published
        as the round last issued, under a new generation."""
        self.generation += 1
        path = self.latest_backup()
        log.warning("recovery %d: the aggregators restore %s as round %d", self.generation,
                    path or "the latest backup on disk", self.round)
        self.metrics.write("restore", generation=self.generation, round=self.round, path=path)
        self.publish(Restore(generation=self.generation, round=self.round, path=path),
                     "restore")

    def handle_restored(self, m: Restored) -> None:
        if m.generation != self.generation or self.aggregator_lost_at is None:
            return
        # the Restore command stands: a worker that missed the restored weights' broadcast
        # asks for them as long as it sees a newer generation than its own
        lost = self.aggregator_lost_at
        self.aggregator_lost_at = None
        self.recoveries.append({"generation": m.generation, "round": m.round,
                                "path": self.latest_backup(),
                                "seconds": round(time.monotonic() - lost, 3) if lost else None,
                                "round_in_flight": self.round_in_flight})
        self.metrics.write("restored", **self.recoveries[-1])
        log.info("recovered: the aggregator published the backup as round %d", m.round)
        self.last_progress = time.monotonic()
        self.round_over()  # a round in flight is void: its contributions died

    def start_export(self, final: bool) -> str:
        self.export_request += 1
        where = self.run_dir / ("export" if final else f"export-{self.export_request}")
        self.export = ExportInProgress(self.export_request, where, final,
                                       export_parts(self.job), time.monotonic())
        self.metrics.write("export_start", request=self.export_request, dir=str(where))
        self.publish(Export(request=self.export_request, dir=str(where)), "export")
        return str(where)

    def handle_exported(self, m: Exported) -> None:
        e = self.export
        if e is None or m.request != e.request or not e.got(m.part, m.files):
            return
        self.standing.pop("export", None)
        self.export = None
        last = next((r for r in reversed(self.epochs) if "auc" in r), {})
        write_manifest(e, self.job, run_id=self.run_id, round_=self.round,
                       generation=self.generation, epoch=last.get("epoch"),
                       auc=last.get("auc"), logloss=last.get("logloss"))
        record = {"request": e.request, "dir": str(e.dir), "final": e.final,
                  "seconds": round(time.monotonic() - e.started, 3)}
        self.exports.append(record)
        self.metrics.write("export", **record)
        log.info("model exported to %s", e.dir)
        if e.final:
            self.finish()

    def export_failed(self, now: float) -> None:
        e, self.export = self.export, None
        self.standing.pop("export", None)
        record = {"request": e.request, "dir": str(e.dir), "final": e.final,
                  "error": f"no answer from {', '.join(e.missing())}"}
        self.exports.append(record)
        self.metrics.write("export_failed", **record)
        log.error("export %d failed: %s", e.request, record["error"])
        if e.final:
            self.finish()

    # -- a restarted shard ---------------------------------------------------------------------
    def shard_restarting(self, node_id: str, before) -> None:
        """A new process says Hello as a shard that had been ready."""
        updates = before.counters.get("updates")
        self.shards_back[node_id] = (self.shards_lost.pop(node_id, time.monotonic()),
                                     updates if isinstance(updates, int) else 0)
        log.warning("%s restarted: it restores its latest checkpoint", node_id)

    def shard_back(self, node_id: str, info: dict) -> None:
        lost_at, updates_before = self.shards_back.pop(node_id)
        now = time.monotonic()
        self.shard_generation += 1
        record = {"shard": node_id, "generation": self.shard_generation,
                  "checkpoint_s": self.job.train.checkpoint_s,
                  **shard_recovery(lost_at, now, updates_before, info)}
        self.shard_recoveries.append(record)
        self.metrics.write("shard_recovered", **record)
        log.warning("%s is back after %.1f s from a checkpoint %s s old: at least %d updates "
                    "lost", node_id, record["down_s"], record["checkpoint_age_s"],
                    record["updates_lost_at_least"])
        self.last_progress = now
        index = int(node_id.rsplit("-", 1)[1])
        self.publish(ShardBack(shard=index, generation=self.shard_generation),
                     f"shard_back-{index}")
