"""A small TCP probe run inside a namespace (``roles/testbed/netns.py``): an echo and sink
server, the round trip of a TCP connect and of 1-byte echoes, and a one-way stream's throughput.

    python roles/testbed/netprobe.py serve PORT                # echo server; 'S' first: a sink
    python roles/testbed/netprobe.py rtt HOST PORT [N]         # JSON: connect_ms, echo_ms
    python roles/testbed/netprobe.py stream HOST PORT SECONDS  # JSON: MB/s sent one way
"""

from __future__ import annotations

import socket
import statistics
import sys
import threading
import time

import orjson

CHUNK = 1 << 20


def serve(port: int) -> None:
    listener = socket.create_server(("0.0.0.0", port), reuse_port=True)
    print("ready", flush=True)
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=handle, args=(conn,), daemon=True).start()


def handle(conn: socket.socket) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        first = conn.recv(1)
        if first == b"S":  # a sink: read until the peer closes, then say how much
            total = 1
            while data := conn.recv(CHUNK):
                total += len(data)
            return
        while first:
            conn.sendall(first)
            first = conn.recv(1)


def rtt(host: str, port: int, n: int) -> dict:
    connects, echoes = [], []
    for _ in range(n):
        started = time.perf_counter()
        conn = socket.create_connection((host, port), timeout=10)
        connects.append(time.perf_counter() - started)
        with conn:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            for _ in range(5):
                started = time.perf_counter()
                conn.sendall(b"e")
                conn.recv(1)
                echoes.append(time.perf_counter() - started)
    return {"connect_ms": statistics.median(connects) * 1000,
            "echo_ms": statistics.median(echoes) * 1000,
            "echo_min_ms": min(echoes) * 1000}


def stream(host: str, port: int, seconds: float) -> dict:
    payload = b"S" + bytes(CHUNK - 1)
    with socket.create_connection((host, port), timeout=10) as conn:
        sent, started = 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            conn.sendall(payload)
            sent += len(payload)
        conn.shutdown(socket.SHUT_WR)
        conn.recv(1)  # the sink closes once it has read everything
        took = time.perf_counter() - started
    return {"mb_per_s": sent / took / 1e6, "seconds": took}


def main() -> None:
    mode, *args = sys.argv[1:]
    if mode == "serve":
        serve(int(args[0]))
        return
    result = rtt(args[0], int(args[1]), int(args[2]) if len(args) > 2 else 10) \
        if mode == "rtt" else stream(args[0], int(args[1]), float(args[2]))
    sys.stdout.write(orjson.dumps(result).decode() + "\n")


if __name__ == "__main__":
    main()
