"""Role processes forked from one process that has imported every role already (a zygote, as
Android's and Chromium's): a whole job of processes then costs one Python start-up, not seven.

A role's process spends most of its CPU on a short job importing (``import torch`` alone is
3.5 s of CPU on the test hosts); the suite's jobs of processes start about 500 of them, and on
2 cores that import time was most of the suite's. ``Zygote`` starts ``python -m
roles.testbed.zygote`` once; it imports the roles, then forks a child for each command it is
given, which becomes what ``python -m MODULE ARGS`` or ``python -c CODE ARGS`` would have been:
its own session, working directory, environment, log on its stdout and stderr, default signal
dispositions, the module run as ``__main__``. The zygote reaps its children and reports each
status; ``ForkedProcess`` answers as ``subprocess.Popen`` does (``pid``, ``poll``, ``wait``,
``send_signal``, ``terminate``, ``kill``, ``returncode``).

What a fork cannot be is left to ``subprocess.Popen`` (``can_fork``): another program, a
process group to join (that group's session is not the zygote's), a memory cgroup to join (the
pages the zygote imported are charged to its own cgroup, so the budget would measure less), and
an environment whose variables act before ``main`` (the C library's allocator, the loader,
Python's own start-up, BLAS threads, numba), when they differ from the zygote's. Two things
differ from a fresh process, both harmless to the roles: ``/proc/<pid>/environ`` and
``cmdline`` show the zygote's (``LocalCluster.strays`` finds the forks of a forked process by
its descendants, not by their environment), and
numpy's legacy global random state is reseeded in each child.

Only the zygote is single-threaded Python here: it imports, reads commands and forks; no
socket, context or thread of a role exists in it before the fork (the import-time threads of
OpenBLAS and jemalloc are fork-safe, both re-made in the child by their ``pthread_atfork``
handlers).
"""

from __future__ import annotations

import importlib
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import orjson

PRELOAD = ("numpy", "torch", "zmq", "roles.control.main", "roles.feeder.process",
           "roles.worker.process", "roles.ps", "roles.aggregator", "roles.member")
# variables read before a role's main runs: a child whose value differs is started afresh
_AT_START = ("MALLOC_", "GLIBC_TUNABLES", "LD_", "PYTHON", "OMP_", "OPENBLAS_", "MKL_",
             "NUMBA_", "JE_", "ARROW_")
_IGNORED_AT_START = {"PYTHONUNBUFFERED"}   # the zygote runs unbuffered, as the clusters ask


def _at_start(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items()
            if k.startswith(_AT_START) and k not in _IGNORED_AT_START}


# -- the client, in the test's process -----------------------------------------------------------
class ForkedProcess:
    """A child of the zygote, as ``subprocess.Popen`` shows a child of this process."""

    def __init__(self, zygote: Zygote, pid: int, args: list[str]):
        self.zygote, self.pid, self.args = zygote, pid, args
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.zygote.status(self.pid)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.zygote.changed:
            while self.poll() is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
                if not self.zygote.alive():
                    raise RuntimeError(f"the zygote died; pid {self.pid}'s status is lost")
                self.zygote.changed.wait(0.5 if left is None else min(left, 0.5))
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The zygote process, started at the first ``start`` and stopped by ``close``."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self._statuses: dict[int, int] = {}     # pid -> returncode, once reaped
        self._started: set[int] = set()         # pids forked and not yet reaped
        self._replies: list[dict] = []
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._reader: threading.Thread | None = None
        self._env: dict[str, str] = {}
        self._lock = threading.Lock()           # one start at a time

    def can_fork(self, argv: list[str], env: Mapping[str, str], group: int | None = None,
                 preexec: object = None) -> bool:
        """Whether ``argv`` in ``env`` can be forked from the zygote (the module's docstring)."""
        return (len(argv) >= 3 and argv[0] == sys.executable and argv[1] in ("-m", "-c")
                and (group in (None, 0) or group in self.children()) and preexec is None
                and _at_start(env) == _at_start(self._env or os.environ))

    def start(self, argv: list[str], cwd: Path, env: Mapping[str, str], log: Path,
              group: int | None = None) -> ForkedProcess:
        """``argv`` (``[sys.executable, "-m"|"-c", ...]``) forked in a session of its own, in
        ``cwd`` with ``env``, its output appended to ``log``; ``group``: in that process group
        instead (0: a new one), in the zygote's session (the group of another child's)."""
        with self._lock:
            if self._proc is None:
                self._launch()
            self._send({"argv": argv[1:], "cwd": str(cwd), "env": dict(env), "log": str(log),
                        "group": group})
            with self.changed:
                while not self._replies:
                    if not self.alive():
                        raise RuntimeError("the zygote died: " + self._stderr())
                    self.changed.wait(0.5)
                reply = self._replies.pop(0)
        if "error" in reply:
            raise OSError(f"zygote: {reply['error']}")
        return ForkedProcess(self, reply["pid"], argv)

    def status(self, pid: int) -> int | None:
        with self.changed:
            return self._statuses.get(pid)

    def children(self) -> list[int]:
        """The pids of the zygote's children still running."""
        with self.changed:
            return sorted(self._started)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def close(self) -> None:
        """Stop the zygote; its children left running are killed (their process groups)."""
        if self._proc is None:
            return
        for pid in self.children():
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        assert self._sock is not None
        self._sock.shutdown(socket.SHUT_RDWR)   # the zygote ends at the end of its commands
        self._sock.close()
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        if self._reader is not None:
            self._reader.join(timeout=10)
        self._proc = None

    def _launch(self) -> None:
        ours, theirs = socket.socketpair()
        env = self._env = dict(os.environ, PYTHONUNBUFFERED="1")
        self._proc = subprocess.Popen([sys.executable, "-m", "roles.testbed.zygote",
                                       str(theirs.fileno())], pass_fds=[theirs.fileno()],
                                      env=env, stdin=subprocess.DEVNULL,
                                      stderr=subprocess.PIPE, start_new_session=True)
        theirs.close()
        self._sock = ours
        self._reader = threading.Thread(target=self._read, name="zygote-reader", daemon=True)
        self._reader.start()

    def _send(self, message: dict) -> None:
        assert self._sock is not None
        self._sock.sendall(orjson.dumps(message) + b"\n")

    def _read(self) -> None:
        assert self._sock is not None
        for line in self._sock.makefile("rb"):
            message = orjson.loads(line)
            with self.changed:
                if "exit" in message:
                    self._statuses[message["exit"]] = message["code"]
                    self._started.discard(message["exit"])
                else:
                    if "pid" in message:
                        self._started.add(message["pid"])
                    self._replies.append(message)
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def _stderr(self) -> str:
        if self._proc is None or self._proc.stderr is None or self._proc.poll() is None:
            return "(still running)"
        return self._proc.stderr.read().decode(errors="replace")[-2000:]


