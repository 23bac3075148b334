"""zbus run the way Kubernetes runs it: every role a "pod" (``zbus-pod ROLE``) in a network
namespace of its own host, found by name (``[cluster] node_host``, each namespace's
``/etc/hosts`` standing in for the cluster's DNS), CURVE keys from a flat directory (a Secret),
a health file per pod for ``zbus-probe``; a shard's pod killed and started again in another
namespace, at another address under the same name. And the parts: the pod's index and
control's resume decision, the health record and the probes' rule, the node names as hosts,
binding a name, a flat keys directory. The namespaces are skipped, with the reason, where the
machine does not allow them."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from pathlib import Path

import orjson
import pytest
from harness import ADULT_JOB, ADULT_TRAIN_ROWS, REPO, hosts_or_skip

from roles.checkpoint.files import SUMMARY, write_manifest
from roles.control import handover
from roles.protocol.topology import ClusterConfig
from roles.storage.store import Store
from roles.testbed import kube_pods
from roles.testbed.local_cluster import clean_environ
from roles.testbed.netns import Hosts
from roles.testbed.s3 import S3Server
from roles.tools import pod, probe
from roles.tools.keys import make_keys
from zbus import health, signals
from zbus.endpoints import bind_address
from zbus.security import OPERATOR

NODE_HOST = "zbus-{node}.zbus"


# -- the parts ---------------------------------------------------------------------------------

def test_node_host_names_each_endpoint_by_the_node_that_binds_it():
    c = ClusterConfig(node_host=NODE_HOST, workers=3, shards=4, parts=2, feeders=2,
                      aggregators=2, endpoints={"ps-0": "tcp://10.0.0.9:5000"})
    assert c.endpoint("control") == "tcp://zbus-control-0.zbus:47100"
    assert c.endpoint("status") == "tcp://zbus-control-0.zbus:47107"
    assert c.endpoint("ps-3") == "tcp://zbus-ps-3.zbus:47113"
    assert c.endpoint("samples-1") == "tcp://zbus-feeder-1.zbus:49502"
    assert c.endpoint("aggregator_pub") == "tcp://zbus-aggregator-0.zbus:47105"
    assert c.endpoint("aggregator-1") == "tcp://zbus-aggregator-1.zbus:47381"
    assert c.endpoint("group-2-0") == "tcp://zbus-worker-2.zbus:47404"
    assert c.endpoint("group-2-1") == "tcp://zbus-member-2.zbus:47405"
    assert c.endpoint("ps-0") == "tcp://10.0.0.9:5000"   # an override still wins
    assert not c.single_host() and c.curve_enabled()      # a name is not this host
    assert ClusterConfig().endpoint("ps-1") == "tcp://127.0.0.1:47111"  # unset: as before


@pytest.mark.parametrize("bad", ["zbus", "tcp://zbus-{node}", "zbus-{node}:80",
                                 "zbus-{node}/x", "zbus-{node}-{index}"])
def test_node_host_must_be_a_bare_host_name_pattern(bad):
    with pytest.raises(ValueError, match="node_host"):
        ClusterConfig(node_host=bad)


def test_an_endpoint_by_name_is_bound_on_every_interface_unless_one_is_named():
    assert bind_address("tcp://zbus-ps-3.zbus:47113") == "tcp://*:47113"
    assert bind_address("tcp://zbus-ps-3.zbus:47113", "eth0") == "tcp://eth0:47113"
    assert bind_address("tcp://10.0.0.2:47113") == "tcp://10.0.0.2:47113"
    assert bind_address("tcp://[::1]:47113") == "tcp://[::1]:47113"
    assert bind_address("tcp://localhost:47113") == "tcp://localhost:47113"
    assert bind_address("tcp://10.0.0.2:47113", "*") == "tcp://*:47113"
    assert bind_address("ipc:///tmp/x/ps-0", "*") == "ipc:///tmp/x/ps-0"


def test_a_pods_index_is_the_trailing_number_of_its_name():
    assert pod.pod_index("zbus-ps-3") == 3
    assert pod.pod_index("zbus-worker-12") == 12
    for bad in ("", "zbus-ps", "zbus-ps-x", "zbus-ps-3a", "-"):
        with pytest.raises(pod.PodError, match="ZBUS_POD_NAME"):
            pod.pod_index(bad)
    env = {"ZBUS_POD_NAME": "zbus-ps-3"}
    assert pod.role_argv("ps", env, ["--slowdown", "2"]) == \
        [sys.executable, "-m", "roles.ps", "--index", "3", "--slowdown", "2"]
    assert pod.role_argv("control", {"ZBUS_POD_NAME": "anything"})[1:] == ["-m", "roles.control"]
    with pytest.raises(pod.PodError, match="no role"):
        pod.role_argv("console", env)
    environ = pod.pod_environ({})
    assert environ["ZBUS_HEALTH_FILE"] == "/tmp/zbus-health.json"
    assert pod.pod_environ({"ZBUS_HEALTH_FILE": "/h"})["ZBUS_HEALTH_FILE"] == "/h"


def test_control_resumes_the_run_its_run_directory_holds_else_starts_one(tmp_path):
    run = tmp_path / "run"
    assert pod.control_args({}) == []
    assert pod.control_args({"ZBUS_RUN_DIR": str(run)}) == []   # not there yet
    run.mkdir()
    (run / "metrics.jsonl").write_text("")                     # a run's files, no state
    assert pod.control_args({"ZBUS_RUN_DIR": str(run)}) == []
    (run / "control-state.json").write_text('{"course": {"phase": "training"}}')
    assert pod.control_args({"ZBUS_RUN_DIR": str(run)}) == ["--resume", str(run)]  # restarted
    (run / "control-state.json").write_text('{"course": {"phase": "done"}}')
    (run / "summary.json").write_text('{"status": "failed", "reason": "feeder-0: bad data"}')
    with pytest.raises(pod.JobEnded, match="has ended [(]failed: feeder-0: bad data[)]"):
        pod.control_args({"ZBUS_RUN_DIR": str(run)})            # ended for good: it idles


def test_control_in_an_empty_run_directory_resumes_from_the_checkpoint_store(tmp_path):
    """A pod rescheduled elsewhere has an empty run directory: with [checkpoint] dir set (a
    bucket, here a directory), control resumes the run its newest complete checkpoint belongs
    to; when the summary there says that run ended for good, the pod has nothing to start."""
    store = tmp_path / "bucket"
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\nsource = "synthetic"\n[checkpoint]\ndir = "{store}"\n')
    env = {"ZBUS_JOB": str(job), "ZBUS_RUN_DIR": str(tmp_path / "run")}
    assert pod.control_args(env) == []                         # a new job: nothing there
    (store / "000001").mkdir(parents=True)
    (store / "000001" / "dense.npz").write_bytes(b"x" * 10)
    assert pod.control_args(env) == []                         # no manifest: not complete
    write_manifest(Store(str(store)), 1, {"parts": {"aggregator-0": ["000001/dense.npz"]}})
    assert pod.control_args(env) == ["--resume", str(tmp_path / "run")]
    (store / SUMMARY).write_bytes(orjson.dumps({"status": "interrupted", "resume_from": 1}))
    assert pod.control_args(env) == ["--resume", str(tmp_path / "run")]   # resumable
    (store / SUMMARY).write_bytes(orjson.dumps({"status": "completed", "resume_from": None}))
    with pytest.raises(pod.JobEnded, match="completed"):
        pod.control_args(env)


def test_control_goes_on_from_records_handed_over_and_any_pod_of_an_ended_job_idles(
        tmp_path):
    """Control stopped in its pod handed its records over in the store: the next control, on
    an empty disk, resumes from them before any checkpoint is taken. A pod of any role whose
    health file, or the store's summary, says the job ended for good has nothing to run."""
    store = tmp_path / "bucket"
    job = tmp_path / "job.toml"
    job.write_text(f'[data]\nsource = "synthetic"\n[checkpoint]\ndir = "{store}"\n')
    env = {"ZBUS_JOB": str(job), "ZBUS_RUN_DIR": str(tmp_path / "run"),
           "ZBUS_HEALTH_FILE": str(tmp_path / "health.json")}
    assert pod.control_args(env) == [] and pod.job_over(env) is None
    records = Store(str(store))
    handover.hand_over(records, "state", "history")   # (any records: the files are what counts)
    assert pod.control_args(env) == ["--resume", str(tmp_path / "run")]
    assert handover.handed_over(records) == str(store / "control")
    handover.remove_handover(records)
    assert handover.handed_over(records) is None and pod.control_args(env) == []
    (store / SUMMARY).write_bytes(orjson.dumps({"status": "interrupted", "resume_from": 2}))
    assert pod.job_over(env) is None                           # resumable: the roles run
    (store / SUMMARY).write_bytes(orjson.dumps({"status": "failed", "reason": "bad data",
                                                "resume_from": None}))
    assert "has ended (failed: bad data)" in pod.job_over(env)
    (store / SUMMARY).unlink()
    health.HealthFile(tmp_path / "health.json", "ps-1").write("ready", pid=7)
    assert pod.job_over(env) is None
    assert not pod.ended_by(health.read(tmp_path / "health.json"), 7)
    health.HealthFile(tmp_path / "health.json", "ps-1").write("ended", pid=7)
    assert pod.ended_by(health.read(tmp_path / "health.json"), 7)      # whatever its status
    assert not pod.ended_by(health.read(tmp_path / "health.json"), 8)  # another process's
    assert "health file" in pod.job_over(env)           # a container of this pod, restarted


