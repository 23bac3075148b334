#!/usr/bin/env python
"""The bus's own cost: zbus messages (msgpack header + raw array frames, encoded with
``to_frames``, sent with ``zbus.sockets.send``, received and validated with
``zbus.sockets.recv``) against raw pyzmq ``send_multipart`` / ``recv_multipart`` of the same
bytes, in one run: PUSH/PULL and DEALER/ROUTER (request and reply), over tcp and ipc, at 1 KB,
64 KB and 1 MB payloads. Messages/s and MB/s of payload; the ratio zbus / raw is the median
over ``--repeats`` alternating runs of each pair.

Two raw sides, the frames only: ``raw`` with pyzmq's ``send_multipart`` /
``recv_multipart`` (what a pyzmq user writes), ``calls`` with pyzmq's Cython ``send`` /
``recv`` per frame (the calls ``zbus.sockets`` makes: the strongest comparator); a ratio
against each.

Sender and receiver are two processes (as on the bus). Two zbus messages: SampleBatch (the
sample queue's: 5 scalar fields, a float32 array of the payload size, labels and weights of one
element: 5 frames) and Weights (3 scalar fields, one float32 array: 3 frames). The raw side
sends the very frames the zbus message encodes to (same count and bytes), without encoding,
validating or counting anything.

    .venv/bin/python scripts/bench_bus.py [--repeats 5] [--seconds 1.0]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import zmq

from roles.protocol.datapath import SampleBatch
from roles.protocol.dense_sync import Weights
from zbus import sockets
from zbus.codec import Message

SIZES = {"1 KB": 1024, "64 KB": 64 * 1024, "1 MB": 1024 * 1024}
KINDS = ("zbus", "raw", "calls")
SEND, RECV, SNDMORE = zmq.backend.Socket.send, zmq.backend.Socket.recv, int(zmq.SNDMORE)


def message(nbytes: int, kind: str = "SampleBatch") -> Message:
    cols = max(1, nbytes // 4)
    if kind == "Weights":
        return Weights(round=1, step=0, generation=0, params=np.ones(cols, np.float32))
    return SampleBatch(batch_id=1, epoch=0, eval=False, min_round=0, round=0,
                       dense=np.ones((1, cols), np.float32), labels=np.zeros(1, np.float32),
                       weights=np.ones(1, np.float32), lengths=np.zeros((1, 0), np.int32))


def raw_frames(msg: Message) -> list:
    """Frames of the same sizes as the zbus message's, without encoding anything."""
    return [bytes(f) for f in msg.to_frames("bench", 1)]


def sender(kind: str, pattern: str, endpoint: str, nbytes: int, count: int,
           msg_type: str) -> None:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH if pattern == "push/pull" else zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 5000)
    sock.connect(endpoint)
    msg = message(nbytes, msg_type)
    frames = raw_frames(msg)
    traffic = sockets.Traffic()
    for i in range(count):
        if kind == "zbus":
            sockets.send(sock, msg, sender="bench", seq=i, traffic=traffic)
        elif kind == "raw":
            sock.send_multipart(frames, copy=sum(map(len, frames)) < 65536)  # as zbus
        else:  # "calls": pyzmq's Cython send per frame, as zbus.sockets.send makes them
            copy = sum(map(len, frames)) < 65536
            for frame in frames[:-1]:
                SEND(sock, frame, SNDMORE, copy, False)
            SEND(sock, frames[-1], 0, copy, False)
        if pattern == "dealer/router" and (i + 1) % 64 == 0:
            sock.recv()  # the router's acknowledgement of 64 messages: a bounded window
    sock.close()
    ctx.term()


