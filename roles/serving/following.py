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

from roles.checkpoint.files import LATEST
from roles.checkpoint.serving import checkpoint_of
from roles.serving.model import ExportError, read_model
from roles.serving.served import Served
from roles.storage.fs import StorageError, is_uri
from roles.storage.store import Store

log = logging.getLogger("zbus.serve")


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
        """Where the newest complete checkpoint is now (None: none yet)."""
        if is_uri(self.where):
            latest = Store(self.where).read_bytes(LATEST) \
                if Store(self.where).size(LATEST) is not None else None
            return f"{self.where.rstrip('/')}/{latest.decode().strip()}" if latest else None
        found = checkpoint_of(Path(self.where))
        return str(found) if found is not None else None

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