def test_a_sigterm_is_a_restart_only_where_zbus_pod_says_so():
    """Under zbus-pod a SIGTERM comes from Kubernetes (eviction, drain, deletion): the role's
    restart. Elsewhere (honcho's Ctrl-C, a kill) it stops the job, as SIGINT always does."""
    assert signals.meaning(signal.SIGTERM, {}) == signals.STOP
    assert signals.meaning(signal.SIGTERM, {"ZBUS_SIGTERM": "stop"}) == signals.STOP
    under_pod = pod.pod_environ({})
    assert signals.meaning(signal.SIGTERM, under_pod) == signals.RESTART
    assert signals.meaning(signal.SIGINT, under_pod) == signals.STOP
    assert pod.pod_environ({"ZBUS_SIGTERM": "stop"})["ZBUS_SIGTERM"] == "stop"


def test_the_health_record_is_written_whole_and_only_when_asked_for(tmp_path):
    assert health.HealthFile.from_env("ps-0", {}) is None   # no file unless set
    path = tmp_path / "health.json"
    h = health.HealthFile.from_env("ps-0", {"ZBUS_HEALTH_FILE": str(path)})
    assert h is not None
    h.write("starting")
    record = health.read(path)
    assert record is not None and record["node"] == "ps-0" and record["pid"] == os.getpid()
    assert record["state"] == "starting" and abs(record["time"] - time.time()) < 5
    h.beat("starting", every_s=60)         # nothing new, not due: not written again
    assert health.read(path) == record
    h.beat("ready", every_s=60)            # a new state: at once
    assert health.read(path)["state"] == "ready"
    assert [p.name for p in tmp_path.iterdir()] == ["health.json"]  # no temporary left
    assert health.read(tmp_path / "none") is None