def receive(kind: str, pattern: str, endpoint: str, nbytes: int, seconds: float,
            msg_type: str) -> tuple:
    """Messages and payload bytes per second received (the sender runs in another process)."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL if pattern == "push/pull" else zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind(endpoint)
    # calibrate: about `seconds` worth of messages at a rough rate
    count = max(200, int(seconds * min(200_000, 2e9 / max(nbytes, 1))))
    proc = mp.get_context("spawn").Process(target=sender,
                                           args=(kind, pattern, endpoint, nbytes, count,
                                                 msg_type))
    proc.start()
    traffic = sockets.Traffic()
    router = pattern == "dealer/router"
    got = 0
    first = None
    while got < count:
        if not sock.poll(20_000):
            raise SystemExit(f"{kind} {pattern}: stalled at {got} of {count}")
        if kind == "zbus":
            identity, env = sockets.recv(sock, router=router, traffic=traffic, flags=0)
            assert type(env.msg).__name__ == msg_type
        elif kind == "raw":
            frames = sock.recv_multipart(copy=False)
            identity = frames[0].bytes if router else None
        else:  # "calls": Frames from pyzmq's Cython recv until one says no more follow
            frame = RECV(sock, 0, False, False)
            frames = [frame]
            while frame.more:
                frame = RECV(sock, 0, False, False)
                frames.append(frame)
            identity = frames[0].bytes if router else None
        if first is None:
            first = time.perf_counter()
        got += 1
        if router and got % 64 == 0:
            sock.send_multipart([identity, b"k"])
    took = time.perf_counter() - first
    proc.join()
    sock.close()
    ctx.term()
    rate = (count - 1) / took
    return rate, rate * nbytes / 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=1.0)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        port = 0  # ipc endpoints' numbers; tcp ports are free ones (another bench may run)
        for msg_type in ("SampleBatch", "Weights"):
            for transport in ("tcp", "ipc"):
                for pattern in ("push/pull", "dealer/router"):
                    for label, nbytes in SIZES.items():
                        ratios, ratios_c = [], []
                        rates: dict[str, list] = {k: [] for k in KINDS}
                        for r in range(args.repeats):
                            pair = {}
                            for kind in KINDS[r % 3:] + KINDS[:r % 3]:   # each first in turn
                                port += 1
                                endpoint = (f"tcp://127.0.0.1:{sockets.free_tcp_ports(1)[0]}"
                                            if transport == "tcp"
                                            else f"ipc://{Path(tmp) / f'b{port}'}")
                                pair[kind] = receive(kind, pattern, endpoint, nbytes,
                                                     args.seconds, msg_type)
                                rates[kind].append(pair[kind])
                            ratios.append(pair["zbus"][0] / pair["raw"][0])
                            ratios_c.append(pair["zbus"][0] / pair["calls"][0])
                        z, w, c = (statistics.median(m for m, _ in rates[k]) for k in KINDS)
                        ratio, ratio_c = statistics.median(ratios), statistics.median(ratios_c)
                        rows.append((msg_type, transport, pattern, label, z, w, c, ratio,
                                     ratio_c, nbytes))
                        print(f"  {msg_type} {transport} {pattern} {label}: zbus {z:,.0f} "
                              f"msg/s, raw {w:,.0f}, calls {c:,.0f}; ratios {ratio:.2f}, "
                              f"{ratio_c:.2f}", flush=True)
    print("\n| message | transport | pattern | payload | zbus msg/s | zbus MB/s | raw msg/s "
          "| calls msg/s | zbus / raw | zbus / calls |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for msg_type, transport, pattern, label, z, w, c, ratio, ratio_c, nbytes in rows:
        print(f"| {msg_type} | {transport} | {pattern} | {label} | {z:,.0f} | "
              f"{z * nbytes / 1e6:,.0f} | {w:,.0f} | {c:,.0f} | {ratio:.2f} | {ratio_c:.2f} |")
    for msg_type in ("SampleBatch", "Weights"):
        for label, target in (("1 KB", 0.7), ("1 MB", 0.9)):
            for name, at in (("raw", 7), ("calls", 8)):
                got = [r[at] for r in rows if r[3] == label and r[0] == msg_type]
                print(f"{msg_type} {label}: zbus / {name} median {statistics.median(got):.2f}, "
                      f"lowest {min(got):.2f} (target >= {target}): "
                      f"{'met' if min(got) >= target else 'NOT met'} (by the lowest)")


if __name__ == "__main__":
    main()
