"""An interrupted job says what interrupted it (a Ctrl-C of honcho start is a Ctrl-C, not "control
received SIGTERM") and how to go on with it: ``ZBUS_JOB=<run>/config.toml ZBUS_RESUME=<run>
scripts/start``, the run's config.toml being the whole effective job, so that no ZBUS_* setting
needs remembering."""

from __future__ import annotations

import os
import socket
from typing import Any

import psutil
import pytest
from harness import REPO

from roles.algorithms.control.membership import FAILED, NodeState
from roles.control.interruption import SETTLE_S, Interruption
from roles.control.main import headline
from roles.job.settings import job_to_toml, load_job


def gone_pid() -> int:
    """A pid no process has."""
    pid = 4_000_000
    while psutil.pid_exists(pid):
        pid += 1
    return pid


def node(pid: int, status: str = "alive") -> NodeState:
    return NodeState("worker", 0, socket.gethostname(), pid, 0.0, status=status)


def test_a_sigterm_under_honcho_is_a_ctrl_c_unless_a_node_had_exited():
    here = {"ps-0": node(os.getpid()), "worker-1": node(gone_pid(), FAILED)}
    assert Interruption.begin("SIGTERM", True, here, 0.0).reason() == \
        "Ctrl-C: honcho stopped every process (SIGTERM) before the job finished"
    died = {**here, "worker-0": node(gone_pid())}   # gone, and control had not heard of it
    assert Interruption.begin("SIGTERM", True, died, 0.0).reason() == \
        "honcho stopped every process (SIGTERM) after worker-0 exited, before the job finished"
    assert Interruption.begin("SIGTERM", False, died, 0.0).reason() == \
        "control received SIGTERM before the job finished"
    assert Interruption.begin("SIGINT", True, here, 0.0).reason() == \
        "control received SIGINT before the job finished"


def test_a_node_the_same_sigterm_stopped_first_is_not_why_honcho_stopped_the_job():
    """honcho SIGTERMs every process at once: a node may exit before control's handler runs.
    It says a signal stopped it as it leaves, and control waits a moment for those words."""
    nodes = {"ps-0": node(gone_pid()), "feeder-0": node(gone_pid()), "worker-0": node(os.getpid())}
    stopped = Interruption.begin("SIGTERM", True, nodes, 10.0)
    assert not stopped.settled(10.0) and stopped.settled(10.0 + SETTLE_S)
    nodes["ps-0"].signalled = "SIGTERM"   # its Leaving came after control's signal
    assert stopped.reason() == \
        "honcho stopped every process (SIGTERM) after feeder-0 exited, before the job finished"
    nodes["feeder-0"].signalled = "SIGTERM"
    assert stopped.reason() == \
        "Ctrl-C: honcho stopped every process (SIGTERM) before the job finished"
    nobody_gone = Interruption.begin("SIGTERM", True, {"worker-0": node(os.getpid())}, 10.0)
    assert nobody_gone.settled(10.0)   # nothing to wait for


def summary(run_dir: str, resume_from: int | None) -> Any:
    return {"ok": False, "job": "adult", "status": "interrupted", "resume_from": resume_from,
            "reason": "Ctrl-C: honcho stopped every process (SIGTERM) before the job finished",
            "run_dir": run_dir, "shard_recoveries": [], "recovery": [], "parts": None,
            "checkpoints": {"rollbacks": [], "every_s": 300.0}}


def test_the_resume_hint_names_the_runs_own_job_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    lines = headline(summary(str(tmp_path / "runs" / "adult-1"), 4),
                     tmp_path / "runs" / "adult-1" / "summary.json")
    assert lines == [
        "zbus: job adult interrupted: Ctrl-C: honcho stopped every process (SIGTERM) before the "
        "job finished",
        "zbus: to go on from checkpoint 4: ZBUS_JOB=runs/adult-1/config.toml "
        "ZBUS_RESUME=runs/adult-1 scripts/start",
        "zbus: summary in runs/adult-1/summary.json"]


@pytest.mark.parametrize("job_file", ["jobs/adult.toml", "jobs/items_din.toml", None])
def test_a_runs_config_toml_is_the_whole_job_without_its_settings(tmp_path, monkeypatch,
                                                                 job_file):
    """What ZBUS_* settings, a cluster file and the job file's own directory made of the job
    is in config.toml: read alone (no setting, from the run directory), it is the same job."""
    (tmp_path / "nets").mkdir()
    (tmp_path / "nets" / "tiny.py").write_text("def build(*args):\n    pass\n")
    (tmp_path / "cluster.toml").write_text('[endpoints]\ncontrol = "10.0.0.1:5555"\n')
    env = {"ZBUS_TRAIN__EPOCHS": "7", "ZBUS_MODEL__HIDDEN": "[32, 16]",
           "ZBUS_MODEL__OPTIONS": '{width = 24, names = ["a", "b"]}',
           "ZBUS_MODEL__MODULE": "nets/tiny.py:build", "ZBUS_MODEL__NETWORK": "mlp",
           "ZBUS_CLUSTER_FILE": str(tmp_path / "cluster.toml"),
           "ZBUS_CHECKPOINT__DIR": "checkpoints", "ZBUS_AGGREGATION__FAILURE_RATE_MAX": "0.1"}
    monkeypatch.chdir(tmp_path)   # relative settings are the working directory's
    job = load_job(str(REPO / job_file) if job_file else None, environ=env)
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(job_to_toml(job))
    again = load_job(str(run / "config.toml"), environ={})
    assert again.fingerprint() == job.fingerprint()
    assert again.model.module == f"{tmp_path}/nets/tiny.py:build"
    assert again.cluster.endpoint("control") == "tcp://10.0.0.1:5555"
    assert again.train.epochs == 7 and again.model.options == {"width": 24, "names": ["a", "b"]}
    assert again.checkpoint.dir == str(tmp_path / "checkpoints")
