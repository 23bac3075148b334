"""A job that cannot start fails at once, for good, with one line naming why: control checks the
job's network before any node waits on it (``roles.control.network_check``), and a node that
cannot start says why to control (``zbus.unstarted``), whose job fails with that line rather
than waiting out ``start_timeout_s``; no role's log holds a traceback."""

from __future__ import annotations

import socket

import numpy as np
import orjson
import pytest
import torch
from harness import BIN

from roles.algorithms.control.membership import Members
from roles.control.start_failures import start_failure
from roles.job.settings import parse_job
from roles.protocol.lifecycle import NetworkFile
from zbus.codec import ProtocolError, decode
from zbus.messages import Hello

ROLES = ("control-0", "feeder-0", "ps-0", "worker-0", "aggregator-0")
NET = """
import torch
from torch import nn


class Net(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.out = nn.Linear(width, 1)

    def forward(self, sparse, dense, lengths):
        return {returns}


def build(sparse_dims, sequence_fields, dense_count, options):
    return Net(sum(sparse_dims.values()) + dense_count)
"""
# what the network file holds, and what the job's reason says after "[model] module <file>: "
BROKEN = {
    "returns [B, 1]": (NET.format(returns="self.out(torch.cat([*sparse.values(), dense], 1))"),
                       "forward returns shape [4, 1] for a batch of 4; return logits of shape "
                       "[batch] (e.g. .squeeze(1))"),
    "forward raises": (NET.format(returns="dense @ torch.ones(3, 3)"),
                       "forward raised RuntimeError: "),
    "no factory": ("def other():\n    pass\n", "no factory 'build' in it (it defines other)"),
}


def user_job(tmp_path, source: str | None) -> object:
    """A synthetic job whose network is ``net.py`` beside it (absent when ``source`` is None)."""
    if source is not None:
        (tmp_path / "net.py").write_text(source)
    job = tmp_path / "job.toml"
    job.write_text('[data]\nsource = "synthetic"\n[model]\nmodule = "net.py:build"\n'
                   '[cluster]\nworkers = 1\nshards = 1\n')
    return job


def failed_for_good(c, reason_has: str) -> dict:
    """The job failed with a reason saying ``reason_has``, cannot be resumed, and no role's log
    holds a traceback."""
    s = c.summary()
    assert s["status"] == "failed" and not s["ok"], (s["status"], s["reason"])
    assert reason_has in s["reason"], s["reason"]
    assert "\n" not in s["reason"]
    assert s["resume_from"] is None
    state = orjson.loads((c.run_dir / "control-state.json").read_bytes())
    assert state["course"]["phase"] == "done"   # ended for good
    for name in c.procs:
        assert "Traceback" not in c.log(name), c.log(name)
    return s


@pytest.mark.inprocess
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_network_that_cannot_train_fails_the_job_before_it_starts(cluster, tmp_path, case):
    source, said = BROKEN[case]
    c = cluster(user_job(tmp_path, source), cluster__start_timeout_s=600)
    assert c.run_job(timeout=120) == 1
    s = failed_for_good(c, f"[model] module {(tmp_path / 'net.py').resolve()}: {said}")
    assert s["reason"].startswith("[model] module ")   # control's own check: no node named
    for name in ("worker-0", "aggregator-0"):          # they met it too, and said so in a line
        assert c.log(name).count(f"zbus {name}: cannot start: [model] module ") == 1, \
            c.log(name)


@pytest.mark.inprocess
def test_a_missing_network_file_fails_the_job_naming_it(cluster, tmp_path):
    c = cluster(user_job(tmp_path, None), cluster__start_timeout_s=600)
    assert c.run_job(timeout=120) == 1
    failed_for_good(c, f"[model] module: no file {(tmp_path / 'net.py').resolve()}")


@pytest.mark.inprocess
def test_a_node_that_cannot_start_fails_the_job_with_its_line(cluster):
    """A shard whose port is taken: the job fails at once with the shard's line, not after
    start_timeout_s with "not ready"."""
    c = cluster(cluster__workers=1, cluster__shards=1, cluster__start_timeout_s=600,
                transport="tcp")
    host, port = c.job.cluster.endpoint("ps-0").removeprefix("tcp://").rsplit(":", 1)
    taken = socket.socket()
    try:
        taken.bind((host, int(port)))
        taken.listen()
        assert c.run_job(timeout=120) == 1
    finally:
        taken.close()
    failed_for_good(c, f"ps-0 cannot start: cannot bind tcp://{host}:{port}: the port is "
                       "in use by pid ")
    assert c.procs["ps-0"].wait(timeout=30) == 2
    assert "zbus ps-0: cannot start: cannot bind" in c.log("ps-0")


