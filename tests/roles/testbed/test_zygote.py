"""The zygote the tests' role processes are forked from (``roles.testbed.zygote``): each child
is what ``python -m``/``-c`` would have started, and answers as ``subprocess.Popen`` does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

CHILD = """
import os, sys
print(os.getcwd(), os.environ["ZBUS_PROBE"], os.getsid(0) == os.getpid(),
      os.getpgid(0) == os.getpid(), sys.argv[1:], flush=True)
sys.exit(int(sys.argv[1]))
"""


@pytest.mark.integration
def test_a_forked_child_runs_in_its_own_session_directory_and_environment(zygote, tmp_path):
    log = tmp_path / "child.log"
    env = dict(os.environ, ZBUS_PROBE="seen")
    proc = zygote.start([sys.executable, "-c", CHILD, "3"], tmp_path, env, log)
    assert proc.wait(timeout=60) == 3 and proc.poll() == 3
    assert log.read_text().split() == [str(tmp_path), "seen", "True", "True", "['3']"]


@pytest.mark.integration
def test_a_signalled_child_reports_the_signal_as_popen_does_and_a_group_can_be_joined(
        zygote, tmp_path):
    sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
    leader = zygote.start(sleeper, tmp_path, os.environ, tmp_path / "a.log", group=0)
    member = zygote.start(sleeper, tmp_path, os.environ, tmp_path / "b.log", group=leader.pid)
    assert os.getpgid(member.pid) == leader.pid == os.getpgid(leader.pid)
    assert os.getsid(member.pid) != os.getsid(0)   # the zygote's session, not this one's
    with pytest.raises(subprocess.TimeoutExpired):
        member.wait(timeout=0.2)
    os.killpg(leader.pid, signal.SIGTERM)   # as Ctrl-C reaches a terminal's foreground job
    assert leader.wait(timeout=60) == member.wait(timeout=60) == -signal.SIGTERM
    assert leader.pid not in zygote.children()


@pytest.mark.integration
def test_what_a_fork_cannot_be_is_left_to_popen(zygote):
    argv = [sys.executable, "-m", "roles.ps"]
    assert zygote.can_fork(argv, os.environ)
    assert not zygote.can_fork(["/bin/sh", "-c", "true"], os.environ)
    assert not zygote.can_fork(argv, dict(os.environ, MALLOC_ARENA_MAX="1"))
    assert not zygote.can_fork(argv, os.environ, preexec=lambda: None)   # a cgroup to join
    assert not zygote.can_fork(argv, os.environ, group=1)   # a group not of the zygote's