def test_the_probes_rule():
    now = 1000.0
    rec = {"node": "ps-1", "pid": 42, "time": now - 5, "state": "ready"}

    def alive(_pid):
        return True

    def dead(_pid):
        return False

    assert health.verdict(rec, "live", now, alive=alive) is None
    assert health.verdict(rec, "ready", now, alive=alive) is None
    assert "not running" in health.verdict(rec, "live", now, alive=dead)
    assert "ago" in health.verdict({**rec, "time": now - 61}, "live", now, alive=alive)
    assert health.verdict({**rec, "time": now - 61}, "live", now, 120, alive=alive) is None
    starting = {**rec, "state": "starting"}
    assert health.verdict(starting, "live", now, alive=alive) is None
    assert "not ready" in health.verdict(starting, "ready", now, alive=alive)
    ended = {**rec, "state": "ended"}   # its process gone: the job is over for it
    assert health.verdict(ended, "live", now, alive=dead) is None
    assert "ended, not ready" in health.verdict(ended, "ready", now, alive=dead)
    assert "no health record" in health.verdict(None, "live", now)
    assert "malformed" in health.verdict({"state": "fine"}, "live", now)


def test_zbus_probe_exits_0_or_1_with_the_reason(tmp_path, capsys):
    path = tmp_path / "health.json"
    with pytest.raises(SystemExit) as out:
        probe.main(["live", "--file", str(path)])
    assert out.value.code == 1
    assert "no health record" in capsys.readouterr().err
    health.HealthFile(path, "worker-1").write("starting")
    probe.main(["live", "--file", str(path)])
    with pytest.raises(SystemExit) as out:
        probe.main(["ready", "--file", str(path)])
    assert out.value.code == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "worker-1 is starting, not ready" in err
    health.HealthFile(path, "worker-1").write("ready")
    probe.main(["ready", "--file", str(path), "--max-age", "5"])
    assert "worker-1 is ready" in capsys.readouterr().out


