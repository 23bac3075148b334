"""``zbus-ctl wait``: wait until a job has ended, as control's status says (the console's
``status`` endpoint), and say how in the exit status: 0 the job completed, 1 it ended any
other way (failed, stopped, interrupted), 2 the waiter cannot tell (no keys, no status for
``--timeout`` seconds).

Control publishes its status every ``status_s`` and, once the job has ended, its final figures
a few more times before it exits; the waiter subscribes for the whole wait (ZeroMQ reconnects
it to a control that restarts), so that it sees them. A waiter that starts after control
exited, or whose control went quiet, reads the run's ``summary.json`` in the checkpoint store
when ``[checkpoint] dir`` is set (control writes it there at the end, ``zbus-pod`` reads it
too). ``--supervised``: a supervisor starts control again after a resumable end (Kubernetes'
``zbus-pod``: control resumes the run from its run directory or the checkpoint store), so
such an end is waited through; without it, any end ends the wait.

The zbus-wait Job of ``deploy/kubernetes`` runs ``zbus-ctl wait --supervised``, so that
``kubectl wait --for=condition=complete job/zbus-wait`` waits for the job.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import orjson
import zmq

from roles.checkpoint.files import SUMMARY
from roles.job.settings import Job
from roles.protocol.operator import Status
from roles.storage.fs import StorageError
from roles.storage.store import Store
from zbus import security, sockets
from zbus.codec import ProtocolError

COMPLETED, ENDED, UNKNOWN = 0, 1, 2
STORE_AFTER_S = 10.0   # control silent this long: its summary is looked for in the store


def verdict(status: str | None, resume_from: int | None, supervised: bool) -> int | None:
    """The exit status for a job that ended with ``status``, or None when the wait goes on:
    a resumable end (``resume_from``, a checkpoint) that a supervisor resumes."""
    if supervised and resume_from is not None:
        return None
    return COMPLETED if status == "completed" else ENDED


def ended_line(job: str, f: dict[str, Any]) -> str:
    """How the job ended, in one line (from the status's final figures or the summary)."""
    if f.get("status") == "completed" and f.get("auc") is not None:
        return (f"job {job} completed in {f.get('wall_s') or 0:.1f} s: auc {f['auc']:.4f}, "
                f"logloss {f.get('logloss') or float('nan'):.4f}")
    reason = f": {f['reason']}" if f.get("reason") else ""
    return f"job {job} {f.get('status')}{reason}"


class Waiter:
    def __init__(self, job: Job, *, supervised: bool, timeout_s: float | None,
                 say: Callable[[str], None]):
        self.job = job
        self.supervised = supervised
        self.timeout_s = timeout_s
        self.say = say
        self.endpoint = job.cluster.endpoint("status")
        self.store = Store(job.checkpoint.dir) if job.checkpoint.dir else None
        self.resumable_said: int | None = None
        self.store_error_said = False

    def run(self) -> int:
        ctx = zmq.Context()
        try:
            try:
                curve = security.for_process(ctx, self.job.cluster, security.OPERATOR,
                                             authenticate=False)
            except OSError as exc:   # no key pair
                self.say(f"cannot wait: {exc}")
                return UNKNOWN
            secure = None if curve is None else functools.partial(curve.client,
                                                                  address=self.endpoint)
            sub = sockets.connect(ctx, zmq.SUB, self.endpoint, rcvhwm=16, secure=secure)
            return self.watch(sub)
        finally:
            ctx.destroy(linger=0)

    def watch(self, sub: zmq.Socket) -> int:
        started = time.monotonic()
        heard: float | None = None   # the last status
        look_in_store = started      # at once: the job may have ended before the waiter came
        self.say(f"waiting for job {self.job.name} to end (control's status at "
                 f"{self.endpoint})")
        traffic = sockets.Traffic()
        while True:
            if sub.poll(1000):
                final = None
                while True:   # the newest status waiting
                    try:
                        _, env = sockets.recv(sub, router=False, traffic=traffic)
                    except zmq.Again:
                        break
                    except ProtocolError:
                        continue   # a bad message is not the end
                    if isinstance(env.msg, Status):
                        try:
                            final = env.msg.snapshot().get("final")
                        except ProtocolError:
                            continue
                        heard = time.monotonic()
                if final:
                    code = self.ended(dict(final))
                    if code is not None:
                        return code
            now = time.monotonic()
            quiet_s = now - (started if heard is None else heard)
            if self.store is not None and now >= look_in_store and (
                    heard is None or quiet_s >= STORE_AFTER_S):
                look_in_store = now + STORE_AFTER_S
                summary = self.stored_summary()
                if summary is not None:
                    code = self.ended(summary)
                    if code is not None:
                        return code
            if self.timeout_s is not None and quiet_s > self.timeout_s:
                self.say(f"no status from control at {self.endpoint} for {self.timeout_s:g} s: "
                         "cannot tell how the job ended")
                return UNKNOWN

    def ended(self, f: dict[str, Any]) -> int | None:
        """The exit status for these final figures, said; None (said once) when the wait
        goes on through a resumable end."""
        resume_from = f.get("resume_from")
        code = verdict(f.get("status"), resume_from, self.supervised)
        if code is None:
            if resume_from != self.resumable_said:
                self.resumable_said = resume_from
                self.say(f"{ended_line(self.job.name, f)}; resumable from checkpoint "
                         f"{resume_from}: waiting for it to go on")
            return None
        self.say(ended_line(self.job.name, f))
        return code

    def stored_summary(self) -> dict[str, Any] | None:
        """The run's summary in the checkpoint store, once it ended; else None."""
        assert self.store is not None
        try:
            if self.store.size(SUMMARY) is None:
                return None
            summary = orjson.loads(self.store.read_bytes(SUMMARY))
        except (OSError, StorageError, orjson.JSONDecodeError) as exc:
            if not self.store_error_said:
                self.store_error_said = True
                self.say(f"cannot read the summary in {self.job.checkpoint.dir}: {exc}")
            return None
        return summary if isinstance(summary, dict) else None


def wait(job: Job, supervised: bool, timeout_s: float | None) -> int:
    def say(line: str) -> None:
        print(f"zbus ctl: {line}", flush=True)
    try:
        return Waiter(job, supervised=supervised, timeout_s=timeout_s, say=say).run()
    except KeyboardInterrupt:
        print("zbus ctl: stopped waiting", file=sys.stderr)
        return UNKNOWN
