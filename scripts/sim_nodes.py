"""Stand-in nodes for console tests and benchmarks: one process that plays every node of a job
(feeder, aggregators, shards, workers) towards a real control over its real socket. Each says
Hello with the job's fingerprint, Ready (the feeder then its index of a made-up data set and
the statistics of its training part), then heartbeats with changing load figures and counters
and answers probes; none trains. Control thus sees a cluster of any size, here on two
cores (32 nodes as 32 Python processes with PyTorch would not fit).

    python scripts/sim_nodes.py [--seconds N]      job from ZBUS_JOB / ZBUS_* as for roles
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import socket
import time

import numpy as np
import zmq

from roles.job.settings import load_job
from roles.protocol.datapath import DataIndex, PartMap, PartStats
from zbus import sockets
from zbus.messages import Heartbeat, Hello, Probe, ProbeReply, Ready, Welcome

# the data the stand-in feeder says it indexed: one training part and one eval part
PARTS = np.array([[0, 0, 0, 1_000_000, 0, 0, 0], [1, 0, 1_000_000, 10_000, 0, 0, 1]], np.int64)


class SimNode:
    def __init__(self, ctx: zmq.Context, endpoint: str, node_id: str, rng: random.Random,
                 dense: int = 0):
        self.node_id = node_id
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
        self.send(Hello(role=self.role, index=self.index, host=socket.gethostname(),
                        pid=os.getpid(), fingerprint=fingerprint))

    def beat(self) -> None:
        r = self.rng
        self.totals["samples"] += r.randint(500, 5000)
        self.totals["in"] += r.randint(10_000, 5_000_000)
        self.totals["out"] += r.randint(10_000, 5_000_000)
        self.totals["keys"] += r.randint(1000, 100_000)
        counters = {"bytes_in": {"data": self.totals["in"]},
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

    def on_message(self) -> None:
        _, env = sockets.recv(self.sock, router=False, traffic=self.traffic)
        match env.msg:
            case Welcome(accepted=True) if not self.welcomed:
                self.welcomed = True
                self.send(Ready(info={}))
                if self.role == "feeder":
                    self.send(DataIndex(n_train=1_000_000, oracle_auc=-1.0,
                                        body=PartMap.body_of([]), parts=PARTS))
            case Welcome(accepted=False, reason=reason):
                raise SystemExit(f"sim_nodes: {self.node_id} refused: {reason}")
            case Probe(nonce=nonce):
                self.send(ProbeReply(nonce=nonce))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3600.0)
    args = parser.parse_args(argv)
    job = load_job(None)
    c = job.cluster
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    ctx = zmq.Context()
    rng = random.Random(7)
    nodes = [SimNode(ctx, c.endpoint("control"), node_id, rng, len(job.dense_fields))
             for node_id in c.expected_nodes()]
    poller = zmq.Poller()
    for node in nodes:
        poller.register(node.sock, zmq.POLLIN)
    by_sock = {node.sock: node for node in nodes}
    end = time.monotonic() + args.seconds
    next_beat = 0.0
    try:
        while not stop and time.monotonic() < end:
            for sock, _ in poller.poll(int(c.heartbeat_s * 250)):
                by_sock[sock].on_message()
            now = time.monotonic()
            if now >= next_beat:
                next_beat = now + c.heartbeat_s
                for node in nodes:
                    node.beat() if node.welcomed else node.hello(job.fingerprint())
    finally:
        ctx.destroy(linger=0)


if __name__ == "__main__":
    main()