@pytest.mark.inprocess
def test_a_built_in_the_job_cannot_run_fails_the_job_with_a_nodes_line(cluster):
    """A built-in with its default options is not checked by control: the worker and the
    aggregator meet the NetworkError as they start, and the first to tell control says why
    (before: a traceback from each, and the job waited out start_timeout_s)."""
    c = cluster(cluster__workers=1, cluster__shards=1, cluster__start_timeout_s=600,
                model__network="din")   # the synthetic job has no sequence field
    assert c.run_job(timeout=120) == 1
    s = failed_for_good(c, " cannot start: din needs a sequence field")
    assert s["reason"].split(" ")[0] in ("worker-0", "aggregator-0"), s["reason"]


def hello(node: str, failed: str = "cannot bind", fingerprint: str = "f") -> Hello:
    role, index = node.rsplit("-", 1)
    return Hello(role=role, index=int(index), host="h", pid=7, fingerprint=fingerprint,
                 failed=failed)


@pytest.mark.parametrize("node, fingerprint, starting, refuse, resumable, said", [
    ("ps-0", "f", True, False, False, "ps-0 cannot start: cannot bind"),
    ("ps-0", "f", False, False, True, "ps-0 cannot start: cannot bind"),
    ("worker-5", "f", False, True, False, "worker-5 cannot start: cannot bind (the job goes "
                                          "on without it)"),
    ("ps-0", "g", True, True, False, "ps-0 runs a different job (fingerprint g)"),
    ("ps-3", "f", True, True, False, "ps-3 (socket identity 'ps-3') is not a node of this "
                                     "job"),
])
def test_what_a_start_failure_means_to_the_job(node, fingerprint, starting, refuse, resumable,
                                               said):
    members = Members(["feeder-0", "ps-0", "worker-0", "aggregator-0"], 255, 0.0)
    verdict = start_failure(members, "f", node, hello(node, fingerprint=fingerprint), starting)
    assert (verdict.refuse, verdict.resumable) == (refuse, resumable)
    assert verdict.reason.startswith(said), verdict.reason


@pytest.mark.parametrize("name, sha256, reason, detail", [
    ("../net.py", "a" * 64, "", "no directory"),
    ("", "a" * 64, "", "no directory"),
    ("net.py", "abc", "", "sha256"),
])
def test_a_malformed_network_file_is_refused_as_any_message(name, sha256, reason, detail):
    frames = NetworkFile(name=name, sha256=sha256, reason=reason,
                         source=np.frombuffer(b"x = 1\n", np.uint8)).to_frames("control-0", 1)
    with pytest.raises(ProtocolError, match=detail) as refused:
        decode(frames)
    assert refused.value.kind == "inconsistent"
    ok = NetworkFile(name="", sha256="", reason="control cannot read it",
                     source=np.zeros(0, np.uint8))
    back = decode(ok.to_frames("control-0", 2)).msg
    assert isinstance(back, NetworkFile) and back.reason == ok.reason and not back.source.size


def test_a_job_file_and_its_run_records_have_one_fingerprint_wherever_the_network_file_is(
        tmp_path):
    """A node may load control's copy of the network file from its cache: the same job."""
    for home in ("a", "b"):
        (tmp_path / home).mkdir()
        (tmp_path / home / "net.py").write_text(NET.format(returns="dense[:, 0]"))
    text = '[data]\nsource = "synthetic"\n[model]\nmodule = "net.py:build"\n'
    a, b = (parse_job(text, str(tmp_path / h / "job.toml"), tmp_path / h, environ={})
            for h in ("a", "b"))
    assert a.model.module != b.model.module and a.fingerprint() == b.fingerprint()
    (tmp_path / "b" / "net.py").write_text(NET.format(returns="dense[:, 1]"))
    assert a.fingerprint() != b.fingerprint()   # what the file holds still counts


PROCFILE = """control: exec zbus-control
feeder: exec zbus-spawn feeder
ps: exec zbus-spawn ps
worker: exec zbus-spawn worker
aggregator: exec zbus-spawn aggregator
"""