# -- the zygote ----------------------------------------------------------------------------------
def serve(fd: int) -> dict | None:
    """Read commands from ``fd`` until it closes; in a forked child, return its command."""
    sock = socket.socket(fileno=fd)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    reader = sock.makefile("rb")
    selector = selectors.DefaultSelector()
    selector.register(sock, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    while True:
        for key, _ in selector.select():
            if key.fileobj == wake_r:
                os.read(wake_r, 4096)
                _reap(sock)
                continue
            line = reader.readline()
            if not line:   # the client has gone: its children are its to kill
                signal.set_wakeup_fd(-1)
                return None
            command = orjson.loads(line)
            ready_r, ready_w = os.pipe()
            try:
                pid = os.fork()
            except OSError as exc:
                os.close(ready_r)
                os.close(ready_w)
                sock.sendall(orjson.dumps({"error": str(exc)}) + b"\n")
                continue
            if pid == 0:
                selector.close()
                reader.close()
                sock.close()
                for fd in (wake_r, wake_w, ready_r):
                    os.close(fd)
                _own_group(command["group"])
                os.close(ready_w)    # its session or group is made: the zygote answers
                return command
            os.close(ready_w)
            os.read(ready_r, 1)      # (an end of file, once the child has closed its end)
            os.close(ready_r)
            sock.sendall(orjson.dumps({"pid": pid}) + b"\n")


def _reap(sock: socket.socket) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        try:
            sock.sendall(orjson.dumps({"exit": pid, "code": code}) + b"\n")
        except OSError:
            return


def _own_group(group: int | None) -> None:
    """A session of its own, or the process group ``group`` (0: a new one)."""
    if group is None:
        os.setsid()
    else:
        os.setpgid(0, group)


def become(command: dict) -> None:
    """In the forked child: become ``python ARGV`` as the command says, and exit as it does."""
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(command["cwd"])
    os.environ.clear()
    os.environ.update(command["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    log = os.open(command["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(null)
    os.close(log)
    import numpy
    numpy.random.seed()
    flag, target, *args = command["argv"]
    if flag == "-m":
        sys.argv = [target, *args]
        preloaded = sys.modules.get(target)
        if preloaded is not None and not hasattr(preloaded, "__path__"):
            # a module, not a package: run as __main__ alone, as in a fresh process
            del sys.modules[target]
            parent, _, leaf = target.rpartition(".")
            if parent and getattr(sys.modules.get(parent), leaf, None) is preloaded:
                delattr(sys.modules[parent], leaf)
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    else:
        sys.argv = ["-c", *args]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})


def main() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    forked = serve(int(sys.argv[1]))
    if forked is not None:
        become(forked)
        return
    while True:   # no command can come: the children left are the client's to kill
        try:
            os.wait()
        except ChildProcessError:
            return


if __name__ == "__main__":
    main()
