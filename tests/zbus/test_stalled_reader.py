"""A reader that stops reading for longer than any of zbus's TCP timeouts (a worker whose
short sample queue is full and whose batch runs long, a checkpoint's drain) loses nothing: its
connection stays up, a zero window and all. With TCP_USER_TIMEOUT set (10 s, as zbus once
had it), the kernel aborted such a connection after 10 s, and ZeroMQ dropped what the binding
side had queued on it: batches lost, a drain waiting for them until its timeout.

zbus's sockets set no TCP_USER_TIMEOUT (ZMQ_TCP_MAXRT), checked on the sockets; their one TCP
timeout is keepalive's (~10 s: ``zbus.sockets``), here scaled down to 2 s (probed after 1 s
idle, dropped after 1 unanswered probe a second later) so that a stall of 3 s outlasts it, as
13 s outlasted the 10 s before: the stall's length is only what outlasts the timeouts."""

from __future__ import annotations

import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from zbus import sockets

KEEPALIVE = {"KEEPALIVE_IDLE_S": 1, "KEEPALIVE_INTVL_S": 1, "KEEPALIVE_CNT": 1}   # ~2 s
STALL_S = 3.0   # longer than that keepalive


def test_a_reader_stalled_longer_than_the_tcp_timeouts_loses_no_message(monkeypatch):
    for name, value in KEEPALIVE.items():
        monkeypatch.setattr(sockets, name, value)
    ctx = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{sockets.free_tcp_ports(1)[0]}"
    # as the sample queue: small kernel buffers and high-water marks, so the window closes
    push = sockets.bind(ctx, zmq.PUSH, endpoint, sndhwm=2, kernel_buffer=65536)
    pull = sockets.connect(ctx, zmq.PULL, endpoint, rcvhwm=2, kernel_buffer=65536)
    monitor = push.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_ACCEPTED)
    try:
        assert push.getsockopt(zmq.TCP_MAXRT) == pull.getsockopt(zmq.TCP_MAXRT) == 0
        assert push.getsockopt(zmq.TCP_KEEPALIVE_IDLE) == 1   # the keepalive scaled down
        payload = b"x" * 100_000
        sent = 0
        deadline = time.monotonic() + 1   # fill every queue on the way (at once, on loopback)
        while time.monotonic() < deadline:
            try:
                push.send(payload, zmq.NOBLOCK)
                sent += 1
            except zmq.Again:
                time.sleep(0.01)
        assert sent >= 4, sent   # queued in ZeroMQ and the kernels, not yet read
        time.sleep(STALL_S)
        got = 0
        while got < sent and pull.poll(5000):
            pull.recv()
            got += 1
        events = []
        while monitor.poll(0):
            events.append(recv_monitor_message(monitor)["event"])
        assert got == sent, (got, sent, events)
        assert zmq.EVENT_DISCONNECTED not in events, events
    finally:
        push.disable_monitor()
        for s in (monitor, push, pull):
            s.close(0)
        ctx.term()