@pytest.mark.integration
def test_a_network_returning_b_by_1_under_honcho_fails_in_one_line_without_a_traceback(
        cluster, tmp_path):
    """The issue's own check, as a user meets it: ``honcho start`` (the repository's
    Procfile) on a job whose network returns [B, 1]."""
    source, said = BROKEN["returns [B, 1]"]
    c = cluster(user_job(tmp_path, source), cluster__start_timeout_s=600)
    (c.workdir / "Procfile").write_text(PROCFILE)
    c.start("honcho", [str(BIN / "honcho"), "-d", str(c.workdir), "-f",
                       str(c.workdir / "Procfile"), "start"])
    assert c.wait("honcho", timeout=180) != 0
    out = c.log("honcho")
    file = (tmp_path / "net.py").resolve()
    assert f"zbus: job {c.job.name} failed: [model] module {file}: {said}" in out, out[-3000:]
    assert "Traceback" not in out and "SIGTERM before the job finished" not in out, out[-6000:]
    failed_for_good(c, f"[model] module {file}: {said}")
    assert not c.strays(), c.strays()


@pytest.mark.integration
def test_a_node_that_cannot_start_says_one_line_and_exits_non_zero(cluster):
    """Its process: one line on stderr, no traceback, exit status 2 once control has heard
    it; control's own exit status is the failed job's."""
    c = cluster(cluster__workers=1, cluster__shards=1, cluster__start_timeout_s=600,
                train__device="cuda")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: a worker asking for one starts")
    assert c.run_job(timeout=120) == 1
    failed_for_good(c, "worker-0 cannot start: [train] device = \"cuda\" but no CUDA device is "
                       "available")
    assert c.wait("worker-0", timeout=30) == 2
    lines = c.log("worker-0").splitlines()
    assert "zbus worker-0: cannot start: [train] device = \"cuda\" but no CUDA device is " \
           "available" in lines, lines


TINY = '''
import torch
from torch import nn


class Tiny(nn.Module):
    def __init__(self, sparse_dims, dense_count, width):
        super().__init__()
        self.fields = list(sparse_dims)
        self.mlp = nn.Sequential(nn.Linear(sum(sparse_dims.values()) + dense_count, width),
                                 nn.ReLU(), nn.Linear(width, 1))

    def forward(self, sparse, dense, lengths):
        return self.mlp(torch.cat([*(sparse[f] for f in self.fields), dense], 1)).squeeze(1)


def build(sparse_dims, sequence_fields, dense_count, options):
    return Tiny(sparse_dims, dense_count, options.get("width", 16))
'''


@pytest.mark.integration
def test_a_network_file_only_where_control_runs_reaches_every_node(cluster, tmp_path):
    """Control's host has the job file and its network; every other role reads the same job
    file from a directory without the network (another host's), fetches control's copy into
    its cache, checks it, and trains it."""
    text = ('name = "carried"\n[data]\nsource = "synthetic"\n[data.synthetic]\nrows = 4000\n'
            '[model]\nmodule = "nets/tiny.py:build"\n[train]\nepochs = 1\n'
            '[cluster]\nworkers = 2\nshards = 1\n')
    control_host, node_host = tmp_path / "control-host", tmp_path / "node-host"
    (control_host / "nets").mkdir(parents=True)
    (control_host / "nets" / "tiny.py").write_text(TINY)
    node_host.mkdir()
    for home in (control_host, node_host):
        (home / "job.toml").write_text(text)
    c = cluster(control_host / "job.toml", checkpoint__every_s=0)
    c.start_role("control")
    elsewhere = ("--job", str(node_host / "job.toml"))
    for role, count in (("feeder", 1), ("ps", 1), ("worker", 2), ("aggregator", 1)):
        for i in range(count):
            c.start_role(role, i, *elsewhere)
    assert c.wait(timeout=240) == 0, c.logs()
    s = c.summary()
    assert s["ok"] and s["samples_trained"] > 0, s["reason"]
    (copy,) = (c.workdir / "runs" / "cache" / "networks").glob("*/tiny.py")
    assert copy.read_text() == TINY
    for node in ("feeder-0", "ps-0", "worker-0", "worker-1", "aggregator-0"):
        assert f"{node}: loads the network from control's copy {copy}" in c.log(node), \
            c.log(node)
        assert f"{node}/network has no {node_host / 'nets' / 'tiny.py'}: sent it control's" \
            in c.log("control-0"), c.log("control-0")
    assert not (node_host / "nets").exists()
