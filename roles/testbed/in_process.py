"""A whole job in one process: every role's loop (``zbus.node.Loop``) driven turn by turn by one
thread, over the same sockets, messages and files as when each role is a process of its own.

Tests use it (``LocalCluster(..., in_process=True)``) for what a job's accounting and protocol
show (every row trained once, what reaches the summary, a role's answer to a message), which do
not need an operating system's processes: a job then costs one Python start-up instead of seven,
and its roles do not compete for the cores with each other's interpreters. What only processes
show (a kill, a signal to a process group, honcho, pods, memory budgets) runs with
``LocalCluster``'s processes.

The driver turns every loop once, looking only (``Loop.turn(0)``), then waits on all their
sockets at once until one is ready or the earliest ``Loop.poll_timeout`` is up. A role handle
answers as ``subprocess.Popen`` does for a process (``poll``, ``wait``, ``send_signal``,
``terminate``, ``kill``, ``returncode``): ``send_signal`` is the role's ``on_signal``, as its
process's handler would call it; ``kill`` drops the role's sockets at once (linger 0), sends
nothing, and frees what the kernel frees of a killed process (``Loop.release``: its threads,
children and files), as SIGKILL leaves a process's peers and its disk; SIGSTOP and SIGCONT stop
and resume its turns (its sockets stay open, their queues fill). A node says it is in this
process (``Node.host`` ends in ``IN_PROCESS``, ``Node.pid`` numbers each start), so that
control tells its starts apart and does not look for its process among the host's. Each role's lines
go to its own log (``zbus.logs.node_scope``).
"""

from __future__ import annotations

import itertools
import logging
import os
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path

import zmq

from zbus import logs
from zbus.node import Loop, Node

log = logging.getLogger(__name__)
IN_PROCESS = "+in-process"     # a node's host name, beside the machine's: not a process there
KILLED = -int(signal.SIGKILL)  # a killed role's returncode, as Popen shows a killed process
_starts = itertools.count(1)   # a node's "pid": one number per start, in this process


class RoleHandle:
    """A role in this process, as ``subprocess.Popen`` shows a process: ``name`` its
    process's (its log), ``node`` the node it runs."""

    def __init__(self, driver: Driver, name: str, node: str, loop: Loop | None,
                 returncode: int | None):
        self.driver, self.name, self.node, self.loop = driver, name, node, loop
        self.returncode = returncode
        self.args = [name]
        self.log: logging.Handler | None = None   # its lines to <name>.log
        self.stopped = False                      # SIGSTOP: not turned until SIGCONT

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.driver.changed:
            while self.returncode is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.name, timeout or 0.0)
                self.driver.changed.wait(left if left is None else min(left, 0.5))
            return self.returncode

    def send_signal(self, signum: int) -> None:
        if signum == signal.SIGKILL:
            self.kill()
            return
        if signum in (signal.SIGSTOP, signal.SIGCONT):
            with self.driver.lock:
                self.stopped = signum == signal.SIGSTOP
            self.driver.wake()
            return
        with self.driver.lock:
            if self.returncode is None and self.loop is not None:
                with logs.node_scope(self.node):
                    self.loop.on_signal(signum)
        self.driver.wake()

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.driver.kill(self)


