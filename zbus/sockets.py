"""Socket helpers: every zbus socket is made here, with linger 0, high-water marks and a cap
on incoming message size, and every message goes through ``send``/``recv`` so that bytes are
counted per channel. A TCP port that cannot be bound because it is in use is said in one line
naming the process that holds it (``port_holder``)."""

from __future__ import annotations

import errno
import os
import socket as _socket
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeAlias

import psutil
import zmq

from zbus.codec import COPY_BELOW, Envelope, Message, ProtocolError, decode

Socket: TypeAlias = zmq.Socket[bytes]  # the sockets zbus makes: synchronous, bytes in and out

# A role's sockets are closed with this linger (ms), not 0: libzmq 4.3.5 aborts the process
# ("Resource temporarily unavailable (src/session_base.cpp:233)", an errno_assert in
# session_base_t::clean_pipes) when a socket closed with linger 0 is half-way through sending a
# multipart message and its peer's connection drops at that moment, as when every role of a
# job gets Ctrl-C at once: with linger 0 the pipe stops giving the rest of the message to the
# session that is cleaning it up. With a linger the pipe gives it. scripts/check_close.py (and
# its first draft), three runs: 21 of 500 closes aborted with linger 0, none of 400 with 100 ms
# (AMD EPYC, 2026-11-30). It was the feeder's SIGABRT on Ctrl-C in tests/processes/
# test_interrupt.py (about 1 run in 15).
CLOSE_LINGER_MS = 100
Context: TypeAlias = zmq.Context[Socket]

DEFAULT_HWM = 1000
# Reconnection, for peers that come back elsewhere (a pod rescheduled: the same DNS name, a new
# address). libzmq resolves a connect endpoint's host name again at every reconnect attempt
# (tested: docs/operations.md, "Names and binding"), so a peer whose process died (its kernel
# closed the connection) is found again at its new address within a reconnect interval. A
# peer whose host vanished sends no FIN: an idle connection to it is dropped by the kernel's
# TCP keepalive (about 10 s); one with data waiting for an ACK would look open for about 15
# minutes (tcp_retries2), so a role that learns that such a peer is back (a shard restarted:
# ShardBack) renews its socket when the name now resolves elsewhere (``Loop.renew``). Not
# TCP_USER_TIMEOUT: it also aborts a healthy connection whose reader has not read for that
# long (a zero window: a slow worker's full sample queue, by design), and the binding side
# drops every message queued on it (measured: batches lost, a checkpoint's drain stuck). Not
# ZMTP heartbeats (ZMQ_HEARTBEAT_*): a socket whose input is stopped by its high-water mark
# reads no PONG, so heartbeats drop the healthy connection, and libzmq 4.3.5 then aborts the
# process (Assertion failed: _input_stopped, libzmq issue 3937), seen here.
KEEPALIVE_IDLE_S = 5          # an idle connection is probed after this ...
KEEPALIVE_INTVL_S = 1         # ... every second ...
KEEPALIVE_CNT = 5             # ... and dropped after this many unanswered probes (~10 s)
CONNECT_TIMEOUT_MS = 3000     # a TCP connect attempt gives up after this, and is tried again
RECONNECT_IVL_MS = 100        # the first retry (libzmq's default) ...
RECONNECT_IVL_MAX_MS = 1000   # ... doubling up to this: a name that does not resolve yet is
                              # asked again once a second, not ten times


def make_socket(ctx: Context, kind: int, *, identity: str | None = None,
                sndhwm: int = DEFAULT_HWM, rcvhwm: int = DEFAULT_HWM,
                max_bytes: int | None = None, kernel_buffer: int | None = None,
                secure: Callable[[Socket], None] | None = None) -> Socket:
    """``kernel_buffer`` caps the TCP socket buffers (SO_SNDBUF and SO_RCVBUF): high-water
    marks count messages in ZeroMQ's queues only, while loopback TCP buffers grow to megabytes
    and would let a slow reader hold hundreds of messages (ipc buffers are not sized by it).
    ``secure`` sets the socket's CURVE options (``zbus.security``) before it binds or connects."""
    sock = ctx.socket(kind)
    if secure is not None:
        secure(sock)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
    sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, KEEPALIVE_IDLE_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, KEEPALIVE_INTVL_S)
    sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, KEEPALIVE_CNT)
    sock.setsockopt(zmq.CONNECT_TIMEOUT, CONNECT_TIMEOUT_MS)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    if kernel_buffer:
        sock.setsockopt(zmq.SNDBUF, kernel_buffer)
        sock.setsockopt(zmq.RCVBUF, kernel_buffer)
    if max_bytes:
        sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
    if identity is not None:
        sock.setsockopt(zmq.IDENTITY, identity.encode())
    if kind == zmq.ROUTER:
        # A node that restarts under the same id takes its identity over at once.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    if kind == zmq.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    return sock


