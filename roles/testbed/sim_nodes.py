"""Stand-in nodes for console tests and benchmarks: one loop (``run``) that plays every node of a
job (feeder, aggregators, shards, workers) towards a real control over its real socket. Each says
Hello with the job's fingerprint, Ready (the feeder then its index of a made-up data set and
the statistics of its training part), then heartbeats with changing load figures and counters
and answers probes; none trains. When control says Stop, every one says it leaves (as a node
does) and ``run`` returns. Control thus sees a cluster of any size, here on two
cores (32 nodes as 32 Python processes with PyTorch would not fit).

With ``windows_count`` N (``--windows``; a job with ``[placement] mode = "skew"``) the stand-ins
also drive control's placement: the feeder closes N allocation windows of Zipf-skewed keys
(``KeyCounts``, ``window_rate`` a second), answers a new key map with ``Drained``; each shard
reports every window's work (``WindowWork``, shard i being i + 1 times slower per pair) until
control has recorded it, and answers a map in phase move with ``Moved``.

``scripts/sim_nodes.py`` runs it as a process of its own; a test may run it on a thread.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import zmq

from roles.algorithms.shard.window_work import WindowLedger
from roles.algorithms.shared.key_map import HeavyHitters, KeyMap
from roles.job.settings import Job
from roles.protocol.datapath import DataIndex, PartMap, PartStats
from roles.protocol.placement import Drained, KeyCounts, Moved, Placement, WorkRecorded
from zbus import sockets
from zbus.codec import decode
from zbus.endpoints import CONTROL_PUB
from zbus.messages import Heartbeat, Hello, Leaving, Probe, ProbeReply, Ready, Stop, Welcome

# the data the stand-in feeder says it indexed: one training part and one eval part
PARTS = np.array([[0, 0, 0, 1_000_000, 0, 0, 0], [1, 0, 1_000_000, 10_000, 0, 0, 1]], np.int64)


class SimNode:
    def __init__(self, ctx: zmq.Context, endpoint: str, node_id: str, rng: random.Random,
                 dense: int = 0, host: str = ""):
        self.node_id = node_id
        self.host = host or socket.gethostname()
        self.role, index = node_id.rsplit("-", 1)
        self.index = int(index)
        self.sock = sockets.connect(ctx, zmq.DEALER, endpoint, identity=node_id)
        self.rng = rng
        self.dense = dense
        self.welcomed = False
        self.seq = 0
        self.traffic = sockets.Traffic()
        self.totals = {"samples": 0, "in": 0, "out": 0, "keys": 0}

    def send(self, msg) -> None:
        self.seq += 1
        sockets.send(self.sock, msg, sender=self.node_id, seq=self.seq, traffic=self.traffic)

    def hello(self, fingerprint: str) -> None:
        self.send(Hello(role=self.role, index=self.index, host=self.host,
                        pid=os.getpid(), fingerprint=fingerprint))

    def beat(self) -> None:
        r = self.rng
        self.totals["samples"] += r.randint(500, 5000)
        self.totals["in"] += r.randint(10_000, 5_000_000)
        self.totals["out"] += r.randint(10_000, 5_000_000)
        self.totals["keys"] += r.randint(1000, 100_000)
        counters: dict[str, object] = {"bytes_in": {"data": self.totals["in"]},
                                       "bytes_out": {"data": self.totals["out"]}}
        if self.role == "worker":
            counters.update(samples_trained=self.totals["samples"], pipeline=r.randint(0, 4),
                            round_samples=r.randint(0, 20_000))
        elif self.role == "feeder":
            counters.update(samples_acked=self.totals["samples"], in_flight=r.randint(0, 40),
                            epoch_samples=self.totals["samples"] % 1_000_000)
        elif self.role == "ps":
            counters.update(keys_received=self.totals["keys"], keys=r.randint(10**5, 10**6),
                            held_batches=r.randint(0, 8), waiting_lookups=r.randint(0, 4))
        if self.role == "feeder":  # its statistics, until control has them all
            self.send(PartStats(first_rejected="", parts=np.array([0], np.int64),
                                counts=np.array([[1000, 1000, 0, 0, -1]], np.int64),
                                moments=np.ones((1, 3, self.dense))))
        self.send(Heartbeat(role=self.role, index=self.index, state="training",
                            load={"cpu": r.uniform(0, 100), "rss": r.randint(50, 900) << 20,
                                  "net": {"lo": [self.totals["out"], self.totals["in"]]},
                                  "speed": {}},
                            counters=counters, final=False))

    def on_message(self, windows: Windows | None = None) -> None:
        _, env = sockets.recv(self.sock, router=False, traffic=self.traffic)
        match env.msg:
            case WorkRecorded() as m if windows is not None:
                windows.ledgers[self.index].answered(m)
            case Welcome(accepted=True) if not self.welcomed:
                self.welcomed = True
                self.send(Ready(info={}))
                if self.role == "feeder":
                    self.send(DataIndex(n_train=1_000_000, oracle_aucs=[],
                                        body=PartMap.body_of([]), parts=PARTS))
            case Welcome(accepted=False, reason=reason):
                raise SystemExit(f"sim_nodes: {self.node_id} refused: {reason}")
            case Probe(nonce=nonce):
                self.send(ProbeReply(nonce=nonce))


class Windows:
    """The feeder's allocation windows and the shards' work in them (``--windows``)."""

    KEYS_PER_WINDOW = 50_000

    def __init__(self, job: Job, count: int, rate: float, seed: int = 7):
        p, c = job.placement, job.cluster
        self.job, self.count, self.interval = job, count, 1.0 / rate
        self.keymap = KeyMap.hashed(c.shards, p.buckets_per_shard)
        self.ledgers = {i: WindowLedger() for i in range(c.shards)}
        self.rng = np.random.default_rng(seed)
        self.sent = 0
        self.next_at = 0.0
        self.drained: set[int] = set()
        self.moved: set[int] = set()

    def due(self, now: float) -> KeyCounts | None:
        """The next window's counts, when it is time; the shards' work in it is noted."""
        if self.sent >= self.count or now < self.next_at:
            return None
        self.next_at = max(self.next_at + self.interval, now - self.interval)
        p = self.job.placement
        keys = (self.rng.zipf(1.2, self.KEYS_PER_WINDOW) * 7919).astype(np.int64)
        heavy = HeavyHitters(p.heavy_keys)
        heavy.add(keys)
        owner = self.keymap.owner_of(keys)
        shard_pairs = np.bincount(owner, minlength=self.keymap.shards)
        for shard, ledger in self.ledgers.items():
            pairs = int(shard_pairs[shard])
            per_pair = 1e-6 * (shard + 1) * self.rng.lognormal(0.0, 0.1)
            ledger.add(self.sent, "lookup", pairs, pairs * per_pair)
            ledger.add(self.sent, "update", pairs, pairs * per_pair / 2)
        counts = KeyCounts(window=self.sent, version=self.keymap.version, size=heavy.size,
                           pairs=heavy.total, keys=heavy.keys, counts=heavy.counts,
                           errors=heavy.errors,
                           bucket_pairs=np.bincount(self.keymap.bucket_of(keys),
                                                    minlength=len(self.keymap.buckets)),
                           shard_pairs=shard_pairs)
        self.sent += 1
        return counts

    def placement(self, m: Placement, feeder: SimNode, shards: list[SimNode]) -> None:
        """Control's key map: drained at once, moved at once, then routed by."""
        if m.phase == "drain" and m.version not in self.drained:
            self.drained.add(m.version)
            feeder.send(Drained(version=m.version))
        elif m.phase == "move" and m.version not in self.moved:
            self.moved.add(m.version)
            for shard in shards:
                shard.send(Moved(version=m.version, sent=0, received=0))
        elif m.phase == "active" and m.version > self.keymap.version:
            self.keymap = KeyMap.from_message(m, self.keymap.shards,
                                              self.job.placement.buckets_per_shard)

    def report(self, shard: SimNode) -> None:
        work = self.ledgers[shard.index].report(Counter())
        if work is not None:
            shard.send(work)


