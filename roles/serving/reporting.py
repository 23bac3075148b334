"""A serving process and the control of the job it follows, over control's request endpoint
(``roles.protocol.serving``): ``ask_job`` asks for the job (``zbus-serve --follow
tcp://host:port``, a server on another host: the run's job file and where its checkpoints
are), and a ``Reporter`` tells control every ``REPORT_S`` what this process serves (version,
version lag, requests/s, rows/s, p50/p99), which control's status lists for the console.

Each socket is a DEALER of its own, on a thread of its own (the follower's, the reporter's),
with the operator's CURVE keys when the job's bus is secured (``--keys``: the directory that
holds them, for a server whose job file names another host's).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from roles.job.settings import Job, JobError, parse_job
from roles.protocol.serving import FollowJob, FollowRequest, ServerReport
from roles.serving.metrics import Recent
from roles.serving.served import Served
from zbus import security
from zbus.codec import ProtocolError, decode
from zbus.endpoints import CONTROL_ID
from zbus.sockets import make_socket

log = logging.getLogger("zbus.serve")
REPORT_S = 1.0        # a ServerReport this often
ASK_AGAIN_S = 5.0     # a FollowRequest unanswered this long is sent again (control not up yet)
UNANSWERED_WARN = 6   # asks unanswered before the log says so


def server_name(port: int) -> str:
    """This serving process, as control lists it: host:port/pid."""
    return f"{socket.gethostname()}:{port}/{os.getpid()}"


def dealer(ctx: zmq.Context, endpoint: str, keys_dir: str | None, job: Job | None = None,
           sndhwm: int = 1000) -> zmq.Socket:
    """A DEALER to control's request endpoint ``endpoint``; a CURVE client with the operator's
    keys when ``keys_dir`` is given or ``job``'s bus is secured (``OSError``: no key pair)."""
    secure = None
    if keys_dir or (job is not None and job.cluster.curve_enabled()):
        where = Path(keys_dir or job.cluster.keys_dir)   # type: ignore[union-attr]
        public, secret = security.load_pair(where, security.OPERATOR)
        server = security.load_public(where, CONTROL_ID)

        def secure(sock: zmq.Socket) -> None:
            sock.curve_publickey, sock.curve_secretkey = public, secret
            sock.curve_serverkey = server

    sock = make_socket(ctx, zmq.DEALER, sndhwm=sndhwm, max_bytes=64 << 20, secure=secure)
    sock.connect(endpoint)
    return sock


def ask_job(endpoint: str, server: str, keys_dir: str | None,
            stop: threading.Event) -> tuple[Job, FollowJob] | None:
    """The job control at ``endpoint`` runs, asked until it answers (None: ``stop`` was set
    first). The job's keys directory is ``keys_dir`` here, when given."""
    ctx = zmq.Context()
    sock = None
    try:
        sock = dealer(ctx, endpoint, keys_dir, sndhwm=1)
        asked, times = 0.0, 0
        while not stop.is_set():
            now = time.monotonic()
            if now - asked >= ASK_AGAIN_S:
                try:   # (control away: the ask waits in the queue, one at most)
                    sock.send_multipart(FollowRequest(server=server).encode(server, 0)[0],
                                        flags=zmq.NOBLOCK)
                except zmq.Again:
                    pass
                asked, times = now, times + 1
                if times == UNANSWERED_WARN:
                    log.warning("zbus-serve: no answer from control at %s yet (is it up? with "
                                "CURVE on, --keys names the operator's keys)", endpoint)
            if not sock.poll(200):
                continue
            try:
                got = decode(sock.recv_multipart(copy=False)).msg
            except ProtocolError as exc:
                log.warning("zbus-serve: a malformed answer from %s (%s)", endpoint, exc)
                continue
            if not isinstance(got, FollowJob):
                log.warning("zbus-serve: %s answered %s, not the job", endpoint,
                            type(got).__name__)
                continue
            environ = {"ZBUS_CLUSTER__KEYS_DIR": keys_dir} if keys_dir else {}
            try:
                job = parse_job(got.job_text, f"{endpoint} (run {got.run_id})", None, environ)
            except JobError as exc:
                log.error("zbus-serve: the job %s sent cannot be read: %s", endpoint, exc)
                return None
            log.info("zbus-serve: following run %s (%s) of %s", got.run_id, job.name, endpoint)
            return job, got
        return None
    finally:
        if sock is not None:
            sock.close(0)
        ctx.term()


class Reporter:
    """Tells control at ``endpoint`` what this process serves, every ``REPORT_S``, from the
    model ``current()`` gives and the requests ``recent`` counts."""

    def __init__(self, endpoint: str, job: Job, keys_dir: str | None, server: str, url: str,
                 current: Callable[[], Served | None], recent: Recent, run_id: str):
        self.endpoint, self.job, self.keys_dir, self.run_id = endpoint, job, keys_dir, run_id
        self.server, self.url, self.current, self.recent = server, url, current, recent
        self.stop = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self.run, name="zbus-report", daemon=True)

    def start(self) -> Reporter:
        self.thread.start()
        return self

    def report(self) -> ServerReport:
        served = self.current()
        requests, rows, p50, p99 = self.recent.take()
        lag = -1.0
        if served is not None and served.trained_at is not None:
            lag = max(0.0, time.time() - served.trained_at)
        return ServerReport(server=self.server, run_id=self.run_id, url=self.url,
                            version="" if served is None else served.version,
                            ready=served is not None, version_lag_s=lag,
                            requests_per_s=requests, rows_per_s=rows, p50_ms=p50, p99_ms=p99)

    def run(self) -> None:
        ctx = zmq.Context()
        try:
            # control away: a few reports wait, the rest are dropped
            sock = dealer(ctx, self.endpoint, self.keys_dir, self.job, sndhwm=4)
        except OSError as exc:   # no key pair: said once, nothing reported
            log.warning("zbus-serve: cannot report to control at %s: %s", self.endpoint, exc)
            ctx.term()
            return
        try:
            while not self.stop.wait(REPORT_S):
                try:
                    sock.send_multipart(self.report().encode(self.server, self.sent)[0],
                                        flags=zmq.NOBLOCK)
                    self.sent += 1
                except zmq.Again:
                    pass
        finally:
            sock.close(0)
            ctx.term()

    def close(self) -> None:
        self.stop.set()
        if self.thread.is_alive():
            self.thread.join(timeout=5)


class Reporters:
    """A serving process's reporters: one per job followed (``on_job``, the follower's hook),
    each telling that job's control what ``current()`` serves, on ``host:port``."""

    def __init__(self, current: Callable[[], Served | None], recent: Recent,
                 keys_dir: str | None, host: str, port: int):
        self.current, self.recent, self.keys_dir = current, recent, keys_dir
        if host in ("0.0.0.0", "::", ""):   # every address (a pod's): its name says where
            host = socket.gethostname()
        self.server, self.url = server_name(port), f"http://{host}:{port}"
        self.started: list[Reporter] = []

    def on_job(self, job: Job, endpoint: str, run_id: str) -> None:
        self.started.append(Reporter(endpoint, job, self.keys_dir, self.server, self.url,
                                     self.current, self.recent, run_id).start())

    def close(self) -> None:
        for reporter in self.started:
            reporter.close()
