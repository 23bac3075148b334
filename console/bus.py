"""The console's link to control: the only code that touches its sockets.

One asyncio task (a Textual worker) owns a SUB socket on control's ``status`` endpoint and a
DEALER on its ``control_req`` endpoint, polls them without blocking and sleeps ``POLL_S``
between empty polls, so the UI's event loop never waits on a socket. It posts what it learns
to the app as messages: ``StatusArrived`` (the newest snapshot; older ones waiting behind it
are skipped), ``LinkChanged`` (connected or not, and why) and ``ReplyArrived`` (the answer to a
request, or a refusal when none came). Requests go one at a time, in order, through ``request``.

ZeroMQ reconnects by itself when control restarts; on top of that, when no status has come for
``silence_s`` the link says so, and after ``REOPEN_AFTER`` times as long it opens its status
socket afresh, then again at that interval (not sooner: a control busy for a few seconds at
the job's end publishes its final status, and exits moments later, while a socket opened
afresh may still be subscribing, and miss it). A DEALER whose request went unanswered is
replaced at once, so that a late reply cannot be taken for the next request's.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import zmq
from textual.message import Message

from roles.protocol.operator import ControlReply, ControlRequest, Status
from roles.protocol.status import StatusSnapshot
from roles.protocol.topology import ClusterConfig
from zbus import security, sockets
from zbus.codec import ProtocolError

log = logging.getLogger(__name__)
POLL_S = 0.05  # the sockets are polled without blocking, then the task sleeps this long
REOPEN_AFTER = 4  # x silence_s without a status: the status socket is opened afresh


class StatusArrived(Message):
    def __init__(self, snapshot: StatusSnapshot) -> None:
        super().__init__()
        self.snapshot = snapshot


class LinkChanged(Message):
    def __init__(self, connected: bool, detail: str) -> None:
        super().__init__()
        self.connected = connected
        self.detail = detail


class ReplyArrived(Message):
    def __init__(self, action: str, ok: bool, text: str, settings: dict) -> None:
        super().__init__()
        self.action = action
        self.ok = ok
        self.text = text
        self.settings = settings


@dataclass(frozen=True)
class Endpoints:
    status: str
    requests: str
    cluster: ClusterConfig | None = None  # the job's cluster: CURVE keys, when it uses them


class BusLink:
    def __init__(self, endpoints: Endpoints, post: Callable[[Message], object], *,
                 silence_s: float = 3.0, request_timeout_s: float = 5.0):
        self.endpoints = endpoints
        self.post = post
        self.silence_s = silence_s
        self.request_timeout_s = request_timeout_s
        self.identity = f"console-{os.getpid()}"
        self.queue: asyncio.Queue[tuple[str, dict]] = asyncio.Queue()
        self.seq = 0
        self.traffic = sockets.Traffic()
        self.rejected = 0
        self.connected: bool | None = None
        self.detail = ""  # the last LinkChanged posted
        self.last_status: float | None = None
        self.curve: security.Curve | None = None

    def request(self, action: str, changes: dict | None = None) -> None:
        self.queue.put_nowait((action, changes or {}))

    async def run(self) -> None:
        ctx = zmq.Context()
        sub = dealer = None
        try:
            cluster = self.endpoints.cluster  # the console authenticates like any node
            try:
                self.curve = None if cluster is None else security.for_process(
                    ctx, cluster, security.OPERATOR, authenticate=False)
            except OSError as exc:  # no key pair: say so, and stay disconnected
                self._link(False, f"cannot authenticate: {exc}")
                return
            sub, dealer = self._open(ctx, "status"), self._open(ctx, "requests")
            opened = time.monotonic()
            pending: tuple[str, float] | None = None
            poller = zmq.Poller()
            poller.register(sub, zmq.POLLIN)
            poller.register(dealer, zmq.POLLIN)
            self._link(False, f"waiting for control at {self.endpoints.status}")
            while True:
                ready = dict(poller.poll(0))
                if not ready:
                    await asyncio.sleep(POLL_S)
                now = time.monotonic()
                if sub in ready:
                    self._read_status(sub, now)
                if dealer in ready and pending is not None:
                    if self._read_reply(dealer, pending[0]):
                        pending = None
                if pending is not None and now - pending[1] > self.request_timeout_s:
                    self.post(ReplyArrived(pending[0], False, "no answer from control at "
                                           f"{self.endpoints.requests} within "
                                           f"{self.request_timeout_s:.0f} s", {}))
                    pending = None
                    poller.unregister(dealer)
                    dealer.close(0)
                    dealer = self._open(ctx, "requests")
                    poller.register(dealer, zmq.POLLIN)
                if pending is None and not self.queue.empty():
                    action, changes = self.queue.get_nowait()
                    self.seq += 1
                    sockets.send(dealer, ControlRequest(action=action, changes=changes),
                                 sender=self.identity, seq=self.seq, traffic=self.traffic)
                    pending = (action, now)
                heard = self.last_status is not None and now - self.last_status < self.silence_s
                if not heard:
                    self._link(False, self._silence(now))
                    # since the socket was opened, or since it last heard, if later
                    quiet_since = max(opened, self.last_status or opened)
                    if now - quiet_since > REOPEN_AFTER * self.silence_s:
                        poller.unregister(sub)
                        sub.close(0)
                        sub = self._open(ctx, "status")
                        poller.register(sub, zmq.POLLIN)
                        opened = now
        finally:
            for sock in (sub, dealer):
                if sock is not None:
                    sock.close(0)
            ctx.term()

    # -- helpers ---------------------------------------------------------------------------
    def _open(self, ctx: zmq.Context, which: str) -> zmq.Socket:
        address = self.endpoints.status if which == "status" else self.endpoints.requests
        secure = None if self.curve is None else functools.partial(self.curve.client,
                                                                   address=address)
        if which == "status":
            return sockets.connect(ctx, zmq.SUB, address, rcvhwm=16, secure=secure)
        return sockets.connect(ctx, zmq.DEALER, address, secure=secure,
                               identity=f"{self.identity}-{self.seq}")

    def _read_status(self, sub: zmq.Socket, now: float) -> None:
        newest = None
        while True:
            try:
                _, env = sockets.recv(sub, router=False, traffic=self.traffic)
                if not isinstance(env.msg, Status):
                    raise ProtocolError("unexpected_type", type(env.msg).__name__)
                newest = env.msg.snapshot()  # its layout checked
            except zmq.Again:
                break
            except ProtocolError as exc:
                self.rejected += 1
                if self.rejected == 1:
                    log.warning("a bad status message from control: %s", exc)
        if newest is not None:
            self.last_status = now
            self.silence_s = max(self.silence_s, 4 * float(newest.get("status_s", 0.25)))
            self._link(True, f"control at {self.endpoints.status}")
            self.post(StatusArrived(newest))

    def _read_reply(self, dealer: zmq.Socket, action: str) -> bool:
        try:
            _, env = sockets.recv(dealer, router=False, traffic=self.traffic)
        except zmq.Again:
            return False
        except ProtocolError as exc:
            self.post(ReplyArrived(action, False, f"a bad reply from control: {exc}", {}))
            return True
        if not isinstance(env.msg, ControlReply):
            self.post(ReplyArrived(action, False, f"control answered with "
                                                  f"{type(env.msg).__name__}", {}))
            return True
        reply = env.msg
        self.post(ReplyArrived(action, reply.ok, reply.message, reply.settings))
        return True

    def _silence(self, now: float) -> str:
        if self.last_status is None:
            return f"no connection: nothing from control at {self.endpoints.status} yet"
        return (f"no connection: control at {self.endpoints.status} silent for "
                f"{now - self.last_status:.0f} s, retrying")

    def _link(self, connected: bool, detail: str) -> None:
        if connected != self.connected or (not connected and detail != self.detail):
            self.connected, self.detail = connected, detail
            self.post(LinkChanged(connected, detail))
