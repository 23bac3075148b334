#!/usr/bin/env python
"""Whether closing a socket half-way through a multipart send, while its peer's connection drops,
aborts the process in this libzmq (``zbus.sockets.CLOSE_LINGER_MS`` says why roles close with a
linger): per trial a sender process pushes 800 kB multipart messages at a receiver process over
ipc for 0.3 s, then closes its context with ``--linger`` ms while the receiver exits with
messages in flight; prints how many senders died of SIGABRT, against linger 0 in the same run.

    .venv/bin/python scripts/check_close.py [--trials 200] [--linger 100]
"""

from __future__ import annotations

import argparse
import os
import signal
import tempfile
import time

import numpy as np
import zmq
from bench_serve import cpu_name  # (scripts/ is the script's own directory)

from zbus.sockets import CLOSE_LINGER_MS

SECONDS = 0.3


def sender(address: str, linger: int, go: int) -> None:
    ctx = zmq.Context()
    s = ctx.socket(zmq.PUSH)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.SNDHWM, 4)
    s.connect(address)
    frames = [b"h" * 100] + [np.ones(200_000, np.float32).tobytes() for _ in range(4)]
    os.read(go, 1)
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        try:
            s.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            pass
    ctx.destroy(linger=linger)
    os._exit(0)


def receiver(address: str, go: int) -> None:
    ctx = zmq.Context()
    r = ctx.socket(zmq.PULL)
    r.setsockopt(zmq.LINGER, 0)
    r.setsockopt(zmq.RCVHWM, 4)
    r.bind(address)
    os.read(go, 1)
    end = time.monotonic() + SECONDS
    while time.monotonic() < end:
        if r.poll(1):
            r.recv_multipart(copy=False)
    os._exit(0)   # gone with messages in flight, as a role stopped with its peers


def aborts(linger: int, trials: int, directory: str) -> int:
    died = 0
    for i in range(trials):
        address = f"ipc://{directory}/s{linger}-{i}"
        go_r, go_w = os.pipe()
        pids = []
        for role in (receiver, sender):
            pid = os.fork()
            if pid == 0:
                role(address, go_r) if role is receiver else sender(address, linger, go_r)
            pids.append(pid)
        time.sleep(0.05)
        os.write(go_w, b"xx")
        _, status = os.waitpid(pids[1], 0)
        os.waitpid(pids[0], 0)
        died += os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGABRT
        os.close(go_r)
        os.close(go_w)
    return died


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--linger", type=int, default=CLOSE_LINGER_MS)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="check-close-") as directory:
        ours = aborts(args.linger, args.trials, directory)
        zero = aborts(0, args.trials, directory)
    print(f"libzmq {zmq.zmq_version()}, {cpu_name()}: senders aborted on close: "
          f"{ours} of {args.trials} with linger {args.linger} ms, {zero} of {args.trials} "
          "with linger 0")


if __name__ == "__main__":
    main()
