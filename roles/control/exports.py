"""Control's part in exporting the model: an export is complete when every part has answered
(``Exported``): the aggregator (``dense``), every shard (``ps-<i>``) and the feeder
(``transform``). Control then writes the job and, last, the manifest
(``roles.checkpoint.model_files`` documents the format). An export not complete within three
``node_timeout_s`` fails (it is recorded with the parts that did not answer)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path

from roles.checkpoint.model_files import JOB, MANIFEST, json_bytes
from roles.control.commands import Commands
from roles.data.hashing import KEY_HASH
from roles.job.module_file import portable
from roles.job.rundir import MetricsLog
from roles.job.settings import Job, job_to_toml
from roles.protocol.lifecycle import Export, Exported
from roles.storage.fs import join
from roles.storage.store import Store

log = logging.getLogger(__name__)
EXPORT_FORMAT = 2   # 2: keys hashed by KEY_HASH (roles.data.hashing), recorded


def export_parts(job: Job) -> set[str]:
    return {"dense", "transform", *(f"ps-{i}" for i in range(job.cluster.shards))}


@dataclass
class ExportInProgress:
    request: int
    dir: str          # a directory, or an object store's URI
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
    recorded, extra = portable(job)
    store = Store(e.dir)
    for name, data in extra.items():
        store.put_bytes(name, data)
    store.put_bytes(JOB, job_to_toml(recorded).encode())
    store.put_bytes(MANIFEST, json_bytes({
        "format": EXPORT_FORMAT, "key_hash": KEY_HASH, "run_id": run_id, "job": job.name,
        "fingerprint": job.fingerprint(), "round": round_, "generation": generation,
        "epoch": epoch, "auc": auc, "logloss": logloss, "shards": job.cluster.shards,
        "embedding_dim": job.layout().row_dim, "sparse": job.sparse_fields,
        "dense": job.dense_fields,
        "files": sorted([JOB, *extra, *(f for files in e.files.values() for f in files)]),
        "created": time.time()}))


class Exports:
    def __init__(self, job: Job, run_dir: Path, run_id: str, commands: Commands,
                 metrics: MetricsLog):
        self.job = job
        self.run_dir = run_dir
        self.run_id = run_id
        self.commands = commands
        self.metrics = metrics
        self.current: ExportInProgress | None = None
        self.request = 0
        self.exports: list[dict] = []

    def start(self, final: bool, now: float) -> str:
        self.request += 1
        where = join(self.job.checkpoint.export_root(str(self.run_dir)),
                     "export" if final else f"export-{self.request}")
        self.current = ExportInProgress(self.request, where, final, export_parts(self.job), now)
        self.metrics.write("export_start", request=self.request, dir=str(where))
        self.commands.publish(Export(request=self.request, dir=str(where)), "export")
        return str(where)

    def exported(self, m: Exported, now: float, *, round_: int, generation: int,
                 last_epoch: dict) -> ExportInProgress | None:
        """A part was written; the export, once complete (its manifest written)."""
        e = self.current
        if e is None or m.request != e.request or not e.got(m.part, m.files):
            return None
        self._close()
        write_manifest(e, self.job, run_id=self.run_id, round_=round_, generation=generation,
                       epoch=last_epoch.get("epoch"), auc=last_epoch.get("auc"),
                       logloss=last_epoch.get("logloss"))
        record = {"request": e.request, "dir": str(e.dir), "final": e.final,
                  "seconds": round(now - e.started, 3)}
        self.exports.append(record)
        self.metrics.write("export", **record)
        log.info("model exported to %s", e.dir)
        return e

    def overdue(self, now: float, timeout_s: float) -> ExportInProgress | None:
        """The export under way, failed for taking longer than ``timeout_s``; else None."""
        e = self.current
        if e is None or now - e.started <= timeout_s:
            return None
        self._close()
        record = {"request": e.request, "dir": str(e.dir), "final": e.final,
                  "error": f"no answer from {', '.join(e.missing())}"}
        self.exports.append(record)
        self.metrics.write("export_failed", **record)
        log.error("export %d failed: %s", e.request, record["error"])
        return e

    def _close(self) -> None:
        self.current = None
        self.commands.withdraw("export")

    def from_state(self, request: int) -> None:
        """A resumed control: an export under way is made again (by the course)."""
        self.request = request
        self.commands.withdraw("export")
