"""A user-space Ethernet bridge that delays every frame: the link emulation of the benchmark
across namespaces (``scripts/bench_hosts.py``), for kernels without ``tc netem``.

    python roles/testbed/delay_bridge.py --delay-ms 0.5 --ready FILE PORT PORT PORT

Run in the hub namespace (``netns.py`` here starts it): one AF_PACKET raw socket bound to each
hub-side veth; every frame that comes in on a port goes out on the port its destination MAC was
learnt on (else on every other port) ``--delay-ms`` later (one way: RTT/2). Each port's frames
leave in the order they came, from one schedule (a deque per destination, FIFO, since every
frame has the same delay). The sockets carry virtio-net headers (``PACKET_VNET_HDR``), so a
GSO super-frame (up to 64 KB, which veth hands over with its checksum unfinished) is forwarded
whole, header and all, and the kernel cuts it up and checksums it on the way out: Python sees
one frame per 64 KB rather than one per 1,500 bytes. Egress still goes through each veth's
qdisc (``tc tbf`` for bandwidth). SIGTERM or SIGINT ends it; it writes its counters (frames,
bytes, super-frames) as JSON to ``--stats`` then.
"""

from __future__ import annotations

import argparse
import heapq
import os
import select
import signal
import socket
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson

ETH_P_ALL = 0x0003
SOL_PACKET = 263
PACKET_VNET_HDR = 15
PACKET_IGNORE_OUTGOING = 23
PACKET_OUTGOING = 4
VNET_HDR = 10           # struct virtio_net_hdr
GSO_NONE = 0
BUFFER = 64 << 20       # socket buffers (root may exceed rmem_max)
SO_RCVBUFFORCE, SO_SNDBUFFORCE = 33, 32


def open_port(name: str) -> socket.socket:
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
    sock.setsockopt(SOL_PACKET, PACKET_VNET_HDR, 1)
    sock.setsockopt(SOL_PACKET, PACKET_IGNORE_OUTGOING, 1)
    sock.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, BUFFER)
    sock.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, BUFFER)
    sock.bind((name, ETH_P_ALL))
    sock.setblocking(False)
    return sock


class Bridge:
    def __init__(self, ports: list[str], delay_s: float):
        self.names = ports
        self.socks = [open_port(p) for p in ports]
        self.delay_s = delay_s
        self.macs: dict[bytes, int] = {}              # learnt: source MAC -> port
        self.queues: list[deque[tuple[float, bytes]]] = [deque() for _ in ports]
        self.due: list[tuple[float, int]] = []        # (time, port) of each queue's head
        self.stats: dict[str, Any] = {"frames": 0, "bytes": 0, "super_frames": 0, "largest": 0,
                      "send_errors": 0, "bytes_in": dict.fromkeys(ports, 0)}

    def receive(self, port: int, now: float) -> None:
        sock = self.socks[port]
        for _ in range(256):  # drain, a bounded number at a time
            try:
                data, addr = sock.recvfrom(70_000)
            except BlockingIOError:
                return
            if addr[2] == PACKET_OUTGOING or len(data) < VNET_HDR + 14:
                continue
            frame = data[VNET_HDR:]
            self.stats["frames"] += 1
            self.stats["bytes"] += len(frame)
            self.stats["bytes_in"][self.names[port]] += len(frame)
            self.stats["largest"] = max(self.stats["largest"], len(frame))
            if data[1] != GSO_NONE:
                self.stats["super_frames"] += 1
            self.macs[frame[6:12]] = port
            out = self.macs.get(frame[0:6]) if not frame[0] & 1 else None
            targets = [out] if out is not None and out != port else \
                [p for p in range(len(self.socks)) if p != port]
            for p in targets:
                if self.delay_s <= 0:
                    self.send(p, data)
                else:
                    if not self.queues[p]:
                        heapq.heappush(self.due, (now + self.delay_s, p))
                    self.queues[p].append((now + self.delay_s, data))

    def send(self, port: int, data: bytes) -> None:
        try:
            self.socks[port].send(data)
        except OSError:  # a full queue (tbf) drops the frame, as a switch would
            self.stats["send_errors"] += 1

    def flush(self, now: float) -> None:
        while self.due and self.due[0][0] <= now:
            _, p = heapq.heappop(self.due)
            queue = self.queues[p]
            while queue and queue[0][0] <= now:
                self.send(p, queue.popleft()[1])
            if queue:
                heapq.heappush(self.due, (queue[0][0], p))

    def run(self, stop: list[bool]) -> None:
        """select, not epoll: its timeout has microseconds (epoll's rounds up to 1 ms)."""
        by_fd = {sock.fileno(): i for i, sock in enumerate(self.socks)}
        fds = list(by_fd)
        while not stop:
            timeout = 0.5 if not self.due else min(0.5, max(0.0, self.due[0][0]
                                                                - time.monotonic()))
            try:
                readable, _, _ = select.select(fds, [], [], timeout)
            except InterruptedError:
                continue
            now = time.monotonic()
            for fd in readable:
                self.receive(by_fd[fd], now)
            self.flush(time.monotonic())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ports", nargs="+")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="one way (RTT/2)")
    parser.add_argument("--ready", type=Path, help="touched once the sockets are bound")
    parser.add_argument("--stats", type=Path, help="counters written here on exit")
    args = parser.parse_args()
    stop: list[bool] = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    bridge = Bridge(args.ports, args.delay_ms / 1000)
    try:  # the bridge plays the network: it goes before the roles (which it shares cores with)
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except OSError:
        pass
    if args.ready:
        args.ready.write_bytes(str(os.getpid()).encode())
    bridge.run(stop)
    if args.stats:
        args.stats.write_bytes(orjson.dumps(bridge.stats))
    sys.exit(0)


if __name__ == "__main__":
    main()
