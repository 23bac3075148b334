"""Writing a snapshot off a role's loop.

``ForkedWrite`` is how a shard writes its table (Redis's BGSAVE does the same): ``os.fork``
gives a child process a copy-on-write image of the parent's memory at that instant; the child
writes the files from it and exits, while the parent goes on serving at once. The parent's
pause is the fork itself (copying its page tables), whatever the size of the table; the
memory the two share is copied page by page only where the parent writes meanwhile. The child
closes every inherited descriptor but its error pipe at once (the parent's sockets among them:
a restarted shard, or the next job, must be able to bind the port while the child still
writes; the parent goes on once the child says it has, a close_range call away), dies with
the parent (``zbus.children``), takes the default signal handlers and leaves
with ``os._exit`` (it never touches the parent's ZeroMQ context). A parent that exits first
ends the write (``stop``): no process of a run outlives it. It needs ``os.fork`` (Linux,
macOS: the systems zbus runs on).

``ThreadWrite`` writes a small snapshot the caller already copied (the dense weights, a
feeder's ack log) on a thread.

Both are polled from the loop: ``done()`` is None while writing, then (ok, error).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from zbus import children

READY = b"\0"   # the child to the parent: it has closed what it inherited


class ThreadWrite:
    def __init__(self, write: Callable[[], object]):
        self.result: tuple[bool, str] | None = None
        self.value: Any = None   # what ``write`` returned, once it has
        self.thread = threading.Thread(target=self._run, args=(write,), daemon=True,
                                       name="zbus-checkpoint")
        self.thread.start()

    def _run(self, write: Callable[[], object]) -> None:
        try:
            self.value = write()
            self.result = (True, "")
        except Exception as exc:  # reported to control, which aborts the checkpoint
            self.result = (False, f"{type(exc).__name__}: {exc}")

    def done(self) -> tuple[bool, str] | None:
        return self.result

    def wait(self) -> tuple[bool, str]:
        self.thread.join()
        assert self.result is not None
        return self.result


class ForkedWrite:
    def __init__(self, write: Callable[[], object]):
        read_end, write_end = os.pipe()
        parent = os.getpid()
        children.prepare()
        pid = os.fork()
        if pid == 0:  # the child: write, say what went wrong if anything, leave
            code = 1
            try:
                children.close_inherited(keep=write_end)
                children.die_with_parent(parent)
                os.write(write_end, READY)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                write()
                code = 0
            except BaseException:
                try:
                    os.write(write_end, traceback.format_exc(limit=3).encode()[-4000:])
                except OSError:
                    pass
            finally:
                os._exit(code)
        os.close(write_end)
        os.read(read_end, len(READY))  # it holds none of this process's ports from here on
        os.set_blocking(read_end, False)  # (or it died: end of file)
        self.pid, self.pipe = pid, read_end
        self.result: tuple[bool, str] | None = None

    def done(self) -> tuple[bool, str] | None:
        if self.result is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid == 0:
                return None
            self._finish(status)
        return self.result

    def wait(self) -> tuple[bool, str]:
        if self.result is None:
            _, status = os.waitpid(self.pid, 0)
            self._finish(status)
        assert self.result is not None
        return self.result

    def stop(self) -> None:
        """End a write still under way (its parent is exiting: the checkpoint cannot be
        completed any more) and reap the child; its result says it was stopped."""
        if self.result is not None:
            return
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.waitpid(self.pid, 0)
        os.close(self.pipe)
        self.result = (False, "stopped: the process that forked the writer exited")

    def _finish(self, status: int) -> None:
        try:
            said = os.read(self.pipe, 4096).decode(errors="replace").strip()
        except OSError:
            said = ""
        os.close(self.pipe)
        code = os.waitstatus_to_exitcode(status)
        if code == 0:
            self.result = (True, "")
        else:
            last = said.splitlines()[-1] if said else f"the writer exited with status {code}"
            self.result = (False, last)
            if said:
                print(said, file=sys.stderr)
