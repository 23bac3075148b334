"""A node's copy of the job's network file, fetched from control when its host lacks it.

``[model] module = "nets/tiny.py:build"`` names a file that every role loads. Where a role runs
on a host without it (other machines, pods whose ConfigMap holds the job file only), its entry
point asks control for it before it makes the role (``NetworkWanted``; control answers with the
file it read at its start and its sha256, ``roles.control.network_files``): the bytes are
checked against the sha256, written to ``<[data] cache_dir>/networks/<sha256>/<name>`` (kept:
a node started again finds it there) and the job names that copy from then on. The job's
fingerprint holds the file's sha256, not its path (``Job.fingerprint``), so the node still runs
control's job; a host whose own file differs runs another job and is refused at Hello.

It waits for control as a node waits for its Welcome, giving up after ``orphan_timeout_s``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from pathlib import Path

import zmq

from roles.job.module_file import module_path
from roles.job.settings import Job
from roles.protocol.lifecycle import NetworkFile, NetworkWanted
from zbus import security
from zbus.codec import Envelope
from zbus.endpoints import CONTROL
from zbus.files import atomic_write
from zbus.node import Loop

log = logging.getLogger(__name__)
WAITING_LOG_S = 10.0   # a node waiting for control's copy says so again this often


class NetworkFileError(OSError):
    """The network file is not here and no copy came from control: one line."""


def with_network_file(job: Job, node_id: str) -> Job:
    """``job`` as it is where its network file is here (or it names none); else the job naming
    a copy of control's, fetched into the cache (``NetworkFileError`` when it cannot be)."""
    path = module_path(job)
    if path is None or path.is_file():
        return job
    log.info("%s: %s is not on this host; asking control for its copy", node_id, path)
    fetch = Fetch(job, node_id, str(path))
    fetch.run()
    got = fetch.got
    if got is None:
        raise NetworkFileError(f"[model] module {path} is not on this host, and control sent "
                               f"no copy within orphan_timeout_s = "
                               f"{job.cluster.orphan_timeout_s:g} s")
    if got.reason:
        raise NetworkFileError(f"[model] module {path} is not on this host, and control "
                               f"cannot send it: {got.reason}")
    source = got.source.tobytes()
    if hashlib.sha256(source).hexdigest() != got.sha256:
        raise NetworkFileError(f"[model] module {path}: control's copy does not match its "
                               f"sha256 {got.sha256}")
    copy = cache_dir(job) / "networks" / got.sha256 / got.name
    if not (copy.is_file() and copy.read_bytes() == source):
        copy.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(copy, source)
    log.info("%s: loads the network from control's copy %s", node_id, copy)
    factory = job.model.module.rpartition(":")[2]
    return dataclasses.replace(job, model=dataclasses.replace(job.model,
                                                              module=f"{copy}:{factory}"))


def cache_dir(job: Job) -> Path:
    """Where this host keeps what it made or fetched for jobs: ``[data] cache_dir``, or
    ``ZBUS_CACHE_DIR``."""
    return Path(os.environ.get("ZBUS_CACHE_DIR") or job.data.cache_dir).expanduser().absolute()


class Fetch(Loop):
    """Asks control for the network file every heartbeat until it answers (``got``) or
    ``orphan_timeout_s`` has passed."""

    def __init__(self, job: Job, node_id: str, path: str):
        c = job.cluster
        super().__init__(node_id, c.heartbeat_s, c.max_message_bytes)
        self.curve = security.for_process(self.ctx, c, node_id)
        self.path = path
        self.timeout_s = c.orphan_timeout_s
        self.got: NetworkFile | None = None
        # its own name on control's link: the node's, once made, must not meet this one's
        self.control = self.connect(zmq.DEALER, c.endpoint(CONTROL), self.on_answer,
                                    identity=f"{node_id}/network")
        self.next_ask = 0.0
        self.said = self.started

    def on_answer(self, _identity: bytes | None, env: Envelope) -> None:
        if isinstance(env.msg, NetworkFile):
            self.got = env.msg
            self.stopping = True
        else:   # anything else control says to a node it does not know yet
            self.unexpected(env, "control link")

    def on_tick(self, now: float) -> None:
        if now >= self.next_ask:
            self.next_ask = now + self.heartbeat_s
            self.send(self.control, NetworkWanted(path=self.path))
        if now - self.said >= WAITING_LOG_S:
            self.said = now
            log.info("%s: still waiting for control's copy of %s (%.0f s)", self.node_id,
                     self.path, now - self.started)
        if now - self.started > self.timeout_s:
            self.stopping = True

    def close(self) -> None:
        self.control.close(0)
        super().close()
