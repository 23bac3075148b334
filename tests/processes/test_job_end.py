"""What a job leaves when it ends: no process (a shard's forked checkpoint writer, control's
capacity trainer), no half-written checkpoint file, no port held (the next job on the same
ports binds them at once; when a port is held, the bind says by whom in one line), and each
role's log in the run directory."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import time

import numpy as np
import psutil
import pytest
import zmq
from harness import REPO

from roles.algorithms.shard.applied import AppliedBatches
from roles.algorithms.shard.embedding_table import EmbeddingTable
from roles.checkpoint import shard as shard_checkpoints
from roles.checkpoint.background import ForkedWrite
from roles.checkpoint.files import checkpoints_dir
from zbus import sockets
from zbus.endpoints import CONTROL
from zbus.files import temp_path
from zbus.logs import log_path

ZIPF_JOB = REPO / "jobs" / "zipf.toml"   # placement mode skew: control has a trainer child
GONE_WITHIN_S = 20.0   # generous: a process killed by the kernel is reaped by its new parent
# a shard whose checkpoint writer (its forked child) writes to a disk so slow that it is still
# writing when the job ends: each file's save waits 600 s first (patched in that process only)
SLOW_DISK_SHARD = """
import time

import roles.checkpoint.shard as checkpoints
from roles.ps import main

save = checkpoints.save_npz


def slow_save(*args, **kwargs):
    time.sleep(600)
    save(*args, **kwargs)


checkpoints.save_npz = slow_save
main()
"""


def bind_again(endpoint: str) -> None:
    """Bind ``endpoint`` as the next job's role would (ZeroMQ, like every zbus socket)."""
    ctx: sockets.Context = zmq.Context()
    try:
        sockets.bind(ctx, zmq.ROUTER, endpoint).close(0)
    finally:
        ctx.destroy(linger=0)


def left_alive(pids: list[int]) -> list[str]:
    """Those of ``pids`` still running after a while, in words; they are killed then (this
    test started them), so that a failure leaves nothing behind."""
    procs = []
    for pid in pids:
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    _, alive = psutil.wait_procs(procs, timeout=GONE_WITHIN_S)
    left = []
    for proc in alive:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"pid {proc.pid}: {' '.join(proc.cmdline())}")
            proc.kill()
        except psutil.NoSuchProcess:
            continue
    return left


def run_script(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_each_role_logged_under_the_run_directory_the_lines_it_printed(c) -> None:
    """Each role's log in the run directory: the lines it printed, each with its time."""
    stamp = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} ")
    for name in c.procs:
        path = log_path(c.run_dir, name)
        assert path.exists(), name
        printed = [line for line in c.log(name).splitlines() if line]
        written = path.read_text().splitlines()
        assert all(stamp.match(line) for line in written), name
        assert printed and printed == [stamp.sub("", line) for line in written], name
        assert "waiting for control at" in written[0] or name == "control-0", written[0]
    control = log_path(c.run_dir, "control-0").read_text().splitlines()
    assert any(" epoch 1: train loss " in line for line in control), control
    assert control[-1].endswith("zbus: summary in run/summary.json"), control[-3:]


@pytest.mark.integration
def test_once_a_job_has_ended_no_process_of_it_is_left_and_every_port_binds_again(cluster):
    """... and each role wrote its log under the run directory, the same lines it printed
    (one job of real processes shows both)."""
    c = cluster(ZIPF_JOB, transport="tcp", train__epochs=2, checkpoint__every_s=0.5)
    c.start_role("control", 0)
    c.start_role("feeder", 0)
    # its checkpoint writer is still writing when the job ends (SLOW_DISK_SHARD)
    c.start("ps-0", [sys.executable, "-c", SLOW_DISK_SHARD, "--index", "0"])
    c.start_role("ps", 1)
    c.start_role("worker", 0)
    c.start_role("aggregator", 0)
    shard = psutil.Process(c.procs["ps-0"].pid)
    deadline = time.monotonic() + 120
    while not (writers := shard.children()):
        assert time.monotonic() < deadline and c.procs["ps-0"].poll() is None, c.logs()
        time.sleep(0.05)
    trainer = psutil.Process(c.procs["control-0"].pid).children()
    assert trainer, "control started no capacity trainer: this test would check nothing of it"
    assert c.wait() == 0, c.logs()
    assert c.summary()["ok"]
    for name, proc in c.procs.items():
        assert proc.wait(timeout=60) is not None, name
    # ps-0's writer never finished: it was writing when the job ended
    assert c.summary()["checkpoints"]["complete"] == 0, c.summary()["checkpoints"]
    # no process of the run is left: the writer and the trainer went with their parents
    left = left_alive([p.pid for p in [*writers, *trainer, *c.strays()]])
    assert not left, left
    # every port of the run binds again at once, as the next job's roles bind them
    for name in c.job.cluster.endpoint_names():
        endpoint = c.job.cluster.endpoint(name)
        if endpoint.startswith("tcp://"):
            bind_again(endpoint)
    # (checkpoint 1, or 2 where the first cut was abandoned at an epoch's end before ps-0's
    # writer began: then the second is the one it is writing)
    assert re.search(r"exiting while it wrote checkpoint [12]: the writer is stopped",
                     c.log("ps-0")), c.log("ps-0")
    assert_each_role_logged_under_the_run_directory_the_lines_it_printed(c)


