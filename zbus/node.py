"""The skeleton every role runs on.

``Loop`` is a single-threaded event loop over ZeroMQ sockets: a ``zmq.Poller`` whose timeout is
the heartbeat interval, a handler per socket, counting of malformed messages (logged once per
kind, never fatal), per-channel byte counts. ``run`` turns it until it stops; ``turn`` is one
turn (wait for a socket, its handlers, then ``on_tick``), so that one process can drive several
loops turn by turn (``roles.tools.in_process``: a whole job in one process, for tests). A turn
leaves the messages still queued to the next turn once it has worked ``TURN_BUDGET_S``; the
longest turn is counted (``longest_turn_s``: how long the loop went without looking at its
sockets). A loop installs no signal handler: the process that runs it does
(``install_signals``), and SIGTERM/SIGINT then end the loop within one poll interval
(``on_signal``: a role may give a signal another meaning). ``Node`` adds the
link to control that every role but control has: Hello until Welcome (which names the run
directory, where the node's log goes too from then on: ``zbus.logs``), heartbeats with load
figures and counters, and the lifecycle commands on control's PUB.

Control may be killed and started again on its run (``zbus-control --resume``). It does not
know the nodes then, and answers a node's first message with Rejoin: the node says Hello again
with its run id and whether it was ready, then sends once more the latest report of each kind
it sent (an epoch trained, a round done, ...), which the dead control may never have read.
Control handles every report idempotently.

A node that has not heard from control for a few heartbeats looks control's name up again
(once a second at most): when it points elsewhere (control's pod made again on another host
while the old one vanished without closing its connections), the node connects anew.

When the job ends, control publishes Stop: a node says it is leaving and exits at once (a
SIGTERM after that, from honcho or a spawner, ends it quietly); control waits for them, then
prints the run's summary, so that the summary is the run's last output. A node that says Hello
after the end (one slow to start) is answered Stop directly, and exits with the job's status.
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import socket as _socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import zmq

from zbus import health, logs, security, sockets
from zbus.codec import Envelope, Message, ProtocolError
from zbus.endpoints import CONTROL, CONTROL_PUB, BusConfig, bind_address, resolved
from zbus.load import LoadSampler
from zbus.messages import (
    Deciding,
    Failure,
    Finish,
    Heartbeat,
    Hello,
    Leaving,
    Probe,
    ProbeReply,
    Ready,
    Rejoin,
    Stop,
    Welcome,
)

log = logging.getLogger(__name__)

Handler = Callable[[bytes | None, Envelope], None]
DRAIN_PER_POLL = 64      # messages taken from one socket before looking at the others
WAITING_LOG_S = 10.0     # a node waiting for control says so again this often
TURN_BUDGET_S = 0.02     # a turn that has worked this long leaves what is still queued to the
                         # next turn, so that one busy socket does not keep the others waiting


class Loop:
    """Event loop over registered sockets; subclasses add sockets and handlers."""

    # errors a role knows it may meet and cannot go on after (bad input, not a bug): the loop
    # ends with the error's message, not a traceback
    fatal_errors: tuple[type[Exception], ...] = ()

    def __init__(self, node_id: str, heartbeat_s: float, max_message_bytes: int | None = None):
        self.node_id = node_id
        self.heartbeat_s = heartbeat_s
        self.max_message_bytes = max_message_bytes
        self.ctx = zmq.Context()
        self.curve: security.Curve | None = None  # set by the role before its first socket
        # bind TCP endpoints on this network interface (e.g. eth0, or *) instead of the address
        # the job lists: a setting of the host, not of the job (ZBUS_BIND_INTERFACE); one
        # listed by host name is bound on * (zbus.endpoints.bind_address)
        self.bind_interface = os.environ.get("ZBUS_BIND_INTERFACE", "")
        self.poller = zmq.Poller()
        self.traffic = sockets.Traffic()
        self.rejected: Counter[str] = Counter()
        self.stopping = False
        self.exit_code = 0
        self.started = time.monotonic()
        self.idle_s = 0.0  # time spent waiting in poll: 1 - idle_s / uptime is the loop's load
        self.longest_turn_s = 0.0  # the longest a turn of the loop kept it from polling
        self.wake_at: float | None = None  # a role that needs on_tick sooner than a heartbeat
        self.resting_until = 0.0   # rest(): the loop handles nothing before this time
        self._handlers: dict[sockets.Socket, tuple[Handler, bool]] = {}
        # what each connected socket was made with, and where its endpoint's name pointed then
        self._connected: dict[sockets.Socket, tuple[int, str, Handler | None, dict[str, Any],
                                                    str]] = {}
        self._events: dict[sockets.Socket, int] = {}
        self._seq = 0
        self._turn_began = 0.0
        # ZBUS_HEALTH_FILE, when set: this process's health for a supervisor's probes
        self.health_file = health.HealthFile.from_env(node_id)
        if self.health_file is not None:
            self.health_file.write("starting")
        self.ended = False   # run() or the last turn() is over: the loop is closed

    # -- sockets ---------------------------------------------------------------------------
    def bind(self, kind: int, endpoint: str, handler: Handler | None = None,
             **options: Any) -> sockets.Socket:
        options.setdefault("max_bytes", self.max_message_bytes)
        if self.curve is not None:
            options["secure"] = self.curve.server
        sock = sockets.bind(self.ctx, kind, bind_address(endpoint, self.bind_interface),
                            **options)
        if handler is not None:
            self.watch(sock, handler, router=kind == zmq.ROUTER)
        return sock

    def connect(self, kind: int, endpoint: str, handler: Handler | None = None,
                **options: Any) -> sockets.Socket:
        options.setdefault("max_bytes", self.max_message_bytes)
        options.setdefault("identity", self.node_id)
        if self.curve is not None:
            options["secure"] = functools.partial(self.curve.client, address=endpoint)
        sock = sockets.connect(self.ctx, kind, endpoint, **options)
        if handler is not None:
            self.watch(sock, handler, router=kind == zmq.ROUTER)
        self._connected[sock] = (kind, endpoint, handler, options, resolved(endpoint))
        return sock

    def moved(self, sock: sockets.Socket) -> bool:
        """The host name ``sock`` connected to now resolves to another address (a peer made
        again elsewhere: a rescheduled pod); not while it resolves to none (the pod is gone,
        and not yet made again: libzmq looks the name up again at each reconnect)."""
        _, endpoint, _, _, at = self._connected[sock]
        now = resolved(endpoint)
        return now != at and now != endpoint

    def renew(self, sock: sockets.Socket) -> sockets.Socket:
        """``sock`` closed and connected again, as it was (its endpoint looked up anew): a
        connection to a peer whose host vanished can look open for minutes, and ZeroMQ only
        resolves the name again once it drops. What was queued on it is dropped."""
        kind, endpoint, handler, options, _ = self._connected.pop(sock)
        if sock in self._handlers:
            self._handlers.pop(sock)
            self._set_events(sock, 0)
        sock.close(sockets.CLOSE_LINGER_MS)
        log.info("%s: connecting anew to %s (now %s)", self.node_id, endpoint,
                 resolved(endpoint))
        return self.connect(kind, endpoint, handler, **options)

    def watch(self, sock: sockets.Socket, handler: Handler, *, router: bool = False) -> None:
        self._handlers[sock] = (handler, router)
        self._set_events(sock, zmq.POLLIN)

    def pause(self, sock: sockets.Socket, paused: bool) -> None:
        """Stop (or resume) reading a socket; its messages wait in ZeroMQ's queue meanwhile."""
        events = self._events.get(sock, 0)
        self._set_events(sock, events & ~zmq.POLLIN if paused else events | zmq.POLLIN)

    def want_writable(self, sock: sockets.Socket, wanted: bool) -> None:
        events = self._events.get(sock, 0)
        self._set_events(sock, events | zmq.POLLOUT if wanted else events & ~zmq.POLLOUT)

    def _set_events(self, sock: sockets.Socket, events: int) -> None:
        if self._events.get(sock, 0) == events:
            return
        if events:
            self.poller.register(sock, events)
            self._events[sock] = events
        else:
            self.poller.unregister(sock)
            self._events.pop(sock, None)

    def send(self, sock: sockets.Socket, msg: Message, identity: bytes | None = None,
             flags: int = 0) -> int:
        self._seq += 1
        return sockets.send(sock, msg, sender=self.node_id, seq=self._seq,
                            traffic=self.traffic, identity=identity, flags=flags)

    def reject(self, exc: ProtocolError, where: str = "") -> None:
        """Count a malformed or unexpected message; log the first of each kind."""
        self.rejected[exc.kind] += 1
        if self.rejected[exc.kind] == 1:
            log.warning("%s rejected a message%s (%s); further ones of this kind are "
                        "only counted", self.node_id, f" on {where}" if where else "", exc)

    def unexpected(self, env: Envelope, where: str) -> None:
        self.reject(ProtocolError("unexpected_type",
                                  f"{type(env.msg).__name__} from {env.sender!r}"), where)

    # -- the loop ----------------------------------------------------------------------------
    def run(self) -> int:
        """Turn the loop until it stops; its exit status."""
        while self.turn():
            pass
        return self.exit_code

    def poll_timeout(self, now: float) -> float:
        """How long the next turn may wait for a socket: a heartbeat, or until ``wake_at``, or
        while the loop rests (``rest``)."""
        if now < self.resting_until:
            return self.resting_until - now
        if self.wake_at is None:
            return self.heartbeat_s
        return min(self.heartbeat_s, max(0.0, self.wake_at - now))

    def rest(self, seconds: float) -> None:
        """Handle nothing for ``seconds`` (no socket read, no tick): a machine that is slower by
        as much (a test and demo aid, ``--slowdown``). Unlike a sleep it holds up nothing else
        a process runs beside this loop."""
        self.resting_until = max(self.resting_until, time.monotonic() + seconds)

    def turn(self, timeout_s: float | None = None) -> bool:
        """One turn: wait up to ``timeout_s`` (default ``poll_timeout``; 0: only look) for a
        socket, handle what is ready, then ``on_tick``. False once the loop has ended: it
        stopped, or died of an exception (logged, control told, exit status 1), and is closed."""
        if self.ended:
            return False
        if not self.stopping:
            try:
                self._turn(timeout_s)
            except self.fatal_errors as exc:  # the role cannot go on, and says why in one line
                log.error("%s: %s", self.node_id, exc)
                self.on_crash(exc)
                self.exit_code = 1
                self.stopping = True
            except Exception as exc:  # a bug or a broken environment: say it, tell control
                log.exception("%s crashed", self.node_id)
                self.on_crash(exc)
                self.exit_code = 1
                self.stopping = True
        if not self.stopping:
            return True
        self.ended = True
        self.close()
        if self.health_file is not None and self.health_state() == "ended":
            self.health_file.write("ended")   # the job is over for good, whatever the status
        return False

    def _turn(self, timeout_s: float | None) -> None:
        waited = time.monotonic()
        timeout = self.poll_timeout(waited) if timeout_s is None else timeout_s
        if waited < self.resting_until:   # resting (rest): the time passes, nothing is done
            time.sleep(min(timeout, self.resting_until - waited))
            self.idle_s += time.monotonic() - waited
            return
        ready = self.poller.poll(int(timeout * 1000))
        woke = self._turn_began = time.monotonic()
        self.idle_s += woke - waited
        for sock, events in ready:
            if events & zmq.POLLIN and sock in self._handlers:
                self._drain(sock)
            if events & zmq.POLLOUT:
                self.on_writable(sock)
        self.on_tick(time.monotonic())
        if self.health_file is not None:
            self.health_file.beat(self.health_state(), self.heartbeat_s)
        self.longest_turn_s = max(self.longest_turn_s, time.monotonic() - woke)

    def watched(self) -> list[tuple[sockets.Socket, int]]:
        """The sockets this loop watches and for what (``zmq.POLLIN``/``POLLOUT``): what one
        process driving several loops waits on (none while it rests)."""
        if time.monotonic() < self.resting_until:
            return []
        return list(self._events.items())

    def _drain(self, sock: sockets.Socket) -> None:
        handler, router = self._handlers[sock]
        for _ in range(DRAIN_PER_POLL):
            try:
                identity, env = sockets.recv(sock, router=router, traffic=self.traffic)
            except zmq.Again:
                return
            except ProtocolError as exc:
                self.reject(exc)
                continue
            try:
                handler(identity, env)
            except ProtocolError as exc:  # well-formed, but wrong for this role or this moment
                self.reject(exc, type(env.msg).__name__)
            if sock not in self._events or not self._events[sock] & zmq.POLLIN:
                return  # the handler paused this socket
            if time.monotonic() - self._turn_began > TURN_BUDGET_S:
                return  # the rest waits for the next turn (the poll finds it at once)

    def on_tick(self, now: float) -> None:
        """Called after every poll (at least once per heartbeat interval)."""

    def health_state(self) -> str:
        """``starting``, ``ready`` or ``ended`` (the job is over for good), for the health
        file (``zbus.health``): a role says when it is ready, and when the job has ended."""
        return "starting"

    def on_writable(self, sock: sockets.Socket) -> None:
        """Called when a socket registered with want_writable can take a message."""

    def on_crash(self, exc: Exception) -> None:
        """Called when the loop dies of an exception."""

    def on_signal(self, signum: int) -> None:
        """SIGTERM or SIGINT reached the process (``install_signals``): the loop stops."""
        if not self.stopping and not self.quiet_stop():
            log.info("%s received %s, stopping", self.node_id, signal.Signals(signum).name)
        self.stopping = True

    def quiet_stop(self) -> bool:
        """A signal now is expected (the job is over): stop without a word."""
        return False

    def release(self) -> None:
        """Free what the operating system frees when a process ends, however it ends: the
        role's threads, child processes and open files (a role that holds any extends this).
        ``close`` calls it; a process that runs several loops calls it alone when it drops one
        at once, as a SIGKILL would (``roles.testbed.in_process``)."""
        if self.curve is not None:
            self.curve.stop()

    def close(self) -> None:
        """The loop's end: what the role still sends (its sockets' linger), then ``release``."""
        self._handlers.clear()
        self.release()
        self.ctx.destroy(linger=sockets.CLOSE_LINGER_MS)   # (not 0: zbus.sockets says why)


