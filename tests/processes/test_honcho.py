"""A whole job as ``honcho start`` runs it from the repository's Procfile (every role a process
honcho starts and stops): the default job comes close to its oracle and ends plainly; a job
file's error is said once; honcho's status is the job's."""

from __future__ import annotations

import pytest
from harness import ADULT_JOB, BIN, REPO

pytestmark = pytest.mark.integration


def test_default_synthetic_job_under_honcho_comes_close_to_the_oracle(cluster):
    c = cluster()  # no job file: the built-in default job, as `honcho start` runs it
    c.start("honcho", [str(BIN / "honcho"), "-d", str(REPO), "-f", str(REPO / "Procfile"),
                       "start"])
    assert c.wait("honcho") == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["job"] == "synthetic" and s["epochs"] == 2
    assert abs(s["auc"] - s["oracle_auc"]) <= 0.02, s
    assert s["samples_trained"] == s["samples_in_data"] * 2 == 160000
    # a demo of seconds checkpoints too: Ctrl-C would have left it resumable
    assert s["checkpoints"]["complete"] >= 1, s["checkpoints"]
    assert all(n > 0 for n in s["workers"].values()) and len(s["workers"]) == 2
    # push: the feeder's Deliver tells the shards where to send, no worker asks (lookups)
    assert all(s["bytes"][ch] > 0 for ch in ("samples", "keys", "deliveries", "embeddings",
                                             "embedding_grads", "dense_sync", "acks",
                                             "control")), s["bytes"]
    out = c.log("honcho")
    assert "auc" in out and "summary in" in out
    # the end is said plainly: zbus's last lines are the summary, every process ends on its own
    # and well, nothing is said twice
    lines = [line.split(" ", 1)[1] for line in out.splitlines() if " | " in line]
    zbus = [line for line in lines if not line.startswith("system")]
    assert [line.split("| ", 1)[1].split(":")[0] for line in zbus[-3:]] == ["zbus"] * 3, zbus
    assert "summary in" in zbus[-1]
    for noise in ("received SIGTERM", "finishing its batches", "SIGKILL", "Traceback"):
        assert noise not in out, out
    assert len(set(zbus)) == len(zbus), [x for x in zbus if zbus.count(x) > 1]
    assert all(line.endswith("(rc=0)") for line in lines if "stopped (rc=" in line), out
    # the summary is the last thing but honcho's word that control stopped
    said = [line.split(" | ", 1)[1] for line in out.splitlines() if " | " in line]
    assert said[-1] == "control.1 stopped (rc=0)" and "summary in" in said[-2], said[-12:]
    # the log reads as one: feeder and control count epochs from 1; no file count for data
    # that has no file
    assert "epoch 1: training on" in out and "epoch 2 trained" in out, out
    assert "epoch 0" not in out and "indexed 0 file(s)" not in out, out
    assert "synthetic data: 100000 rows" in out, out


def test_a_job_file_error_is_said_once_for_the_whole_honcho_start(cluster, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(ADULT_JOB.read_text().replace("[train]\n", "[train]\nepochz = 2\n"))
    c = cluster(ADULT_JOB)
    c.env["ZBUS_JOB"] = str(bad)
    c.start("honcho", [str(BIN / "honcho"), "-d", str(REPO), "-f", str(REPO / "Procfile"),
                       "start"])
    assert c.wait("honcho", timeout=60) == 2
    out = c.log("honcho")
    said = [line for line in out.splitlines() if "job error" in line]
    assert len(said) == 1, out
    assert "unknown key [train] epochz (did you mean 'epochs'?)" in said[0]
    assert "Traceback" not in out


def test_honcho_exits_non_zero_when_the_job_fails(cluster, tmp_path):
    c = cluster(ADULT_JOB, data__path=str(tmp_path / "missing.csv"))
    c.start("honcho", [str(BIN / "honcho"), "-d", str(REPO), "-f", str(REPO / "Procfile"),
                       "start"])
    assert c.wait("honcho", timeout=120) != 0
    assert "missing.csv' does not exist" in c.summary()["reason"]


def test_the_online_job_is_one_command_a_broker_a_replay_and_the_job(cluster):
    """``ZBUS_JOB=jobs/online.toml scripts/start``: its Procfile starts a nats-server, replays
    the generator's rows onto it and runs the stream job on them to the end (here 20,000
    events, on a port of its own)."""
    from zbus.sockets import free_tcp_ports
    (port,) = free_tcp_ports(1)
    c = cluster(REPO / "jobs" / "online.toml", train__until_events=20_000,
                stream__url=f"nats://127.0.0.1:{port}")
    c.env.update(ZBUS_ONLINE_ROWS="20000", ZBUS_NATS_PORT=str(port))
    c.start("start", [str(REPO / "scripts" / "start")])
    assert c.wait("start", timeout=300) == 0, c.logs()
    s = c.summary()
    st = s["stream"]
    assert s["ok"] and s["job"] == "online", s["reason"]
    assert st["events_trained"] == 20_000 and st["events_rejected"] == 0, st
    assert st["events_trained_twice"] == 0 and len(st["windows"]) == 2, st
    assert st["progressive_auc"] > 0.6, st   # it learns (the oracle's is about 0.86)
    assert "zbus-replay: 20,000 events" in c.log("start"), c.log("start")[-3000:]