def run(job: Job, seconds: float = 3600.0, windows_count: int = 0, window_rate: float = 20.0,
        stopped: Callable[[], bool] = lambda: False, host: str = "") -> None:
    """Every node of ``job`` played towards its control for ``seconds`` or until ``stopped()``
    (looked at every quarter heartbeat); ``windows_count`` allocation windows (``Windows``).
    ``host``: the one the nodes say they run on (default this one's name; a test running them
    on a thread says ``roles.testbed.in_process.IN_PROCESS`` after it, as its in-process roles
    do, so that control does not take the test's process for theirs)."""
    c = job.cluster
    ctx = zmq.Context()
    rng = random.Random(7)
    nodes = [SimNode(ctx, c.endpoint("control"), node_id, rng, len(job.dense_fields), host)
             for node_id in c.expected_nodes()]
    poller = zmq.Poller()
    for node in nodes:
        poller.register(node.sock, zmq.POLLIN)
    by_sock = {node.sock: node for node in nodes}
    windows = Windows(job, windows_count, window_rate) if windows_count else None
    feeder = next(n for n in nodes if n.role == "feeder")
    shards = [n for n in nodes if n.role == "ps"]
    commands = sockets.connect(ctx, zmq.SUB, c.endpoint(CONTROL_PUB), identity="sim")
    commands.setsockopt(zmq.SUBSCRIBE, b"")
    poller.register(commands, zmq.POLLIN)
    end = time.monotonic() + seconds
    next_beat = 0.0
    try:
        while not stopped() and time.monotonic() < end:
            for sock, _ in poller.poll(int(c.heartbeat_s * 250)):
                if sock is commands:
                    msg = decode(commands.recv_multipart()).msg
                    if windows is not None and isinstance(msg, Placement):
                        windows.placement(msg, feeder, shards)
                    elif isinstance(msg, Stop):   # the job is over: each leaves, as a node
                        for node in nodes:
                            if node.welcomed:
                                node.send(Leaving(reason="the job is over"))
                        return
                else:
                    by_sock[sock].on_message(windows)
            now = time.monotonic()
            if windows is not None and feeder.welcomed and all(s.welcomed for s in shards):
                counts = windows.due(now)
                if counts is not None:
                    feeder.send(counts)
            if now >= next_beat:
                next_beat = now + c.heartbeat_s
                for node in nodes:
                    node.beat() if node.welcomed else node.hello(job.fingerprint())
                    if windows is not None and node.welcomed and node.role == "ps":
                        windows.report(node)
    finally:
        ctx.destroy(linger=0)