class Driver:
    """The thread that turns every role's loop (started with the first role, stopped by
    ``close``)."""

    def __init__(self, log_dir: Path, level: str = "INFO"):
        self.log_dir = log_dir
        self.lock = threading.RLock()        # held while a loop turns or a role is made
        self.changed = threading.Condition(self.lock)
        self.roles: dict[str, RoleHandle] = {}
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_w, False)
        self._closing = False
        self._closed = False                 # close() has been called
        self._thread: threading.Thread | None = None
        self._handlers: list[logging.Handler] = []
        self._root_level = logging.getLogger().level
        self._level = getattr(logging, level.upper(), logging.INFO)
        self.errors: list[str] = []          # the driver's own failures (a bug here)
        self._kills: list[RoleHandle] = []

    # -- roles ---------------------------------------------------------------------------------
    def start(self, name: str, make: Callable[[], Loop], node: str | None = None
              ) -> RoleHandle:
        """A role made by ``make`` (in this thread, its lines in its log ``<name>.log``) and
        turned from now on; a role that cannot be made ends at once with status 2, its reason
        in its log, as its process would. ``node``: the node it runs (default ``name``)."""
        node = node or name
        handler = self._log_to(name, node)
        with self.lock:
            with logs.node_scope(node):
                try:
                    loop = make()
                except StartError as exc:
                    logging.getLogger(f"zbus.{node}").error("%s", exc)
                    handle = RoleHandle(self, name, node, None, exc.status)
                    handle.log = handler
                    self.roles[name] = handle
                    self._ended(handle, exc.status)
                    return handle
            if isinstance(loop, Node):   # control tells a node's starts apart by these
                loop.host += IN_PROCESS
                loop.pid = next(_starts)
            handle = RoleHandle(self, name, node, loop, None)
            handle.log = handler
            self.roles[name] = handle
            if self._thread is None:
                logging.getLogger().setLevel(self._level)
                self._thread = threading.Thread(target=self._run, name="zbus-in-process",
                                                daemon=True)
                self._thread.start()
        self.wake()
        return handle

    def kill(self, handle: RoleHandle) -> None:
        """As SIGKILL leaves it: the role's sockets gone at once, nothing more sent (done by
        the driver's thread, which may be waiting on them; returns once it is done)."""
        with self.changed:
            if handle.returncode is not None:
                return
            self._kills.append(handle)
            running = self._thread is not None and self._thread.is_alive()
            if not running:
                self._do_kills()
                return
        self.wake()
        with self.changed:
            while handle.returncode is None:
                self.changed.wait(0.5)

    def _do_kills(self) -> None:
        for handle in self._kills:
            if handle.returncode is None and handle.loop is not None:
                handle.loop.stopping = handle.loop.ended = True
                handle.loop.ctx.destroy(linger=0)
                with logs.node_scope(handle.node):
                    handle.loop.release()   # its threads, children and files, as the OS would
                self._ended(handle, KILLED)
        self._kills.clear()

    def wake(self) -> None:
        try:
            os.write(self._wake_w, b"x")
        except BlockingIOError:
            pass   # already woken

    def _ended(self, handle: RoleHandle, code: int) -> None:
        """The role's loop is over (its process would have exited with ``code``): its log is
        closed, so that a node started again under its name logs elsewhere."""
        handle.returncode = code
        if handle.log is not None:
            logging.getLogger().removeHandler(handle.log)
            handle.log.close()
            self._handlers.remove(handle.log)
            handle.log = None
        self.changed.notify_all()

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._turn_all()
        except BaseException:   # a bug of the driver's: every role ends, the cluster says why
            import traceback
            self.errors.append(traceback.format_exc())
            with self.changed:
                for handle in self.roles.values():
                    if handle.returncode is None:
                        self._ended(handle, 70)
            raise

    def _turn_all(self) -> None:
        while not self._closing:
            with self.lock:
                self._do_kills()
                live = [h for h in self.roles.values()
                        if h.returncode is None and not h.stopped]
                for handle in live:
                    assert handle.loop is not None
                    with logs.node_scope(handle.node):
                        going = handle.loop.turn(0)
                    if not going:
                        self._ended(handle, handle.loop.exit_code)
                live = [h for h in live if h.returncode is None and not h.stopped]
                now = time.monotonic()
                timeout = min((h.loop.poll_timeout(now) for h in live if h.loop is not None),
                              default=0.5)
                poller = zmq.Poller()
                poller.register(self._wake_r, zmq.POLLIN)
                for handle in live:
                    assert handle.loop is not None
                    for sock, events in handle.loop.watched():
                        poller.register(sock, events)
            try:
                ready = poller.poll(int(timeout * 1000))
            except zmq.ZMQError as exc:   # a socket closed meanwhile (a role killed): turn again
                if exc.errno != zmq.ENOTSOCK:
                    self.errors.append(f"poll: {exc}")
                continue
            if any(fd == self._wake_r for fd, _ in ready):
                while select.select([self._wake_r], [], [], 0)[0]:
                    os.read(self._wake_r, 4096)

    # -- logs --------------------------------------------------------------------------------------
    def _log_to(self, name: str, node: str) -> logging.Handler:
        """``<log_dir>/<name>.log`` (appended to): ``node``'s lines, as its process's output
        would be."""
        handler = logging.FileHandler(self.log_dir / f"{name}.log", encoding="utf-8")
        handler.setFormatter(logs.line_format(node))
        handler.addFilter(logs.OfNode(node))
        logging.getLogger().addHandler(handler)
        self._handlers.append(handler)
        return handler

    def say(self, node: str, text: str) -> None:
        """Lines a role's process prints (control's headline) into its log."""
        with logs.node_scope(node):
            logs.to_file(text)
            for handler in self._handlers:
                for line in text.splitlines():
                    handler.handle(logging.makeLogRecord({"msg": line, "printed": True}))

    # -- the end -------------------------------------------------------------------------------
    def close(self, grace_s: float = 10.0) -> None:
        """SIGTERM to every live role, ``grace_s`` for them to end, then kill what is left; the
        thread stopped, the logs closed (every file handler a role added under ``run_dir`` too).
        Control is signalled first and waited for: its Stop has the nodes leave, and it exits
        once they have. (A node signalled meanwhile would end without a word to control, which,
        unable to see its process gone as it sees a process's, waited ``CLOSE_WAIT_S`` for it.)
        Closed once: a second call does nothing.
        """
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + grace_s
        handles = list(self.roles.values())
        controls = [h for h in handles if h.loop is not None and not isinstance(h.loop, Node)]
        for group in (controls, [h for h in handles if h not in controls]):
            for handle in group:
                handle.terminate()
            for handle in group:
                try:
                    handle.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    handle.kill()
        self._closing = True
        self.wake()
        if self._thread is not None:
            self._thread.join(timeout=30)
        root = logging.getLogger()
        nodes = {h.node for h in self.roles.values()}
        for handler in list(root.handlers):
            if handler in self._handlers or (
                    isinstance(handler, logging.FileHandler)
                    and any(isinstance(f, logs.OfNode) and f.node_id in nodes
                            for f in handler.filters)):
                root.removeHandler(handler)
                handler.close()
        root.setLevel(self._root_level)
        os.close(self._wake_r)
        os.close(self._wake_w)


class StartError(Exception):
    """A role that cannot start (a bad job file, a port in use): its process would say this
    line and exit with ``status``."""

    def __init__(self, message: str, status: int = 2):
        super().__init__(message)
        self.status = status