# -- namespaces --------------------------------------------------------------------------------

@pytest.fixture
def hosts():
    h = hosts_or_skip()
    try:
        yield h
    finally:
        h.close()
        for ns in h.names.values():
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


PEER = """
import sys, time, zmq
from zbus import endpoints, sockets
ctx = zmq.Context()
if sys.argv[1] == "server":
    s = sockets.bind(ctx, zmq.ROUTER, "tcp://*:5555")
    print("up", flush=True)
    while True:
        who, _ = s.recv_multipart()
        s.send_multipart([who, sys.argv[2].encode()])
address = "tcp://peer.zbus:5555"
s = sockets.connect(ctx, zmq.DEALER, address)
at, heard, last = endpoints.resolved(address), time.monotonic(), None
while True:
    if s.poll(0, zmq.POLLOUT):
        s.send(b"ping", zmq.NOBLOCK)
    if s.poll(200):
        who = s.recv().decode()
        heard = time.monotonic()
        if who != last:
            print(who, flush=True)
            last = who
    elif sys.argv[1] == "renewing" and time.monotonic() - heard > 1 \
            and endpoints.resolved(address) != at:
        s.close(0)           # as Loop.renew: the name points elsewhere now
        s = sockets.connect(ctx, zmq.DEALER, address)
        at, heard = endpoints.resolved(address), time.monotonic()
        print("renewed", flush=True)
"""


