"""The console as an operator runs it: zbus-console in a pseudo-terminal of 80x24 against a real
running job (its roles turned in the test's process), keys typed into the terminal, figures read
from what it draws (escape sequences stripped). Pilot and the snapshots test the widgets; this
tests the program."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time

import pytest
from harness import ADULT_JOB, BIN

ESCAPE = re.compile(rb"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[@-Z\\-_])")


class Terminal:
    """A pseudo-terminal running one program; ``screen`` is what it has drawn so far, as
    text."""

    def __init__(self, argv: list[str], env: dict, rows: int = 24, cols: int = 80):
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave,
                                     env={**env, "TERM": "xterm-256color"},
                                     start_new_session=True)
        os.close(slave)
        self.raw = b""

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            ready, _, _ = select.select([self.master], [], [], left)
            if not ready:
                continue
            try:
                chunk = os.read(self.master, 65536)
            except OSError:  # the program has closed its terminal
                return
            if not chunk:
                return
            self.raw += chunk

    def text(self, since: int = 0) -> str:
        return ESCAPE.sub(b" ", self.raw[since:]).decode(errors="replace")

    def wait_for(self, pattern: str, timeout: float = 90.0, since: int = 0) -> re.Match:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(pattern, self.text(since))
            if found:
                return found
            self.read(0.5)
        raise AssertionError(f"{pattern!r} not on the screen within {timeout} s; it shows:\n"
                             + self.text(since)[-3000:])

    def type(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        os.close(self.master)


@pytest.mark.integration  # zbus-console: a program in a terminal
@pytest.mark.inprocess    # the job it shows: its roles in this process
def test_the_console_in_a_terminal_shows_live_figures(cluster):
    c = cluster(ADULT_JOB, train__epochs=100, cluster__start_timeout_s=600)
    c.start_all(slowdown={0: 3.0, 1: 3.0})
    cl = c.job.cluster
    term = Terminal([str(BIN / "zbus-console"), "--status", cl.endpoint("status"),
                     "--requests", cl.endpoint("control_req")], c.env)
    try:
        term.wait_for(r"adult\s+adult|● adult")  # the top line: connected to control
        term.wait_for(r"training\s+epoch \d+/100")
        term.type("3")  # the Training tab
        mark = len(term.raw)
        term.wait_for(r"throughput\s+[1-9][\d.]*k?\s+samples/s", since=mark)
        term.wait_for(r"training loss", since=mark)  # the chart's title
        deadline = time.monotonic() + 60
        while len(set(re.findall(r"trained\s+([\d.]+k?)\s+samples", term.text(mark)))) < 2:
            assert time.monotonic() < deadline, "the samples trained do not move"
            term.read(0.5)
        term.type("2")  # the Nodes tab: the table and the selected node's history
        mark = len(term.raw)
        term.wait_for(r"worker-1", since=mark)
        term.wait_for(r"cpu %", since=mark)
        term.type("q")
        assert term.proc.wait(timeout=30) == 0
    finally:
        if term.proc.poll() is None:   # killed, pass or fail
            term.proc.kill()
            term.proc.wait()
        term.close()
    assert c.procs["control-0"].poll() is None  # quitting the console leaves the job running
