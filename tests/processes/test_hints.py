"""The commands a waiting job gives (in its status and its log) are commands that work: run as
printed, from a shell without the job's ZBUS_* settings, they start the node the job waits for
with control's job; and none is given for a node a supervisor may still be starting."""

from __future__ import annotations

import shlex
import subprocess
import time

import psutil
import pytest
import zmq
from harness import BIN, REPO

from console.format import wait_line
from roles.control.operators import START_GRACE, start_command, start_wait, wait_record
from roles.job.cli import started_by_supervisor
from roles.protocol.operator import Status
from roles.testbed.local_cluster import clean_environ
from zbus.codec import decode

NODE_TIMEOUT_S = 5.0
GRACE_S = START_GRACE * NODE_TIMEOUT_S   # how long a supervisor may take to start a node


def test_a_node_a_supervisor_starts_is_waited_for_without_a_command_for_a_grace_time():
    assert start_wait(None, True, 4.9, 5.0) == ("to start", False)
    assert start_wait(None, True, 5.0, 5.0) == ("to join", True)
    assert start_wait(None, False, 0.0, 5.0) == ("to join", True)   # started by hand
    # a node that has joined is running: it gets ready, no command starts it
    assert start_wait("indexing", False, 30.0, 5.0) == ("to be ready (indexing)", False)


def test_honcho_or_zbus_supervised_tells_control_a_supervisor_starts_every_role():
    assert started_by_supervisor({"HONCHO_PROCESS_NAME": "control.1"})
    assert started_by_supervisor({"ZBUS_SUPERVISED": "1"})
    assert not started_by_supervisor({"ZBUS_SUPERVISED": "0", "PATH": "/bin"})


def test_the_command_names_the_runs_job_as_a_shell_reads_it():
    assert start_command("member-3", "/srv/runs/adult 1") == \
        "zbus-member --index 3 --job '/srv/runs/adult 1/config.toml'"


def test_a_wait_without_a_command_says_so_in_one_line():
    w = wait_record("worker-0", "to start", 1.0, 178.94, "")
    assert wait_line(w) == "worker-0 to start (within 2m59s)"


def waits_for(endpoint: str, node: str, until, timeout_s: float = 120.0) -> list[tuple]:
    """(uptime_s, wait record) of ``node`` in each status control publishes, until one for
    which ``until(record)`` holds (the last one listed)."""
    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(endpoint)
    seen: list[tuple] = []
    try:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not sub.poll(500):
                continue
            msg = decode(sub.recv_multipart()).msg
            if not isinstance(msg, Status):
                continue
            snap = msg.snapshot()
            for w in snap["waiting"]:
                if w["node"] == node:
                    seen.append((snap["uptime_s"], w))
                    if until(w):
                        return seen
        raise AssertionError(f"no wait for {node} as expected; seen: {seen[-3:]}")
    finally:
        ctx.destroy(linger=0)


def run_as_printed(c, name: str, command: str) -> None:
    """``command`` run as a user would paste it: in a shell's environment without the job's
    ZBUS_* settings (the cluster's processes have them); killed with the cluster."""
    with open(c.workdir / f"{name}.log", "wb") as log:
        c.procs[name] = subprocess.Popen(shlex.split(command), cwd=c.workdir,
                                         env=clean_environ(), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)


def role_process(c, role: str, index: int) -> psutil.Process:
    """The process of ``<role>-<index>`` that a supervisor of the cluster started."""
    for proc in c.strays():
        try:
            argv = proc.cmdline()
        except psutil.Error:
            continue
        if f"roles.{role}" in argv and argv[argv.index("--index") + 1] == str(index):
            return proc
    raise AssertionError(f"no process of {role}-{index} among {c.strays()}")


@pytest.mark.integration
def test_under_honcho_the_commands_a_waiting_job_gives_start_its_nodes_from_a_bare_shell(
        cluster):
    c = cluster(train__epochs=4, data__synthetic__rows=40_000, checkpoint__every_s=1.0,
                cluster__workers=1, cluster__node_timeout_s=NODE_TIMEOUT_S)
    job_file = c.run_dir / "config.toml"
    # honcho starts every role but the workers: the job waits for worker-0, first without a
    # command (honcho could still be starting it), then with one
    c.start("honcho", [str(BIN / "honcho"), "-d", str(REPO), "-f", str(REPO / "Procfile"),
                       "start", "control", "feeder", "ps", "aggregator"])
    status = c.job.cluster.endpoint("status")
    seen = waits_for(status, "worker-0", lambda w: w["restart"])
    early = [w for up, w in seen if up < GRACE_S - 0.5]
    assert early and all(w == {**w, "what": "to start", "restart": ""} for w in early), seen
    assert all(w["restart"] and w["what"] == "to join" for up, w in seen
               if up >= GRACE_S + 0.5), seen
    command = seen[-1][1]["restart"]
    assert command == f"zbus-worker --index 0 --job {job_file}", command
    said = [line for line in c.log("honcho").splitlines() if "waiting for worker-0" in line]
    assert said and "to start (" in said[0] and "start it with" not in said[0], said
    run_as_printed(c, "worker-0-as-printed", command)
    deadline = time.monotonic() + 120
    while not any(e["event"] == "checkpoint" and e["status"] == "complete"
                  for e in c.events()):
        assert c.procs["honcho"].poll() is None and time.monotonic() < deadline, c.logs()
        time.sleep(0.2)
    # a dead shard: honcho does not restart it; the command given starts it with the job
    role_process(c, "ps", 1).kill()
    seen = waits_for(status, "ps-1", lambda w: w["what"] == "to be restarted")
    command = seen[-1][1]["restart"]
    assert command == f"zbus-ps --index 1 --job {job_file}", command
    run_as_printed(c, "ps-1-as-printed", command)
    c.wait("honcho")
    s = c.summary()
    assert s["ok"] and list(s["workers"]) == ["worker-0"], s
    (r,) = s["shard_recoveries"]
    assert r["shard"] == "ps-1" and r["restored"], r
    assert "refused" not in c.log("honcho"), c.log("honcho")
