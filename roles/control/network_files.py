"""The job's network file, as control hands it to the nodes that lack it.

A job whose ``[model] module`` is a file (``nets/tiny.py:build``) needs that file where every
role runs; control reads it once, at its start, and answers a node's ``NetworkWanted`` (sent
before its Hello: ``roles.job.network_file``) with its bytes and their sha256, so that the file
need only be where control runs. The job's fingerprint holds the file's sha256 (not its path),
so a node that loads the copy runs the same job as control, and one with another version of
the file is refused at Hello as running another job.
"""

from __future__ import annotations

import hashlib
import logging

import numpy as np

from roles.job.module_file import module_path
from roles.job.settings import Job
from roles.protocol.lifecycle import NetworkFile, NetworkWanted

log = logging.getLogger(__name__)


class NetworkFiles:
    def __init__(self, job: Job, max_bytes: int | None):
        self.path = module_path(job)
        self.source: bytes | None = None
        self.sha256 = ""
        self.answered: set[str] = set()   # the nodes it was sent to (said once each)
        self.reason = "the job names no network file ([model] module = \"file.py:factory\")"
        if self.path is None:
            return
        try:
            source = self.path.read_bytes()
        except OSError as exc:
            self.reason = f"control cannot read [model] module {self.path}: {exc.strerror}"
            return
        if max_bytes is not None and len(source) > max_bytes - 4096:
            self.reason = (f"[model] module {self.path} is {len(source):,} bytes, more than a "
                           f"message may carry ([cluster] max_message_bytes = {max_bytes:,}): "
                           "put it on every host")
            return
        self.source = source
        self.sha256 = hashlib.sha256(source).hexdigest()

    def answer(self, node_id: str, wanted: NetworkWanted) -> NetworkFile:
        if self.path is None or self.source is None:
            return NetworkFile(name="", sha256="", reason=self.reason,
                               source=np.zeros(0, np.uint8))
        if node_id not in self.answered:
            self.answered.add(node_id)
            log.info("%s has no %s: sent it control's (%d bytes, sha256 %s)", node_id,
                     wanted.path, len(self.source), self.sha256[:16])
        return NetworkFile(name=self.path.name, sha256=self.sha256, reason="",
                           source=np.frombuffer(self.source, np.uint8))
