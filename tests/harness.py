"""Helpers for integration tests: real role processes on loopback (``tests.local_cluster``), and a
fake control that admits single roles so that they can be driven over their real sockets."""

from __future__ import annotations

import gzip
import time
from pathlib import Path

import zmq
from local_cluster import BIN, LocalCluster

from roles.data.index import index_files, plan_parts
from zbus.codec import Message, decode
from zbus.messages import Heartbeat, Hello, Probe, Welcome

REPO = Path(__file__).resolve().parent.parent
ADULT_JOB = REPO / "jobs" / "adult.toml"
ADULT_TRAIN_ROWS = 39074   # the Adult job's training split (the last 20 % of rows: eval)
# the same rows as a plain CSV (``adult_text``): the eval split begins at the first line start at
# or after the last 20 % of its bytes (``roles.data.index``), one row later than by rows
ADULT_TEXT_TRAIN_ROWS, ADULT_TEXT_EVAL_ROWS = 39075, 9767
SLOW = {"model__hidden": [512, 256]}  # Adult's epochs of seconds: long enough to kill mid-epoch
__all__ = ["ADULT_JOB", "ADULT_TEXT_EVAL_ROWS", "ADULT_TEXT_TRAIN_ROWS", "BIN", "REPO", "Cluster",
           "FakeControl", "adult_text", "criteo_data",
           "dealer", "job_text", "recv_within", "reply", "text_split_rows"]


def text_split_rows(path: Path, fmt: str, eval_fraction: float = 0.2) -> tuple[int, int]:
    """The training and eval rows of a small plain text file as a job splits it (by bytes, at a
    line start: ``roles.data.index``), counted line by line."""
    parts, _ = plan_parts(index_files([str(path)], fmt), eval_fraction, 64)
    data = path.read_bytes()
    rows = [0, 0]
    for p in parts:
        rows[p.eval] += sum(1 for line in data[p.start:p.end].split(b"\n") if line.strip())
    return rows[0], rows[1]


def criteo_data(path: Path | str) -> str:
    """The ``[data]`` lines of a Criteo-layout file (``scripts/make_criteo.py``)."""
    return f'path = "{path}"\nformat = "criteo"'


def job_text(name: str, data: str, *, dim: int = 8, hidden: tuple[int, ...] = (64, 32),
             epochs: int = 1, batch_size: int = 1024, train: str = "", more: str = "") -> str:
    """A job file's text for generated data (2 workers, 2 shards, a fifth of the rows kept
    for evaluation): ``data``'s lines under ``[data]``, ``train``'s under ``[train]``, and
    ``more`` (further sections) at the end."""
    return (f'name = "{name}"\n[data]\neval_fraction = 0.2\n{data}\n'
            f"[model]\nembedding_dim = {dim}\nhidden = {list(hidden)}\n"
            f"[train]\nepochs = {epochs}\nbatch_size = {batch_size}\n{train}\n"
            f"[cluster]\nworkers = 2\nshards = 2\n{more}")


def adult_text(directory: Path) -> str:
    """The shipped Adult data as a plain CSV (a gzipped file is one part; a plain one is cut
    into parts that several feeders read): its path, for ``data__path``."""
    path = directory / "adult.csv"
    if not path.exists():
        path.write_bytes(gzip.decompress((REPO / "data" / "adult.csv.gz").read_bytes()))
    return str(path)


class Cluster(LocalCluster):
    """A LocalCluster with a short heartbeat, so that tests detect things quickly."""

    def __init__(self, workdir: Path, job: Path | None = None, transport: str = "ipc",
                 **settings: object):
        settings.setdefault("cluster__heartbeat_s", 0.25)
        super().__init__(workdir, job, transport, **settings)


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