@pytest.mark.integration
@pytest.mark.parametrize("gone", ["process", "host"])
def test_a_socket_connected_by_name_finds_its_peer_again_at_a_new_address(hosts, tmp_path,
                                                                           gone):
    """A peer whose process died is found again at its new address by libzmq itself (it
    resolves the name again at each reconnect); one whose host vanished (its link cut: no FIN)
    once the name, looked up again, points elsewhere and the socket is renewed."""
    env = {**clean_environ(), "PYTHONPATH": str(REPO)}
    script = tmp_path / "peer.py"
    script.write_text(PEER)
    kube_pods.write_hosts(hosts, {"peer.zbus": "a"})
    procs = []
    try:
        def start(host: str, *args: str) -> subprocess.Popen:
            procs.append(hosts.popen(host, [sys.executable, str(script), *args], env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            return procs[-1]

        server = start("a", "server", "A")
        assert server.stdout.readline() == b"up\n"
        client = start("c", "plain" if gone == "process" else "renewing")
        assert client.stdout.readline() == b"A\n"
        if gone == "process":
            kill_group(server)
        else:
            subprocess.run(["ip", "-n", hosts.names["hub"], "link", "set",
                            hosts.hub_port("a"), "down"], check=True, timeout=30)
        kube_pods.write_hosts(hosts, {"peer.zbus": "b"})
        assert start("b", "server", "B").stdout.readline() == b"up\n"
        said = [client.stdout.readline() for _ in range(1 if gone == "process" else 2)]
        assert said == ([b"B\n"] if gone == "process" else [b"renewed\n", b"B\n"]), said
    finally:
        for p in procs:
            kill_group(p)
            p.wait(timeout=30)


# -- the job's pods, from the rendered manifests ---------------------------------------------

@pytest.fixture
def manifests() -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("no kubectl to render deploy/kubernetes/base with")
    return kube_pods.render("base")


def the_job(tmp_path: Path, manifests: list[dict], data: str, checkpoints: str,
            orphan_timeout_s: float = 60.0, **train: object) -> tuple[Path, dict]:
    """A job of one's own in place of the ConfigMap's (as an overlay's ``job.toml``): Adult
    from S3, slow enough to move pods mid-epoch, short heartbeats and timeouts, checkpoints in
    S3, CURVE on with the keys where the manifests mount the Secret; the names as the shipped
    job has them, and the counts as the manifests give every pod (``ZBUS_CLUSTER__*``, the
    StatefulSets' replicas)."""
    found, config = kube_pods.templates(manifests)
    cluster = tomllib.loads(config["job.toml"])["cluster"]
    counts = {"feeders": "feeder", "shards": "ps", "aggregators": "aggregator",
              "workers": "worker"}
    for t in found.values():
        env = {v["name"]: v.get("value") for v in t.env}
        assert {k: int(env[f"ZBUS_CLUSTER__{k.upper()}"]) for k in counts} == \
            {k: found[r].replicas for k, r in counts.items()}, "replicas are the job's counts"
    text = ADULT_JOB.read_text()
    text = text.replace('path = "../data/adult.csv.gz"', f'path = "{data}"')
    text = text.replace("[model]\nembedding_dim = 16\nhidden = [128, 64]",
                        "[model]\nembedding_dim = 16\nhidden = [512, 256]")
    settings = {"epochs": 2, "recovery_timeout_s": 90, **train}
    text = text.replace("[train]\nepochs = 3\n", "[train]\n" + "".join(
        f"{k} = {v}\n" for k, v in settings.items()))
    text = text.replace("[cluster]\nworkers = 2\nshards = 2\n", "[cluster]\n" + "".join(
        f'{k} = "{cluster[k]}"\n' for k in ("node_host", "keys_dir")) + 'curve = "on"\n'
        f"heartbeat_s = 0.25\nnode_timeout_s = 3.0\norphan_timeout_s = {orphan_timeout_s}\n")
    text += f'\n[checkpoint]\nevery_s = 1.5\ndir = "{checkpoints}"\n'
    assert f'path = "{data}"' in text and "node_host" in text and "epochs" in text
    path = tmp_path / "job.toml"   # the ConfigMap's key, mounted with subPath
    path.write_text(text)
    return path, cluster


def the_keys(tmp_path: Path, nodes: list[str]) -> Path:
    """A Secret is flat: no allowed/ (every *.key in it is allowed)."""
    full, flat = tmp_path / "keys-made", tmp_path / "keys"
    make_keys(full, [*nodes, OPERATOR])
    flat.mkdir()
    for f in full.iterdir():
        if f.is_file():
            shutil.copy(f, flat / f.name)
    return flat


class Job:
    """The pods of one job and what its control says, for the tests below."""

    def __init__(self, hosts: Hosts, tmp_path: Path, manifests: list[dict], s3: S3Server,
                 data: str, **settings: object):
        found, _ = kube_pods.templates(manifests)
        self.nodes = [f"{t.role}-{i}" for t in found.values() for i in range(t.replicas)]
        self.store = s3.uri("checkpoints")
        job, cluster = the_job(tmp_path, manifests, data, self.store, **settings)
        self.s3, self.hosts = s3, hosts
        self.pods = kube_pods.Pods(hosts, tmp_path, manifests, job, {"zbus-s3": s3.env},
                                   {"zbus-keys": the_keys(tmp_path, self.nodes)},
                                   cluster["node_host"],
                                   extra_args={"worker": ["--slowdown", "4"]})

    def stored(self, what: str) -> list[str]:
        """The keys in the checkpoint store that hold ``what`` (listed from host a, where the
        S3 server is reachable)."""
        code = ("import boto3, json; pages = boto3.client('s3').get_paginator("
                f"'list_objects_v2').paginate(Bucket={self.s3.bucket!r}, Prefix='checkpoints/'); "
                "print(json.dumps([o['Key'] for p in pages for o in p.get('Contents', [])]))")
        out = self.hosts.run("a", [sys.executable, "-c", code], env={**os.environ,
                                                                    **self.s3.env})
        return [k for k in orjson.loads(out.stdout) if what in k]

    def run_dir(self) -> Path:
        return self.pods.disk("control-0", "state") / "run"

    def health(self, node: str) -> dict:
        return health.read(self.pods.disk(node, "tmp") / "zbus-health.json") or {}

    def events(self) -> list[dict]:
        path = self.run_dir() / "metrics.jsonl"
        return [orjson.loads(x) for x in path.read_bytes().splitlines() if x] \
            if path.exists() else []

    def wait(self, predicate, what: str, timeout: float = 120.0):
        """Until ``predicate()`` is true (the kubelet restarting containers meanwhile)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.pods.tick()
            found = predicate()
            if found:
                return found
            time.sleep(0.1)
        raise AssertionError(f"no {what} within {timeout} s\n{self.pods.logs()}")

    def event(self, predicate, what: str, timeout: float = 120.0) -> dict:
        return self.wait(lambda: next((e for e in self.events() if predicate(e)), None), what,
                         timeout)

    def checkpoint_after(self, t: float) -> dict:
        return self.event(lambda e: e["event"] == "checkpoint" and e["status"] == "complete"
                          and e["t"] > t, f"a complete checkpoint after {t:.1f}")

    def ended(self, node: str) -> None:
        self.wait(lambda: self.health(node).get("state") == "ended", f"{node} ended")

    def idles(self, node: str, probes: bool = False) -> None:
        """The pod has nothing to run, and says so: its container idling, its health ended
        (``probes``: the manifest's probes say live, not ready)."""
        self.ended(node)
        pod = self.pods.pods[node]
        assert pod.proc is not None and pod.proc.poll() is None, (node, self.pods.logs())
        if probes:
            assert self.pods.probe(node, "live").returncode == 0
            ready = self.pods.probe(node, "ready")
            assert ready.returncode == 1 and "ended, not ready" in ready.stderr, ready.stderr

    def restarted_idle(self, node: str) -> None:
        """Its container killed: the kubelet starts it again, and it idles at once."""
        pod = self.pods.pods[node]
        before = len(pod.exits)
        self.pods.crash(node)
        self.wait(lambda: len(pod.exits) > before and pod.exited_at == 0.0
                  and "has ended" in self.pods.log(node).rsplit("--- started", 1)[-1],
                  f"{node}'s restarted container idling", timeout=60)
        self.idles(node, probes=True)


@pytest.mark.integration
def test_pods_go_on_when_any_pod_moves_or_is_stopped_and_idle_once_the_job_is_over(
        hosts, tmp_path, manifests):
    """The job's pods as the rendered manifests run them, each on its own disks, the data and
    the checkpoints in S3 (moto, on host a). Host b vanishes without a word with ps-1, the only
    feeder and the aggregator on it (no FIN: their connections look open); the StatefulSets
    make them again on host c, at new addresses, with empty disks: the peers connect anew by
    name, the shard and the aggregator restore, the feeder goes on from its ack log's copy in
    the store, and nothing is trained twice. Control's pod is deleted (SIGTERM: an eviction,
    a drain): it hands its records over and its new pod, on another host with an empty disk,
    goes on with the nodes, nothing rolled back. Then control's host vanishes: its new pod
    takes its records from the newest checkpoint, the nodes find it by name, are refused,
    their containers restart and the whole job goes back to that checkpoint. The job
    completes, every row trained once per epoch counted from the cut; every pod idles, live
    and not ready, also once its container is started again, and exits 0 on SIGTERM."""
    s3 = S3Server(host=hosts.address["a"], netns=hosts.names["a"], log=tmp_path / "s3.log")
    job = None
    try:
        job = Job(hosts, tmp_path, manifests, s3,
                  s3.upload("data/adult.csv.gz", REPO / "data" / "adult.csv.gz"))
        pods = job.pods
        place = {"control-0": "a", "feeder-0": "b", "aggregator-0": "b", "ps-0": "b",
                 "ps-1": "b", "worker-0": "c", "worker-1": "c"}
        assert sorted(place) == sorted(job.nodes)
        for node in job.nodes:
            pods.create(node, place[node])
        job.event(lambda e: e["event"] == "round_done" and e["round"] >= 3, "round 3")
        for node, kind in (("control-0", "live"), ("control-0", "ready"), ("worker-1", "ready")):
            result = pods.probe(node, kind)   # the manifests' probes, of running pods
            assert result.returncode == 0, (node, kind, result.stderr)
        first = job.checkpoint_after(0.0)

        # host b vanishes with ps-1, feeder-0 and aggregator-0; made again on host c, empty
        for node in ("ps-1", "feeder-0", "aggregator-0"):
            pods.vanish(node)
        for node in ("ps-1", "feeder-0", "aggregator-0"):
            pods.create(node, "c")
        back = [job.event(lambda e, kind=kind: e["event"] == kind and e["t"] > first["t"],
                          kind) for kind in ("shard_recovered", "feeder_back", "restored")]
        moved = job.checkpoint_after(max(e["t"] for e in back))
        assert "starts from its copy in" in pods.log("feeder-0")

        # control's pod deleted (an eviction): it hands over; its new pod, empty, goes on
        assert pods.delete("control-0") == 128 + signal.SIGTERM, pods.logs()
        handed = [e for e in job.events() if e["event"] == "handover"]
        rounds_before = max(e["round"] for e in job.events() if e["event"] == "round_done")
        assert handed and job.stored("/control/control-state.json"), pods.logs()
        pods.create("control-0", "b")
        job.event(lambda e: e["event"] == "rejoin", "a node rejoining the new control")
        going_on = job.event(lambda e: e["event"] == "round_done", "a round after the handover")
        assert going_on["round"] > rounds_before   # from where it was: not rolled back
        assert "handed over when its pod was stopped" in pods.log("control-0")
        assert not job.stored("/control/control-")   # taken, and removed
        cut = job.checkpoint_after(going_on["t"])
        assert not [e for e in job.events() if e["event"] in ("rollback", "end")]

        # control's host vanishes: its new pod goes back to the newest checkpoint
        pods.vanish("control-0")
        last_cut = max(e["number"] for e in job.events() if e["event"] == "checkpoint"
                       and e["status"] == "complete")
        assert last_cut >= cut["number"] > moved["number"]
        pods.create("control-0", "c")
        job.event(lambda e: e["event"] == "rollback", "the whole job back to its checkpoint")
        # a guard against a hang, not a timing
        job.wait(lambda: job.health("control-0").get("state") == "ended", "the job's end",
                 timeout=480)
        s = orjson.loads((job.run_dir() / "summary.json").read_bytes())
        assert s["ok"], pods.logs()
        for node in job.nodes:   # every pod idles: the job is over
            job.idles(node)
        for node in ("control-0", "ps-0"):   # whatever container restarts follow
            job.restarted_idle(node)
        for node in job.nodes:   # the StatefulSets are deleted: SIGTERM, exit 0
            assert pods.delete(node) == 0, (node, pods.logs())
    finally:
        if job is not None:
            job.pods.close()
        s3.close()
    assert s["auc"] >= 0.88, s["auc"]
    (rollback,) = s["checkpoints"]["rollbacks"]
    assert rollback["checkpoint"] == last_cut, (rollback, last_cut)
    (shard,) = s["shard_recoveries"]
    assert shard["shard"] == "ps-1" and shard["restored"], shard
    (feeder,) = s["parts"]["feeder_recoveries"]
    assert feeder["feeder"] == "feeder-0", feeder
    assert len(s["recovery"]) == 1, s["recovery"]   # the aggregator's restore
    for rows in s["parts"]["rows_per_epoch"]:
        assert rows["rows"] == rows["rows_once"] == ADULT_TRAIN_ROWS, rows
    assert s["samples_trained"] == 2 * ADULT_TRAIN_ROWS
    assert s["duplicates_refused"]["embedding_updates"] == 0
    # what the moves cause, and only that: a restarted node's report to a control that has not
    # heard its Hello yet, a Rejoin reaching a node not yet welcomed (counted, never fatal)
    assert {kind for counts in s["rejected_messages"].values() for kind in counts} <= \
        {"unregistered", "unexpected_type"}, s["rejected_messages"]


@pytest.mark.integration
def test_the_pods_of_a_job_that_failed_for_good_idle_whatever_container_restarts_follow(
        hosts, tmp_path, manifests):
    """A job that fails in a way a resume would meet again (here its data cannot be read):
    every pod idles, live and not ready, health ``ended``; control's container started again
    idles at once (its run has ended) and exits 0 on SIGTERM, and so does a node's. (A node
    that starts after control ended waits ``orphan_timeout_s`` for it, exits, and its container
    started again idles: the run's summary in the store says it ended.)"""
    s3 = S3Server(host=hosts.address["a"], netns=hosts.names["a"], log=tmp_path / "s3.log")
    job = None
    try:
        job = Job(hosts, tmp_path, manifests, s3, s3.uri("data/nowhere.csv.gz"),
                  orphan_timeout_s=10.0)
        pods = job.pods
        for i, node in enumerate(job.nodes):
            pods.create(node, "abc"[i % 3])
        job.wait(lambda: job.health("control-0").get("state") == "ended", "the job's end")
        s = orjson.loads((job.run_dir() / "summary.json").read_bytes())
        assert s["status"] == "failed" and s["resume_from"] is None, s["reason"]
        for node in job.nodes:
            job.idles(node)
        for node in ("control-0", "feeder-0", "worker-0"):
            job.restarted_idle(node)
        for node in job.nodes:
            assert pods.delete(node) == 0, (node, pods.logs())
    finally:
        if job is not None:
            job.pods.close()
        s3.close()