class Node(Loop):
    """A role process other than control: registers with control and heartbeats to it."""

    role = "node"

    def __init__(self, cluster: BusConfig, index: int, fingerprint: str):
        super().__init__(f"{self.role}-{index}", cluster.heartbeat_s, cluster.max_message_bytes)
        self.curve = security.for_process(self.ctx, cluster, self.node_id)
        self.cluster = cluster
        self.index = index
        self.fingerprint = fingerprint
        self.state = "starting"
        self.run_id = ""
        self.run_dir = ""
        self.restore_dir = ""   # Welcome: the checkpoint to restore from (the role says what)
        self.rollback = False   # Welcome: the whole run goes back to it
        self.rollback_id = ""   # Welcome: that roll back's name
        self.welcomed = False
        self.load = LoadSampler()
        # who this node is to control beside its id: its host and process (a process that
        # runs several nodes, roles.tools.in_process, names each one apart)
        self.host, self.pid = _socket.gethostname(), os.getpid()
        self.control = self.connect(zmq.DEALER, cluster.endpoint(CONTROL),
                                    self._on_control_reply)
        self.commands = self.connect(zmq.SUB, cluster.endpoint(CONTROL_PUB), self._on_command)
        self._next_beat = 0.0
        self.job_over = False   # control said Stop: the node leaves, quietly
        self.signalled = ""     # the signal that stopped the node (SIGTERM), said as it leaves
        self.said_leaving = False
        self.ended_for_good = False  # ... and the run cannot be resumed (its health: ended)
        self._next_lookup = 0.0  # control silent: when its name is looked up again
        self._last_heard = time.monotonic()
        self._waiting_said = self.started
        log.info("%s: waiting for control at %s (%s)", self.node_id,
                 cluster.endpoint(CONTROL), security.describe(self.curve))
        self.ready_sent = False
        self.ready_held: Ready | None = None   # Ready said before control admitted the node
        self.reports: dict[type, Message] = {}  # the latest report of each kind
        self._rejoined_at = 0.0

    def to_control(self, msg: Message) -> None:
        if isinstance(msg, Ready):
            if not self.welcomed:   # (a worker is ready at the first weights it hears, which
                self.ready_held = msg   # a restored aggregator may publish first): control
                return                  # hears Ready once it has admitted the node
            self.ready_sent = True
        if isinstance(msg, Leaving):
            self.said_leaving = True
        self.send(self.control, msg)

    def report(self, msg: Message) -> None:
        """Send control a report: the latest of each kind is sent again to a restarted
        control, which may never have read it (control handles every report idempotently)."""
        self.reports[type(msg)] = msg
        self.send(self.control, msg)

    def hello(self) -> Hello:
        return Hello(role=self.role, index=self.index, host=self.host,
                     pid=self.pid, fingerprint=self.fingerprint, run_id=self.run_id,
                     ready=self.ready_sent)

    def rejoin(self, run_id: str) -> None:
        """A restarted control asks who this node is: Hello again, then the latest reports."""
        now = time.monotonic()
        if run_id != self.run_id:
            log.error("%s: control now runs %s, not this node's run %s; exiting", self.node_id,
                      run_id, self.run_id)
            self.exit_code = 2
            self.stopping = True
            return
        if now - self._rejoined_at < 4 * self.heartbeat_s:
            return  # answers to messages sent before this node said Hello again
        self._rejoined_at = now
        log.warning("%s: control was restarted; joining it again", self.node_id)
        self.send(self.control, self.hello())
        for msg in self.reports.values():
            self.send(self.control, msg)

    def heartbeat(self, final: bool = False) -> None:
        now = time.monotonic()
        self.to_control(Heartbeat(role=self.role, index=self.index, state=self.state,
                                  load=self.load.sample(),
                                  counters={**self.counters(), **self.traffic.as_dict(),
                                            "rejected_messages": dict(self.rejected),
                                            "idle_s": round(self.idle_s, 3),
                                            "longest_turn_s": round(self.longest_turn_s, 4),
                                            "uptime_s": round(now - self.started, 3)},
                                  final=final))

    def counters(self) -> dict[str, Any]:
        """The role's own figures for heartbeats and the summary."""
        return {}

    def fail(self, reason: str) -> None:
        """A fatal problem: tell control why, then exit non-zero."""
        log.error("%s: %s", self.node_id, reason)
        self.to_control(Failure(reason=reason))
        self.exit_code = 1
        self.stopping = True

    def on_crash(self, exc: Exception) -> None:
        try:
            self.to_control(Failure(reason=f"{self.node_id} crashed: {type(exc).__name__}: "
                                           f"{exc}"))
        except zmq.ZMQError:
            pass

    # -- control link ----------------------------------------------------------------------------
    def _on_control_reply(self, _identity: bytes | None, env: Envelope) -> None:
        self._last_heard = time.monotonic()
        match env.msg:
            case Welcome(accepted=True) as w:
                if not self.welcomed:
                    self.welcomed = True
                    self.run_id, self.run_dir = w.run_id, w.run_dir
                    self.restore_dir, self.rollback = w.restore, w.rollback
                    self.rollback_id = w.rollback_id
                    if w.run_dir:
                        logs.to_run_dir(w.run_dir, self.node_id)  # its log there too
                    log.info("%s joined run %s", self.node_id, w.run_id)
                    self.on_welcome()  # may take long (loading data): count silence anew
                    self._last_heard = time.monotonic()
                    if self.ready_held is not None:
                        held, self.ready_held = self.ready_held, None
                        self.to_control(held)
            case Probe(nonce=nonce) if self.welcomed:
                self.to_control(ProbeReply(nonce=nonce))
            case Rejoin(run_id=run_id) if self.welcomed:
                self.rejoin(run_id)
            case Welcome(accepted=False, reason=reason):  # at Hello, or later: sent away
                log.error("%s refused by control: %s", self.node_id, reason)
                self.exit_code = 2
                self.stopping = True
            case Stop(ok=ok, resumable=resumable):  # the answer to a Hello after the end
                self.job_ended(ok, resumable)
            case _ if self.welcomed:
                self.handle_reply(env)
            case _:
                self.unexpected(env, "control link")

    def _on_command(self, _identity: bytes | None, env: Envelope) -> None:
        self._last_heard = time.monotonic()
        match env.msg:
            case Stop(ok=ok, resumable=resumable):
                self.job_ended(ok, resumable)
            case Finish():
                if self.welcomed:
                    self.heartbeat(final=True)
            case Deciding():   # a resumed control, not decided yet: only heard
                pass
            case _ if self.welcomed:
                self.handle_command(env)

    def job_ended(self, ok: bool, resumable: bool = False) -> None:
        """Control said Stop: leave quietly with the job's status (control states the reason
        and waits for the nodes). A job that cannot be resumed has ended for good: the health
        file says so (``zbus-pod`` then keeps the pod idle, whatever the status)."""
        if self.job_over:
            return
        log.debug("%s: job %s, exiting", self.node_id, "done" if ok else "failed")
        self.job_over = True   # a signal from the supervisor now changes nothing (quiet_stop)
        self.ended_for_good = ok or not resumable
        self.exit_code = 0 if ok else 1
        if self.welcomed:
            self.to_control(Leaving(reason="the job is over"))
        self.stopping = True

    def handle_command(self, env: Envelope) -> None:
        """The application's commands from control's PUB (all but Stop, Finish and Deciding)."""

    def handle_reply(self, env: Envelope) -> None:
        """The application's answers from control on this node's own link (to its reports)."""
        self.unexpected(env, "control link")

    def on_welcome(self) -> None:
        """Called once control admitted this node."""

    def health_state(self) -> str:
        if getattr(self, "ended_for_good", False):   # (asked before __init__ is done too)
            return "ended"
        return "ready" if self.welcomed else "starting"

    def quiet_stop(self) -> bool:
        return self.job_over

    def keep_alive(self, now: float) -> None:
        """From inside a long piece of work that keeps the loop waiting (indexing the data):
        the heartbeat when it is due, so that control sees the node alive and its progress."""
        if self.welcomed and now >= self._next_beat:
            self._next_beat = now + self.heartbeat_s
            self.heartbeat()
            if self.health_file is not None:
                self.health_file.beat(self.health_state(), self.heartbeat_s)

    def on_tick(self, now: float) -> None:
        if now >= self._next_beat:
            self._next_beat = now + self.heartbeat_s
            if self.welcomed:
                self.heartbeat()
            else:
                self.to_control(self.hello())
                if now - self._waiting_said >= WAITING_LOG_S:
                    self._waiting_said = now
                    log.info("%s: still waiting for control at %s (%.0f s)", self.node_id,
                             self.cluster.endpoint(CONTROL), now - self.started)
        if self.welcomed and now - self._last_heard > max(3 * self.heartbeat_s, 1.0) \
                and now >= self._next_lookup:
            self._next_lookup = now + max(self.heartbeat_s, 1.0)
            self.find_control()
        if now - self._last_heard > self.cluster.orphan_timeout_s:
            log.error("%s: nothing from control for %.0f s, giving up", self.node_id,
                      now - self._last_heard)
            self.exit_code = 1
            self.stopping = True

    def find_control(self) -> None:
        """Control is silent (it publishes every heartbeat): when its name now points at
        another address (its pod made again elsewhere while the old host vanished, sending no
        FIN: the connection would look open for minutes), connect anew, and say Hello again
        with the latest reports, as a rejoin does: what was queued on the old link is dropped
        (a control that did not move, its name looked up anew, takes them idempotently)."""
        if self.moved(self.control) or self.moved(self.commands):
            log.warning("%s: control is silent and its name now points elsewhere: "
                        "connecting anew", self.node_id)
            self.control = self.renew(self.control)
            self.commands = self.renew(self.commands)
            self._rejoined_at = 0.0
            self.rejoin(self.run_id)

    def on_signal(self, signum: int) -> None:
        if not self.stopping and not self.job_over and not self.signalled:
            self.signalled = signal.Signals(signum).name
        super().on_signal(signum)

    def close(self) -> None:
        if self.signalled and self.welcomed and not self.said_leaving and not self.job_over:
            # stopped by a signal, which control may have got too (honcho SIGTERMs every
            # process at once): this node did not end on its own
            self.to_control(Leaving(reason=f"received {self.signalled}",
                                    signal=self.signalled))
        # Let a last Failure, Leaving or final heartbeat reach control.
        self.control.setsockopt(zmq.LINGER, 500)
        self.control.close()
        super().close()


def install_signals(loop: Loop) -> None:
    """SIGTERM and SIGINT to this process go to ``loop.on_signal`` (a process's entry point
    calls this once its loop is made; until then the default action ends the process, which
    has nothing to clean up yet)."""
    def handler(signum: int, _frame: Any) -> None:
        loop.on_signal(signum)

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
