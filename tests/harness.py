"""Helpers for integration tests: real role processes on loopback (``tests.local_cluster``), and a
fake control that admits single roles so that they can be driven over their real sockets."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import zmq

from roles.testbed.jobs import (
    ADULT_JOB,
    ADULT_TEXT_EVAL_ROWS,
    ADULT_TEXT_TRAIN_ROWS,
    ADULT_TRAIN_ROWS,
    REPO,
    SLOW,
    adult_rows,
    adult_text,
    criteo_data,
    job_text,
    text_split_rows,
)
from roles.testbed.local_cluster import BIN, LocalCluster
from roles.testbed.netns import Hosts, namespaces_allowed
from zbus.codec import Message, decode
from zbus.messages import Heartbeat, Hello, Probe, Welcome

__all__ = ["ADULT_JOB", "ADULT_TEXT_EVAL_ROWS", "ADULT_TEXT_TRAIN_ROWS", "ADULT_TRAIN_ROWS",
           "BIN", "REPO", "SLOW", "TEST_DATA", "Cluster", "FakeControl", "adult_rows",
           "adult_text", "criteo_data", "dealer", "first_status", "hosts_or_skip", "job_text",
           "recv_within", "reply", "text_split_rows"]

TEST_DATA = Path(__file__).resolve().parent / "data"   # files the tests read


class Cluster(LocalCluster):
    """A LocalCluster with a short heartbeat, so that tests detect things quickly."""

    def __init__(self, workdir: Path, job: Path | None = None, transport: str = "ipc",
                 in_process: bool = False, **settings: object):
        settings.setdefault("cluster__heartbeat_s", 0.25)
        super().__init__(workdir, job, transport, in_process, **settings)


def recv_within(sock: zmq.Socket, timeout_s: float = 10.0) -> list[bytes]:
    """One multipart message, or AssertionError when none arrives in time."""
    if not sock.poll(int(timeout_s * 1000)):
        raise AssertionError(f"no message within {timeout_s} s")
    return sock.recv_multipart()


class FakeControl:
    """The test plays control: binds control's endpoints, admits nodes, reads heartbeats."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.ctx = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.bind(cluster.job.cluster.endpoint("control"))
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.bind(cluster.job.cluster.endpoint("control_pub"))
        self.beats: dict[str, Heartbeat] = {}

    def admit(self, nodes: set[str], timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        admitted: set[str] = set()
        while admitted != nodes:
            assert time.monotonic() < deadline, f"only {admitted} said Hello"
            identity, *frames = recv_within(self.router, deadline - time.monotonic())
            env = decode(frames)
            if isinstance(env.msg, Hello):
                admitted.add(identity.decode())
                self.router.send_multipart([identity, *Welcome(
                    accepted=True, reason="", run_id="t", run_dir=str(self.cluster.run_dir)
                ).to_frames("control-0")])

    def heartbeat(self, node: str, until, timeout_s: float = 20.0) -> Heartbeat:
        """The first heartbeat of ``node`` whose counters satisfy ``until``."""
        deadline = time.monotonic() + timeout_s
        while True:
            assert time.monotonic() < deadline, f"no matching heartbeat of {node}: " \
                f"{self.beats.get(node)}"
            identity, *frames = recv_within(self.router, deadline - time.monotonic())
            env = decode(frames)
            if isinstance(env.msg, Heartbeat):
                self.beats[identity.decode()] = env.msg
                if identity.decode() == node and until(env.msg.counters):
                    return env.msg

    def close(self) -> None:
        self.ctx.destroy(linger=0)


def dealer(ctx: zmq.Context, endpoint: str, identity: str) -> zmq.Socket:
    """A DEALER connected to ``endpoint`` as ``identity`` (a role's socket, as a test plays it)."""
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.IDENTITY, identity.encode())
    sock.connect(endpoint)
    return sock


def reply(sock: zmq.Socket) -> Message:
    """The next message other than control's health probes."""
    while True:
        msg = decode(recv_within(sock)).msg
        if not isinstance(msg, Probe):
            return msg


def hosts_or_skip(**kwargs: object) -> Hosts:
    """The namespaces built (``Hosts(**kwargs)``), or the test skipped, saying why, where the
    machine does not allow them; the caller closes them (``with``, or ``close()``)."""
    why = namespaces_allowed()
    if why:
        pytest.skip(why)
    hosts = Hosts(**kwargs)  # type: ignore[arg-type]
    try:
        hosts.build()
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        hosts.close()
        pytest.skip(f"cannot build the namespaces here ({' '.join(exc.cmd)}): "
                    f"{(exc.stderr or b'').decode(errors='replace').strip()}")
    return hosts


def first_status(endpoint: str, want, timeout_s: float = 60.0, cluster=None) -> dict:
    """The first status snapshot control publishes on ``endpoint`` that ``want`` accepts
    (``cluster``: the job's, for the operator's CURVE keys when it uses them)."""
    from roles.protocol.operator import Status
    from zbus import security
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    curve = None if cluster is None else security.for_process(ctx, cluster, security.OPERATOR,
                                                              authenticate=False)
    if curve is not None:
        curve.client(sub, endpoint)
    sub.connect(endpoint)
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if sub.poll(500):
                msg = decode(sub.recv_multipart()).msg
                if isinstance(msg, Status) and want(msg.snapshot()):
                    return msg.snapshot()
        raise AssertionError(f"no status as wanted within {timeout_s} s")
    finally:
        sub.close(0)
        ctx.term()