@pytest.mark.integration
def test_a_bind_on_a_held_port_fails_in_one_line_naming_the_process_that_holds_it(cluster):
    c = cluster(transport="tcp")
    port = int(c.job.cluster.endpoint(CONTROL).rsplit(":", 1)[1])
    holder = run_script(f"""
        import socket, sys, time
        s = socket.socket()
        s.bind(("127.0.0.1", {port}))
        s.listen()
        print("listening", flush=True)
        time.sleep(120)
    """)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "listening\n"
        c.start_role("control", 0)
        assert c.wait(timeout=120) == 2
        lines = c.log("control-0").splitlines()
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"zbus control: cannot start: cannot bind tcp://127.0.0.1:"
                                   f"{port}: the port is in use by pid {holder.pid} ("), lines
        assert "import socket, sys, time s = socket.socket()" in lines[0], lines
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.integration
def test_a_forked_writer_dies_with_the_process_that_forked_it():
    parent = run_script("""
        import time
        from roles.checkpoint.background import ForkedWrite
        w = ForkedWrite(lambda: time.sleep(600))
        print(w.pid, flush=True)
        time.sleep(600)
    """)
    assert parent.stdout is not None
    writer = int(parent.stdout.readline())
    assert psutil.pid_exists(writer)
    parent.kill()   # SIGKILL: the parent has no say in it
    parent.wait()
    assert not left_alive([writer])


@pytest.mark.integration
@pytest.mark.parametrize("end", ["closed", "killed"])
def test_controls_capacity_trainer_does_not_outlive_control(tmp_path, end):
    control = run_script(f"""
        import os, signal, time
        from pathlib import Path
        import psutil
        from roles.control.capacity_training import BackgroundFit
        fit = BackgroundFit(2, 10, Path({str(tmp_path)!r}) / "model.pt")
        fit.pool.submit(time.sleep, 0).result()   # the child has started
        print(*[p.pid for p in psutil.Process().children()], flush=True)
        if {end!r} == "closed":
            fit.close()
            os._exit(0)   # as control exits
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    assert control.stdout is not None and control.stderr is not None
    pids = [int(p) for p in control.stdout.readline().split()]
    control.wait(timeout=120)
    left = left_alive(pids)   # (a child left would hold the pipes: read them after this)
    err = control.stderr.read()
    assert pids, err
    assert not left, left
    if end == "closed":
        assert err == "", err   # nothing said after control's summary


def test_a_forked_writer_holds_none_of_its_parents_ports_and_stop_ends_it():
    ctx: sockets.Context = zmq.Context()
    port = sockets.free_tcp_ports(1)[0]
    endpoint = f"tcp://127.0.0.1:{port}"
    held = sockets.bind(ctx, zmq.ROUTER, endpoint)
    w = ForkedWrite(lambda: time.sleep(600))
    try:
        held.close(0)
        ctx.destroy(linger=0)   # the parent closes its port, its writer still writes
        bind_again(endpoint)
    finally:
        w.stop()
    assert w.done() == (False, "stopped: the process that forked the writer exited")
    assert not psutil.pid_exists(w.pid)


def test_a_bind_on_a_port_in_use_names_the_process_that_holds_it():
    ctx: sockets.Context = zmq.Context()
    try:
        endpoint = f"tcp://127.0.0.1:{sockets.free_tcp_ports(1)[0]}"
        held = sockets.bind(ctx, zmq.ROUTER, endpoint)
        with pytest.raises(OSError) as raised:
            sockets.bind(ctx, zmq.ROUTER, endpoint)
        assert str(raised.value).startswith(f"cannot bind {endpoint}: the port is in use by "
                                            f"pid {os.getpid()} "
                                            "(this process)"), raised.value
        held.close(0)
    finally:
        ctx.destroy(linger=0)


def test_a_shard_that_exits_mid_write_ends_its_writer_and_removes_the_half_written_file(
        tmp_path, monkeypatch):
    def half_write(path, **arrays):   # in the child: a slow disk, the file half written
        tmp = temp_path(path, os.getpid())
        tmp.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(b"PK half of it")
        time.sleep(600)

    monkeypatch.setattr(shard_checkpoints, "save_npz", half_write)
    table = EmbeddingTable(4, 0.1, 0.05, seed=3, capacity=8)
    table.rows_for(np.arange(10, dtype=np.int64))
    root = checkpoints_dir(tmp_path)
    checkpoints = shard_checkpoints.ShardCheckpoints(0, table, full_every=3)
    checkpoints.begin(1, root, AppliedBatches(), {"updates": 0, "newest_epoch": 0, "version": 0})
    assert checkpoints.writing is not None
    writer = checkpoints.writing.writer
    try:
        half = temp_path(root / checkpoints.writing.name, writer.pid)
        deadline = time.monotonic() + 30
        while not half.exists():
            assert time.monotonic() < deadline and writer.done() is None, writer.done()
            time.sleep(0.01)
        assert checkpoints.close() == 1   # the shard exits: checkpoint 1 cannot be completed
        assert not half.exists()
        assert not psutil.pid_exists(writer.pid)
        assert checkpoints.close() is None   # nothing under way any more
    finally:
        writer.stop()
