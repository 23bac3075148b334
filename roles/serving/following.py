"""``zbus-serve --follow RUN``: serve a running job's newest complete checkpoint, and the next
one as soon as it is complete. A checkpoint is a consistent cut of the whole job (every
shard's rows and the dense weights at one round, ``roles.control.checkpoints``): the follower
loads it whole, off the serving thread, and only then swaps it in (``Holder.replace``), so a
response comes from one checkpoint, never from a mix.

``RUN`` is a run directory or its checkpoints directory on this host, or a checkpoints prefix
in an object store (``s3://bucket/prefix``): what ``LATEST`` names there is polled every
``poll_s``. Or control's request endpoint, ``tcp://host:port`` (``Remote``): control tells the
job and where its checkpoints are (``roles.serving.reporting.ask_job``), then the job is
followed as a run directory's would be.

Whatever follows a job whose file it knows calls ``on_job(job, endpoint, run_id)`` once it
does, with control's request endpoint: the server reports to control there (``Reporter``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import zmq

from roles.checkpoint.files import LATEST
from roles.checkpoint.serving import checkpoint_of
from roles.job.settings import Job, JobError, parse_job
from roles.protocol.serving import FollowJob
from roles.serving.model import ExportError, read_model
from roles.serving.reporting import ask_job
from roles.serving.served import Served
from roles.storage.fs import StorageError, is_uri
from roles.storage.store import Store

if TYPE_CHECKING:
    from roles.serving.live import LiveFollower

log = logging.getLogger("zbus.serve")
RETRY_S = 5.0   # a follower that failed tries again after this


def newest_checkpoint(where: str) -> str | None:
    """Where the newest complete checkpoint of ``where`` (a run or checkpoints directory, or a
    checkpoints prefix in an object store) is now (None: none yet)."""
    if is_uri(where):
        store = Store(where)
        latest = store.read_bytes(LATEST) if store.size(LATEST) is not None else None
        return f"{where.rstrip('/')}/{latest.decode().strip()}" if latest else None
    found = checkpoint_of(Path(where))
    return str(found) if found is not None else None


OnJob = Callable[[Job, str, str], None]   # the job, control's request endpoint, the run id


def run_job(run: str) -> Job | None:
    """The job of run directory ``run`` (None: ``run`` is no run directory with its job file
    here)."""
    config = Path(run) / "config.toml"
    if is_uri(run) or not config.is_file():
        return None
    try:
        return parse_job(config.read_text(), str(config), None, {})
    except JobError as exc:
        raise ExportError(f"cannot read {config}: {exc}") from None


def live_job(run: str) -> Job | None:
    """The job of run directory ``run`` when it publishes live parameters (``[serving]
    publish_ms``), else None (its checkpoints are followed)."""
    job = run_job(run)
    return job if job is not None and job.serving.publish_ms > 0 else None


def follower(run: str, replace: Callable[[Served], None], poll_s: float,
             on_job: OnJob | None = None, keys_dir: str | None = None, max_rows: int = 0):
    """What follows ``run``: its live parameters (``roles.serving.live``) when ``run`` is the
    run directory of a job that publishes them, else its checkpoints. A run directory that
    holds neither its job (``config.toml``) nor a checkpoint yet is watched until one comes;
    control's endpoint (``tcp://``) is asked for the job (``keys_dir``: the operator's CURVE
    keys here). ``max_rows``: a checkpoint of more rows is served from disk
    (``roles.serving.row_store``)."""
    if run.startswith("tcp://"):
        return Remote(run, replace, poll_s, on_job, keys_dir, max_rows)
    if is_uri(run) or decidable(run):
        return chosen(run, replace, poll_s, on_job, max_rows)
    return Undecided(run, replace, poll_s, on_job, max_rows)


def decidable(run: str) -> bool:
    """The local ``run`` holds its job file or a checkpoint: what follows it can be chosen."""
    return (Path(run) / "config.toml").is_file() or newest_checkpoint(run) is not None


def chosen(run: str, replace: Callable[[Served], None], poll_s: float,
           on_job: OnJob | None = None, max_rows: int = 0):
    job = run_job(run)
    if job is not None and on_job is not None:
        on_job(job, job.cluster.endpoint("control_req"), Path(run).name)
    store = (job.checkpoint.dir if job is not None else "") or str(Path(run) / "checkpoints")
    return of_job(job, run if job is None or job.serving.publish_ms <= 0 else store, replace,
                  poll_s, max_rows)


def of_job(job: Job | None, checkpoints: str, replace: Callable[[Served], None],
           poll_s: float, max_rows: int = 0):
    """What follows ``job`` (None: not known) whose checkpoints are at ``checkpoints``: its
    live parameters when it publishes them, else its checkpoints."""
    if job is None or job.serving.publish_ms <= 0:
        return Follower(checkpoints, replace, poll_s, max_rows)
    from roles.serving.live import LiveFollower
    return LiveFollower(job, lambda: newest_checkpoint(checkpoints), replace, poll_s, max_rows)


class Remote:
    """``--follow tcp://host:port``: control there is asked for the job (until it answers),
    which is then followed as a run directory's: its checkpoints where control says they are
    (an object store, or a directory this host sees too), live when it publishes."""

    def __init__(self, endpoint: str, replace: Callable[[Served], None], poll_s: float,
                 on_job: OnJob | None, keys_dir: str | None, max_rows: int = 0):
        self.endpoint, self.replace, self.poll_s = endpoint, replace, poll_s
        self.on_job, self.keys_dir, self.max_rows = on_job, keys_dir, max_rows
        self.inner: Follower | LiveFollower | None = None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.wait, name="zbus-follow", daemon=True)

    def start(self) -> Remote:
        self.thread.start()
        return self

    def wait(self) -> None:
        """Ask until control answers with a job this process can follow (a key pair missing,
        a job it cannot read: said, then asked again after ``RETRY_S``: the operator may
        mount the keys, a new job may start there)."""
        while not self.stop.is_set():
            try:
                asked = ask_job(self.endpoint, f"zbus-serve {self.endpoint}", self.keys_dir,
                                self.stop)
                if asked is None:   # (stopped, or a job it cannot read: said)
                    self.stop.wait(RETRY_S)
                    continue
                self.follow(*asked)
                return
            except (OSError, zmq.ZMQError, ExportError) as exc:
                log.error("zbus-serve: cannot follow the job of %s: %s (again in %.0f s)",
                          self.endpoint, exc, RETRY_S)
                self.stop.wait(RETRY_S)

    def follow(self, job: Job, got: FollowJob) -> None:
        if not is_uri(got.checkpoints) and not Path(got.checkpoints).exists():
            log.warning("zbus-serve: the job's checkpoints are at %s on control's host, not "
                        "(yet) here: a server on another host follows a job whose [checkpoint] "
                        "dir is an object store (s3://...); waiting for them", got.checkpoints)
        if self.stop.is_set():
            return
        self.inner = of_job(job, got.checkpoints, self.replace, self.poll_s,
                            self.max_rows).start()
        if self.on_job is not None:
            self.on_job(job, self.endpoint, got.run_id)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=30)
        if self.inner is not None:
            self.inner.close()


class Undecided:
    """A run directory not started yet: the follower is chosen (``chosen``) once its job
    file or a checkpoint is there."""

    def __init__(self, run: str, replace: Callable[[Served], None], poll_s: float,
                 on_job: OnJob | None = None, max_rows: int = 0):
        self.run, self.replace, self.poll_s, self.on_job = run, replace, poll_s, on_job
        self.max_rows = max_rows
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
                    self.inner = chosen(self.run, self.replace, self.poll_s, self.on_job,
                                        self.max_rows).start()
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

    def __init__(self, where: str, replace: Callable[[Served], None], poll_s: float,
                 max_rows: int = 0):
        self.where, self.replace, self.poll_s, self.max_rows = where, replace, poll_s, max_rows
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
        served = Served.of(read_model(newest, self.max_rows))
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