def bind(ctx: Context, kind: int, endpoint: str, **options: Any) -> Socket:
    sock = make_socket(ctx, kind, **options)
    if endpoint.startswith("ipc://"):
        os.makedirs(os.path.dirname(endpoint[len("ipc://"):]) or ".", exist_ok=True)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as exc:
        sock.close(0)
        port = endpoint.rsplit(":", 1)[-1]
        if exc.errno != errno.EADDRINUSE or not endpoint.startswith("tcp://") \
                or not port.isdigit():
            raise OSError(f"cannot bind {endpoint}: {exc}") from None
        raise OSError(f"cannot bind {endpoint}: the port is in use by {port_holder(int(port))} "
                      f"(another job on this port? end it, or set [cluster] base_port or "
                      f"ZBUS_CLUSTER__BASE_PORT)") from None
    return sock


def port_holder(port: int) -> str:
    """The process that holds TCP ``port`` on this host, in words: ``pid N (its command
    line)``, a listener first."""
    try:
        held = [c for c in psutil.net_connections(kind="tcp") if c.laddr and c.laddr.port == port]
    except (psutil.Error, OSError) as exc:
        return f"a process this user cannot see ({type(exc).__name__})"
    held.sort(key=lambda c: c.status != psutil.CONN_LISTEN)
    for conn in held:
        if conn.pid is None:
            continue
        if conn.pid == os.getpid():
            return f"pid {conn.pid} (this process)"
        try:
            proc = psutil.Process(conn.pid)
            command = " ".join(" ".join(proc.cmdline()).split()) or proc.name()  # one line
        except psutil.Error:
            continue
        return f"pid {conn.pid} ({command[:200]})"
    if any(c.status == psutil.CONN_LISTEN for c in held):
        return "a process this user cannot see (another user's)"
    return ("no process listening now (one that has exited since, or a connection's own "
            "local port: reserve the job's ports, docs/operations.md \"Ports\")")


def connect(ctx: Context, kind: int, endpoint: str, **options: Any) -> Socket:
    sock = make_socket(ctx, kind, **options)
    sock.connect(endpoint)
    return sock


class Traffic:
    """Bytes and messages sent and received, per channel."""

    def __init__(self) -> None:
        self.bytes_out: Counter[str] = Counter()
        self.bytes_in: Counter[str] = Counter()
        self.msgs_out: Counter[str] = Counter()
        self.msgs_in: Counter[str] = Counter()

    def as_dict(self) -> dict[str, dict[str, int]]:
        return {"bytes_out": dict(self.bytes_out), "bytes_in": dict(self.bytes_in),
                "msgs_out": dict(self.msgs_out), "msgs_in": dict(self.msgs_in)}


# pyzmq's own calls, below its Python layer: ``send_multipart`` and ``recv_multipart`` cost
# 6-10 us for a message of 5 small frames (a type check per frame, a Python method per frame,
# and ``getsockopt(RCVMORE)``, about 1.5 us a frame through its option enum), against about
# 1.2 and 3 us for the loops below: each frame goes straight to the Cython send or recv, and
# whether more frames follow is the received Frame's ``more`` (read in C by ``recv``). For the
# synchronous sockets zbus makes (``make_socket``), as every subclass of zmq.backend.Socket.
_SEND = zmq.backend.Socket.send
_RECV = zmq.backend.Socket.recv
_SNDMORE = int(zmq.SNDMORE)


def send(sock: Socket, msg: Message, *, sender: str, seq: int, traffic: Traffic,
         identity: bytes | None = None, flags: int = 0) -> int:
    """Encode and send; a message of COPY_BELOW bytes or more goes without a copy (below, a
    copy costs less than zmq.Frame objects). Returns the payload bytes."""
    frames, nbytes = msg.encode(sender, seq)
    copy = nbytes < COPY_BELOW
    more = flags | _SNDMORE
    if identity is not None:
        _SEND(sock, identity, more, True, False)
    for frame in frames[:-1]:  # ZeroMQ queues a multipart message whole, or none of it
        _SEND(sock, frame, more, copy, False)
    _SEND(sock, frames[-1], flags, copy, False)
    channel = msg.CHANNEL
    traffic.bytes_out[channel] += nbytes
    traffic.msgs_out[channel] += 1
    return nbytes


def recv_frames(sock: Socket, flags: int = 0) -> list[zmq.Frame]:
    """One whole multipart message as zmq.Frame objects (``recv_multipart(copy=False)``)."""
    frame = _RECV(sock, flags, False, False)
    frames = [frame]
    while frame.more:  # the rest of a multipart message is there once its first frame is
        frame = _RECV(sock, flags, False, False)
        frames.append(frame)
    return frames


def recv(sock: Socket, *, router: bool, traffic: Traffic,
         flags: int = zmq.NOBLOCK) -> tuple[bytes | None, Envelope]:
    """Receive and decode one message; raises zmq.Again when none waits and ProtocolError
    when the message is malformed (it is consumed either way)."""
    frames = recv_frames(sock, flags)
    identity = None
    if router:
        identity = frames[0].bytes
        del frames[0]
        if not frames:
            raise ProtocolError("truncated", "identity frame only")
    env = decode(frames)
    channel = env.msg.CHANNEL
    traffic.bytes_in[channel] += env.nbytes
    traffic.msgs_in[channel] += 1
    return identity, env


def free_tcp_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the kernel says are free right now (for tests and benchmarks)."""
    socks = []
    try:
        for _ in range(count):
            s = _socket.socket(_socket.AF_INET, _socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()
