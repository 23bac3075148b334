"""Three hosts: the roles in three network namespaces joined by a bridge (veth pairs, made and
removed here), started with the per-role scripts from one cluster file, train Adult over TCP
between the namespaces, authenticated with CURVE (on by default off loopback); and across a
5 ms round trip (the delay bridge), where the workers widen their sample queues. Skipped, with
the reason, where the machine does not allow network namespaces."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import pytest
from harness import ADULT_JOB, REPO, hosts_or_skip

from roles.job.settings import load_job
from roles.job.summary import read_summary
from roles.testbed.netns import HOSTS
from roles.tools.keys import make_keys
from zbus.security import OPERATOR

pytestmark = pytest.mark.integration


@pytest.fixture
def three_hosts():
    with hosts_or_skip() as hosts:
        yield hosts


@pytest.fixture
def three_hosts_5ms(tmp_path):
    with hosts_or_skip(rtt_ms=5.0, mtu=65535, workdir=tmp_path) as hosts:
        yield hosts


def train_across(hosts, tmp_path, curve: bool = True) -> dict:
    """Adult, 1 epoch, the roles started in the hosts' namespaces (CURVE on by default off
    loopback, or turned off); its summary."""
    a, b, c = HOSTS["a"], HOSTS["b"], HOSTS["c"]
    endpoints = {"control": f"{a}:47100", "control_pub": f"{a}:47101",
                 "control_req": f"{a}:47106", "status": f"{a}:47107",
                 "aggregator": f"{a}:47104", "aggregator_pub": f"{a}:47105",
                 "samples": f"{b}:47102", "ledger": f"{b}:47103",
                 "ps-0": f"{b}:47110", "ps-1": f"{c}:47111"}
    cluster_file = tmp_path / "cluster.toml"
    cluster_file.write_text("[endpoints]\n" + "".join(
        f'"{n}" = "{v}"\n' for n, v in endpoints.items()))
    env = {**os.environ, "ZBUS_CLUSTER__KEYS_DIR": str(tmp_path / "keys"),
           "ZBUS_RUN_DIR": str(tmp_path / "run"), "ZBUS_TRAIN__EPOCHS": "1",
           "ZBUS_CLUSTER_FILE": str(cluster_file), "ZBUS_JOB": str(ADULT_JOB),
           **({} if curve else {"ZBUS_CLUSTER__CURVE": "off"})}
    job = load_job(None, environ=env)
    assert job.cluster.curve_enabled() == curve
    if curve:
        make_keys(tmp_path / "keys", [*job.cluster.expected_nodes(), "control-0", OPERATOR])
    starts = [("a", "control", []), ("a", "aggregator", ["--index", "0"]),
              ("b", "feeder", ["--index", "0"]), ("b", "ps", ["--index", "0"]),
              ("c", "ps", ["--index", "1"]), ("c", "worker", ["--index", "0"]),
              ("c", "worker", ["--index", "1"])]
    procs = {}
    try:
        for host, role, args in starts:
            name = f"{role}-{args[-1] if args else 0}"
            with open(tmp_path / f"{name}.log", "wb") as out:
                procs[name] = subprocess.Popen(
                    ["ip", "netns", "exec", hosts.names[host], str(REPO / "scripts" /
                     f"run-{role}"), "--cluster", str(cluster_file), "--job", str(ADULT_JOB),
                     *args], env=env, stdout=out, stderr=subprocess.STDOUT,
                    start_new_session=True, cwd=tmp_path)
        deadline = time.monotonic() + 240
        while procs["control-0"].poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        logs = "\n".join(f"--- {n}\n{(tmp_path / f'{n}.log').read_text()[-1500:]}"
                         for n in procs)
        assert procs["control-0"].poll() == 0, logs
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
    s = read_summary(tmp_path / "run")
    assert s["ok"] and s["auc"] >= 0.89, s["auc"]
    assert s["samples_trained"] == s["samples_in_data"]
    assert all(n > 0 for n in s["workers"].values())
    assert s["rejected_messages"] == {}
    return s


def test_adult_trains_across_three_hosts_over_tcp_with_curve(three_hosts, tmp_path):
    train_across(three_hosts, tmp_path)


def test_workers_open_more_sample_queue_connections_across_a_5_ms_round_trip(
        three_hosts_5ms, tmp_path):
    """The worker's measured round trip to its feeder (about 5 ms) over its batch time (a few
    ms) needs more than the one batch a connection carries per round trip: each worker opens
    more (TakeWindow.links), and every row is still trained once."""
    s = train_across(three_hosts_5ms, tmp_path, curve=False)
    windows = s["take_windows"]
    assert sorted(windows) == ["worker-0", "worker-1"]
    for node, w in windows.items():
        assert w["take_rtt_ms"] >= 5.0, (node, w)      # the link's delay was measured
        assert w["sample_links"] >= 2, (node, w)       # and the queue widened for it
