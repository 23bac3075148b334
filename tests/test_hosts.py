"""Three hosts: the roles in three network namespaces joined by a bridge (veth pairs, made and
removed here), started with the per-role scripts from one cluster file, train Adult over TCP
between the namespaces, authenticated with CURVE (on by default off loopback). Skipped, with
the reason, where the machine does not allow network namespaces."""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import time

import orjson
import pytest
from harness import ADULT_JOB, REPO

from roles.job.settings import load_job
from roles.tools.keys import make_keys
from zbus.security import OPERATOR

pytestmark = pytest.mark.integration

HOSTS = {"a": "10.77.0.1", "b": "10.77.0.2", "c": "10.77.0.3"}


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def namespaces_allowed() -> str:
    """'' when this process may make network namespaces, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is missing"
    probe = f"zbprobe{secrets.token_hex(3)}"
    try:
        ip("netns", "add", probe)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
        return f"ip netns add is not permitted here: {getattr(exc, 'stderr', b'')!r}"
    ip("netns", "del", probe)
    return ""


@pytest.fixture
def three_hosts():
    why = namespaces_allowed()
    if why:
        pytest.skip(why)
    tag = secrets.token_hex(2)
    names = {h: f"zb{tag}{h}" for h in HOSTS} | {"hub": f"zb{tag}hub"}
    try:
        try:
            build(names, tag)
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired) as exc:
            pytest.skip(f"cannot build the namespaces here ({' '.join(exc.cmd)}): "
                        f"{(exc.stderr or b'').decode(errors='replace').strip()}")
        yield names
    finally:
        for ns in names.values():  # removing a namespace removes its links
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
        for h in HOSTS:  # and a pair left behind by a failed move, if any
            subprocess.run(["ip", "link", "del", f"zb{tag}{h}o"], capture_output=True,
                           timeout=30)


def build(names: dict[str, str], tag: str) -> None:
    """The hub's bridge, and each host's veth pair into it with its address."""
    for ns in names.values():
        ip("netns", "add", ns)
    ip("-n", names["hub"], "link", "add", "br0", "type", "bridge")
    ip("-n", names["hub"], "link", "set", "br0", "up")
    for h, address in HOSTS.items():
        outside, inside = f"zb{tag}{h}o", f"zb{tag}{h}i"
        ip("link", "add", outside, "type", "veth", "peer", "name", inside)
        ip("link", "set", outside, "netns", names["hub"])
        ip("link", "set", inside, "netns", names[h])
        ip("-n", names["hub"], "link", "set", outside, "master", "br0", "up")
        ip("-n", names[h], "addr", "add", f"{address}/24", "dev", inside)
        ip("-n", names[h], "link", "set", inside, "up")
        ip("-n", names[h], "link", "set", "lo", "up")


def test_adult_trains_across_three_hosts_over_tcp_with_curve(three_hosts, tmp_path):
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
           "ZBUS_CLUSTER_FILE": str(cluster_file), "ZBUS_JOB": str(ADULT_JOB)}
    job = load_job(None, environ=env)
    assert job.cluster.curve_enabled()  # off loopback: on by default
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
                    ["ip", "netns", "exec", three_hosts[host], str(REPO / "scripts" /
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
    s = orjson.loads((tmp_path / "run" / "summary.json").read_bytes())
    assert s["ok"] and s["auc"] >= 0.89, s["auc"]
    assert s["samples_trained"] == s["samples_in_data"]
    assert all(n > 0 for n in s["workers"].values())
    assert s["rejected_messages"] == {}
