"""``zbus-serve --follow RUN``: serve a running job's newest complete checkpoint, and the next
one as soon as it is complete. A checkpoint is a consistent cut of the whole job (every
shard's rows and the dense weights at one round, ``roles.control.checkpoints``): the follower
loads it whole, off the serving thread, and only then swaps it in (``Holder.replace``), so a
response comes from one checkpoint, never from a mix.

``RUN`` is a run directory or its checkpoints directory on this host, or a checkpoints prefix
in an object store (``s3://bucket/prefix``): what ``LATEST`` names there is polled every
``poll_s``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from roles.checkpoint.files import LATEST
from roles.checkpoint.serving import checkpoint_of
from roles.job.settings import Job, JobError, parse_job
from roles.serving.model import ExportError, read_model
from roles.serving.served import Served
from roles.storage.fs import StorageError, is_uri
from roles.storage.store import Store

if TYPE_CHECKING:
    from roles.serving.live import LiveFollower

log = logging.getLogger("zbus.serve")


def newest_checkpoint(where: str) -> str | None:
    """Where the newest complete checkpoint of ``where`` (a run or checkpoints directory, or a
    checkpoints prefix in an object store) is now (None: none yet)."""
    if is_uri(where):
        store = Store(where)
        latest = store.read_bytes(LATEST) if store.size(LATEST) is not None else None
        return f"{where.rstrip('/')}/{latest.decode().strip()}" if latest else None
    found = checkpoint_of(Path(where))
    return str(found) if found is not None else None


def live_job(run: str) -> Job | None:
    """The job of run directory ``run`` when it publishes live parameters (``[serving]
    publish_ms``), else None (its checkpoints are followed)."""
    config = Path(run) / "config.toml"
    if is_uri(run) or not config.is_file():
        return None
    try:
        job = parse_job(config.read_text(), str(config), None, {})
    except JobError as exc:
        raise ExportError(f"cannot read {config}: {exc}") from None
    return job if job.serving.publish_ms > 0 else None


def follower(run: str, replace: Callable[[Served], None], poll_s: float):
    """What follows ``run``: its live parameters (``roles.serving.live``) when ``run`` is the
    run directory of a job that publishes them, else its checkpoints. A run directory that
    holds neither its job (``config.toml``) nor a checkpoint yet is watched until one comes."""
    if is_uri(run) or decidable(run):
        return chosen(run, replace, poll_s)
    return Undecided(run, replace, poll_s)


def decidable(run: str) -> bool:
    """The local ``run`` holds its job file or a checkpoint: what follows it can be chosen."""
    return (Path(run) / "config.toml").is_file() or newest_checkpoint(run) is not None


def chosen(run: str, replace: Callable[[Served], None], poll_s: float):
    job = live_job(run)
    if job is None:
        return Follower(run, replace, poll_s)
    from roles.serving.live import LiveFollower
    store = job.checkpoint.dir or str(Path(run) / "checkpoints")
    return LiveFollower(job, lambda: newest_checkpoint(store), replace, poll_s)


class Undecided:
    """A run directory not started yet: the follower is chosen (``chosen``) once its job
    file or a checkpoint is there."""

    def __init__(self, run: str, replace: Callable[[Served], None], poll_s: float):
        self.run, self.replace, self.poll_s = run, replace, poll_s
        self.inner: Follower | LiveFollower | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.wait, name="zbus-follow", daemon=True)

    def start(self) -> Undecided:
        self.thread.start()
        return self

    def wait(self) -> None:
        while not self.stop.wait(self.poll_s):
            if decidable(self.run):
                try:
                    self.inner = chosen(self.run, self.replace, self.poll_s).start()
                except ExportError as exc:
                    log.error("zbus-serve: %s", exc)
                return

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        if self.inner is not None:
            self.inner.close()


class Follower:
    """Polls ``where`` for its newest complete checkpoint; ``replace`` gets each one loaded."""

    def __init__(self, where: str, replace: Callable[[Served], None], poll_s: float):
        self.where, self.replace, self.poll_s = where, replace, poll_s
        self.loaded: str | None = None   # the checkpoint served (its path or URI)
        self.stop = threading.Event()
        self.failures = 0
        self.thread = threading.Thread(target=self.run, name="zbus-follow", daemon=True)

    def start(self) -> Follower:
        self.thread.start()
        return self

    def newest(self) -> str | None:
        return newest_checkpoint(self.where)

    def poll(self) -> bool:
        """Load the newest checkpoint if it is not the one served; True when it was."""
        newest = self.newest()
        if newest is None or newest == self.loaded:
            return False
        served = Served.of(read_model(newest))
        self.replace(served)
        self.loaded = newest
        log.info("zbus-serve: serving %s (round %s)", newest, served.version)
        return True

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.poll()
                self.failures = 0
            except (ExportError, OSError, KeyError, ValueError, StorageError) as exc:
                # a checkpoint pruned while it was read, a store away for a moment: the next
                # poll tries again (the model served stays)
                self.failures += 1
                if self.failures in (1, 10, 100):
                    log.warning("zbus-serve: cannot load the newest checkpoint of %s: %s",
                                self.where, exc)
            self.stop.wait(self.poll_s)

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=30)   # (a checkpoint being read: its end)
