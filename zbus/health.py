"""A role's health as a small file, for a supervisor's probes (Kubernetes' liveness and
readiness probes run ``zbus-probe live|ready`` in the role's container).

Only when ``ZBUS_HEALTH_FILE`` names it (the transport writes no file otherwise), the loop
(``zbus.node.Loop``) writes ``{"node", "pid", "time", "state"}`` there about once per
heartbeat interval and whenever the state changes, atomically (``zbus.files.atomic_write``):
``time`` is the wall clock, ``state`` one of

- ``starting``: the process runs, but has not joined the job yet (a node before control's
  Welcome);
- ``ready``: a node welcomed by control; control once it runs the job (its run made or
  resumed, its endpoints bound);
- ``ended``: the job is over for good (it completed, was stopped, or failed in a way a
  resume would meet again: Stop without ``resumable``), whatever the role's exit status;
  ``zbus-pod`` then keeps the pod idle, and a restarted container of the pod stays idle.

``verdict`` is the probes' rule: *live* when the file was written within ``max_age`` seconds
and its process lives (or has ended normally); *ready* when live and ``ready``.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import psutil

from zbus.files import atomic_write

log = logging.getLogger(__name__)

ENV = "ZBUS_HEALTH_FILE"
DEFAULT_PATH = "/tmp/zbus-health.json"  # zbus-pod's and zbus-probe's default
STATES = ("starting", "ready", "ended")
MAX_AGE_S = 60.0                         # zbus-probe's default --max-age


class HealthFile:
    """Where one process writes its health."""

    def __init__(self, path: str | Path, node: str):
        self.path = Path(path)
        self.node = node
        self.state = ""
        self.written_at = 0.0   # monotonic
        self._failed = False

    @classmethod
    def from_env(cls, node: str, environ: dict[str, str] | None = None) -> HealthFile | None:
        path = (os.environ if environ is None else environ).get(ENV, "")
        return cls(path, node) if path else None

    def write(self, state: str, pid: int | None = None) -> None:
        """The record, atomically; a file that cannot be written is said once, never fatal."""
        self.state, self.written_at = state, time.monotonic()
        record = {"node": self.node, "pid": os.getpid() if pid is None else pid,
                  "time": time.time(), "state": state}
        try:
            atomic_write(self.path, orjson.dumps(record), durable=False)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                log.warning("%s: cannot write its health file %s (%s)", self.node, self.path,
                            exc)

    def beat(self, state: str, every_s: float) -> None:
        """Write when the state changed or ``every_s`` has passed since the last write."""
        if state != self.state or time.monotonic() - self.written_at >= every_s:
            self.write(state)


def read(path: str | Path) -> dict[str, Any] | None:
    """The record, or None when there is none (not yet written, unreadable, torn)."""
    try:
        record = orjson.loads(Path(path).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return None
    return record if isinstance(record, dict) else None


def process_alive(pid: int) -> bool:
    """A process with this id runs (a zombie does not)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True   # there, but not ours to inspect


def verdict(record: dict[str, Any] | None, probe: str, now: float,
            max_age_s: float = MAX_AGE_S,
            alive: Callable[[int], bool] = process_alive) -> str | None:
    """None when the probe (``live`` or ``ready``) passes, else why not, in one line."""
    if record is None:
        return "no health record (the role has not started, or ZBUS_HEALTH_FILE differs)"
    node, state, pid = record.get("node", "?"), record.get("state"), record.get("pid")
    stamp = record.get("time")
    if not isinstance(stamp, (int, float)) or not isinstance(pid, int) or state not in STATES:
        return f"malformed health record: {record!r}"
    age = now - stamp
    if age > max_age_s:
        return f"{node} ({state}) last wrote its health {age:.0f} s ago (more than " \
               f"{max_age_s:g} s): its loop is stuck"
    if state != "ended" and not alive(pid):
        return f"{node} ({state}): its process {pid} is not running"
    if probe == "ready" and state != "ready":
        return f"{node} is {state}, not ready"
    return None
